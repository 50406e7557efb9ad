//! redirector as istio-init in a real pod: the tests' containerd, driven through the CRI as
//! kubelet drives it, runs a pod whose init container is redirector under istio's name
//! (`/usr/local/bin/istio-iptables` in an image of the test's own) with istio's injected
//! flags, and only once it exited 0 the sidecar and the app. The service is a pod of its
//! own on the same ptp network (IPv4 and IPv6). See docs/real-pod.md.

use k8s_cri::v1::Mount;
use serde_json::json;

use redirector_tests::cgroup::cgroup2_root;
use redirector_tests::cri::pods::{
    assert_inbound_on_proxy, assert_reaches_service, assert_served_by, connect, dual_stack_network,
    probe_container,
};
use redirector_tests::cri::{container_config, Containerd, Sandbox};
use redirector_tests::host_net::{ForwardingGuard, HostNetState};
use redirector_tests::netns::cookie_at;
use redirector_tests::prelude::*;

/// The app's own port, captured inbound.
const APP_PORT: u16 = 8080;
/// istio's health port: in `-d`, never captured inbound.
const EXCLUDED_INBOUND_PORT: u16 = 15021;
const SERVICE_PORT: u16 = 80;
/// istio's init image stands in as an image of its own: busybox and redirector.
const INIT_IMAGE: &str = "localhost/rdt-istio-init:1";
const ISTIO_IPTABLES: &str = "/usr/local/bin/istio-iptables";

/// The injected pod: its sandbox, containers, addresses (IPv4, IPv6), network namespace
/// (the path CNI got) and cgroup (every container's cgroup is a child of it).
struct Web {
    sandbox: Sandbox,
    sidecar: String,
    app: String,
    ips: Vec<IpAddr>,
    netns: PathBuf,
    cgroup: PathBuf,
}

#[test]
fn redirector_as_istio_init_in_a_containerd_pod() {
    privileged!("containerd pod", &["containerd", "runc"]);
    let started = Instant::now();
    let host_before = HostNetState::now();
    // Drop order (reverse of declaration): containerd, pins, the pods' cgroup parent, the
    // IPAM directory, the forwarding switches ptp turned on.
    let forwarding = ForwardingGuard::new();
    let ipam = StateDir::new("ipam");
    let pods = Cgroup::new("realpod");
    let pins = PinRoot::new("realpod");
    let mut cri = Containerd::start(&dual_stack_network(83, &ipam), &[]);
    let init_binary = [(redirector_bin(), ISTIO_IPTABLES)];
    cri.import_busybox_image(INIT_IMAGE, &init_binary, json!({}));

    let svc_pod = cri.run_sandbox("svc", &[], &format!("{}/svc", pods.relative_path()));
    let serve =
        format!("serve --listen 0.0.0.0:{SERVICE_PORT} --listen [::]:{SERVICE_PORT} --name svc");
    let svc = probe_container(&mut cri, &svc_pod, "svc", &serve, 0);
    let svc_addrs: Vec<SocketAddr> = (cri.sandbox_ips(&svc_pod.0).into_iter())
        .map(|ip| SocketAddr::new(ip, SERVICE_PORT))
        .collect();
    let dual_stack = matches!(svc_addrs[..], [v4, v6] if v4.is_ipv4() && v6.is_ipv6());
    assert!(dual_stack, "IPv4, then IPv6: {svc_addrs:?}");

    let web = start_injected_pod(&mut cri, &pods, &pins);
    eprintln!("pod web started after {:.1?}", started.elapsed());

    let installed = redirection_persists_without_a_redirector_process(&web, &pins);
    app_reaches_service_through_sidecar(&mut cri, &web, &svc_addrs);
    inbound_reaches_app_through_proxy(&mut cri, &web, &svc);
    cleanup_only_in_pod_netns_removes_everything(&mut cri, &web, &pins, &installed, svc_addrs[0]);

    cri.remove_sandbox(&web.sandbox.0);
    cri.remove_sandbox(&svc_pod.0);
    assert_eq!(
        subdirs(&web.cgroup),
        Vec::<PathBuf>::new(),
        "container cgroups left"
    );
    cri.stop_leaving_nothing();
    drop((pins, pods, ipam));
    forwarding.restore();
    assert_eq!(
        forwarding.changed(),
        vec![],
        "forwarding switches not restored"
    );
    assert_eq!(
        HostNetState::now(),
        host_before,
        "host netns/CNI state changed"
    );
    eprintln!("real pod test took {:.1?}", started.elapsed());
}

/// The pod of an injected workload, started in kubelet's order: the sandbox, istio-init run
/// to its end (exit 0, or nothing else starts), then the sidecar (uid 1337, Envoy's outbound
/// listener forwarding to the original destination), the inbound listener (uid 1337, -z) and
/// the app (uid 1000), each once it listens.
fn start_injected_pod(cri: &mut Containerd, pods: &Cgroup, pins: &PinRoot) -> Web {
    let cgroup_parent = format!("{}/web", pods.relative_path());
    let mut config = cri.sandbox_config("default", "web", &[], &cgroup_parent);
    // As kubelet: a sandbox holds privileged containers only if it is privileged itself.
    let linux = config.linux.as_mut().unwrap();
    linux.security_context.as_mut().unwrap().privileged = true;
    let sandbox = (cri.run_pod_sandbox(config))
        .unwrap_or_else(|e| panic!("RunPodSandbox web: {e}\n{}", cri.log()));

    let pin_root = pins.path().display().to_string();
    let mut command = vec![ISTIO_IPTABLES];
    command.extend(STANDARD_INJECTION);
    command.extend(["--pin-root", &pin_root]);
    let mut init = container_config("istio-init", INIT_IMAGE, &command, 0);
    // Privileged: CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN and writable mounts. The host's
    // bpffs (the pins) and cgroup2 tree (the pod's cgroup, found from /proc/self/cgroup),
    // both at their host paths.
    let linux = init.linux.as_mut().unwrap();
    linux.security_context.as_mut().unwrap().privileged = true;
    init.mounts = [Path::new("/sys/fs/bpf"), cgroup2_root()]
        .map(|path| Mount {
            container_path: path.display().to_string(),
            host_path: path.display().to_string(),
            ..Default::default()
        })
        .into();
    let init = cri.create_and_start(&sandbox, init);
    let code = cri.wait_exit(&init, Duration::from_secs(30));
    let log = cri.container_log(&init);
    assert_eq!(code, 0, "istio-init's exit code (CRI); its log:\n{log}");

    let sidecar = "proxy --listen 127.0.0.1:15001 --listen [::1]:15001 --name sidecar --forward";
    let sidecar = probe_container(cri, &sandbox, "sidecar", sidecar, PROXY_UID);
    // Envoy's inbound listener (-z 15006), reporting itself as `proxy` as the kit's
    // sidecar does. Not forwarding: a forward from here would be captured again, as it
    // does not bind the passthrough source 127.0.0.6.
    let inbound = "proxy --listen 0.0.0.0:15006 --listen [::]:15006 --name proxy";
    probe_container(cri, &sandbox, "inbound", inbound, PROXY_UID);
    let (a, x) = (APP_PORT, EXCLUDED_INBOUND_PORT);
    let app = format!(
        "serve --name app --listen 0.0.0.0:{a} --listen [::]:{a} --listen 0.0.0.0:{x} --listen [::]:{x}"
    );
    let app = probe_container(cri, &sandbox, "app", &app, APP_UID);
    Web {
        ips: cri.sandbox_ips(&sandbox.0),
        netns: cri.sandbox_netns(&sandbox.0),
        cgroup: pods.path().join("web"),
        sandbox,
        sidecar,
        app,
    }
}

/// What the init container left: kernel ids of what it pinned.
struct Installed {
    cookie: u64,
    progs: Vec<u64>,
    maps: Vec<u64>,
    links: Vec<u64>,
}

fn redirection_persists_without_a_redirector_process(web: &Web, pins: &PinRoot) -> Installed {
    assert_eq!(
        processes_running(ISTIO_IPTABLES),
        Vec::<u32>::new(),
        "istio-iptables processes still running"
    );
    // Every container sits in a child of the pod cgroup. Finding it from inside the init
    // container (its own cgroup's parent) is redirector's job: the attachments below, read
    // from the kernel, show it found the right one.
    let sidecar_procs = std::fs::read_to_string(web.cgroup.join(&web.sidecar).join("cgroup.procs"));
    assert!(
        sidecar_procs.is_ok_and(|p| !p.trim().is_empty()),
        "the sidecar runs in a child of {}",
        web.cgroup.display()
    );

    let cookie = cookie_at(&web.netns);
    let all = pins_under(pins.path());
    let ids = |kind: &str, part: &str| -> Vec<u64> {
        all.iter()
            .filter(|p| p.to_string_lossy().contains(part))
            .map(|p| pinned_id(kind, p))
            .collect()
    };
    let installed = Installed {
        cookie,
        progs: ids("prog", "/progs/"),
        maps: ids("map", "/maps/"),
        links: ids("link", &format!("/links/{cookie}_")),
    };
    assert!(
        installed.links.len() >= 4 && !installed.maps.is_empty(),
        "link pins of the pod (netns cookie {cookie}) and maps expected: {all:?}"
    );
    let attached = cgroup_attachments(&web.cgroup);
    assert!(
        attached.len() >= 4,
        "programs attached to {}: {attached:?}",
        web.cgroup.display()
    );
    for (prog, hook, name) in &attached {
        assert!(
            installed.progs.contains(prog),
            "{name} ({hook}) on the pod cgroup is not one of the pinned programs {:?}",
            installed.progs
        );
    }
    installed
}

/// The app's connection (uid 1000) lands on the sidecar with the service as its original
/// destination, and the sidecar's own connection (uid 1337) is not captured: it reaches the
/// service from the pod's address. A client in the sidecar's container reaches the service
/// directly.
fn app_reaches_service_through_sidecar(cri: &mut Containerd, web: &Web, svc_addrs: &[SocketAddr]) {
    for (&svc, &pod_ip) in svc_addrs.iter().zip(&web.ips) {
        match connect(cri, &web.app, svc) {
            ConnOutcome::Proxied {
                name,
                orig,
                upstream: Some(upstream),
                ..
            } if name == "sidecar" => {
                assert_eq!(orig, Some(svc), "SO_ORIGINAL_DST seen by the sidecar");
                match *upstream {
                    ConnOutcome::Served { name, local, peer } if name == "svc" => {
                        assert_eq!(local, svc);
                        // It left the pod from the pod's address, not through the proxy again.
                        assert_eq!(peer.ip(), pod_ip);
                    }
                    other => {
                        panic!("the sidecar's forward to {svc} should reach the service: {other:?}")
                    }
                }
            }
            other => {
                panic!("app -> {svc}: expected the sidecar, forwarding to the service: {other:?}")
            }
        }
        assert_reaches_service(cri, &web.sidecar, svc);
    }
}

/// Connections from outside the pod (the service's) to the app's port land on the inbound
/// listener with the app's address as original destination; the sidecar's hand-off from
/// the passthrough source 127.0.0.6 reaches the app and is not captured again; an excluded
/// port (`-d`) reaches the app directly.
fn inbound_reaches_app_through_proxy(cri: &mut Containerd, web: &Web, svc: &str) {
    for (&ip, passthrough) in web.ips.iter().zip(["127.0.0.6", "::6"]) {
        let app = SocketAddr::new(ip, APP_PORT);
        assert_inbound_on_proxy(cri, svc, app);
        let handoff = ["probe", "connect", &app.to_string(), "--bind", passthrough];
        match ConnOutcome::parse(&cri.exec(&web.sidecar, &handoff).1) {
            ConnOutcome::Served { name, .. } if name == "app" => {}
            other => panic!("sidecar -> {app} from {passthrough}: expected the app, got {other:?}"),
        }
        let excluded = SocketAddr::new(ip, EXCLUDED_INBOUND_PORT);
        assert_served_by(cri, svc, excluded, "app");
    }
}

/// `--cleanup-only`, run from the host inside the pod's netns while the pod still exists
/// (its netns cookie keys everything redirector installed for it).
fn cleanup_only_in_pod_netns_removes_everything(
    cri: &mut Containerd,
    web: &Web,
    pins: &PinRoot,
    installed: &Installed,
    svc: SocketAddr,
) {
    assert_eq!(cookie_at(&web.netns), installed.cookie);
    run_ok(
        std::process::Command::new(redirector_bin())
            .args(["istio-iptables", "--cleanup-only", "--network-namespace"])
            .arg(&web.netns)
            .arg("--pin-root")
            .arg(pins.path()),
    );
    assert!(
        !pins.path().exists(),
        "pins left: {:?}",
        pins_under(pins.path())
    );
    assert_eq!(
        cgroup_attachments(&web.cgroup),
        vec![],
        "attachments left on the pod cgroup"
    );
    for (kind, ids) in [
        ("link", &installed.links),
        ("prog", &installed.progs),
        ("map", &installed.maps),
    ] {
        let left = wait_gone(kind, ids, EVENTUALLY);
        assert!(
            left.is_empty(),
            "{kind}s still loaded after cleanup: {left:?}"
        );
    }
    assert_reaches_service(cri, &web.app, svc);
}

/// Pids whose executable is named like `path`'s file: a container's process shows its
/// path inside the container, and every container has its own copy of its image.
fn processes_running(path: &str) -> Vec<u32> {
    let name = Path::new(path).file_name().unwrap();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| {
                let exe = exe.to_string_lossy().replace(" (deleted)", "");
                Path::new(&exe).file_name() == Some(name)
            })
        })
        .collect()
}

/// The child directories of `dir`.
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    (std::fs::read_dir(dir).into_iter().flatten().flatten())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}
