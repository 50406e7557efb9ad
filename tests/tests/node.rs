//! The node component as an operator installs it: `deploy/daemonset.yaml` itself, run by
//! containerd through the CRI with the image `cargo xtask image` built (the test plays
//! kubelet: see the kit's `kubelet` module). The DaemonSet's hostPath volumes are the
//! host's own (bpffs, cgroup2, /run/redirector, /var/run/netns), except the runtime's: the
//! CNI directories and containerd's socket directory are the test containerd's. The
//! kubepods cgroup is the test's `kubepods` at the cgroup2 root (the cgroupfs driver's
//! name), which both containers find themselves, as the manifest names none.
//!
//! One lifecycle, once over a primary network at CNI 0.3.1 and once at 1.0.0: the install
//! step's bad input, a pod from before the DaemonSet repaired, new pods captured, the
//! conflist rewritten by the network plugin, a reboot, an upgrade under traffic, the
//! uninstall.

use std::process::Command;

use redirector_tests::cri::pods::{
    app_pod, assert_lands_on_proxy, assert_reaches_service, connect, on_proxy, primary_network,
    serve, sidecar, LeftAlone, STATUS,
};
use redirector_tests::cri::{Containerd, Sandbox};
use redirector_tests::daemon::{http_get, tcp_listeners};
use redirector_tests::host_net::ForwardingGuard;
use redirector_tests::kubelet::{DaemonSet, Node};
use redirector_tests::oci;
use redirector_tests::prelude::*;
use redirector_tests::redirector::NextObject;

/// Where the DaemonSet's daemon pins and keeps its records: the defaults.
const PIN_ROOT: &str = redirector::store::pins::DEFAULT_ROOT;
const STATE_DIR: &str = redirector::pods::records::DEFAULT_STATE_DIR;
/// The daemon's metrics, on the host's loopback only, and its probes, on every address
/// of the host (kubelet probes a host-network pod at the node's address).
const METRICS: &str = "127.0.0.1:15014";
const METRICS_PORT: u16 = 15014;
const HEALTH_PORT: u16 = 15015;
/// A DaemonSet pod is ready once its daemon started: 120 s as for `Daemon::start`, since a
/// starved emulated guest was seen to take over 20 s for that start.
const DAEMON_READY: Duration = Duration::from_secs(120);

/// The node's own state the DaemonSet writes (its pins and records): absent at the start,
/// removed at the end whatever happened.
struct HostState;

impl HostState {
    fn claim() -> Self {
        for path in [PIN_ROOT, STATE_DIR] {
            assert!(
                !Path::new(path).exists(),
                "{path} exists: this test installs redirector on this machine as a node \
                 would, and needs it absent (left by a killed run? remove it)"
            );
        }
        HostState
    }

    /// What a reboot clears: bpffs and /run.
    fn reboot(&self) {
        for path in [PIN_ROOT, STATE_DIR] {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

impl Drop for HostState {
    fn drop(&mut self) {
        self.reboot();
    }
}

/// `path` a shared mount while the test runs, as on a systemd node (systemd mounts
/// everything shared): a Bidirectional mount of it needs that. Restored on drop.
struct SharedMount(Option<PathBuf>);

impl SharedMount {
    fn new(path: &str) -> Self {
        let out = run_ok(Command::new("findmnt").args(["-no", "PROPAGATION", path]));
        if String::from_utf8_lossy(&out.stdout).trim() == "shared" {
            return SharedMount(None);
        }
        run_ok(Command::new("mount").args(["--make-shared", path]));
        SharedMount(Some(PathBuf::from(path)))
    }
}

impl Drop for SharedMount {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            let _ = Command::new("mount")
                .arg("--make-private")
                .arg(path)
                .status();
        }
    }
}

/// The release image with a different kernel side: the built object with one more byte,
/// named by REDIRECTOR_EBPF_OBJECT in the image's environment. Its reference.
fn next_image(base: &Path, work: &Path) -> (PathBuf, String) {
    let rootfs = work.join("next-rootfs");
    let (reference, mut config) = oci::unpack(base, &rootfs);
    let object = "/usr/local/lib/redirector/next.o";
    let path = rootfs.join(object.trim_start_matches('/'));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::copy(&NextObject::new().path, &path).unwrap();
    config["Env"]
        .as_array_mut()
        .expect("the image sets its environment")
        .push(format!("REDIRECTOR_EBPF_OBJECT={object}").into());
    let next = format!("{reference}-next");
    let archive = oci::archive(work, &rootfs, &next, config);
    (archive, next)
}

/// Whether the daemon's metrics show `line` within `limit`.
fn metric_within(limit: Duration, line: &str) -> bool {
    within(limit, || {
        http_get(METRICS, "/metrics").is_ok_and(|(_, body)| body.lines().any(|l| l == line))
    })
    .is_some()
}

/// The manifest's install step run once on `node`, with `args`: its exit code and log.
fn install_cni(
    (ds, cri): (&DaemonSet, &mut Containerd),
    node: &Node,
    release: &str,
    args: &str,
) -> (i32, String) {
    ds.run_once(cri, node, "install-cni", release, &words(args), &[])
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", path.display()))
}

fn has_entry(conflist: &serde_json::Value) -> bool {
    conflist["plugins"]
        .as_array()
        .is_some_and(|p| p.iter().any(|p| p["type"] == "redirector-cni"))
}

/// What a node test holds on this host while it runs, given back on drop (fields drop in
/// order): the kubepods cgroup, a network namespace (`ip netns add` makes /run/netns a
/// shared mount of its own, as on a node whose runtime keeps its namespaces there: the
/// DaemonSet mounts it HostToContainer), /sys/fs/bpf shared, the host's pin root and state
/// directory, IP forwarding.
struct NodeHost {
    kubepods: Cgroup,
    _netns: NetNs,
    _bpffs: SharedMount,
    host: HostState,
    _forwarding: ForwardingGuard,
}

impl NodeHost {
    fn claim(netns_hint: &str) -> Self {
        let _forwarding = ForwardingGuard::new();
        let host = HostState::claim();
        let _bpffs = SharedMount::new("/sys/fs/bpf");
        let _netns = NetNs::new(netns_hint);
        NodeHost {
            kubepods: Cgroup::named_at_root("kubepods"),
            _netns,
            _bpffs,
            host,
            _forwarding,
        }
    }
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The test's containerd over the `primary` network with the release image imported, and
/// the DaemonSet, which must run that image: the runtime, the DaemonSet, the image's name.
fn containerd_with_daemonset(
    primary: &serde_json::Value,
    image: &Path,
) -> (Containerd, DaemonSet, String) {
    let cri = Containerd::start(primary, &[]);
    let ds = DaemonSet::load(&deploy_dir().join("daemonset.yaml"));
    let release = ds.image().to_owned();
    assert_eq!(
        release,
        oci::reference(image),
        "the DaemonSet runs the image `cargo xtask image` builds"
    );
    cri.import(image);
    (cri, ds, release)
}

/// The node as the test lays it out: the host's paths but the runtime's (the CNI
/// directories and the socket directory are the test containerd's) and `extra_paths`;
/// pods under `parent`; `env` set on every container.
fn node_of(
    cri: &Containerd,
    parent: &str,
    extra_paths: &[(&str, &Path)],
    env: &[(&str, &str)],
) -> Node {
    Node {
        host_paths: [
            ("/etc/cni/net.d", cri.conf_dir()),
            ("/opt/cni/bin", cri.bin_dir()),
            ("/run/containerd", cri.dir().to_path_buf()),
        ]
        .into_iter()
        .chain(extra_paths.iter().map(|(p, ours)| (*p, ours.to_path_buf())))
        .map(|(path, ours)| (PathBuf::from(path), ours))
        .collect(),
        cgroup_parent: parent.to_owned(),
        node_env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn node_lifecycle(cni_version: &str, third_octet: u8) {
    privileged!("containerd node", &["containerd", "runc", "ctr"]);
    let Some(image) = oci::release_image("node") else {
        return;
    };
    let held = NodeHost::claim("nodenetns");
    let (host, kubepods) = (&held.host, &held.kubepods);
    let ipam = StateDir::new("ipam");
    let work = StateDir::new("images");
    let primary = primary_network(cni_version, third_octet, &ipam);
    let (mut cri, ds, release) = containerd_with_daemonset(&primary, &image);
    let conflist = cri.conf_dir().join("10-test.conflist");
    let plugin = cri.bin_dir().join("redirector-cni");
    let parent = kubepods.relative_path();
    let node = node_of(&cri, &parent, &[], &[]);

    // The install step refuses bad input with exit 1, naming it, and writes nothing.
    std::fs::write(cri.conf_dir().join("05-broken.conflist"), "{\"plugins\": [").unwrap();
    let (code, log) = install_cni((&ds, &mut cri), &node, &release, "install-cni");
    assert_eq!(code, 1, "{log}");
    assert!(log.contains("05-broken.conflist"), "names the file: {log}");
    std::fs::remove_file(cri.conf_dir().join("05-broken.conflist")).unwrap();
    let bad = "install-cni -- -p notaport";
    let (code, log) = install_cni((&ds, &mut cri), &node, &release, bad);
    assert_eq!(code, 1, "{log}");
    assert!(log.contains("notaport"), "names the value: {log}");
    assert_eq!(read_json(&conflist), primary, "bad input wrote nothing");
    assert!(!plugin.exists(), "bad input installed nothing");

    // Before the DaemonSet: a service with no sidecar and an injected pod, uncaptured.
    let svc = cri.run_sandbox("svc", &[], &format!("{parent}/svc"));
    let (_, svc_addr) = serve(&mut cri, &svc);
    let (early, early_app) = app_pod(&mut cri, "default", "early", &[(STATUS, "{}")], &parent);
    sidecar(&mut cri, &early);
    assert_reaches_service(&mut cri, &early_app, svc_addr);

    // The DaemonSet's pod: ready, the entry chained, the early pod repaired.
    let started = Instant::now();
    let pod = ds.run(&mut cri, &node, "a", &release);
    ds.wait_ready(&mut cri, &pod, DAEMON_READY);
    let loopback: SocketAddr = METRICS.parse().unwrap();
    assert_eq!(
        tcp_listeners(METRICS_PORT),
        [loopback],
        "the metrics, which name the node's pods, on loopback only"
    );
    assert_eq!(
        tcp_listeners(HEALTH_PORT),
        [SocketAddr::from(([0, 0, 0, 0], HEALTH_PORT))],
        "the probes on every address"
    );
    assert!(
        has_entry(&read_json(&conflist)),
        "install-cni chained the entry"
    );
    assert!(plugin.exists());
    // By the first round, at the start, or the next, --repair-interval (30 s by default)
    // later; the rest is room for a slow round.
    within(Duration::from_secs(60), || {
        on_proxy(&connect(&mut cri, &early_app, svc_addr), svc_addr)
    })
    .unwrap_or_else(|| panic!("the early pod is not repaired\n{}", ds.logs(&mut cri, &pod)));
    eprintln!(
        "node {cni_version}: early pod repaired {:.0} ms after its DaemonSet pod was created",
        started.elapsed().as_secs_f64() * 1e3
    );
    // Scrapes share a snapshot up to a second old; the rest is room for a starved guest.
    let counted = metric_within(EVENTUALLY, "redirector_pods_repaired_total 1");
    assert!(counted, "the repair is not counted");

    // New pods: the injected one captured at creation, the others left alone.
    let (web, web_app) = app_pod(&mut cri, "default", "web", &[(STATUS, "{}")], &parent);
    sidecar(&mut cri, &web);
    let left_alone = LeftAlone::start(&mut cri, &parent, "");
    assert_lands_on_proxy(&mut cri, &web_app, svc_addr);
    left_alone.assert_direct(&mut cri, svc_addr);

    // The network plugin rewrites its file without the entry: it is back (within a second
    // here; the wait allows a starved emulated guest).
    std::fs::write(&conflist, serde_json::to_vec_pretty(&primary).unwrap()).unwrap();
    let back = within(EVENTUALLY, || has_entry(&read_json(&conflist)))
        .unwrap_or_else(|| panic!("the entry is not back\n{}", ds.logs(&mut cri, &pod)));
    eprintln!(
        "node {cni_version}: entry back {:.0} ms after the rewrite",
        back.as_secs_f64() * 1e3
    );
    let (late, late_app) = app_pod(&mut cri, "default", "late", &[(STATUS, "{}")], &parent);
    sidecar(&mut cri, &late);
    assert_lands_on_proxy(&mut cri, &late_app, svc_addr);
    // At the next repair round (every 30 s), with room for a slow one.
    let none_uncaptured = metric_within(EVENTUALLY, "redirector_pods_uncaptured 0");
    assert!(none_uncaptured, "pods left uncaptured");

    // A reboot: every pod gone, bpffs and /run empty, the conflist still chaining the
    // plugin. Pods the plugin leaves alone start; an injected one waits for the pins.
    ds.delete(&mut cri, pod);
    left_alone.remove(&mut cri);
    for sandbox in [&late.0, &web.0, &early.0, &svc.0] {
        cri.remove_sandbox(sandbox);
    }
    host.reboot();
    assert!(has_entry(&read_json(&conflist)));
    let svc = cri.run_sandbox("svc2", &[], &format!("{parent}/svc2"));
    let (_, svc_addr) = serve(&mut cri, &svc);
    let left_alone = LeftAlone::start(&mut cri, &parent, "2");
    left_alone.assert_direct(&mut cri, svc_addr);
    let refused = cri
        .try_run_sandbox(
            "default",
            "steady",
            &[(STATUS, "{}")],
            &format!("{parent}/steady"),
        )
        .map(|(id, _)| id)
        .expect_err("an injected pod must not start with nothing pinned");
    assert!(refused.message().contains("nothing is pinned"), "{refused}");
    let pod = ds.run(&mut cri, &node, "b", &release);
    ds.wait_ready(&mut cri, &pod, DAEMON_READY);
    let (steady, steady_app) = app_pod(&mut cri, "default", "steady", &[(STATUS, "{}")], &parent);
    sidecar(&mut cri, &steady);
    assert_lands_on_proxy(&mut cri, &steady_app, svc_addr);
    left_alone.assert_direct(&mut cri, svc_addr);

    // An upgrade to an image whose kernel side differs, while a pod connects
    // continuously: every connection lands on the proxy.
    let (next, next_ref) = next_image(&image, work.path());
    cri.import(&next);
    let hammer = format!("probe hammer {svc_addr} --for-ms 6000");
    let hammer = cri.start_container(&steady, "hammer", &words(&hammer), i64::from(APP_UID));
    std::thread::sleep(Duration::from_millis(500));
    ds.delete(&mut cri, pod);
    let pod = ds.run(&mut cri, &node, "c", &next_ref);
    ds.wait_ready(&mut cri, &pod, DAEMON_READY);
    let counts = within(EVENTUALLY, || cri.exit_code(&hammer).is_some())
        .map(|_| cri.container_log(&hammer))
        .expect("the client ends");
    let (total, proxied) = hammer_counts(&counts);
    eprintln!(
        "node {cni_version}: upgrade under traffic: {total} connections, {} escaped",
        total - proxied
    );
    // Not a speed claim (thousands in its 6 s): fewer means the client hardly ran.
    assert!(total >= 5, "{counts}");
    assert_eq!(proxied, total, "connections escaped the proxy: {counts}");
    let logs = ds.logs(&mut cri, &pod);
    assert!(logs.contains("upgraded the node from object"), "{logs}");
    assert_lands_on_proxy(&mut cri, &steady_app, svc_addr);

    // Uninstall: the DaemonSet deleted, then the Job's two steps.
    ds.delete(&mut cri, pod);
    let uninstall = DaemonSet::load(&deploy_dir().join("uninstall.yaml"));
    assert_eq!(
        uninstall.image(),
        release,
        "the uninstall Job runs the same image"
    );
    let (code, log) = uninstall.complete(&mut cri, &node, "uninstall", &next_ref);
    assert_eq!(code, 0, "{log}");
    assert_eq!(
        read_json(&conflist),
        primary,
        "the network's own configuration"
    );
    assert!(!plugin.exists(), "the plugin binary is gone");
    assert_eq!(pins_under(Path::new(PIN_ROOT)), Vec::<PathBuf>::new());
    assert_eq!(cgroup_attachments(kubepods.path()), Vec::new());
    let records = pins_under(Path::new(STATE_DIR));
    assert_eq!(records, Vec::<PathBuf>::new(), "records left");
    assert_reaches_service(&mut cri, &steady_app, svc_addr);
    left_alone.assert_direct(&mut cri, svc_addr);
}

/// `hammer total=N proxied=M …` → (N, M).
fn hammer_counts(log: &str) -> (u64, u64) {
    let line = log
        .lines()
        .find(|l| l.starts_with("hammer "))
        .unwrap_or_else(|| panic!("no hammer line in {log:?}"));
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{name}=")).map(str::to_owned))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    (field("total"), field("proxied"))
}

#[test]
fn the_daemonset_runs_a_node_over_a_cni_0_3_1_network() {
    node_lifecycle("0.3.1", 81);
}

#[test]
fn the_daemonset_runs_a_node_over_a_cni_1_0_0_network() {
    node_lifecycle("1.0.0", 82);
}

/// install-cni's readiness port in the manifest.
const INSTALL_HEALTH: &str = "127.0.0.1:15016";

/// The DaemonSet on a node it cannot serve, made so three ways: a kubepods cgroup given
/// that does not exist, a kernel the probes refuse (the test-only switch), bpffs absent
/// (the pod's /sys/fs/bpf a plain directory). Each time: the entry an earlier run chained
/// goes and none comes back, both containers keep running not ready with the reason in
/// their probes, the metric and `redirector status`; a plain and a kube-system pod start
/// and reach a service directly; a meshed pod starts uncaptured and istio's validation, run
/// as its init container runs it, fails it closed (exit 126).
#[test]
fn a_node_the_daemonset_cannot_serve_keeps_starting_pods_and_fails_meshed_ones_closed() {
    privileged!("containerd node", &["containerd", "runc", "ctr"]);
    let Some(image) = oci::release_image("node") else {
        return;
    };
    let held = NodeHost::claim("unservnetns");
    let (host, kubepods) = (&held.host, &held.kubepods);
    let ipam = StateDir::new("ipam");
    // A tmpfs, shared as bpffs is: the daemon's mount of it is Bidirectional.
    let not_bpffs = StateDir::on_tmpfs("notbpffs");
    let _not_bpffs_shared = SharedMount::new(&not_bpffs.path().display().to_string());
    let primary = primary_network("1.0.0", 83, &ipam);
    let (mut cri, ds, release) = containerd_with_daemonset(&primary, &image);
    let conflist = cri.conf_dir().join("10-test.conflist");
    let parent = kubepods.relative_path();
    let node = |extra_paths: &[(&str, &Path)], env: &[(&str, &str)]| {
        node_of(&cri, &parent, extra_paths, env)
    };
    let gone = kubepods
        .path()
        .with_file_name(format!("rdt-{}-gone", std::process::id()));
    let gone = gone.display().to_string();
    let env = |key, value| node(&[], &[(key, value)]);
    let ways: [(&str, Node); 3] = [
        ("kubepods_cgroup", env("REDIRECTOR_CGROUP", &gone)),
        ("kernel", env("REDIRECTOR_FORCE_REFUSAL", "sk-lookup")),
        ("bpffs", node(&[("/sys/fs/bpf", not_bpffs.path())], &[])),
    ];
    let served = node(&[], &[]);
    let svc = cri.run_sandbox("svc", &[], &format!("{parent}/svc"));
    let (_, svc_addr) = serve(&mut cri, &svc);
    for (n, (reason, unservable)) in ways.iter().enumerate() {
        // An entry an earlier run chained, on a node it could serve then.
        let (code, log) = install_cni((&ds, &mut cri), &served, &release, "install-cni");
        assert_eq!(code, 0, "{log}");
        assert!(has_entry(&read_json(&conflist)), "{log}");

        let pod = ds.run(&mut cri, unservable, &format!("u{n}"), &release);
        within(Duration::from_secs(60), || {
            !has_entry(&read_json(&conflist))
        })
        .unwrap_or_else(|| panic!("{reason}: the entry stays\n{}", ds.logs(&mut cri, &pod)));
        let verdict = format!("cannot be served ({reason})");
        for addr in [INSTALL_HEALTH, &format!("127.0.0.1:{HEALTH_PORT}")] {
            within(Duration::from_secs(60), || {
                http_get(addr, "/readyz")
                    .is_ok_and(|(code, body)| code == 503 && body.contains(&verdict))
            })
            .unwrap_or_else(|| {
                panic!(
                    "{reason}: {addr} not answering not ready\n{}",
                    ds.logs(&mut cri, &pod)
                )
            });
        }
        let series = format!("redirector_node_unservable{{reason=\"{reason}\"}} 1");
        assert!(metric_within(EVENTUALLY, &series), "{reason}: no metric");
        let status = redirector(&format!("status --state-dir {STATE_DIR}")).output();
        let status = String::from_utf8_lossy(&status.stdout);
        assert!(
            status.starts_with(&format!("node: this node {verdict}")),
            "{status}"
        );
        // No restart, no crash: both containers still run after a while.
        std::thread::sleep(Duration::from_secs(3));
        for (name, container) in &pod.containers {
            assert_eq!(cri.exit_code(container), None, "{reason}: {name} exited");
        }
        assert!(!has_entry(&read_json(&conflist)), "{reason}: chained again");
        assert_eq!(pins_under(Path::new(PIN_ROOT)), Vec::<PathBuf>::new());

        // The node serves every pod: the plain and the kube-system one reach the service.
        let left_alone = LeftAlone::start(&mut cri, &parent, &format!("u{n}"));
        left_alone.assert_direct(&mut cri, svc_addr);
        // A meshed pod starts, uncaptured, and istio's validation fails it closed.
        let meshed = format!("meshed{n}");
        let (meshed, meshed_app) =
            app_pod(&mut cri, "default", &meshed, &[(STATUS, "{}")], &parent);
        assert_reaches_service(&mut cri, &meshed_app, svc_addr);
        let validation = istio_validation(&mut cri, &meshed, &release);
        assert_eq!(
            cri.exit_code(&validation),
            Some(126),
            "{reason}: validation: {}",
            cri.container_log(&validation)
        );
        left_alone.remove(&mut cri);
        cri.remove_sandbox(&meshed.0);
        ds.delete(&mut cri, pod);
        host.reboot();
    }
}

/// istio's `istio-validation` init container in `sandbox`, as the injector writes it with
/// CNI on: the proxy image's `istio-iptables --run-validation --skip-rule-apply` as the
/// proxy's uid (here, redirector's drop-in from the release image). Its id, once exited.
fn istio_validation(cri: &mut Containerd, sandbox: &Sandbox, image: &str) -> String {
    use k8s_cri::v1::{
        ContainerConfig, ContainerMetadata, ImageSpec, Int64Value, LinuxContainerConfig,
        LinuxContainerSecurityContext,
    };
    let config = ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: "istio-validation".into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        args: ["istio-iptables", "--run-validation", "--skip-rule-apply"]
            .map(String::from)
            .to_vec(),
        log_path: "istio-validation.log".into(),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                run_as_user: Some(Int64Value { value: 1337 }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = cri.create_and_start(sandbox, config);
    within(Duration::from_secs(60), || cri.exit_code(&id).is_some())
        .unwrap_or_else(|| panic!("validation did not end: {}", cri.container_log(&id)));
    id
}
