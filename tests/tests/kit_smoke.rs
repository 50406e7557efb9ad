//! Privileged smoke tests of the test kit itself: namespaces, cgroups, spawning, the probe
//! binary, and istio's iptables rules as the reference redirector is compared with.
//!
//! Run as root, one thread: `cargo test -p redirector-tests -- --test-threads=1`.

use redirector_tests::iptables::{append_rules, apply_golden, golden};
use redirector_tests::prelude::*;
use redirector_tests::proxied_pod::{assert_forwarded, assert_served};
use redirector_tests::{iptables, wait_tcp_listening, Landing};

fn start_service(topo: &Topology, port: u16) -> ChildGuard {
    ProbeServer::serve(&topo.service, "svc")
        .listen(topo.service_addr(false, port))
        .listen(topo.service_addr(true, port))
        .start()
}

#[test]
fn pod_reaches_service_over_ipv4_and_ipv6() {
    privileged!();
    let topo = Topology::new("reach");
    let _svc = start_service(&topo, 80);
    // Already ready (start() waited for it), so this only checks the ss-based helper.
    wait_tcp_listening(&topo.service, 80, EVENTUALLY);

    for v6 in [false, true] {
        let dst = topo.service_addr(v6, 80);
        let outcome = topo.connect(APP_UID, APP_UID, dst);
        let ConnOutcome::Served { name, local, peer } = &outcome else {
            panic!("{dst}: expected the service, got {outcome:?}");
        };
        assert_eq!((name.as_str(), *local), ("svc", dst));
        assert_eq!(
            peer.ip(),
            topo.pod_addr(v6, 0).ip(),
            "{dst}: source should be the pod's address"
        );
    }

    // Nothing on port 81: a clean refusal, not a timeout.
    assert_eq!(
        topo.connect(APP_UID, APP_UID, topo.service_addr(false, 81)),
        ConnOutcome::Refused
    );
    // A bound source address is honoured.
    let (svc, pod) = (topo.service_addr(false, 80), topo.pod_ip4());
    let bound = connect_from(&topo, None, 0, 0, svc, Some(pod.into()));
    assert!(
        matches!(bound, ConnOutcome::Served { peer, .. } if peer.ip() == topo.pod_ip4()),
        "{bound:?}"
    );
}

#[test]
fn spawn_applies_cgroup_user_and_netns_before_exec() {
    privileged!();
    let topo = Topology::new("spawn");
    let output = Spawn::new("sh")
        .args([
            "-c",
            "cat /proc/self/cgroup; id -u; id -g; id -G; cat /proc/self/net/dev",
        ])
        .netns(&topo.pod)
        .cgroup(&topo.pod_cgroup)
        .user(APP_UID, APP_UID + 1)
        .output();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let expected_cgroup = format!("0::{}", topo.pod_cgroup.relative_path());
    assert!(
        stdout.lines().any(|l| l == expected_cgroup),
        "not in {expected_cgroup}:\n{stdout}"
    );
    let ids: Vec<&str> = stdout
        .lines()
        .filter(|l| l.chars().all(|c| c.is_ascii_digit()))
        .collect();
    assert_eq!(
        ids,
        ["1000", "1001", "1001"],
        "uid, gid, groups (no supplementary):\n{stdout}"
    );
    assert!(stdout.contains("eth0:"), "not in the pod netns:\n{stdout}");
    // The cookie identifies the namespace.
    assert_ne!(topo.pod.cookie(), topo.service.cookie());
    assert_eq!(topo.pod.cookie(), topo.pod.cookie());
}

/// istio's `-b '*'` rules plus the outbound capture of `-i '*'`: an app's connection lands on
/// the proxy with the service as its original destination; the proxy's own does not.
#[test]
fn iptables_capture_reaches_proxy_with_original_dst_v4() {
    privileged!();
    let topo = Topology::new("ipt4");
    let (v4, v6) = golden("inbound-ports-wildcard");
    assert_eq!(v6, None, "inbound-ports-wildcard has no IPv6 section");
    apply_golden(
        &topo.pod,
        &append_rules(&v4, "nat", &["-A ISTIO_OUTPUT -j ISTIO_REDIRECT"]),
        None,
    );

    let _svc = start_service(&topo, 80);
    let _proxy = ProbeServer::proxy(&topo.pod, "outbound")
        .listen("127.0.0.1:15001".parse().unwrap())
        .cgroup(&topo.pod_cgroup)
        .user(PROXY_UID, PROXY_UID)
        .start();
    let dst = topo.service_addr(false, 80);

    let app = topo.connect(APP_UID, APP_UID, dst);
    assert_eq!(
        app.landing(),
        Landing::Proxy {
            name: "outbound".into(),
            orig: Some(dst),
            upstream: None
        },
        "{app:?}\n{}",
        iptables::saved_rules(&topo.pod, false, "nat")
    );
    assert_served(&topo.connect(PROXY_UID, PROXY_UID, dst), "svc", dst);
}

/// The same over IPv6 through ip6tables, with a forwarding proxy: the proxy reads the IPv6
/// original destination and its own connection to it is not captured.
#[test]
fn ip6tables_capture_and_forwarding_proxy_v6() {
    privileged!();
    let topo = Topology::new("ipt6");
    let (v4, v6) = golden("ipv6-empty-inbound-ports");
    let v6 = v6.expect("ipv6-empty-inbound-ports has an IPv6 section");
    let capture = ["-A ISTIO_OUTPUT -j ISTIO_REDIRECT"];
    apply_golden(
        &topo.pod,
        &append_rules(&v4, "nat", &capture),
        Some(&append_rules(&v6, "nat", &capture)),
    );

    let _svc = start_service(&topo, 80);
    let _proxy = ProbeServer::proxy(&topo.pod, "outbound")
        .listen("127.0.0.1:15001".parse().unwrap())
        .listen("[::1]:15001".parse().unwrap())
        .forward()
        .cgroup(&topo.pod_cgroup)
        .user(PROXY_UID, PROXY_UID)
        .start();

    for v6 in [true, false] {
        let dst = topo.service_addr(v6, 80);
        let outcome = topo.connect(APP_UID, APP_UID, dst);
        assert_forwarded(&outcome, "outbound", dst, "svc", dst);
    }
    // A captured connection to a closed port: the proxy's upstream is refused, the app's
    // connection itself succeeded (to the proxy).
    let closed: SocketAddr = topo.service_addr(true, 81);
    let outcome = topo.connect(APP_UID, APP_UID, closed);
    assert!(
        matches!(&outcome, ConnOutcome::Proxied { orig: Some(o), upstream: Some(u), .. } if *o == closed && **u == ConnOutcome::Refused),
        "{outcome:?}"
    );
}

/// Guards undo everything on drop, also when the test body panics.
#[test]
fn guards_clean_up_even_on_panic() {
    privileged!();
    let mut names = Vec::new();
    let mut cgroups = Vec::new();
    let mut pids = Vec::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let topo = Topology::new("clean");
        names.extend([topo.pod.name().to_owned(), topo.service.name().to_owned()]);
        cgroups.push(topo.pod_cgroup.path().to_path_buf());
        let server = ProbeServer::serve(&topo.pod, "in-cgroup")
            .listen("127.0.0.1:0".parse().unwrap())
            .cgroup(&topo.pod_cgroup)
            .start();
        pids.push(server.pid());
        assert_eq!(topo.pod_cgroup.pids(), [server.pid()]);
        let extra = NetNs::new("extra");
        names.push(extra.name().to_owned());
        panic!("deliberate");
    }));
    assert!(result.is_err());
    assert_eq!(names.len(), 3);

    let listed = run_ok(std::process::Command::new("ip").args(["netns", "list"])).stdout;
    let listed = String::from_utf8_lossy(&listed);
    for name in &names {
        assert!(
            !Path::new("/run/netns").join(name).exists(),
            "{name} still exists"
        );
        let is_listed = listed
            .lines()
            .any(|l| l.split_whitespace().next() == Some(name));
        assert!(!is_listed, "{name} listed:\n{listed}");
    }
    for cgroup in &cgroups {
        assert!(!cgroup.exists(), "{} still exists", cgroup.display());
    }
    for pid in &pids {
        let running = Path::new(&format!("/proc/{pid}")).exists();
        assert!(!running, "probe {pid} still running");
    }
}

/// Conformance needs to tell a refusal from a drop (timeout). (EPERM, what a cgroup program
/// rejecting a connect produces, cannot be made with netfilter for TCP: a SYN dropped in
/// OUTPUT is retried, not reported; its mapping is unit-tested in probe_protocol.)
#[test]
fn client_errors_are_distinguishable() {
    privileged!();
    let topo = Topology::new("errs");
    // A SYN dropped at the service is never answered.
    topo.service
        .run(&words("iptables -A INPUT -p tcp --dport 83 -j DROP"));

    let landing = |port| {
        topo.connect(APP_UID, APP_UID, topo.service_addr(false, port))
            .landing()
    };
    assert_eq!(landing(81), Landing::Refused);
    let timeout = Landing::Error {
        kind: "timeout".into(),
    };
    assert_eq!(landing(83), timeout);
}

/// The standard injection rule set derived from the goldens is accepted by both tools.
#[test]
fn standard_injection_applies() {
    privileged!();
    let netns = NetNs::new("std");
    let (v4, v6) = iptables::standard_injection();
    apply_golden(&netns, &v4, Some(&v6));
    for v6 in [false, true] {
        let saved = iptables::saved_rules(&netns, v6, "nat");
        assert_contains(&saved, "-A ISTIO_OUTPUT -j ISTIO_REDIRECT");
        assert!(saved.contains("--dport 15020 -j RETURN"), "{saved}");
    }
}
