//! The daemon killed (SIGKILL) and restarted again and again while an app in a captured
//! pod connects without pause: no connection reaches the service uncaptured, the pod is
//! never lost, and no link, pin or map entry piles up. `REDIRECTOR_CRASH_CYCLES` sets the
//! number of cycles (default 20; 100 for a long run). `cargo xtask soak` is the daemon's
//! other long run: one daemon under hours of pod churn, its memory held flat.

use redirector_tests::prelude::*;
use redirector_tests::redirector::map_fill;

/// Map fill by name, without the connection maps (they change with traffic).
fn config_fill(root: &PinRoot) -> Vec<(String, u64)> {
    map_fill(root)
        .into_iter()
        .filter(|(name, _)| !name.starts_with("ORIG_DST") && !name.starts_with("DNS_ORIG"))
        .collect()
}

#[test]
fn a_daemon_in_a_crash_loop_lets_no_connection_escape_and_leaks_nothing() {
    privileged!();
    let cycles: u32 = std::env::var("REDIRECTOR_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let TestNode { root, node, state } = TestNode::new("crash");
    let mut daemon = Daemon::start(&root, &node, &state);
    let pod = ProxiedPod::under(&node, "crashpod");
    let netns = pod.topo.pod.path().display().to_string();
    let mut args = vec![
        "add",
        "--netns",
        netns.as_str(),
        "--name",
        "default/app",
        "--",
    ];
    args.extend_from_slice(&STANDARD_INJECTION);
    assert!(daemon.pod(&args).status.success());
    let pins_before = pins_under(root.path());
    let fill_before = config_fill(&root);

    // The app connects without pause for as long as the crash loop may take.
    let dst = pod.service(false);
    let started = Instant::now();
    let budget = Duration::from_secs(u64::from(cycles) * 3 + 10);
    let app = Spawn::new(probe_bin())
        .args(["hammer", &dst.to_string(), "--for-ms"])
        .arg(budget.as_millis().to_string())
        .netns(&pod.topo.pod)
        .cgroup(&pod.topo.pod_cgroup)
        .user(APP_UID, APP_UID)
        .spawn();
    for _ in 0..cycles {
        daemon = daemon.kill_and_restart();
    }
    let crash_loop = started.elapsed();
    // A last second of connections to the daemon that is up now, then the counts.
    std::thread::sleep(Duration::from_secs(1));
    app.sigterm();
    let report = app.wait_line(
        "the hammer's counts",
        budget + Duration::from_secs(30),
        |l| l.starts_with("hammer "),
    );
    eprintln!("{cycles} SIGKILL/restart cycles in {crash_loop:?}; {report}");
    let count = |key: &str| -> u64 {
        report
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    // Not a speed claim (over 10,000 here): fewer means the hammer hardly ran.
    assert!(count("total") > 100, "{report}");
    assert_eq!(count("served"), 0, "connections escaped capture: {report}");
    assert_eq!(count("proxied"), count("total"), "{report}");
    assert_eq!(daemon.pod_names(), ["default/app"]);
    assert_eq!(pins_under(root.path()), pins_before, "pins changed");
    assert_eq!(config_fill(&root), fill_before, "map entries changed");
}
