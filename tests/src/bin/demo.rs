//! The README's first command (`cargo xtask demo`): a pod (netns + cgroup) with a
//! stand-in sidecar proxy, a service in a second netns, `redirector istio-iptables` with
//! istio's standard injection flags, and an app connection that lands on the proxy with
//! its original destination. Everything it creates is removed before it exits.

use std::process::{Command, ExitCode};

use redirector_tests::redirector::{redirector_bin, STANDARD_INJECTION};
use redirector_tests::{ConnOutcome, ProbeServer, Topology, APP_UID, PROXY_UID};

fn say(line: &str) {
    println!("demo: {line}");
}

fn describe(outcome: &ConnOutcome) -> String {
    match outcome {
        ConnOutcome::Proxied {
            local,
            orig,
            upstream,
            ..
        } => {
            let orig = orig.map_or("none".to_owned(), |o| o.to_string());
            let upstream = match upstream.as_deref() {
                Some(ConnOutcome::Served { name, local, .. }) => {
                    format!(", proxy forwarded it and {name} at {local} answered")
                }
                Some(other) => format!(", proxy's upstream: {other:?}"),
                None => String::new(),
            };
            format!("REDIRECTED to the proxy at {local}, SO_ORIGINAL_DST = {orig}{upstream}")
        }
        ConnOutcome::Served { name, local, .. } => {
            format!("not redirected: {name} at {local} answered directly")
        }
        other => format!("failed: {other:?}"),
    }
}

fn redirector(netns: &std::path::Path, cgroup: &std::path::Path, args: &[&str]) -> bool {
    let shown: Vec<String> = args
        .iter()
        .map(|a| {
            if a.is_empty() || *a == "*" {
                format!("'{a}'")
            } else {
                a.to_string()
            }
        })
        .collect();
    say(&format!("$ redirector istio-iptables {}", shown.join(" ")));
    let out = Command::new(redirector_bin())
        .arg("istio-iptables")
        .arg("--network-namespace")
        .arg(netns)
        .arg("--cgroup")
        .arg(cgroup)
        .args(args)
        .output()
        .expect("running redirector");
    let log = String::from_utf8_lossy(&out.stderr);
    for line in log
        .lines()
        .filter(|l| l.contains("attached in") || l.contains("cleaned up") || l.contains("ERROR"))
    {
        say(&format!(
            "  {}",
            line.split_once("  ").map_or(line, |(_, rest)| rest.trim())
        ));
    }
    if !out.status.success() {
        say(&format!("redirector failed ({}):\n{log}", out.status));
    }
    out.status.success()
}

/// Run a read-only redirector command and print what it says.
fn show(args: &[&str]) {
    say(&format!("$ redirector {}", args.join(" ")));
    let out = Command::new(redirector_bin())
        .args(args)
        .output()
        .expect("running redirector");
    for line in String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
    {
        say(&format!("  {line}"));
    }
}

fn main() -> ExitCode {
    if !redirector_tests::require_root() {
        return ExitCode::FAILURE;
    }
    let topo = Topology::new("demo");
    say(&format!(
        "pod netns {} ({}, {}), cgroup {}",
        topo.pod.name(),
        topo.pod_ip4(),
        topo.pod_ip6(),
        topo.pod_cgroup.path().display()
    ));
    let _service = ProbeServer::serve(&topo.service, "service")
        .listen(topo.service_addr(false, 80))
        .listen(topo.service_addr(true, 80))
        .start();
    say(&format!(
        "service in a second netns on {} and {}",
        topo.service_addr(false, 80),
        topo.service_addr(true, 80)
    ));
    let _proxy = ProbeServer::proxy(&topo.pod, "proxy")
        .listen("127.0.0.1:15001".parse().unwrap())
        .listen("[::1]:15001".parse().unwrap())
        .cgroup(&topo.pod_cgroup)
        .user(PROXY_UID, PROXY_UID)
        .forward()
        .start();
    say("stand-in sidecar proxy (uid 1337) in the pod on 127.0.0.1:15001 and [::1]:15001; it reads SO_ORIGINAL_DST and forwards there");

    let v4 = topo.service_addr(false, 80);
    say(&format!(
        "before: app (uid {APP_UID}) -> {v4}: {}",
        describe(&topo.connect(APP_UID, APP_UID, v4))
    ));
    if !redirector(
        &topo.pod.path(),
        topo.pod_cgroup.path(),
        &STANDARD_INJECTION,
    ) {
        return ExitCode::FAILURE;
    }
    let mut ok = true;
    for dst in [v4, topo.service_addr(true, 80)] {
        let outcome = topo.connect(APP_UID, APP_UID, dst);
        ok &= matches!(&outcome, ConnOutcome::Proxied { orig: Some(o), .. } if *o == dst);
        say(&format!(
            "app (uid {APP_UID}) -> {dst}: {}",
            describe(&outcome)
        ));
    }
    let own = topo.connect(PROXY_UID, PROXY_UID, v4);
    ok &= matches!(own, ConnOutcome::Served { .. });
    say(&format!(
        "proxy (uid {PROXY_UID}) -> {v4}: {}",
        describe(&own)
    ));
    let netns = topo.pod.path();
    let netns = netns.to_string_lossy();
    show(&[
        "explain",
        "--netns",
        &netns,
        "--uid",
        "1000",
        "--dst",
        &v4.to_string(),
    ]);
    show(&[
        "explain",
        "--netns",
        &netns,
        "--uid",
        "1337",
        "--dst",
        &v4.to_string(),
    ]);
    show(&["status", "--netns", &netns]);
    ok &= redirector(
        &topo.pod.path(),
        topo.pod_cgroup.path(),
        &["--cleanup-only"],
    );
    say(&format!(
        "after cleanup: app (uid {APP_UID}) -> {v4}: {}",
        describe(&topo.connect(APP_UID, APP_UID, v4))
    ));
    say(if ok {
        "OK: the app's connections were redirected with their original destination"
    } else {
        "FAILED"
    });
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
