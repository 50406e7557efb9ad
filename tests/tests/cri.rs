//! A real Kubernetes container runtime: containerd with its CRI plugin, driven through the
//! CRI API as kubelet does, with `redirector-cni` chained after ptp + host-local and a
//! `redirector daemon` on the node. Pods are captured with no init container.

use std::net::SocketAddr;

use serde_json::json;

use redirector_tests::cri::Containerd;
use redirector_tests::daemon::{Daemon, StateDir};
use redirector_tests::podman_host::ForwardingGuard;
use redirector_tests::redirector::{
    pins_under, pod_links, redirector_bin, PinRoot, STANDARD_INJECTION,
};
use redirector_tests::{
    require_root, require_tools, use_probe_bin, Cgroup, ConnOutcome, APP_UID, PROXY_UID,
};

/// The annotation istio's injector sets on every pod it injected a sidecar into.
const STATUS: &str = "sidecar.istio.io/status";

#[track_caller]
fn landed(stdout: &str) -> ConnOutcome {
    ConnOutcome::parse(stdout)
}

/// The node's network at `cni_version`: ptp with host-local addresses in
/// 10.x.`third_octet`.0/24, then `redirector-cni` with the default pod selection.
fn chained_network(
    cni_version: &str,
    third_octet: u8,
    ipam: &StateDir,
    root: &PinRoot,
    state: &StateDir,
) -> serde_json::Value {
    let subnet = 200 + (std::process::id() % 50);
    json!({
        "cniVersion": cni_version,
        "name": "rdtcri",
        "plugins": [
            {"type": "ptp", "ipam": {"type": "host-local", "subnet": format!("10.{subnet}.{third_octet}.0/24"), "dataDir": ipam.path()}},
            {"type": "redirector-cni", "pinRoot": root.path(), "stateDir": state.path(),
             "args": STANDARD_INJECTION, "capabilities": {"io.kubernetes.cri.pod-annotations": true}}
        ]
    })
}

#[test]
fn containerd_pods_are_captured_by_the_cni_plugin_with_no_init_container() {
    if !require_root() || !require_tools("containerd pod", &["containerd", "runc"]) {
        return;
    }
    use_probe_bin(env!("CARGO_BIN_EXE_probe"));
    let _forwarding = ForwardingGuard::new();
    let root = PinRoot::new("cri");
    let node = Cgroup::new("crinode");
    let state = StateDir::new("cristate");
    let daemon = Daemon::start(&root, &node, &state);
    let ipam = StateDir::new("ipam");
    let conflist = chained_network("1.0.0", 77, &ipam, &root, &state);
    let redirector = redirector_bin();
    let mut cri = Containerd::start(&conflist, &[("redirector-cni", redirector.as_path())]);
    let parent = node.relative_path();

    // The service: a pod the mesh leaves alone.
    let svc = cri.run_sandbox(
        "svc",
        &[("sidecar.istio.io/inject", "false")],
        &format!("{parent}/svc"),
    );
    let svc_server = cri.start_container(
        &svc,
        "svc",
        &[
            "probe",
            "serve",
            "--listen",
            "0.0.0.0:8080",
            "--name",
            "svc",
        ],
        0,
    );
    let svc_addr = SocketAddr::new(cri.sandbox_ip(&svc.0), 8080);

    // The meshed pod: an app and a proxy (uid 1337), no init container.
    let web = cri.run_sandbox("web", &[(STATUS, "{}")], &format!("{parent}/web"));
    let app = cri.start_container(
        &web,
        "app",
        &[
            "probe",
            "serve",
            "--listen",
            "0.0.0.0:8080",
            "--name",
            "app",
        ],
        i64::from(APP_UID),
    );
    let proxy = cri.start_container(
        &web,
        "proxy",
        &[
            "probe",
            "proxy",
            "--listen",
            "127.0.0.1:15001",
            "--listen",
            "0.0.0.0:15006",
            "--name",
            "proxy",
        ],
        i64::from(PROXY_UID),
    );
    let web_addr = SocketAddr::new(cri.sandbox_ip(&web.0), 8080);
    std::thread::sleep(std::time::Duration::from_millis(300));

    // Outbound: the app's connection lands on the proxy with its original destination.
    let (_, out) = cri.exec(&app, &["probe", "connect", &svc_addr.to_string()]);
    match landed(&out) {
        ConnOutcome::Proxied { name, orig, .. } if name == "proxy" => {
            assert_eq!(orig, Some(svc_addr))
        }
        other => panic!(
            "app -> {svc_addr}: expected the proxy, got {other:?}\n{}",
            cri.log()
        ),
    }
    // The proxy's own traffic passes.
    let (_, out) = cri.exec(&proxy, &["probe", "connect", &svc_addr.to_string()]);
    assert!(
        matches!(landed(&out), ConnOutcome::Served { ref name, .. } if name == "svc"),
        "{out}"
    );
    // Inbound: a connection to the app's port lands on the proxy's -z listener.
    let (_, out) = cri.exec(&svc_server, &["probe", "connect", &web_addr.to_string()]);
    match landed(&out) {
        ConnOutcome::Proxied { name, orig, .. } if name == "proxy" => {
            assert_eq!(orig, Some(web_addr))
        }
        other => panic!("svc -> {web_addr}: expected the proxy's inbound listener, got {other:?}"),
    }

    // An annotation changes what is captured.
    let excl = cri.run_sandbox(
        "excl",
        &[
            (STATUS, "{}"),
            ("traffic.sidecar.istio.io/excludeOutboundPorts", "8080"),
        ],
        &format!("{parent}/excl"),
    );
    let excl_app = cri.start_container(&excl, "app", &["sleep", "100000"], i64::from(APP_UID));
    let (_, out) = cri.exec(&excl_app, &["probe", "connect", &svc_addr.to_string()]);
    assert!(
        matches!(landed(&out), ConnOutcome::Served { ref name, .. } if name == "svc"),
        "{out}"
    );

    assert_eq!(
        daemon.pod_names(),
        ["default/excl", "default/web"],
        "the opted-out pod is not captured"
    );

    // Stopping and removing the sandboxes (CNI DEL, twice) leaves no pod state.
    let cookies: Vec<u64> = daemon
        .pods()
        .iter()
        .filter_map(|p| p["netns_cookie"].as_u64())
        .collect();
    for sandbox in [&web.0, &excl.0, &svc.0] {
        cri.remove_sandbox(sandbox);
    }
    assert!(daemon.pods().is_empty());
    for cookie in cookies {
        assert_eq!(pod_links(&root, cookie), None);
    }
}

/// A node just rebooted: nothing pinned, no daemon yet, and a CNI 0.3.1 network (as
/// flannel, Calico and kindnet write theirs) with `redirector-cni` under its default
/// selection. Pods the plugin leaves alone start at once and uncaptured; an injected pod is
/// refused until a daemon has pinned the programs, and kubelet's retry then starts it
/// captured.
#[test]
fn a_rebooted_node_starts_pods_it_leaves_alone_and_holds_injected_ones_until_pinned() {
    if !require_root() || !require_tools("containerd pod", &["containerd", "runc"]) {
        return;
    }
    use_probe_bin(env!("CARGO_BIN_EXE_probe"));
    let _forwarding = ForwardingGuard::new();
    let root = PinRoot::new("crireboot");
    let node = Cgroup::new("crinode");
    let state = StateDir::new("cristate");
    let ipam = StateDir::new("ipam");
    let conflist = chained_network("0.3.1", 78, &ipam, &root, &state);
    let redirector = redirector_bin();
    let mut cri = Containerd::start(&conflist, &[("redirector-cni", redirector.as_path())]);
    let parent = node.relative_path();
    assert_eq!(pins_under(root.path()), Vec::<std::path::PathBuf>::new());

    // A pod with no sidecar annotations: the service, and a client beside it.
    let svc = cri.run_sandbox("svc", &[], &format!("{parent}/svc"));
    cri.start_container(
        &svc,
        "svc",
        &[
            "probe",
            "serve",
            "--listen",
            "0.0.0.0:8080",
            "--name",
            "svc",
        ],
        0,
    );
    let svc_addr = SocketAddr::new(cri.sandbox_ip(&svc.0), 8080);
    let plain = cri.run_sandbox("plain", &[], &format!("{parent}/plain"));
    let plain_app = cri.start_container(&plain, "app", &["sleep", "100000"], i64::from(APP_UID));
    // A kube-system pod, even one the injector marked.
    let system = cri.run_sandbox_in(
        "kube-system",
        "system",
        &[(STATUS, "{}")],
        &format!("{parent}/system"),
    );
    let system_app = cri.start_container(&system, "app", &["sleep", "100000"], i64::from(APP_UID));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let direct = |cri: &mut Containerd, app: &str| {
        let (_, out) = cri.exec(app, &["probe", "connect", &svc_addr.to_string()]);
        assert!(
            matches!(landed(&out), ConnOutcome::Served { ref name, .. } if name == "svc"),
            "{app} -> {svc_addr}: expected the service directly, got {out}"
        );
    };
    direct(&mut cri, &plain_app);
    direct(&mut cri, &system_app);

    // The injected pod: refused (the plugin's code 11), not started uncaptured.
    let web_parent = format!("{parent}/web");
    let refused = cri
        .try_run_sandbox("default", "web", &[(STATUS, "{}")], &web_parent)
        .map(|(id, _)| id)
        .expect_err("an injected pod must not start with nothing pinned");
    assert!(
        refused.message().contains("nothing is pinned"),
        "RunPodSandbox's error names the plugin's reason: {refused}"
    );

    // A daemon pins the node's programs; kubelet's retry of the same pod now starts it,
    // captured with no init container.
    let daemon = Daemon::start(&root, &node, &state);
    let web = cri.run_sandbox_in("default", "web", &[(STATUS, "{}")], &web_parent);
    let app = cri.start_container(&web, "app", &["sleep", "100000"], i64::from(APP_UID));
    cri.start_container(
        &web,
        "proxy",
        &[
            "probe",
            "proxy",
            "--listen",
            "127.0.0.1:15001",
            "--listen",
            "0.0.0.0:15006",
            "--name",
            "proxy",
        ],
        i64::from(PROXY_UID),
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (_, out) = cri.exec(&app, &["probe", "connect", &svc_addr.to_string()]);
    match landed(&out) {
        ConnOutcome::Proxied { name, orig, .. } if name == "proxy" => {
            assert_eq!(orig, Some(svc_addr))
        }
        other => panic!(
            "app -> {svc_addr}: expected the proxy, got {other:?}\n{}",
            cri.log()
        ),
    }
    // The pods started before stay as they were: uncaptured, unrecorded.
    direct(&mut cri, &plain_app);
    direct(&mut cri, &system_app);
    assert_eq!(daemon.pod_names(), ["default/web"]);

    // Removing the sandboxes (CNI DEL, twice) leaves no pod state.
    let cookies: Vec<u64> = daemon
        .pods()
        .iter()
        .filter_map(|p| p["netns_cookie"].as_u64())
        .collect();
    assert_eq!(cookies.len(), 1);
    for sandbox in [&web.0, &system.0, &plain.0, &svc.0] {
        cri.remove_sandbox(sandbox);
    }
    assert!(daemon.pods().is_empty());
    assert_eq!(pod_links(&root, cookies[0]), None);
}
