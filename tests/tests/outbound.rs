//! Privileged tests of outbound capture: real programs attached to a real cgroup, real
//! connections from a pod netns to a service netns, the original destination read by a
//! stand-in proxy with SO_ORIGINAL_DST.
//!
//! Run as root, one at a time: `cargo xtask test`.

use redirector_tests::prelude::*;
use redirector_tests::proxied_pod::SERVICE_PORT;
use redirector_tests::redirector::NextObject;

#[test]
fn app_connection_redirected_with_original_destination_v4_and_v6() {
    privileged!();
    let pod = ProxiedPod::new("origdst");
    let root = PinRoot::new("origdst");
    // Before: straight to the service.
    pod.assert_app_direct(false);
    pod.install(&root, &STANDARD_INJECTION);
    for v6 in [false, true] {
        pod.assert_app_proxied(v6);
    }
}

#[test]
fn proxy_uid_and_gid_are_not_redirected() {
    privileged!();
    let pod = ProxiedPod::new("owner");
    let root = PinRoot::new("owner");
    pod.install(&root, &STANDARD_INJECTION);
    let dst = pod.service(false);
    assert_direct(&pod.connect(PROXY_UID, APP_UID, dst), dst);
    assert_direct(&pod.connect(APP_UID, PROXY_UID, dst), dst);
    assert_direct(
        &pod.connect(PROXY_UID, PROXY_UID, pod.service(true)),
        pod.service(true),
    );
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
}

#[test]
fn excluded_cidr_and_excluded_port_pass_untouched() {
    privileged!();
    let pod = ProxiedPod::new("exclude");
    let other: IpAddr = Ipv4Addr::new(10, 201, pod.topo.subnet(), 3).into();
    pod.topo.add_service_addr(other);
    let root = PinRoot::new("exclude");
    let excluded = format!("{}/32", pod.topo.service_ip4());
    pod.install(&root, &["-i", "*", "-x", &excluded, "-o", "8080"]);
    // -x: the excluded address goes direct, on any port.
    pod.assert_app_direct(false);
    // -o: the excluded port goes direct, to any address.
    let other_8080 = SocketAddr::new(other, 8080);
    assert_direct(&pod.connect(APP_UID, APP_UID, other_8080), other_8080);
    // Everything else is captured; IPv6 is unaffected by an IPv4 exclusion.
    let other_80 = SocketAddr::new(other, SERVICE_PORT);
    assert_proxied(&pod.connect(APP_UID, APP_UID, other_80), other_80);
    pod.assert_app_proxied(true);
}

#[test]
fn include_list_is_respected() {
    privileged!();
    let pod = ProxiedPod::new("include");
    let other: IpAddr = Ipv4Addr::new(10, 201, pod.topo.subnet(), 3).into();
    pod.topo.add_service_addr(other);
    let root = PinRoot::new("include");
    pod.install(&root, &["-i", "10.201.0.0/16"]);
    let other_80 = SocketAddr::new(other, SERVICE_PORT);
    assert_proxied(&pod.connect(APP_UID, APP_UID, other_80), other_80);
    pod.assert_app_direct(false);
    pod.assert_app_direct(true);
    // An empty -i captures nothing, as in istio (8080 is served on every service address).
    let other_8080 = SocketAddr::new(other, 8080);
    assert_proxied(&pod.connect(APP_UID, APP_UID, other_8080), other_8080);
    pod.install(&root, &["-i", ""]);
    assert_direct(&pod.connect(APP_UID, APP_UID, other_8080), other_8080);
}

#[test]
fn two_pods_with_different_config_share_one_object_and_do_not_interfere() {
    privileged!();
    let a = ProxiedPod::new("poda");
    let b = ProxiedPod::new("podb");
    let root = PinRoot::new("twopods");
    let log_a = a.install(&root, &STANDARD_INJECTION);
    let excluded = format!("{}/32", b.topo.service_ip4());
    let log_b = b.install(&root, &["-i", "*", "-x", &excluded, "-u", "4242"]);
    assert!(
        log_a.contains("loaded now"),
        "first pod loads the object:\n{log_a}"
    );
    assert!(
        log_b.contains("already loaded"),
        "second pod reuses it:\n{log_b}"
    );
    assert_eq!(object_ids(&root).len(), 1, "one object for the node");

    // A: captured, proxy uid 1337 passes.
    a.assert_app_proxied(false);
    assert_direct(
        &a.connect(PROXY_UID, PROXY_UID, a.service(false)),
        a.service(false),
    );
    // B: its service address is excluded, and 1337 is not its proxy uid (4242 is).
    b.assert_app_direct(false);
    b.assert_app_proxied(true);
    assert_proxied(
        &b.connect(PROXY_UID, PROXY_UID, b.service(true)),
        b.service(true),
    );
    assert_direct(&b.connect(4242, 4242, b.service(true)), b.service(true));
}

#[test]
fn pins_survive_the_loader_and_a_rerun_replaces_instead_of_doubling() {
    privileged!();
    let pod = ProxiedPod::new("rerun");
    let root = PinRoot::new("rerun");
    pod.install(&root, &STANDARD_INJECTION);
    // The loader has exited; its pins hold the links.
    let pins = pins_under(root.path());
    let links = pod_links(&root, pod.topo.pod.cookie()).expect("the pod is set up");
    assert_eq!(
        links.len(),
        7,
        "seven links for the pod (6 cgroup, 1 netns): {links:?}"
    );
    assert_eq!(cgroup_attachments(pod.topo.pod_cgroup.path()).len(), 6);
    let dst = pod.service(false);
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);

    // The same flags again: the state is already there.
    let log = pod.install(&root, &STANDARD_INJECTION);
    assert!(log.contains("nothing to apply"), "{log}");
    // --force-apply replaces it anyway, as a changed config would.
    let mut forced: Vec<&str> = STANDARD_INJECTION.to_vec();
    forced.push("--force-apply");
    let log = pod.install(&root, &forced);
    assert!(log.contains("pod attached in"), "{log}");
    let attached = cgroup_attachments(pod.topo.pod_cgroup.path());
    assert_eq!(
        attached.len(),
        6,
        "re-running must replace, not add: {attached:?}"
    );
    assert_eq!(pins_under(root.path()), pins, "same pins after re-running");
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
}

#[test]
fn cleanup_only_leaves_no_program_link_map_or_pin() {
    privileged!();
    let pod = ProxiedPod::new("cleanup");
    let root = PinRoot::new("cleanup");
    pod.install(&root, &STANDARD_INJECTION);
    let pins = pins_under(root.path());
    let ids = |kind: &str, part: &str| -> Vec<u64> {
        pins.iter()
            .filter(|p| p.to_string_lossy().contains(part))
            .map(|p| pinned_id(kind, p))
            .collect()
    };
    let progs = ids("prog", "/progs/");
    let maps = ids("map", "/maps/");
    let links = ids("link", "/links/");
    assert_eq!(links.len(), 7, "the pod's links");
    assert!(
        progs.len() >= links.len() && !maps.is_empty(),
        "the node's programs and maps"
    );
    assert!(progs.iter().all(|id| loaded_ids("prog").contains(id)));

    let out = pod.istio_iptables(&root, &["--cleanup-only"]);
    assert_success(&out);

    assert!(
        !root.path().exists(),
        "pin root left behind: {:?}",
        pins_under(root.path())
    );
    assert_eq!(cgroup_attachments(pod.topo.pod_cgroup.path()), vec![]);
    for (kind, ids) in [("link", &links), ("prog", &progs), ("map", &maps)] {
        let left = wait_gone(kind, ids, EVENTUALLY);
        assert!(
            left.is_empty(),
            "{kind}s still loaded after cleanup: {left:?}"
        );
    }
    pod.assert_app_direct(false);
    // Cleaning up a clean pod is not an error.
    let again = pod.istio_iptables(&root, &["--cleanup-only"]);
    assert!(again.status.success());
}

#[test]
fn invalid_values_exit_1_naming_the_flag_and_attach_nothing() {
    privileged!();
    let pod = ProxiedPod::new("invalid");
    let root = PinRoot::new("invalid");
    let cases = [
        (
            "-i * -x 10.0.0.0/33",
            "istio-service-exclude-cidr",
            "10.0.0.0/33",
        ),
        ("-i * -x *", "istio-service-exclude-cidr", "*"),
        ("-p 70000 -i *", "envoy-port", "70000"),
        ("-i 10.0.0.300/8", "istio-service-cidr", "10.0.0.300/8"),
        (
            "-i * -o 80,70000",
            "istio-local-outbound-ports-exclude",
            "70000",
        ),
    ];
    for (args, flag, value) in cases {
        let out = pod.istio_iptables(&root, &words(args));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args}: exit code; stderr:\n{stderr}"
        );
        assert!(
            stderr.contains(flag),
            "{args}: message should name {flag}:\n{stderr}"
        );
        assert!(
            stderr.contains(value),
            "{args}: message should name {value}:\n{stderr}"
        );
        assert!(!root.path().exists(), "{args}: something was pinned");
        let attached = cgroup_attachments(pod.topo.pod_cgroup.path());
        assert_eq!(attached, vec![], "{args}: attached");
    }
    pod.assert_app_direct(false);
}

#[test]
fn traffic_leaving_through_an_excluded_interface_passes() {
    privileged!();
    let pod = ProxiedPod::new("excliface");
    let root = PinRoot::new("excliface");
    // The pod's routes to the service leave through its eth0.
    let mut args: Vec<&str> = STANDARD_INJECTION.to_vec();
    args.extend(["-c", "eth0"]);
    if pod.install_with_interfaces(&root, &args, "-c") {
        for v6 in [false, true] {
            pod.assert_app_direct(v6);
        }
    }
    pod.install(&root, &STANDARD_INJECTION);
    pod.assert_app_proxied(false);
}

/// What `getpeername()` says on an app's socket connected to `dst` (`probe peername` in the
/// pod as uid 1000, in the pod cgroup); the connection stays open while it asks.
fn peer_seen_by_app(pod: &ProxiedPod, dst: SocketAddr) -> String {
    let out = Spawn::new(probe_bin())
        .args(["peername", &dst.to_string()])
        .netns(&pod.topo.pod)
        .cgroup(&pod.topo.pod_cgroup)
        .user(APP_UID, APP_UID)
        .output();
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(out.starts_with("peer "), "{out}");
    out.trim().trim_start_matches("peer ").to_owned()
}

#[test]
fn a_redirected_socket_reports_its_original_peer() {
    privileged!();
    let pod = ProxiedPod::new("peername");
    let root = PinRoot::new("peername");
    pod.install(&root, &STANDARD_INJECTION);
    for v6 in [false, true] {
        let dst = pod.service(v6);
        assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
        assert_eq!(
            peer_seen_by_app(&pod, dst),
            format!("{} {}", dst.ip(), dst.port())
        );
    }
}

#[test]
fn a_new_object_takes_over_the_pod_without_doubling() {
    privileged!();
    let pod = ProxiedPod::new("upgrade");
    let root = PinRoot::new("upgrade");
    pod.install(&root, &STANDARD_INJECTION);
    let dst = pod.service(false);
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    let before = object_ids(&root);
    assert_eq!(before.len(), 1);

    // A rebuilt kernel side (the same programs, different bytes) takes the pod over.
    let next = NextObject::new();
    let out = pod.istio_iptables_with_object(&root, &next.path, &STANDARD_INJECTION);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert_contains(&log, format!("moved from objects [\"{}\"]", before[0]));

    let after = object_ids(&root);
    assert_eq!(
        after.len(),
        1,
        "the old object goes once no pod uses it: {after:?}"
    );
    assert_ne!(after, before);
    assert_eq!(
        cgroup_attachments(pod.topo.pod_cgroup.path()).len(),
        6,
        "replaced, not added"
    );
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
}

#[test]
fn a_failed_apply_leaves_the_pod_as_it_was() {
    privileged!();
    let pod = ProxiedPod::new("rollback");
    let root = PinRoot::new("rollback");
    let other: IpAddr = Ipv4Addr::new(10, 201, pod.topo.subnet(), 3).into();
    pod.topo.add_service_addr(other);
    pod.install(&root, &["-i", "10.201.0.0/16"]);
    let included = SocketAddr::new(other, 8080);
    let excluded = SocketAddr::new(pod.topo.service_ip4().into(), 8080);
    assert_proxied(&pod.connect(APP_UID, APP_UID, included), included);
    assert_direct(&pod.connect(APP_UID, APP_UID, excluded), excluded);
    let pins = pins_under(root.path());
    let links = cgroup_attachments(pod.topo.pod_cgroup.path());

    // Make the apply fail: a directory where new links are staged, which it cannot clear.
    let connect4 = format!("{}_connect4", pod.topo.pod.cookie());
    let object = pins
        .iter()
        .find(|p| p.ends_with(&connect4))
        .and_then(|p| p.parent()?.parent())
        .expect("the pod's connect4 link")
        .to_path_buf();
    let staging = object.join("staging").join(&connect4);
    std::fs::create_dir(&staging).unwrap();
    let out = pod.istio_iptables(&root, &["-i", "*", "-o", "9999"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    std::fs::remove_dir(&staging).unwrap();

    // Same pins, same links, same decisions: nothing of the new config took effect.
    assert_eq!(pins_under(root.path()), pins);
    assert_eq!(cgroup_attachments(pod.topo.pod_cgroup.path()), links);
    assert_proxied(&pod.connect(APP_UID, APP_UID, included), included);
    assert_direct(&pod.connect(APP_UID, APP_UID, excluded), excluded);
}

/// Moves a pod's link pins where releases before the flat `links/` layout put them,
/// `objects/<id>/pods/<cookie>/<hook>`, as a node upgraded from such a release has them.
fn pin_as_an_earlier_release(root: &PinRoot, cookie: u64) -> usize {
    let prefix = format!("{cookie}_");
    let mut moved = 0;
    for pin in pins_under(root.path()) {
        let Some(hook) = pin
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .strip_prefix(&prefix)
        else {
            continue;
        };
        let object = pin.parent().unwrap().parent().unwrap();
        let dir = object.join("pods").join(cookie.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::rename(&pin, dir.join(hook)).unwrap();
        moved += 1;
    }
    moved
}

#[test]
fn a_pod_pinned_by_an_earlier_release_is_kept_updated_and_moved_on_upgrade() {
    privileged!();
    let pod = ProxiedPod::new("legacy");
    let root = PinRoot::new("legacy");
    pod.install(&root, &STANDARD_INJECTION);
    let cookie = pod.topo.pod.cookie();
    assert_eq!(pin_as_an_earlier_release(&root, cookie), 7);
    let in_pod_dir = |root: &PinRoot| {
        pins_under(root.path())
            .iter()
            .filter(|p| p.to_string_lossy().contains(&format!("/pods/{cookie}/")))
            .count()
    };
    let dst = pod.service(false);
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    let links = pod_links(&root, cookie).expect("the pod is seen where it is");
    assert_eq!(links.len(), 7, "{links:?}");

    // The same flags: nothing to do. Changed flags: updated where it is, not doubled.
    let log = pod.install(&root, &STANDARD_INJECTION);
    assert!(log.contains("nothing to apply"), "{log}");
    let mut changed: Vec<&str> = STANDARD_INJECTION.to_vec();
    changed.extend(["-o", "9999", "--force-apply"]);
    let log = pod.install(&root, &changed);
    assert!(log.contains("pod attached in"), "{log}");
    assert_eq!(in_pod_dir(&root), 7, "{:?}", pins_under(root.path()));
    assert_eq!(cgroup_attachments(pod.topo.pod_cgroup.path()).len(), 6);
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);

    // A new object takes the pod over and pins its links the current way.
    let next = NextObject::new();
    let out = pod.istio_iptables_with_object(&root, &next.path, &changed);
    assert_success(&out);
    let pins = pins_under(root.path());
    assert_eq!(in_pod_dir(&root), 0, "{pins:?}");
    assert!(
        !pins.iter().any(|p| p.to_string_lossy().contains("/pods/")),
        "the earlier release's pod directory is gone: {pins:?}"
    );
    assert_eq!(pod_links(&root, cookie).map(|l| l.len()), Some(7));
    assert_eq!(cgroup_attachments(pod.topo.pod_cgroup.path()).len(), 6);
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    pod.install(&root, &["--cleanup-only"]);
    assert!(!root.path().exists(), "{:?}", pins_under(root.path()));
}
