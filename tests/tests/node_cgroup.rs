//! A daemon pod whose processes run outside the daemon's `--cgroup` has map entries and no
//! program on its sockets — captured on paper, not in the kernel. The daemon says so: a
//! log line naming both cgroups, a metric, a mark in `pod list`, and `pod check` fails.

use redirector_tests::prelude::*;

#[test]
fn a_pod_outside_the_node_cgroup_is_reported_and_fails_its_check() {
    privileged!();
    let root = PinRoot::new("ncg");
    let node = Cgroup::new("ncgnode");
    let elsewhere = Cgroup::new("ncgelsewhere");
    let inside = Cgroup::under(&node, "ncgpod");
    let state = StateDir::new("ncgstate");
    let daemon = Daemon::start_with(
        &root,
        &node,
        &state,
        &["--gc-interval", "1", "--metrics-addr", "127.0.0.1:0"],
    );

    // One pod runs in a cgroup below the node's, one outside it.
    let good = NetNs::new("ncggood");
    let bad = NetNs::new("ncgbad");
    let _good_proc = Spawn::new("sleep")
        .arg("60")
        .netns(&good)
        .cgroup(&inside)
        .spawn();
    let _bad_proc = Spawn::new("sleep")
        .arg("60")
        .netns(&bad)
        .cgroup(&elsewhere)
        .spawn();
    daemon.add(&good, "default/good", &STANDARD_INJECTION);
    daemon.add(&bad, "default/bad", &STANDARD_INJECTION);

    let out = daemon.pod(&["check", "--name", "default/good"]);
    assert_success(&out);
    let out = daemon.pod(&["check", "--name", "default/bad"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let elsewhere_path = elsewhere.path().display().to_string();
    assert!(
        err.contains(&elsewhere_path) && err.contains(&node.path().display().to_string()),
        "the check names both cgroups: {err}"
    );

    // The next collection marks it in the list, counts it and logs it: one runs every
    // second, and 30 s is room for a loaded machine.
    let (mut pods, mut marked) = (Vec::new(), None);
    within(Duration::from_secs(30), || {
        pods = daemon.pods();
        let bad_pod = pods.iter().find(|p| p["name"] == "default/bad").cloned();
        marked = bad_pod.filter(|p| p.get("outside_node_cgroup").is_some());
        marked.is_some()
    });
    let marked = marked.unwrap_or_else(|| panic!("not marked: {pods:?}\n{}", daemon.log()));
    assert_eq!(marked["outside_node_cgroup"], elsewhere_path.as_str());
    let good_pod = daemon
        .pods()
        .into_iter()
        .find(|p| p["name"] == "default/good")
        .unwrap();
    assert!(good_pod.get("outside_node_cgroup").is_none(), "{good_pod}");
    let out = daemon.pod(&["list"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains("NOT CAPTURED"), "{listed}");
    let (status, metrics) = daemon.http_get("/metrics");
    assert_eq!(status, 200);
    assert_contains(&metrics, "redirector_pods_outside_node_cgroup 1");
    let log = daemon.log();
    assert!(
        log.lines().any(|l| l.contains("default/bad")
            && l.contains(&elsewhere_path)
            && l.contains(&node.path().display().to_string())),
        "{log}"
    );
}
