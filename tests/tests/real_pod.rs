//! redirector as istio-init in a real pod: podman runs a pod (infra, init, sidecar, app
//! containers, runc, cgroupfs) from a local root filesystem in which redirector is
//! `/usr/local/bin/istio-iptables`, run by the init container with istio's injected flags.
//!
//! Only the pod's and the service's network namespaces carry traffic: the pod has no CNI
//! network (`--network none`); the test wires its netns to a service netns of its own with a
//! veth pair, as a CNI plugin would. See docs/real-pod.md.
//!
//! Run as root: `cargo build -p redirector -p redirector-tests --bins && cargo test -p
//! redirector-tests --test real_pod -- --test-threads=1 --nocapture`.

use std::os::unix::fs::MetadataExt;
use std::process::Command;

use redirector_tests::cgroup::cgroup2_root;
use redirector_tests::podman::host::{ForwardingGuard, HostNetState};
use redirector_tests::podman::net::{netns_cookie, PodNetwork};
use redirector_tests::podman::pod::Pod;
use redirector_tests::podman::rootfs::Rootfs;
use redirector_tests::podman::{processes_mentioning, Podman};
use redirector_tests::prelude::*;
use redirector_tests::probe::protocol::parse_listening;

const SERVICE_PORT: u16 = 80;
/// The app's own port, captured inbound.
const APP_PORT: u16 = 8080;
/// istio's health port: in `-d`, never captured inbound.
const EXCLUDED_INBOUND_PORT: u16 = 15021;
const ISTIO_IPTABLES: &str = "/usr/local/bin/istio-iptables";
const PROBE: &str = "/usr/local/bin/probe";
const READY: Duration = Duration::from_secs(10);

#[test]
fn redirector_as_istio_init_in_a_podman_pod() {
    privileged!("podman pod", &["podman"]);
    let started = Instant::now();
    for stale in Podman::remove_stale() {
        eprintln!("removed the leftovers of a killed run: {stale}");
    }
    let host_before = HostNetState::now();
    let image_cache_existed = Path::new("/var/lib/containers").exists();
    // Drop order (reverse of declaration): service process, service netns, pod, podman
    // installation, pins, forwarding switches.
    let forwarding = ForwardingGuard::new();
    let pins = PinRoot::new("realpod");
    let podman = Podman::new("podman");
    let podman_dir = podman.dir().to_path_buf();
    let rootfs = build_rootfs(&podman);

    let pod = Pod::create(&podman, &format!("{}-pod", dir_name(&podman_dir)));
    let service_ns = NetNs::new("podsvc");
    let net = PodNetwork::link(pod.infra_pid(), &service_ns);
    let service = ProbeServer::serve(&service_ns, "svc")
        .listen(net.service_addr(false, SERVICE_PORT))
        .listen(net.service_addr(true, SERVICE_PORT))
        .start();
    add_containers(&pod, &rootfs, &pins, &podman_dir.join("init.log"));

    let start = pod.start();
    let start_err = String::from_utf8_lossy(&start.stderr).into_owned();
    let init_log = std::fs::read_to_string(podman_dir.join("init.log")).unwrap_or_default();
    assert!(
        start.status.success(),
        "podman pod start failed ({}): {start_err}\n--- init container log ---\n{init_log}",
        start.status
    );
    eprintln!("pod {} started after {:.1?}", pod.name(), started.elapsed());
    wait_ready(&pod);

    init_container_succeeded_and_is_gone(&podman, &pod, &init_log);
    let installed = redirection_persists_without_a_redirector_process(&pod, &rootfs, &pins);
    app_reaches_service_through_sidecar(&pod, &net);
    inbound_reaches_app_through_proxy(&pod, &net, &service_ns);
    cleanup_only_in_pod_netns_removes_everything(&pod, &net, &pins, &installed);

    let pod_cgroup = pod.cgroup();
    pod.remove();
    podman_left_nothing_running(&podman, &pod_cgroup);

    drop(service);
    drop(service_ns);
    drop(podman);
    drop(pins);
    assert!(!podman_dir.exists(), "{} left behind", podman_dir.display());
    assert_eq!(
        processes_mentioning(&podman_dir),
        Vec::<String>::new(),
        "processes left"
    );
    assert_eq!(forwarding.changed(), vec![], "forwarding switches changed");
    assert_eq!(
        HostNetState::now(),
        host_before,
        "host netns/CNI state changed"
    );
    assert_eq!(
        Path::new("/var/lib/containers").exists(),
        image_cache_existed,
        "podman's image cache dir was not restored"
    );
    eprintln!("real pod test took {:.1?}", started.elapsed());
}

/// busybox, redirector as istio-iptables (so argv[0] is `istio-iptables`, the name istio's
/// init image uses), and probe.
fn build_rootfs(podman: &Podman) -> Rootfs {
    let rootfs = Rootfs::busybox(&podman.dir().join("rootfs"));
    rootfs.add_binary(&redirector_bin(), ISTIO_IPTABLES);
    rootfs.add_binary(&probe_bin(), PROBE);
    rootfs
}

/// The pod of an injected workload: istio-init, the sidecar (uid 1337) on 15001 with
/// `--forward` to the original destination, and the app (uid 1000) serving its own ports.
fn add_containers(pod: &Pod<'_>, rootfs: &Rootfs, pins: &PinRoot, init_log: &Path) {
    let cgroup2 = cgroup2_root().to_string_lossy().into_owned();
    let log_path = format!("path={}", init_log.display());
    let pin_root = pins.path().to_string_lossy().into_owned();
    let mut init_cmd = vec![ISTIO_IPTABLES];
    init_cmd.extend(STANDARD_INJECTION);
    init_cmd.extend(["--pin-root", &pin_root]);
    // --privileged: CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN, and writable bind mounts.
    // --cgroupns=host: redirector takes the parent of its own cgroup (/proc/self/cgroup)
    // under the cgroup2 mount; in a private cgroup namespace it would read `0::/`.
    // The log: podman removes a `once` init container after it ran.
    let init_opts = format!(
        "--init-ctr once --privileged --cgroupns=host -v /sys/fs/bpf:/sys/fs/bpf \
         -v {cgroup2}:{cgroup2} --log-driver k8s-file --log-opt {log_path}"
    );
    pod.add_container("init", &words(&init_opts), rootfs, &init_cmd);
    let proxy_user = format!("--user {PROXY_UID}:{PROXY_UID}");
    let sidecar = format!(
        "{PROBE} proxy --listen 127.0.0.1:15001 --listen [::1]:15001 --name sidecar --forward"
    );
    pod.add_container("sidecar", &words(&proxy_user), rootfs, &words(&sidecar));
    // Envoy's inbound listener (-z 15006). Not forwarding: a forward from here would be
    // captured again, as it does not bind the passthrough source 127.0.0.6.
    let inbound =
        format!("{PROBE} proxy --listen 0.0.0.0:15006 --listen [::]:15006 --name inbound");
    pod.add_container("inbound", &words(&proxy_user), rootfs, &words(&inbound));
    let app_user = format!("--user {APP_UID}:{APP_UID}");
    let (app, excluded) = (APP_PORT, EXCLUDED_INBOUND_PORT);
    let app_cmd = format!(
        "{PROBE} serve --name app --listen 0.0.0.0:{app} --listen [::]:{app} \
         --listen 0.0.0.0:{excluded} --listen [::]:{excluded}"
    );
    pod.add_container("app", &words(&app_user), rootfs, &words(&app_cmd));
}

fn wait_ready(pod: &Pod<'_>) {
    let listening = |l: &str| parse_listening(l).is_some();
    pod.wait_log_lines("sidecar", 2, READY, listening);
    pod.wait_log_lines("app", 4, READY, listening);
    pod.wait_log_lines("inbound", 2, READY, listening);
}

/// `pod start` succeeding already means it (podman fails the start and starts nothing else
/// when an init container exits non-zero); podman's event log says so too.
fn init_container_succeeded_and_is_gone(podman: &Podman, pod: &Pod<'_>, init_log: &str) {
    let init = pod.container_name("init");
    let events = format!(
        "events --stream=false --filter container={init} --filter event=died --format {{{{.ContainerExitCode}}}}"
    );
    let exit = podman.run(&words(&events));
    assert_eq!(
        exit, "0",
        "init container's exit code (podman events); its log:\n{init_log}"
    );
    let exists = podman.try_run(&["container", "exists", &init]);
    assert_eq!(
        exists.status.code(),
        Some(1),
        "a `once` init container is removed after it ran"
    );
}

/// What the init container left: kernel ids of what it pinned.
struct Installed {
    cookie: u64,
    progs: Vec<u64>,
    maps: Vec<u64>,
    links: Vec<u64>,
}

fn redirection_persists_without_a_redirector_process(
    pod: &Pod<'_>,
    rootfs: &Rootfs,
    pins: &PinRoot,
) -> Installed {
    let running = processes_executing(&rootfs.inside(ISTIO_IPTABLES));
    assert_eq!(
        running,
        Vec::<u32>::new(),
        "istio-iptables processes still running"
    );

    // Every container sits in a child of the pod cgroup. Finding it from inside the init
    // container (its own cgroup's parent) is redirector's job: the attachments below, read
    // from the kernel, show it found the right one.
    let pod_cgroup = pod.cgroup();
    let sidecar_cgroup = own_cgroup(pod.container_pid("sidecar"));
    assert_eq!(
        sidecar_cgroup.parent(),
        Some(pod_cgroup.as_path()),
        "sidecar's cgroup parent"
    );

    let cookie = netns_cookie(&pod.netns_path());
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
    let attached = cgroup_attachments(&pod_cgroup);
    assert!(
        attached.len() >= 4,
        "programs attached to {}: {attached:?}",
        pod_cgroup.display()
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

fn app_connect(pod: &Pod<'_>, uid: u32, dst: SocketAddr) -> ConnOutcome {
    let out = pod.exec(
        "app",
        uid,
        uid,
        &words(&format!("{PROBE} connect {dst} --timeout-ms 3000")),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // probe connect: 0 = a reply, 2 = a connection error it reported.
    assert!(
        matches!(out.status.code(), Some(0 | 2)),
        "podman exec probe connect {dst} as {uid} failed ({}): {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    ConnOutcome::parse(&stdout)
}

/// The app's connection lands on the sidecar with the service as its original destination,
/// and the sidecar's own connection (uid 1337) is not captured: it reaches the service.
fn app_reaches_service_through_sidecar(pod: &Pod<'_>, net: &PodNetwork) {
    for v6 in [false, true] {
        let svc = net.service_addr(v6, SERVICE_PORT);
        match app_connect(pod, APP_UID, svc) {
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
                        assert_eq!(peer.ip(), net.pod_addr(v6, 0).ip());
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
        assert_direct(&app_connect(pod, PROXY_UID, svc), svc);
    }
}

/// Connections from outside the pod to the app's port land on the sidecar's inbound
/// listener with the app's address as original destination; the sidecar's hand-off from
/// the passthrough source 127.0.0.6 reaches the app and is not captured again; an excluded
/// port (`-d`) reaches the app directly.
fn inbound_reaches_app_through_proxy(pod: &Pod<'_>, net: &PodNetwork, service_ns: &NetNs) {
    let from_outside = |dst| connect_from(service_ns, None, APP_UID, APP_UID, dst, None);
    for v6 in [false, true] {
        let app = net.pod_addr(v6, APP_PORT);
        match from_outside(app) {
            ConnOutcome::Proxied { name, orig, .. } if name == "inbound" => {
                assert_eq!(
                    orig,
                    Some(app),
                    "original destination of an inbound connection"
                );
            }
            other => panic!("outside -> {app}: expected the inbound listener, got {other:?}"),
        }
        let passthrough = if v6 { "::6" } else { "127.0.0.6" };
        let handoff = format!("{PROBE} connect {app} --bind {passthrough} --timeout-ms 3000");
        let handoff = pod.exec("sidecar", PROXY_UID, PROXY_UID, &words(&handoff));
        match ConnOutcome::parse(&String::from_utf8_lossy(&handoff.stdout)) {
            ConnOutcome::Served { name, .. } if name == "app" => {}
            other => panic!("sidecar -> {app} from {passthrough}: expected the app, got {other:?}"),
        }
        let excluded = net.pod_addr(v6, EXCLUDED_INBOUND_PORT);
        match from_outside(excluded) {
            ConnOutcome::Served { name, .. } if name == "app" => {}
            other => panic!("outside -> {excluded} (-d): expected the app, got {other:?}"),
        }
    }
}

/// `--cleanup-only`, run from the host inside the pod's netns while the pod still exists
/// (its netns cookie keys everything redirector installed for it).
fn cleanup_only_in_pod_netns_removes_everything(
    pod: &Pod<'_>,
    net: &PodNetwork,
    pins: &PinRoot,
    installed: &Installed,
) {
    assert_eq!(netns_cookie(net.pod_netns()), installed.cookie);
    let out = Command::new(redirector_bin())
        .arg("istio-iptables")
        .arg("--cleanup-only")
        .arg("--network-namespace")
        .arg(pod.netns_path())
        .arg("--pin-root")
        .arg(pins.path())
        .output()
        .expect("running redirector --cleanup-only");
    assert!(
        out.status.success(),
        "cleanup-only: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !pins.path().exists(),
        "pins left: {:?}",
        pins_under(pins.path())
    );
    assert_eq!(
        cgroup_attachments(&pod.cgroup()),
        vec![],
        "attachments left on the pod cgroup"
    );
    for (kind, ids) in [
        ("link", &installed.links),
        ("prog", &installed.progs),
        ("map", &installed.maps),
    ] {
        let left = wait_gone(kind, ids, Duration::from_secs(5));
        assert!(
            left.is_empty(),
            "{kind}s still loaded after cleanup: {left:?}"
        );
    }
    let svc = net.service_addr(false, SERVICE_PORT);
    assert_direct(&app_connect(pod, APP_UID, svc), svc);
}

/// After `pod rm`: no container, conmon or runtime process, no mount, no running cgroup.
fn podman_left_nothing_running(podman: &Podman, pod_cgroup: &Path) {
    assert_eq!(podman.run(&["ps", "-a", "-q"]), "", "containers left");
    assert_eq!(podman.run(&["pod", "ps", "-q"]), "", "pods left");
    within(Duration::from_secs(5), || podman.processes().is_empty());
    assert_eq!(
        podman.processes(),
        Vec::<String>::new(),
        "podman processes left"
    );
    assert_eq!(podman.mounts(), Vec::<PathBuf>::new(), "mounts left");
    // podman 4.3 with cgroupfs leaves the pod's (empty) cgroup2 directory; the cgroup parent
    // guard removes it. Nothing may run in it.
    if pod_cgroup.exists() {
        let procs = std::fs::read_to_string(pod_cgroup.join("cgroup.procs")).unwrap_or_default();
        assert_eq!(
            procs.trim(),
            "",
            "processes left in {}",
            pod_cgroup.display()
        );
        eprintln!(
            "note: podman left the empty pod cgroup {}",
            pod_cgroup.display()
        );
    }
}

/// Pids whose executable is `file` (same device and inode; a process in a container shows
/// its own path in /proc/PID/exe, the inode is the same).
fn processes_executing(file: &Path) -> Vec<u32> {
    let target = std::fs::metadata(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/exe"))
                .is_ok_and(|m| m.dev() == target.dev() && m.ino() == target.ino())
        })
        .collect()
}

/// `<cgroup2 root>/<path from /proc/PID/cgroup>`.
fn own_cgroup(pid: u32) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("/proc/PID/cgroup");
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a cgroup v2 line");
    cgroup2_root().join(rel.trim().trim_start_matches('/'))
}

fn dir_name(dir: &Path) -> String {
    dir.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}
