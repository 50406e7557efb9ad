//! A real Kubernetes container runtime: containerd with its CRI plugin, driven through the
//! CRI API as kubelet does, with `redirector-cni` chained after ptp + host-local and a
//! `redirector daemon` on the node. Pods are captured with no init container.

use std::net::SocketAddr;

use serde_json::json;

use redirector_tests::cri::Containerd;
use redirector_tests::daemon::{Daemon, StateDir};
use redirector_tests::podman_host::ForwardingGuard;
use redirector_tests::redirector::{pod_links, redirector_bin, PinRoot, STANDARD_INJECTION};
use redirector_tests::{
    require_root, require_tools, use_probe_bin, Cgroup, ConnOutcome, APP_UID, PROXY_UID,
};

#[track_caller]
fn landed(stdout: &str) -> ConnOutcome {
    ConnOutcome::parse(stdout)
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
    let subnet = 200 + (std::process::id() % 50);
    let ipam = StateDir::new("ipam");
    let conflist = json!({
        "cniVersion": "1.0.0",
        "name": "rdtcri",
        "plugins": [
            {"type": "ptp", "ipam": {"type": "host-local", "subnet": format!("10.{subnet}.77.0/24"), "dataDir": ipam.path()}},
            {"type": "redirector-cni", "pinRoot": root.path(), "stateDir": state.path(),
             "args": STANDARD_INJECTION, "capabilities": {"io.kubernetes.cri.pod-annotations": true}}
        ]
    });
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
    let web = cri.run_sandbox("web", &[], &format!("{parent}/web"));
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
        &[("traffic.sidecar.istio.io/excludeOutboundPorts", "8080")],
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
