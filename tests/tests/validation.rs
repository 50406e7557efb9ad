//! `--run-validation`, as istio's validation init container runs it: as the proxy's uid,
//! inside the pod, after the pod was set up (`--skip-rule-apply`).

use redirector_tests::prelude::*;

/// `redirector istio-iptables --run-validation --skip-rule-apply --probe-timeout <timeout>`
/// as uid/gid 1337 in the pod's netns and cgroup; returns the exit code and the log.
fn validate(topo: &Topology, timeout: &str) -> (Option<i32>, String) {
    let out = redirector("istio-iptables --run-validation --skip-rule-apply --probe-timeout")
        .arg(timeout)
        .netns(&topo.pod)
        .cgroup(&topo.pod_cgroup)
        .user(PROXY_UID, PROXY_UID)
        .output();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), log)
}

#[test]
fn validation_passes_on_a_pod_set_up_by_redirector() {
    privileged!();
    let topo = Topology::new("valok");
    let root = PinRoot::new("valok");
    install(&topo.pod, &topo.pod_cgroup, &root, &STANDARD_INJECTION);
    // Validation ends at the first captured connection: the long deadline only keeps a
    // starved machine (an emulated guest beside a build) from failing a working pod.
    let (code, log) = validate(&topo, "60s");
    assert_eq!(code, Some(0), "validation should pass:\n{log}");
    assert!(log.contains("validation passed"), "{log}");
}

#[test]
fn validation_fails_with_126_on_a_pod_without_capture() {
    privileged!();
    let topo = Topology::new("valfail");
    let started = Instant::now();
    let (code, log) = validate(&topo, "2s");
    assert_eq!(code, Some(126), "validation must fail with 126:\n{log}");
    assert!(
        log.contains("127.0.0.6:15002"),
        "the message says what was tried:\n{log}"
    );
    assert!(
        log.contains("within 2s;"),
        "--probe-timeout is honoured:\n{log}"
    );
    // Not a speed claim (about 2 s here): only a deadline overshot many times over fails.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "validation gave up after {:?}",
        started.elapsed()
    );
}
