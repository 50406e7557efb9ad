//! `redirector trace` over real connections: a redirected, a passed, an inbound and a DNS
//! decision each show up with its reason while the trace runs; the switch is off once the
//! tracer exits on SIGTERM, and `gc` clears the switch a killed tracer left on. The
//! daemon's `trace` request streams the same until its client hangs up. A pod on an object
//! an earlier release pinned (no trace ring) is named and left untraced until it is set up
//! again by this release, or its daemon moves the node's object.

use std::os::unix::net::UnixStream;

use serde_json::{json, Value};

use redirector_tests::dns::{use_dnsprobe_bin, DnsClient, DnsMode, ResolvConf, DNS_PORT};
use redirector_tests::prelude::*;
use redirector_tests::redirector::{
    status_pod, trace_switch_on, wait_for_trace_switch, NextObject,
};
use redirector_tests::twin_pods::{start_app, start_peer, start_proxy};

/// Each wait here is for a step of milliseconds: [`EVENTUALLY`] is room for a starved guest.
fn wait_until(what: &str, ready: impl FnMut() -> bool) {
    assert!(
        within(EVENTUALLY, ready).is_some(),
        "timed out waiting until {what}"
    );
}

/// `redirector trace` of the pod (`--json` or text), once its switch is on.
fn start_trace(topo: &Topology, root: &PinRoot, json: bool) -> ChildGuard {
    let json = if json { "--json" } else { "" };
    let (netns, root_path) = (topo.pod.path(), root.path());
    let line = format!(
        "trace {json} --netns {} --pin-root {}",
        netns.display(),
        root_path.display()
    );
    let tracer = redirector(&line).spawn();
    wait_for_trace_switch(root, &tracer);
    tracer
}

/// Each field of `want` is `decision`'s.
#[track_caller]
fn assert_fields(decision: &Value, want: Value) {
    for (key, value) in want.as_object().unwrap() {
        assert_eq!(&decision[key], value, "{key} of {decision}");
    }
}

/// The next decision the tracer prints that satisfies `pred`.
fn decision(tracer: &ChildGuard, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let line = tracer.wait_line(what, EVENTUALLY, |l| {
        serde_json::from_str::<Value>(l).is_ok_and(|v| pred(&v))
    });
    serde_json::from_str(&line).unwrap()
}

#[test]
fn trace_shows_each_decision_and_switches_off_on_exit() {
    privileged!();
    use_dnsprobe_bin(env!("CARGO_BIN_EXE_dnsprobe"));
    let topo = Topology::new("trace");
    let _service = start_peer(&topo, &[80]);
    let _app = start_app(&topo, &[8080]);
    let _proxies = [("outbound", 15001), ("inbound", 15006)].map(|(name, port)| {
        let any4 = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port);
        start_proxy(&topo, name, [any4], (PROXY_UID, PROXY_UID))
    });
    let root = PinRoot::new("trace");
    let resolv = ResolvConf::new("trace", &[topo.service_ip4().into()], false);
    let resolv_path = resolv.path().to_string_lossy().into_owned();
    let mut flags = STANDARD_INJECTION.to_vec();
    flags.extend(["--redirect-dns", "--resolv-conf", &resolv_path]);
    install(&topo.pod, &topo.pod_cgroup, &root, &flags);
    assert!(!trace_switch_on(&root), "tracing starts off");

    let mut tracer = start_trace(&topo, &root, true);
    let svc = topo.service_addr(false, 80);
    let svc_ip = svc.ip().to_string();

    // Redirected: the app's connection lands on the outbound proxy.
    assert!(matches!(
        topo.connect(APP_UID, APP_UID, svc),
        ConnOutcome::Proxied { .. }
    ));
    let d = decision(&tracer, "the redirected connection", |v| {
        v["reason"] == "redirected"
    });
    let want = json!({"direction": "out", "protocol": "tcp", "dst": svc_ip, "dst_port": 80,
        "to": 15001, "uid": APP_UID});
    assert_fields(&d, want);

    // Passed: the proxy's own connection goes straight to the service.
    assert!(matches!(
        topo.connect(PROXY_UID, PROXY_UID, svc),
        ConnOutcome::Served { .. }
    ));
    let d = decision(&tracer, "the proxy's own connection", |v| {
        v["reason"] == "passed_proxy_owner"
    });
    assert_eq!(d["uid"], PROXY_UID);
    assert!(
        d.get("to").is_none(),
        "a passed connection goes nowhere else: {d}"
    );

    // Inbound: a connection to the pod is steered to the inbound proxy.
    let pod_dst = topo.pod_addr(false, 8080);
    assert!(matches!(
        connect_from(&topo.service, None, APP_UID, APP_UID, pod_dst, None),
        ConnOutcome::Proxied { .. }
    ));
    let d = decision(&tracer, "the inbound connection", |v| {
        v["reason"] == "steered_inbound"
    });
    let (dst, src) = (topo.pod_ip4().to_string(), topo.service_ip4().to_string());
    let want = json!({"direction": "in", "dst": dst, "dst_port": 8080, "src": src, "to": 15006});
    assert_fields(&d, want);

    // DNS: a query to resolv.conf's server goes to the DNS proxy port (none listens here;
    // the decision is what is traced).
    let _ = DnsClient::new(&topo, Some(&topo.pod_cgroup), APP_UID, APP_UID)
        .query(topo.service_addr(false, DNS_PORT), DnsMode::Udp);
    let d = decision(&tracer, "the DNS query", |v| {
        v["reason"] == "redirected_dns"
    });
    assert_fields(&d, json!({"protocol": "udp", "dst_port": 53, "to": 15053}));

    // A second tracer is refused while this one runs.
    let out = redirector(&format!("trace --pin-root {}", root.path().display())).output();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_contains(&err, format!("(pid {}) is tracing", tracer.pid()));

    // SIGTERM: the tracer switches tracing off and exits 0.
    let status = tracer.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", tracer.stderr());
    assert!(!trace_switch_on(&root), "tracing is off after exit");
    assert!(!root.path().join("tracers").exists());

    // In text, one line per decision, with explain's reason names. Killed, a tracer leaves
    // the switch on; gc clears it.
    let tracer = start_trace(&topo, &root, false);
    topo.connect(APP_UID, APP_UID, svc);
    let want = format!("out tcp {svc} redirected -> :15001 uid={APP_UID} gid={APP_UID}");
    tracer.wait_line("a text line", EVENTUALLY, |l| l.ends_with(&want));
    drop(tracer);
    assert!(
        trace_switch_on(&root),
        "a killed tracer leaves the switch on"
    );
    assert_success(&redirector(&format!("gc --pin-root {}", root.path().display())).output());
    assert!(
        !trace_switch_on(&root),
        "gc clears a killed tracer's switch"
    );
    assert!(!root.path().join("tracers").exists());
}

/// The daemon's answer to `request`, with the connection and the lines that follow.
fn ask(
    daemon: &Daemon,
    request: &str,
) -> (
    UnixStream,
    std::io::Lines<std::io::BufReader<UnixStream>>,
    Value,
) {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = UnixStream::connect(daemon.socket()).unwrap();
    stream.set_read_timeout(Some(EVENTUALLY)).unwrap();
    writeln!(stream, "{request}").unwrap();
    let mut lines = BufReader::new(stream.try_clone().unwrap()).lines();
    let answer: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    (stream, lines, answer)
}

/// Unpins `object`'s trace ring: what a release before the ring pinned (its programs
/// logged through aya-log).
fn as_pinned_by_an_earlier_release(root: &PinRoot, object: &str) {
    let maps = root.path().join("objects").join(object).join("maps");
    let ring = maps.join(redirector_common::names::TRACE);
    std::fs::remove_file(&ring).unwrap();
}

#[test]
fn the_daemon_streams_a_pods_decisions_until_the_client_hangs_up() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("dtrace");
    // Its gc runs every second while it streams: it must leave its own trace alone.
    let daemon = Daemon::start_with(&root, &node, &state, &["--gc-interval", "1"]);
    let pod = ProxiedPod::under(&node, "dtracepod");
    daemon.add(&pod.topo.pod, "default/traced", &STANDARD_INJECTION);

    let ask = |request: &str| ask(&daemon, request);
    let (_, _, answer) = ask(r#"{"op":"trace","name":"default/nobody"}"#);
    assert_eq!(answer["ok"], false, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("no such pod"));

    let (stream, mut lines, answer) = ask(r#"{"op":"trace","name":"default/traced"}"#);
    assert_eq!(answer["ok"], true, "{answer}");
    wait_until("the trace switch is on", || trace_switch_on(&root));
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        trace_switch_on(&root) && root.path().join("tracers").exists(),
        "the daemon's gc left its own trace on"
    );
    let dst = pod.service(false);
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    let decision = next_redirected(&mut lines);
    let want = json!({"pod": "default/traced", "dst": dst.ip().to_string(), "to": 15001});
    assert_fields(&decision, want);

    // Hanging up ends the stream and switches tracing off.
    drop(lines);
    drop(stream);
    wait_until("the trace switch is off", || !trace_switch_on(&root));
    assert!(!root.path().join("tracers").exists());
}

/// Whether the pod's configuration under `root` has its trace switch on.
fn traced(root: &PinRoot, cookie: u64) -> bool {
    let pod = status_pod(root, cookie).unwrap_or_else(|| panic!("no pod {cookie} in status"));
    let flags = pod["config"]["flags"].as_u64().unwrap();
    flags & u64::from(redirector_common::pod_flags::TRACE) != 0
}

#[test]
fn a_pod_on_an_earlier_releases_object_is_named_and_traced_once_set_up_again() {
    privileged!();
    let (earlier, current) = (ProxiedPod::new("tearly"), ProxiedPod::new("tcurrent"));
    let root = PinRoot::new("tearly");
    earlier.install(&root, &STANDARD_INJECTION);
    let [old] = <[String; 1]>::try_from(object_ids(&root)).unwrap();
    as_pinned_by_an_earlier_release(&root, &old);
    let cookie = earlier.topo.pod.cookie();
    let pod = format!("netns:{cookie}");

    // One of its pods is refused, the message naming the object, the pod and what to do.
    let netns = earlier.topo.pod.path();
    let (netns, pins) = (netns.display(), root.path().display());
    let out = redirector(&format!("trace --netns {netns} --pin-root {pins}")).output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for told in [&old, &pod, "earlier release", "set up again"] {
        assert!(err.contains(told), "{told:?} in {err}");
    }
    assert!(!traced(&root, cookie));

    // Beside a pod on this release's object, tracing every pod traces that one and names
    // the other in its log, whose switch stays off.
    let next = NextObject::new();
    assert_success(&current.istio_iptables_with_object(&root, &next.path, &STANDARD_INJECTION));
    assert_eq!(object_ids(&root).len(), 2);
    let tracer = redirector(&format!(
        "trace --json --pin-root {}",
        root.path().display()
    ))
    .spawn();
    let current_cookie = current.topo.pod.cookie();
    wait_until("the current pod's switch is on", || {
        traced(&root, current_cookie)
    });
    let dst = current.service(false);
    assert_proxied(&current.connect(APP_UID, APP_UID, dst), dst);
    decision(&tracer, "the current pod's decision", |v| {
        v["netns_cookie"] == current_cookie && v["reason"] == "redirected"
    });
    let notice = tracer.stderr();
    for told in [&old, &pod, "earlier release"] {
        assert!(notice.contains(told), "{told:?} in {notice}");
    }
    assert!(
        !traced(&root, cookie),
        "an earlier object's pod stays untraced"
    );
    let dst = earlier.service(false);
    assert_proxied(&earlier.connect(APP_UID, APP_UID, dst), dst);
    drop(tracer);

    // Set up again by this release, it moves to this release's object and is traced.
    assert_success(&earlier.istio_iptables_with_object(&root, &next.path, &STANDARD_INJECTION));
    assert!(!object_ids(&root).contains(&old), "{:?}", object_ids(&root));
    let netns = earlier.topo.pod.path();
    let (netns, pins) = (netns.display(), root.path().display());
    let tracer = redirector(&format!("trace --json --netns {netns} --pin-root {pins}")).spawn();
    wait_until("the moved pod's switch is on", || traced(&root, cookie));
    assert_proxied(&earlier.connect(APP_UID, APP_UID, dst), dst);
    decision(&tracer, "the moved pod's decision", |v| {
        v["netns_cookie"] == cookie && v["reason"] == "redirected"
    });
}

#[test]
fn the_daemon_names_an_earlier_releases_object_and_traces_its_pods_once_it_moves_them() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("dtearly");
    let daemon = Daemon::start(&root, &node, &state);
    let pod = ProxiedPod::under(&node, "dtearlypod");
    daemon.add(&pod.topo.pod, "default/early", &STANDARD_INJECTION);
    let [old] = <[String; 1]>::try_from(object_ids(&root)).unwrap();
    as_pinned_by_an_earlier_release(&root, &old);
    let pod_told = format!("netns:{}", pod.topo.pod.cookie());

    // The pod alone: refused, naming the object. Every pod: streamed, the answer and the
    // log naming the object and its pod.
    let (_, _, answer) = ask(&daemon, r#"{"op":"trace","name":"default/early"}"#);
    assert_eq!(answer["ok"], false, "{answer}");
    let err = answer["error"].as_str().unwrap();
    for told in [&old, &pod_told, "earlier release"] {
        assert!(err.contains(told), "{told:?} in {err}");
    }
    let (stream, lines, answer) = ask(&daemon, r#"{"op":"trace"}"#);
    assert_eq!(answer["ok"], true, "{answer}");
    let message = answer["message"].as_str().unwrap();
    for told in [&old, &pod_told, "earlier release"] {
        assert!(message.contains(told), "{told:?} in {message}");
    }
    daemon.assert_logged(&pod_told);
    assert!(
        !trace_switch_on(&root),
        "an earlier object's pod stays untraced"
    );
    drop((lines, stream));

    // A daemon of this release moves the node to its object at start: the pod is traced.
    let next = NextObject::new();
    let daemon = daemon.kill().restart_with_object(&next.path);
    assert!(!object_ids(&root).contains(&old));
    let (_stream, mut lines, answer) = ask(&daemon, r#"{"op":"trace","name":"default/early"}"#);
    assert_eq!(answer["ok"], true, "{answer}");
    wait_until("the trace switch is on", || trace_switch_on(&root));
    let dst = pod.service(false);
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    let decision = next_redirected(&mut lines);
    assert_fields(&decision, json!({"pod": "default/early", "to": 15001}));
}

/// The next decision of the daemon's trace stream `lines` whose reason is `redirected`.
fn next_redirected(lines: &mut impl Iterator<Item = Result<String, std::io::Error>>) -> Value {
    loop {
        let line = lines
            .next()
            .expect("the stream goes on")
            .expect("a decision within the read timeout");
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["reason"] == "redirected" {
            return v;
        }
    }
}
