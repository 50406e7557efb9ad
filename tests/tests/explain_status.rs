//! `redirector explain` checked against real connections, and `redirector status` counters
//! checked against the connections made.

use redirector_tests::prelude::*;
use redirector_tests::scenario::Family;
use redirector_tests::twin_pods::{start_app, start_peer, start_proxy, wildcard};

/// What `redirector LINE` prints, once it succeeded.
fn output_of(line: &str) -> String {
    let out = run_ok(&mut redirector(line).command());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Where explain says the connection lands, in the terms of a probe outcome.
fn explained_landing(explain: &str) -> &'static str {
    let lands = explain
        .lines()
        .find(|l| l.starts_with("lands on:"))
        .expect("a 'lands on' line");
    if lands.contains("outbound listener") {
        "outbound"
    } else if lands.contains("inbound listener") {
        "inbound"
    } else {
        assert!(lands.contains("directly"), "{lands}");
        "direct"
    }
}

fn real_landing(outcome: &ConnOutcome) -> &'static str {
    match outcome {
        ConnOutcome::Proxied { name, .. } if name == "outbound" => "outbound",
        ConnOutcome::Proxied { name, .. } if name == "inbound" => "inbound",
        ConnOutcome::Served { .. } => "direct",
        other => panic!("unexpected outcome {other:?}"),
    }
}

#[test]
fn explain_matches_real_connections_and_status_counts_them() {
    privileged!();
    let topo = Topology::new("explain");
    let excluded: IpAddr = Ipv4Addr::new(10, 201, topo.subnet(), 3).into();
    topo.add_service_addr(excluded);
    let _service = start_peer(&topo, &[80, 8080]);
    let _app = start_app(&topo, &[8080, 15021]);
    let _proxies = [("outbound", 15001), ("inbound", 15006)].map(|(name, port)| {
        let addrs = Family::BOTH.map(|family| wildcard(family, port));
        start_proxy(&topo, name, addrs, (PROXY_UID, PROXY_UID))
    });
    let root = PinRoot::new("explain");
    let excluded_cidr = format!("{excluded}/32");
    let flags = format!("-i * -x {excluded_cidr} -o 8080 -b * -d 15021");
    install(&topo.pod, &topo.pod_cgroup, &root, &words(&flags));
    let netns = topo.pod.path();
    let (netns, pin_root) = (netns.to_str().unwrap(), root.path().to_str().unwrap());

    let svc4 = topo.service_addr(false, 80);
    let svc6 = topo.service_addr(true, 80);
    let outbound: [(u32, SocketAddr); 5] = [
        (APP_UID, svc4),
        (APP_UID, svc6),
        (PROXY_UID, svc4),
        (APP_UID, SocketAddr::new(excluded, 80)),
        (APP_UID, topo.service_addr(false, 8080)),
    ];
    // `redirector explain` for this pod, plus `args`.
    let explain = |args: &str| {
        output_of(&format!(
            "explain --netns {netns} --pin-root {pin_root} {args}"
        ))
    };
    let mut redirected = 0;
    for (uid, dst) in outbound {
        let explain = explain(&format!("--uid {uid} --dst {dst}"));
        let real = real_landing(&topo.connect(uid, uid, dst));
        assert_eq!(
            explained_landing(&explain),
            real,
            "uid {uid} -> {dst}; explain said:\n{explain}"
        );
        redirected += usize::from(real == "outbound");
    }
    for port in [8080u16, 15021] {
        let dst = topo.pod_addr(false, port);
        let explain = explain(&format!("--inbound --dst {dst}"));
        let from_peer = connect_from(&topo.service, None, APP_UID, APP_UID, dst, None);
        let real = real_landing(&from_peer);
        assert_eq!(
            explained_landing(&explain),
            real,
            "inbound {dst}; explain said:\n{explain}"
        );
    }
    assert_eq!(
        redirected, 2,
        "two of the outbound connections are captured"
    );

    let status = output_of(&format!("status --netns {netns} --pin-root {pin_root}"));
    assert_contains(
        &status,
        "links: connect4 connect6 getpeername4 getpeername6 getsockopt sk_lookup sock_ops",
    );
    let counters: Vec<&str> = status
        .lines()
        .find_map(|l| l.trim().strip_prefix("counters (non-zero): "))
        .expect("a counters line")
        .split(' ')
        .collect();
    for expected in [
        format!("redirected={redirected}"),
        "steered_inbound=1".to_owned(),
        "passed_excluded_cidr=1".to_owned(),
        "passed_excluded_port=1".to_owned(),
        format!("orig_dst_answered={}", redirected + 1),
    ] {
        assert!(
            counters.contains(&expected.as_str()),
            "{expected} in {counters:?}"
        );
    }
}
