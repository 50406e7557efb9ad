//! Istio ambient: the daemon as ztunnel's node agent (`--ztunnel-socket`), with a
//! stand-in ztunnel on its ZDS socket — a snapshot sent on every connection, the state
//! shown in `/metrics`, a daemon killed and restarted taking its socket back.

use std::process::Command;

use redirector_tests::{
    daemon::{Daemon, StateDir},
    privileged,
    redirector::redirector_bin,
    test_node::TestNode,
    ztunnel::{Seen, StandInZtunnel},
};

/// The `redirector_ztunnel` series the daemon's `/metrics` shows at 1.
fn ztunnel_state(daemon: &Daemon) -> String {
    let (_, metrics) = daemon.http_get("/metrics");
    metrics
        .lines()
        .find_map(|line| {
            let state = line.strip_prefix("redirector_ztunnel{state=\"")?;
            let (state, value) = state.split_once("\"} ")?;
            (value.trim() == "1").then(|| state.to_owned())
        })
        .unwrap_or_else(|| panic!("no redirector_ztunnel in:\n{metrics}"))
}

fn wait_state(daemon: &Daemon, state: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while ztunnel_state(daemon) != state {
        assert!(
            std::time::Instant::now() < deadline,
            "ztunnel is {} in /metrics, not {state}",
            ztunnel_state(daemon)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn ztunnel_is_sent_a_snapshot_on_every_connection_and_across_a_daemon_restart() {
    privileged!();
    let node = TestNode::new("ambient-zds");
    let sockets = StateDir::new("ztunnel-run");
    let socket = sockets.path().join("ztunnel").join("ztunnel.sock");
    let socket_flag = socket.display().to_string();
    let daemon = Daemon::start_with(
        &node.root,
        &node.node,
        &node.state,
        &[
            "--metrics-addr",
            "127.0.0.1:0",
            "--ztunnel-socket",
            &socket_flag,
        ],
    );
    wait_state(&daemon, "away");

    let ztunnel = StandInZtunnel::connect(&socket);
    // No pod of the node is enrolled: the snapshot is its end alone.
    ztunnel.wait_for("the snapshot", |seen| seen == [Seen::SnapshotSent]);
    wait_state(&daemon, "synced");
    drop(ztunnel);
    wait_state(&daemon, "away");

    // ztunnel restarted: a fresh snapshot.
    let ztunnel = StandInZtunnel::connect(&socket);
    ztunnel.wait_for("a second snapshot", |seen| seen == [Seen::SnapshotSent]);
    wait_state(&daemon, "synced");

    // The daemon killed: its socket file stays; the next daemon takes it over and
    // ztunnel, reconnecting, is sent the snapshot again.
    let daemon = daemon.kill().restart();
    drop(ztunnel);
    let ztunnel = StandInZtunnel::connect(&socket);
    ztunnel.wait_for("the new daemon's snapshot", |seen| {
        seen == [Seen::SnapshotSent]
    });
    wait_state(&daemon, "synced");
    assert!(
        daemon.log().contains("has the snapshot of 0 pods"),
        "{}",
        daemon.log()
    );
}

#[test]
fn a_ztunnel_socket_path_that_is_not_a_socket_fails_the_start_having_pinned_nothing() {
    privileged!();
    let node = TestNode::new("ambient-badsock");
    let taken = StateDir::new("ztunnel-taken");
    let file = taken.path().join("ztunnel.sock");
    std::fs::write(&file, "not a socket").unwrap();
    let refused = Command::new("timeout")
        .arg("30")
        .arg(redirector_bin())
        .arg("daemon")
        .arg(format!("--pin-root={}", node.root.path().display()))
        .arg(format!("--cgroup={}", node.node.path().display()))
        .arg(format!("--state-dir={}", node.state.path().display()))
        .arg(format!(
            "--socket={}",
            node.state.path().join("api.sock").display()
        ))
        .arg(format!("--ztunnel-socket={}", file.display()))
        .args(["--repair", "off"])
        .output()
        .expect("running redirector daemon");
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("--ztunnel-socket") && stderr.contains("not a socket"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a socket");
    assert!(!node.root.path().exists(), "nothing pinned");
}
