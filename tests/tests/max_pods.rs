//! `redirector daemon --max-pods`: the node's per-pod maps sized at the object's load.
//! A pod past the capacity is added once the daemon runs with a larger size; the node
//! moves between sizes pods and all, and refuses a size below the pods it holds; init
//! containers on the node use the sized object; bad values are refused with nothing
//! pinned.

use redirector_tests::bpftool::pinned_map;
use redirector_tests::prelude::*;

/// The capacity of the node object's map `name`.
fn capacity(root: &PinRoot, name: &str) -> u64 {
    let ids = object_ids(root);
    assert_eq!(ids.len(), 1, "one object on the node: {ids:?}");
    pinned_map(&root.path().join(format!("objects/{}/maps/{name}", ids[0]))).2
}

/// `pod add` of `netns`, its output.
fn add(daemon: &Daemon, netns: &NetNs, name: &str) -> std::process::Output {
    let add = format!("add --netns {} --name {name} --", netns.path().display());
    daemon.pod(&[words(&add), STANDARD_INJECTION.to_vec()].concat())
}

#[test]
fn a_pod_past_the_capacity_is_added_once_the_node_is_sized_for_it() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("maxpods");
    let daemon = Daemon::start_with(&root, &node, &state, &["--max-pods", "3"]);
    assert_eq!(capacity(&root, "POD_CONFIG"), 3);
    assert_eq!(capacity(&root, "LISTENERS"), 12);
    let pods: Vec<ProxiedPod> = (0..3)
        .map(|i| ProxiedPod::under(&node, &format!("mp{i}")))
        .collect();
    for (i, pod) in pods.iter().enumerate() {
        daemon.add(&pod.topo.pod, &format!("default/p{i}"), &STANDARD_INJECTION);
    }
    let fourth = NetNs::new("mp3");
    let refused = add(&daemon, &fourth, "default/p3");
    let answer = String::from_utf8_lossy(&refused.stderr).into_owned()
        + &String::from_utf8_lossy(&refused.stdout);
    assert!(!refused.status.success(), "{answer}");
    assert!(
        answer.contains("is full") && answer.contains("--max-pods"),
        "{answer}"
    );
    let small = object_ids(&root);

    // Restarted larger: the node moves to an object of that size, its pods with it.
    let daemon = daemon.kill().restart_with_flag("--max-pods", "5");
    daemon.assert_logged("upgraded the node from object");
    assert_ne!(object_ids(&root), small);
    assert_eq!(capacity(&root, "POD_CONFIG"), 5);
    assert_eq!(capacity(&root, "PORT_SETS"), 40);
    let out = add(&daemon, &fourth, "default/p3");
    assert_success(&out);
    assert_eq!(daemon.pod_names().len(), 4);
    for pod in &pods {
        pod.assert_app_proxied(false);
    }

    // An init container in the node cgroup uses the node's object, whatever its size.
    let init = ProxiedPod::under(&node, "mpinit");
    let log = init.install(&root, &STANDARD_INJECTION);
    assert!(log.contains("cover cgroup"), "{log}");
    assert_eq!(
        object_ids(&root).len(),
        1,
        "no object of the shipped size: {log}"
    );
    assert_eq!(capacity(&root, "POD_CONFIG"), 5);

    // Smaller than the pods on the node: refused, the node as it was.
    let sized = object_ids(&root);
    let killed = daemon.kill();
    let (code, err) = killed.run_refused("--max-pods", "4");
    assert_eq!(code, 1, "{err}");
    assert_contains(&err, "--max-pods 4 is fewer than the 5 pods");
    assert_eq!(object_ids(&root), sized);

    // The shipped size (the default) again.
    let daemon = killed.restart_with_flag("--max-pods", "4096");
    assert_eq!(capacity(&root, "POD_CONFIG"), 4096);
    assert_eq!(daemon.pod_names().len(), 4);
    for pod in pods.iter().chain([&init]) {
        pod.assert_app_proxied(false);
    }
    init.install(&root, &["--cleanup-only"]);
}

#[test]
fn no_pods_or_absurd_sizes_are_refused_with_nothing_pinned() {
    privileged!();
    let node = TestNode::new("maxbad");
    // The flags, and REDIRECTOR_MAX_PODS where set.
    for (flags, env) in [
        ("--max-pods 0", None),
        ("--max-pods 100000000", None),
        ("--max-pods lots", None),
        ("", Some("0")),
    ] {
        let env: Vec<_> = env
            .map(|v| ("REDIRECTOR_MAX_PODS", v))
            .into_iter()
            .collect();
        let (code, err) = node.daemon_refused(&words(flags), &env);
        assert_eq!(code, 1, "{flags:?} {env:?}: {err}");
        assert!(err.contains("--max-pods"), "{err}");
        assert!(
            !node.root.path().exists(),
            "nothing pinned: {flags:?} {env:?}"
        );
    }
}
