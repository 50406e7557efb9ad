//! The README's first command (`cargo xtask demo`): a pod (netns + cgroup) with a
//! stand-in sidecar proxy, a service in a second netns, `redirector istio-iptables` with
//! istio's standard injection flags, and an app connection that lands on the proxy with
//! its original destination. Everything it creates is removed before it exits.
//!
//! With `--daemon` (`cargo xtask demo --daemon`): the same pod captured through
//! `redirector daemon` and `redirector pod add`, no init container, still captured while
//! the daemon is killed, and listed again by the restarted one.

use std::process::{Command, ExitCode};

use redirector_tests::daemon::{Daemon, StateDir};
use redirector_tests::redirector::{redirector_bin, PinRoot, STANDARD_INJECTION};
use redirector_tests::{words, Cgroup, ConnOutcome, ProbeServer, Topology, APP_UID, PROXY_UID};

/// One line of the demo's narration, `format!`'s arguments.
macro_rules! say {
    ($($arg:tt)*) => {
        println!("demo: {}", format_args!($($arg)*))
    };
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
    say!("$ redirector istio-iptables {}", shown.join(" "));
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
        say!(
            "  {}",
            line.split_once("  ").map_or(line, |(_, rest)| rest.trim())
        );
    }
    if !out.status.success() {
        say!("redirector failed ({}):\n{log}", out.status);
    }
    out.status.success()
}

/// Run a read-only redirector command and print what it says.
fn show(args: &[&str]) {
    say!("$ redirector {}", args.join(" "));
    let out = Command::new(redirector_bin())
        .args(args)
        .output()
        .expect("running redirector");
    for line in String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
    {
        say!("  {line}");
    }
}

fn main() -> ExitCode {
    if !redirector_tests::require_root() {
        return ExitCode::FAILURE;
    }
    if std::env::args().any(|a| a == "--daemon") {
        return daemon_demo();
    }
    let topo = Topology::new("demo");
    say!(
        "pod netns {} ({}, {}), cgroup {}",
        topo.pod.name(),
        topo.pod_ip4(),
        topo.pod_ip6(),
        topo.pod_cgroup.path().display()
    );
    let _service = ProbeServer::serve(&topo.service, "service")
        .listen(topo.service_addr(false, 80))
        .listen(topo.service_addr(true, 80))
        .start();
    say!(
        "service in a second netns on {} and {}",
        topo.service_addr(false, 80),
        topo.service_addr(true, 80)
    );
    let _proxy = ProbeServer::proxy(&topo.pod, "proxy")
        .listen("127.0.0.1:15001".parse().unwrap())
        .listen("[::1]:15001".parse().unwrap())
        .cgroup(&topo.pod_cgroup)
        .user(PROXY_UID, PROXY_UID)
        .forward()
        .start();
    say!("stand-in sidecar proxy (uid 1337) in the pod on 127.0.0.1:15001 and [::1]:15001; it reads SO_ORIGINAL_DST and forwards there");

    let v4 = topo.service_addr(false, 80);
    say!(
        "before: app (uid {APP_UID}) -> {v4}: {}",
        describe(&topo.connect(APP_UID, APP_UID, v4))
    );
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
        say!("app (uid {APP_UID}) -> {dst}: {}", describe(&outcome));
    }
    let own = topo.connect(PROXY_UID, PROXY_UID, v4);
    ok &= matches!(own, ConnOutcome::Served { .. });
    say!("proxy (uid {PROXY_UID}) -> {v4}: {}", describe(&own));
    let netns = topo.pod.path();
    let netns = netns.to_string_lossy();
    for uid in [APP_UID, PROXY_UID] {
        show(&words(&format!(
            "explain --netns {netns} --uid {uid} --dst {v4}"
        )));
    }
    show(&["status", "--netns", &netns]);
    ok &= redirector(
        &topo.pod.path(),
        topo.pod_cgroup.path(),
        &["--cleanup-only"],
    );
    say!(
        "after cleanup: app (uid {APP_UID}) -> {v4}: {}",
        describe(&topo.connect(APP_UID, APP_UID, v4))
    );
    verdict(
        ok,
        "OK: the app's connections were redirected with their original destination",
    )
}

/// A pod (netns + cgroup under a node cgroup) with a service and a stand-in proxy.
struct DemoPod {
    topo: Topology,
    _service: redirector_tests::ChildGuard,
    _proxy: redirector_tests::ChildGuard,
}

fn demo_pod(node: &Cgroup) -> DemoPod {
    let topo = Topology::under(node, "demo");
    let service = ProbeServer::serve(&topo.service, "service")
        .listen(topo.service_addr(false, 80))
        .start();
    let proxy = ProbeServer::proxy(&topo.pod, "proxy")
        .listen("127.0.0.1:15001".parse().unwrap())
        .cgroup(&topo.pod_cgroup)
        .user(PROXY_UID, PROXY_UID)
        .forward()
        .start();
    DemoPod {
        topo,
        _service: service,
        _proxy: proxy,
    }
}

fn daemon_demo() -> ExitCode {
    let root = PinRoot::new("demo");
    let node = Cgroup::new("demonode");
    let state = StateDir::new("demostate");
    say!(
        "$ redirector daemon --cgroup {} --pin-root {} --state-dir {}",
        node.path().display(),
        root.path().display(),
        state.path().display()
    );
    let daemon = Daemon::start(&root, &node, &state);
    for line in daemon.log().lines().filter(|l| l.contains("INFO")) {
        say!("  {}", line.split_once("INFO ").map_or(line, |(_, l)| l));
    }
    let pod = demo_pod(&node);
    let dst = pod.topo.service_addr(false, 80);
    say!(
        "pod netns {} (cgroup below the node cgroup), service at {dst}, stand-in proxy (uid 1337) on 127.0.0.1:15001",
        pod.topo.pod.name()
    );
    let netns = pod.topo.pod.path().display().to_string();
    let add = format!("add --netns {netns} --name default/demo -- ");
    let add = [words(&add), STANDARD_INJECTION.to_vec()].concat();
    say!(
        "$ redirector pod {}",
        add.join(" ")
            .replace(" * ", " '*' ")
            .replace(" -x  ", " -x '' ")
    );
    let out = daemon.pod(&add);
    say!(
        "  {}",
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
    );
    let mut ok = out.status.success();
    let mut connect = |when: &str| {
        let outcome = pod.topo.connect(APP_UID, APP_UID, dst);
        ok &= matches!(&outcome, ConnOutcome::Proxied { orig: Some(o), .. } if *o == dst);
        say!(
            "{when}: app (uid {APP_UID}) -> {dst}: {}",
            describe(&outcome)
        );
    };
    connect("no init container");
    let killed = daemon.kill();
    say!("daemon killed with SIGKILL");
    connect("no daemon running");
    let daemon = killed.restart();
    say!("daemon restarted; it rebuilt its view from the pins before serving");
    say!("$ redirector pod list");
    for line in String::from_utf8_lossy(&daemon.pod(&["list"]).stdout).lines() {
        say!("  {line}");
    }
    say!("$ redirector pod del --name default/demo");
    ok &= daemon
        .pod(&["del", "--name", "default/demo"])
        .status
        .success();
    let after = pod.topo.connect(APP_UID, APP_UID, dst);
    ok &= matches!(after, ConnOutcome::Served { .. });
    say!(
        "after del: app (uid {APP_UID}) -> {dst}: {}",
        describe(&after)
    );
    verdict(
        ok,
        "OK: captured by its network namespace alone, through a daemon restart",
    )
}

/// The demo's last line and exit code.
fn verdict(ok: bool, success: &str) -> ExitCode {
    if ok {
        say!("{success}");
        ExitCode::SUCCESS
    } else {
        say!("FAILED");
        ExitCode::FAILURE
    }
}
