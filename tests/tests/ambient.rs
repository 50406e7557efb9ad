//! Istio ambient: the daemon as ztunnel's node agent (`--ztunnel-socket`), with a
//! stand-in ztunnel on its ZDS socket — a snapshot sent on every connection, the state
//! shown in `/metrics`, a daemon killed and restarted taking its socket back — and the
//! route that brings an app's replies back to ztunnel's transparent sockets; the chained
//! plugin enrolling a labelled pod through the daemon, its labels from a CRI; and the
//! differential scenarios: a pod's traffic and its DNS under istio-cni's rules and under
//! redirector's programs, through the same stand-in ztunnel.

use std::net::Ipv6Addr;

use redirector::mesh::ambient::DNS_CAPTURE;
use redirector::sys::{
    netns::Netns,
    reply_route::{self, REPLY_MARK},
};
use redirector::zds::{self, agent::Workload, wire::WorkloadInfo};
use serde_json::{json, Value};
use socket2::{Domain, Socket, Type};

use redirector_tests::dns::{
    protocol::DnsOutcome, use_dnsprobe_bin, DnsClient, DnsMode, DnsServer, DNS_PORT,
    PROXY_ANSWER_V4,
};
use redirector_tests::fake_cri::FakeCri;
use redirector_tests::istio_cni::{self, DnsCapture};
use redirector_tests::prelude::*;
use redirector_tests::redirector::status;
use redirector_tests::ztunnel::{Seen, StandInProcess, StandInZtunnel, TestAgent};

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

/// Waits for ztunnel's `state` in the daemon's metrics: up to 120 s, as for a daemon's start
/// (a restarted daemon's start and ztunnel's reconnection, in a guest under emulation).
fn wait_state(daemon: &Daemon, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while ztunnel_state(daemon) != state {
        // Each look is a scrape: a guest under emulation is not to be kept busy with them.
        std::thread::sleep(Duration::from_millis(200));
        if Instant::now() > deadline {
            let (now, log) = (ztunnel_state(daemon), daemon.log());
            panic!("ztunnel is {now} in /metrics, not {state}; the daemon's log:\n{log}");
        }
    }
}

#[test]
fn ztunnel_is_sent_a_snapshot_on_every_connection_and_across_a_daemon_restart() {
    privileged!();
    let node = TestNode::new("ambient-zds");
    let sockets = StateDir::new("ztunnel-run");
    let socket = sockets.path().join("ztunnel").join("ztunnel.sock");
    let daemon = ztunnels_daemon(&node, &socket);
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
    assert_contains(&daemon.log(), "has the snapshot of 0 pods");
}

#[test]
fn a_ztunnel_socket_path_that_is_not_a_socket_fails_the_start_having_pinned_nothing() {
    privileged!();
    let node = TestNode::new("ambient-badsock");
    let taken = StateDir::new("ztunnel-taken");
    let file = taken.path().join("ztunnel.sock");
    std::fs::write(&file, "not a socket").unwrap();
    let zsocket = format!("--ztunnel-socket={}", file.display());
    let (code, stderr) = node.daemon_refused(&[&zsocket], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("--ztunnel-socket") && stderr.contains("not a socket"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a socket");
    assert!(!node.root.path().exists(), "nothing pinned");
}

/// What the app saw of a connection a transparent socket made: its peer, its mark.
#[derive(Debug)]
struct Accepted {
    peer: IpAddr,
    mark: u32,
}

/// In the calling thread's namespace: the app listening at `app`, and a ztunnel-like
/// socket — `IP_TRANSPARENT`, bound to `client` (not an address of the namespace), marked
/// `mark` — connecting to it within `timeout`. The app's side, or the connect's error (its
/// SYN-ACK lost).
fn transparent_connect(
    app: SocketAddr,
    client: IpAddr,
    mark: u32,
    timeout: Duration,
) -> std::io::Result<Accepted> {
    let domain = Domain::for_address(app);
    let listener = Socket::new(domain, Type::STREAM, None)?;
    listener.set_reuse_address(true)?;
    listener.bind(&app.into())?;
    listener.listen(4)?;
    let socket = Socket::new(domain, Type::STREAM, None)?;
    if app.is_ipv4() {
        socket.set_ip_transparent_v4(true)?;
    } else {
        socket.set_ip_transparent_v6(true)?;
    }
    socket.set_mark(mark)?;
    socket.bind(&SocketAddr::new(client, 0).into())?;
    socket.connect_timeout(&app.into(), timeout)?;
    let (accepted, peer) = listener.accept()?;
    Ok(Accepted {
        peer: peer.as_socket().expect("an inet peer").ip(),
        mark: accepted.mark()?,
    })
}

#[test]
fn the_reply_route_brings_the_apps_replies_back_to_a_transparent_socket() {
    privileged!();
    let topology = Topology::new("ambient-reply");
    let pod = Netns::open(&topology.pod.path()).expect("the pod's namespace");
    let clients = [
        (
            topology.pod_addr(false, 8080),
            IpAddr::from([10, 251, 7, 9]),
        ),
        (
            topology.pod_addr(true, 8080),
            IpAddr::from([0xfd00, 0x251, 0, 0, 0, 0, 0, 9]),
        ),
    ];
    let connect = |app, client, mark, timeout| {
        pod.run(move || transparent_connect(app, client, mark, timeout))
            .expect("entering the pod's namespace")
    };
    // A connection that is to be lost is given up after LOST; one that is to succeed may
    // take a starved emulated guest far longer.
    const LOST: Duration = Duration::from_secs(2);
    for (app, client) in clients {
        // Without the route back, the app's SYN-ACK leaves by the default route.
        let lost = connect(app, client, REPLY_MARK, LOST);
        assert!(lost.is_err(), "{app} from {client}: {lost:?}");
    }
    for _ in 0..2 {
        // Twice: a second install finds everything in place.
        pod.run(reply_route::install)
            .expect("entering the pod's namespace")
            .expect("the route back");
    }
    for (app, client) in clients {
        let accepted = connect(app, client, REPLY_MARK, EVENTUALLY).expect("connected");
        assert_eq!(accepted.peer, client, "the app sees the client's address");
        assert_eq!(
            accepted.mark, REPLY_MARK,
            "the app's socket carries the mark"
        );
        // ztunnel's other sockets keep 1337: not routed back.
        let other = connect(app, client, 1337, LOST);
        assert!(other.is_err(), "{app} from {client} marked 1337: {other:?}");
    }
    let rules = topology.pod.run(&["ip", "rule", "show"]);
    assert!(rules.contains("fwmark 0x111/0xfff lookup 100"), "{rules}");
    let table = topology.pod.run(&["ip", "route", "show", "table", "100"]);
    assert!(table.contains("local default dev lo"), "{table}");
}

#[test]
fn istio_cnis_rules_send_a_pods_traffic_through_the_stand_in_ztunnel() {
    privileged!();
    let topology = Topology::new("amb-ref");
    istio_cni::apply(&topology.pod);
    let _servers = PodServers::start(&topology);

    // The agent, in the test; ztunnel in a namespace and cgroup of its own.
    let zds_dir = StateDir::new("amb-ref-zds");
    let socket = zds_dir.path().join("ztunnel.sock");
    let pod = workload("amb-ref", &topology.pod);
    let _agent = TestAgent::start(&socket, vec![pod], EVENTUALLY);
    let ztunnel = StandInProcess::start("amb-ref-zt", &socket);
    ztunnel.wait_line("the pod in the snapshot", "added amb-ref-uid");
    assert_traffic_through(&topology, &ztunnel, AppSeenFrom::PodAddress);
}

/// The same pod enrolled through the daemon's API (`pod add --dialect ambient`), captured
/// by redirector's programs: its traffic takes the same way through the same stand-in
/// ztunnel as under istio-cni's rules above, the app sees the client's own address, and
/// nothing of netfilter is in the pod's namespace.
#[test]
fn redirectors_programs_send_a_pods_traffic_through_the_stand_in_ztunnel() {
    privileged!();
    let topology = Topology::new("amb-rd");
    let _servers = PodServers::start(&topology);
    let node = TestNode::new("amb-rd");
    let socket = node.state.path().join("ztunnel.sock");
    let daemon = ztunnels_daemon(&node, &socket);
    let ztunnel = StandInProcess::start("amb-rd-zt", &socket);
    wait_state(&daemon, "synced");

    let netns = topology.pod.path().display().to_string();
    let out = daemon.add_ambient(
        &topology.pod,
        &topology.pod_cgroup,
        "default/app",
        "amb-rd-uid",
    );
    if let Some(why) = ambient_not_served(&node.root) {
        // Refused, saying why (status says it too), and nothing of the pod kept.
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        let refusal = "ambient pods need ztunnel's programs";
        assert!(stderr.contains(refusal), "{stderr}");
        assert!(why.contains(refusal), "status: {why}");
        assert!(daemon.pod_names().is_empty(), "{:?}", daemon.pod_names());
        assert!(cgroup_attachments(topology.pod_cgroup.path()).is_empty());
        return;
    }
    // `status` shows where ztunnel's programs are.
    let object = &status(&node.root)["objects"][0];
    assert_eq!(object["ambient_unsupported"], Value::Null);
    assert_eq!(
        object["ztunnel_links"],
        serde_json::json!(["getsockopt", "sock_ops"])
    );
    assert!(
        out.status.success(),
        "pod add: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        daemon.log()
    );
    ztunnel.wait_line("the pod enrolled", "added amb-rd-uid");
    assert_traffic_through(&topology, &ztunnel, AppSeenFrom::Loopback);
    let rules = topology.pod.run(&["iptables-save"]);
    assert!(!rules.contains("REDIRECT"), "{rules}");

    // The daemon killed: the pinned programs keep the pod captured, ztunnel's proxies live
    // on; restarted, it sends ztunnel a snapshot that keeps the pod.
    let killed = daemon.kill();
    ztunnel.wait_line("the agent gone", "agent gone");
    assert_traffic_through(&topology, &ztunnel, AppSeenFrom::Loopback);
    let daemon = killed.restart();
    ztunnel.wait_line("the pod kept", "kept amb-rd-uid");
    wait_state(&daemon, "synced");

    // Taken out: ztunnel is told, and the pod's connections go straight again.
    assert_success(&daemon.pod(&["del", "--netns", &netns]));
    ztunnel.wait_line("the pod taken out", "deleted amb-rd-uid");
    assert_service_reached(&topology);
}

/// DNS under istio-cni's rules, applied with DNS capture on in one pod and off in
/// another: [`assert_dns_through`], ztunnel seeing each query from the pod's address.
#[test]
fn istio_cnis_rules_send_a_pods_dns_to_the_stand_in_ztunnels_dns_proxy_where_capture_is_on() {
    privileged!();
    let pods = DnsPods::start("amb-refdns");
    istio_cni::apply_with(&pods.on.pod, DnsCapture::On);
    istio_cni::apply_with(&pods.off.pod, DnsCapture::Off);
    let zds_dir = StateDir::new("amb-refdns-zds");
    let socket = zds_dir.path().join("ztunnel.sock");
    let enrolled = vec![
        workload("amb-refdns-on", &pods.on.pod),
        workload("amb-refdns-off", &pods.off.pod),
    ];
    let _agent = TestAgent::start(&socket, enrolled, EVENTUALLY);
    let ztunnel = StandInProcess::start("amb-refdns-zt", &socket);
    ztunnel.wait_line("the pod with DNS capture", "added amb-refdns-on-uid");
    ztunnel.wait_line("the pod without", "added amb-refdns-off-uid");
    pods.assert_dns(&ztunnel, AppSeenFrom::PodAddress);
}

/// The same two pods enrolled through the daemon's API with the annotation
/// `ambient.istio.io/dns-capture` "true" and "false": their DNS takes the same ways as
/// under istio-cni's rules above, ztunnel seeing each query from loopback.
#[test]
fn redirectors_programs_send_a_pods_dns_to_the_stand_in_ztunnels_dns_proxy_where_capture_is_on() {
    privileged!();
    let pods = DnsPods::start("amb-rddns");
    let node = TestNode::new("amb-rddns");
    let socket = node.state.path().join("ztunnel.sock");
    let daemon = ztunnels_daemon(&node, &socket);
    let ztunnel = StandInProcess::start("amb-rddns-zt", &socket);
    wait_state(&daemon, "synced");
    for (topology, uid, dns_capture) in [
        (&pods.on, "amb-rddns-on", "true"),
        (&pods.off, "amb-rddns-off", "false"),
    ] {
        let out = daemon.add_ambient_annotated(
            &topology.pod,
            &topology.pod_cgroup,
            &format!("default/{uid}"),
            uid,
            &[(DNS_CAPTURE, dns_capture)],
        );
        if let Some(why) = ambient_not_served(&node.root) {
            // The refusal itself is the traffic scenario's to check.
            eprintln!("note: ambient pods are not served here: {why}");
            assert!(!out.status.success());
            return;
        }
        assert!(
            out.status.success(),
            "pod add {uid}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            daemon.log()
        );
        ztunnel.wait_line("the pod enrolled", &format!("added {uid}"));
    }
    pods.assert_dns(&ztunnel, AppSeenFrom::Loopback);
}

/// Why the node's object under `root` (the daemon's) serves no ambient pod, as `status`
/// says — on a kernel before 5.15, or with the fallbacks forced, the object is loaded
/// without ztunnel's programs — or `None` where it serves them.
fn ambient_not_served(root: &PinRoot) -> Option<String> {
    let status = status(root);
    let why = &status["objects"][0]["ambient_unsupported"];
    why.as_str().map(str::to_owned)
}

/// The source istio's host rules give kubelet's probes.
const PROBE_SOURCE: Ipv4Addr = Ipv4Addr::new(169, 254, 7, 127);

/// The service (port 80, in the topology's service namespace) and the pod's app (8080),
/// on IPv4 and IPv6; the service's namespace also has the probes' source address.
struct PodServers {
    _service: ChildGuard,
    _app: ChildGuard,
}

impl PodServers {
    fn start(topology: &Topology) -> PodServers {
        let mut service = ProbeServer::serve(&topology.service, "svc");
        let mut app = ProbeServer::serve(&topology.pod, "app").cgroup(&topology.pod_cgroup);
        for v6 in [false, true] {
            service = service.listen(topology.service_addr(v6, 80));
            app = app.listen(topology.pod_addr(v6, 8080));
        }
        topology.add_service_addr(IpAddr::V4(PROBE_SOURCE));
        PodServers {
            _service: service.start(),
            _app: app.start(),
        }
    }
}

/// The pod's app reaches the service (IPv4) with its connection.
fn assert_service_reached(topology: &Topology) {
    assert_service_reached_over(topology, false);
}

/// The pod's app reaches the service over IPv6 (`v6`) or IPv4; the service's address.
fn assert_service_reached_over(topology: &Topology, v6: bool) -> SocketAddr {
    let service = topology.service_addr(v6, 80);
    let out = topology.connect(APP_UID, APP_UID, service);
    assert!(
        matches!(&out, ConnOutcome::Served { name, .. } if name == "svc"),
        "outbound to {service}: {out:?}"
    );
    service
}

/// Where ztunnel's outbound listener sees the app's connection come from.
#[derive(Clone, Copy)]
enum AppSeenFrom {
    /// The pod's address: iptables' REDIRECT rewrites only the destination, after the
    /// source was chosen for the original one.
    PodAddress,
    /// Loopback: the connect program sends the connection to ztunnel's listener on
    /// loopback before the source is chosen, so the kernel picks loopback's (ztunnel knows
    /// the pod by the namespace its listener is in, not by the address).
    Loopback,
}

/// The pod's outbound connections (IPv4 and IPv6) reach the service through ztunnel's
/// 15001, which reads their original destination; inbound ones reach the app through its
/// 15006 with the client's own address; kubelet's probe (from 169.254.7.127, the source
/// istio's host rules give it) reaches the app past ztunnel.
fn assert_traffic_through(topology: &Topology, ztunnel: &StandInProcess, seen_from: AppSeenFrom) {
    let probe = IpAddr::V4(PROBE_SOURCE);
    let app = topology.pod_addr(false, 8080);
    let out = connect_from(&topology.service, None, 0, 0, app, Some(probe));
    assert!(
        matches!(&out, ConnOutcome::Served { name, peer, .. } if name == "app" && peer.ip() == probe),
        "the probe: {out:?}"
    );
    for v6 in [false, true] {
        let (service, app) = (
            assert_service_reached_over(topology, v6),
            topology.pod_addr(v6, 8080),
        );
        let from = app_seen_from(topology, seen_from, service);
        ztunnel
            .process
            .wait_line("the outbound connection", EVENTUALLY, |line| {
                proxied(line, "outbound") == Some((from, service))
            });

        let client = service.ip();
        let out = connect_from(&topology.service, None, 0, 0, app, None);
        match &out {
            ConnOutcome::Served { name, peer, .. } => {
                assert_eq!(name, "app", "inbound to {app}: {out:?}");
                assert_eq!(peer.ip(), client, "the app sees the client's address");
            }
            _ => panic!("inbound to {app}: {out:?}"),
        }
        ztunnel
            .process
            .wait_line("the inbound connection", EVENTUALLY, |line| {
                let seen = proxied(line, "inbound");
                assert_ne!(
                    seen.map(|(from, _)| from),
                    Some(probe),
                    "the probe went through ztunnel"
                );
                seen == Some((client, app))
            });
    }
}

/// A stand-in ztunnel's line `KIND PEER ORIGINAL`: the peer's address and the original
/// destination.
fn proxied(line: &str, kind: &str) -> Option<(IpAddr, SocketAddr)> {
    match ztunnel_saw(line, kind)? {
        (peer, Some(original)) => Some((peer, original)),
        (_, None) => None,
    }
}

/// A stand-in ztunnel's line `KIND PEER [ORIGINAL]`: the peer's address and the original
/// destination where the line has one.
fn ztunnel_saw(line: &str, kind: &str) -> Option<(IpAddr, Option<SocketAddr>)> {
    let mut words = line.split_whitespace();
    (words.next()? == kind).then_some(())?;
    let peer: SocketAddr = words.next()?.parse().ok()?;
    let original = match words.next() {
        Some(word) => Some(word.parse().ok()?),
        None => None,
    };
    Some((peer.ip(), original))
}

/// The pod `default/NAME` (uid `NAME-uid`) as the test, playing istio-cni's agent, enrolls
/// it with ztunnel.
fn workload(name: &str, netns: &NetNs) -> Workload {
    Workload {
        uid: format!("{name}-uid"),
        info: WorkloadInfo {
            name: name.to_owned(),
            namespace: "default".to_owned(),
            service_account: "default".to_owned(),
        },
        netns: netns.path(),
    }
}

/// What the pod's resolver (in the other namespace) answers, and the one on a loopback
/// address of the pod's own (as systemd-resolved's 127.0.0.53).
const RESOLVER_ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const RESOLVER_ANSWER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
const LOOPBACK_RESOLVER: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 53)), DNS_PORT);
const LOOPBACK_RESOLVER_ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 7);

/// Two pods, each with its resolvers, for the DNS scenario: `on` with DNS capture, `off`
/// without. Fields drop in order: the resolvers before their namespaces.
struct DnsPods {
    _resolvers: Vec<ChildGuard>,
    on: Topology,
    off: Topology,
}

impl DnsPods {
    fn start(hint: &str) -> DnsPods {
        use_dnsprobe_bin(env!("CARGO_BIN_EXE_dnsprobe"));
        let (on, off) = (
            Topology::new(&format!("{hint}-on")),
            Topology::new(&format!("{hint}-off")),
        );
        let mut resolvers = Vec::new();
        for topology in [&on, &off] {
            let answer_v6 = Some(RESOLVER_ANSWER_V6);
            let remote =
                DnsServer::server(&topology.service, "resolver", RESOLVER_ANSWER, answer_v6)
                    .listen(topology.service_addr(false, DNS_PORT))
                    .listen(topology.service_addr(true, DNS_PORT));
            let on_loopback =
                DnsServer::server(&topology.pod, "loopback", LOOPBACK_RESOLVER_ANSWER, None)
                    .listen(LOOPBACK_RESOLVER);
            resolvers.extend([remote.start(), on_loopback.start()]);
        }
        for topology in [&on, &off] {
            topology.wait_ipv6_ready();
        }
        DnsPods {
            _resolvers: resolvers,
            on,
            off,
        }
    }

    /// Each pod's app queries its resolvers ([`assert_dns_through`]).
    fn assert_dns(&self, ztunnel: &StandInProcess, seen_from: AppSeenFrom) {
        assert_dns_through(&self.on, ztunnel, DnsCapture::On, seen_from);
        assert_dns_through(&self.off, ztunnel, DnsCapture::Off, seen_from);
    }
}

/// Which way an app's DNS query goes, by istio-cni's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DnsWay {
    /// To ztunnel's DNS proxy (15053), which answers it.
    Proxy,
    /// Straight to the resolver asked.
    Resolver,
    /// As any TCP, through ztunnel's outbound listener (15001) to the resolver.
    Outbound,
}

/// With DNS capture, UDP 53 goes to the proxy unless it leaves through `lo`, TCP 53 unless
/// it is to 127.0.0.1 (or ::1); without, TCP 53 is outbound TCP like any other, except to
/// the pod's own addresses.
fn dns_way(dns: DnsCapture, resolver: SocketAddr, mode: DnsMode) -> DnsWay {
    let through_lo = resolver.ip().is_loopback();
    match (dns, mode) {
        (DnsCapture::On, DnsMode::Tcp) => DnsWay::Proxy,
        (DnsCapture::On, _) if through_lo => DnsWay::Resolver,
        (DnsCapture::On, _) => DnsWay::Proxy,
        (DnsCapture::Off, DnsMode::Tcp) if !through_lo => DnsWay::Outbound,
        (DnsCapture::Off, _) => DnsWay::Resolver,
    }
}

/// The app's queries (an A record; UDP sent and connected, and TCP) to its resolver in the
/// other namespace (IPv4 and IPv6) and to the one on 127.0.0.53 take the way [`dns_way`]
/// says: the answer is the proxy's or the resolver's, a UDP reply always comes from the
/// resolver's address the app asked (restored where the proxy answered), and ztunnel says
/// it saw the query (over TCP with the resolver as its original destination) from the
/// address `seen_from` says.
fn assert_dns_through(
    topology: &Topology,
    ztunnel: &StandInProcess,
    dns: DnsCapture,
    seen_from: AppSeenFrom,
) {
    let app = DnsClient::new(topology, Some(&topology.pod_cgroup), 1000, 1000);
    let resolvers = [
        topology.service_addr(false, DNS_PORT),
        topology.service_addr(true, DNS_PORT),
        LOOPBACK_RESOLVER,
    ];
    for resolver in resolvers {
        for mode in DnsMode::ALL {
            let way = dns_way(dns, resolver, mode);
            let what = format!("{dns:?}: {mode} to {resolver}, {way:?}");
            let answer = match way {
                DnsWay::Proxy => PROXY_ANSWER_V4,
                _ if resolver == LOOPBACK_RESOLVER => LOOPBACK_RESOLVER_ANSWER,
                _ => RESOLVER_ANSWER,
            };
            let reply = DnsOutcome::Reply {
                rcode: 0,
                addrs: vec![answer.into()],
                from: (mode != DnsMode::Tcp).then_some(resolver),
            };
            assert_eq!(app.query(resolver, mode), reply, "{what}");
            let from = app_seen_from(topology, seen_from, resolver);
            let kind = match (way, mode) {
                (DnsWay::Resolver, _) => continue,
                (DnsWay::Proxy, DnsMode::Tcp) => "dns-tcp",
                (DnsWay::Proxy, _) => "dns-udp",
                (DnsWay::Outbound, _) => "outbound",
            };
            // A UDP query's original destination shows only at the app (the reply's source).
            let original = (kind != "dns-udp").then_some(resolver);
            ztunnel.process.wait_line(&what, EVENTUALLY, |line| {
                ztunnel_saw(line, kind) == Some((from, original))
            });
        }
    }
}

/// The address ztunnel sees the app's connection or query to `dst` come from: loopback's
/// when `dst` is on loopback, else as `seen_from` says.
fn app_seen_from(topology: &Topology, seen_from: AppSeenFrom, dst: SocketAddr) -> IpAddr {
    let loopback = match dst.ip() {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    };
    match seen_from {
        _ if dst.ip().is_loopback() => loopback,
        AppSeenFrom::PodAddress => topology.pod_addr(dst.is_ipv6(), 0).ip(),
        AppSeenFrom::Loopback => loopback,
    }
}

/// The workloads file of a real ztunnel (`LOCAL_XDS_PATH`): each pod with its address, over
/// HBONE, on node `node`.
fn ztunnel_workloads(pods: &[(&str, IpAddr)]) -> String {
    let mut yaml = String::from("workloads:\n");
    for (name, ip) in pods {
        yaml.push_str(&format!(
            "- uid: {name}-uid\n  name: {name}\n  namespace: default\n  serviceAccount: default\n  workloadIps: [\"{ip}\"]\n  protocol: HBONE\n  node: node\n  network: \"\"\n  services: {{}}\n"
        ));
    }
    yaml
}

/// istio's own ztunnel, built from istio/ztunnel (`--no-default-features --features
/// tls-ring,testing`) and named by `ZTUNNEL_BIN`: two pods enrolled by the agent, under
/// istio-cni's rules, and a connection from one to the other through HBONE, counted by
/// ztunnel. CI cannot fetch ztunnel; the stand-in is its partner there.
#[test]
#[ignore = "needs ZTUNNEL_BIN, a ztunnel built from istio/ztunnel"]
fn a_real_ztunnel_carries_pod_to_pod_through_hbone_under_istio_cnis_rules() {
    privileged!();
    let topology = Topology::new("amb-real");
    // The pod `a` in the topology's pod namespace, `b` in its other one.
    let (a, b) = (&topology.pod, &topology.service);
    let (a_ip, b_ip) = (topology.pod_ip4(), topology.service_ip4());
    istio_cni::apply(a);
    istio_cni::apply(b);
    let b_cgroup = Cgroup::new("amb-real-b");
    let _app = ProbeServer::serve(b, "app")
        .listen(SocketAddr::new(b_ip.into(), 8080))
        .cgroup(&b_cgroup)
        .start();

    let dir = StateDir::new("amb-real-zds");
    let socket = dir.path().join("ztunnel.sock");
    let workloads = dir.path().join("workloads.yaml");
    std::fs::write(
        &workloads,
        ztunnel_workloads(&[("a", a_ip.into()), ("b", b_ip.into())]),
    )
    .unwrap();
    let pods = vec![workload("a", a), workload("b", b)];
    let agent = TestAgent::start(&socket, pods, EVENTUALLY);
    let ztunnel = RealZtunnel::start("amb-real-zt", &socket, &workloads);
    let synced = within(Duration::from_secs(60), || {
        matches!(agent.agent.ztunnel(), zds::agent::Ztunnel::Synced(_))
    });
    assert!(synced.is_some(), "ztunnel: {}", ztunnel.process.stderr());

    let a_cgroup = Cgroup::new("amb-real-a");
    assert_hbone_from_a_to_b(&topology, &a_cgroup, &ztunnel);
}

/// The same two pods enrolled through the daemon's API and captured by redirector's
/// programs, with istio's own ztunnel (`ZTUNNEL_BIN`): pod a's connection to pod b goes
/// through ztunnel's 15001 in a, HBONE to its 15008 in b, and on to the app, which sees
/// a's address; ztunnel counts it on both sides.
#[test]
#[ignore = "needs ZTUNNEL_BIN, a ztunnel built from istio/ztunnel"]
fn a_real_ztunnel_carries_pod_to_pod_through_hbone_under_redirectors_programs() {
    privileged!();
    let topology = Topology::new("amb-realrd");
    let b_ip = topology.service_ip4();
    let (a_cgroup, b_cgroup) = (Cgroup::new("amb-realrd-a"), Cgroup::new("amb-realrd-b"));
    let _app = ProbeServer::serve(&topology.service, "app")
        .listen(SocketAddr::new(b_ip.into(), 8080))
        .cgroup(&b_cgroup)
        .start();
    let a = (topology.pod_ip4(), &topology.pod, &a_cgroup);
    let b = (b_ip, &topology.service, &b_cgroup);
    let (_node, _daemon, ztunnel) = real_ztunnel_node("amb-realrd", &[("a", a), ("b", b)]);
    assert_hbone_from_a_to_b(&topology, &a_cgroup, &ztunnel);
}

/// One pod enrolled through the daemon's API with istio's own ztunnel (`ZTUNNEL_BIN`),
/// the topology's other namespace outside the mesh: the pod's connection out reaches the
/// server there through ztunnel (passthrough), a connection in reaches the app through
/// ztunnel's 15006 with the client's address, and kubelet's probe reaches the app past
/// ztunnel.
#[test]
#[ignore = "needs ZTUNNEL_BIN, a ztunnel built from istio/ztunnel"]
fn a_real_ztunnel_carries_a_pods_traffic_to_and_from_outside_the_mesh_under_redirectors_programs() {
    privileged!();
    let topology = Topology::new("amb-realio");
    let _servers = PodServers::start(&topology);
    let a = (topology.pod_ip4(), &topology.pod, &topology.pod_cgroup);
    let (_node, _daemon, ztunnel) = real_ztunnel_node("amb-realio", &[("a", a)]);
    let (service, app) = (
        topology.service_addr(false, 80),
        topology.pod_addr(false, 8080),
    );
    let out = topology.connect(1000, 1000, service);
    assert!(
        matches!(&out, ConnOutcome::Served { name, .. } if name == "svc"),
        "inside out: {out:?}\nztunnel: {}",
        ztunnel.process.stderr()
    );
    let out = connect_from(&topology.service, None, 0, 0, app, None);
    assert!(
        matches!(&out, ConnOutcome::Served { name, peer, .. } if name == "app" && peer.ip() == service.ip()),
        "outside in: {out:?}\nztunnel: {}",
        ztunnel.process.stderr()
    );
    let probe = IpAddr::V4(PROBE_SOURCE);
    let out = connect_from(&topology.service, None, 0, 0, app, Some(probe));
    assert!(
        matches!(&out, ConnOutcome::Served { name, peer, .. } if name == "app" && peer.ip() == probe),
        "the probe: {out:?}"
    );
    let opened = connections_opened(&ztunnel);
    eprintln!("{}", opened.join("\n"));
    // One each way: the probe is not among them.
    for (reporter, peer) in [("source", "destination"), ("destination", "source")] {
        let counted = |l: &&String| {
            l.contains(&format!("reporter=\"{reporter}\""))
                && l.contains(&format!("{peer}_principal=\"unknown\""))
                && l.ends_with("} 1")
        };
        assert!(
            opened.iter().any(|l| counted(&l)),
            "no {reporter} count of 1 with an unknown {peer}: {opened:?}"
        );
    }
}

/// ztunnel's `istio_tcp_connections_opened_total` lines.
fn connections_opened(ztunnel: &RealZtunnel) -> Vec<String> {
    let metrics = ztunnel
        .netns
        .run(&["curl", "-s", "http://127.0.0.1:15020/metrics"]);
    metrics
        .lines()
        .filter(|l| l.starts_with("istio_tcp_connections_opened_total"))
        .map(str::to_owned)
        .collect()
}

/// A daemon node serving istio's own ztunnel (`ZTUNNEL_BIN`), with `pods` (name, address,
/// namespace, cgroup) in ztunnel's workloads and enrolled through the daemon's API
/// (`default/NAME`, uid `NAME-uid`). Fields drop in order: ztunnel last, after the daemon.
fn real_ztunnel_node(
    hint: &str,
    pods: &[(&str, (Ipv4Addr, &NetNs, &Cgroup))],
) -> (TestNode, Daemon, RealZtunnel) {
    let node = TestNode::new(hint);
    let socket = node.state.path().join("ztunnel.sock");
    let workloads = node.state.path().join("workloads.yaml");
    let addresses: Vec<(&str, IpAddr)> = pods
        .iter()
        .map(|(n, (ip, ..))| (*n, (*ip).into()))
        .collect();
    std::fs::write(&workloads, ztunnel_workloads(&addresses)).unwrap();
    let daemon = ztunnels_daemon(&node, &socket);
    let ztunnel = RealZtunnel::start(&format!("{hint}-zt"), &socket, &workloads);
    wait_state(&daemon, "synced");
    for (name, (_, netns, cgroup)) in pods {
        let out = daemon.add_ambient(
            netns,
            cgroup,
            &format!("default/{name}"),
            &format!("{name}-uid"),
        );
        assert!(
            out.status.success(),
            "pod add {name}: {}\nztunnel: {}",
            String::from_utf8_lossy(&out.stderr),
            ztunnel.process.stderr()
        );
    }
    (node, daemon, ztunnel)
}

/// Pod a (the topology's pod namespace, an app in `a_cgroup`) connects to the app on
/// 8080 of pod b (its other namespace): served, the app sees a's address, and ztunnel
/// counts the connection as its destination.
fn assert_hbone_from_a_to_b(topology: &Topology, a_cgroup: &Cgroup, ztunnel: &RealZtunnel) {
    let (a, a_ip, b_ip) = (&topology.pod, topology.pod_ip4(), topology.service_ip4());
    let b_app = SocketAddr::new(b_ip.into(), 8080);
    let out = connect_from(a, Some(a_cgroup), APP_UID, APP_UID, b_app, None);
    match &out {
        ConnOutcome::Served { name, peer, .. } => {
            assert_eq!(name, "app", "{out:?}");
            assert_eq!(
                peer.ip(),
                IpAddr::from(a_ip),
                "the app sees pod a's address"
            );
        }
        _ => panic!("a → b: {out:?}\nztunnel: {}", ztunnel.process.stderr()),
    }
    let opened = connections_opened(ztunnel);
    eprintln!("{}", opened.join("\n"));
    let counted = opened
        .iter()
        .any(|l| l.contains("reporter=\"destination\""));
    assert!(counted, "{opened:?}");
}

/// istio's own ztunnel (`ZTUNNEL_BIN`, as above) on the daemon's socket: synced, and ready
/// by its own readiness probe, which waits for a snapshot.
#[test]
#[ignore = "needs ZTUNNEL_BIN, a ztunnel built from istio/ztunnel"]
fn a_real_ztunnel_is_synced_and_ready_on_the_daemons_socket() {
    privileged!();
    let node = TestNode::new("amb-real-daemon");
    let run = StateDir::new("amb-real-run");
    let socket = run.path().join("ztunnel.sock");
    let workloads = run.path().join("workloads.yaml");
    std::fs::write(&workloads, "workloads: []\n").unwrap();
    let daemon = ztunnels_daemon(&node, &socket);
    let ztunnel = RealZtunnel::start("amb-real-dzt", &socket, &workloads);
    wait_state(&daemon, "synced");
    let health = "curl -s -o /dev/null -w %{http_code} http://127.0.0.1:15021/healthz/ready";
    let ready = within(Duration::from_secs(30), || {
        ztunnel.netns.run(&words(health)).trim() == "200"
    });
    assert!(ready.is_some(), "not ready: {}", ztunnel.process.stderr());
}

/// ztunnel's daemon on `node` with the stand-in `start` makes at its socket, synced.
fn synced_with_standin(
    node: &TestNode,
    start: impl FnOnce(&Path) -> StandInProcess,
) -> (Daemon, StandInProcess) {
    let socket = node.state.path().join("ztunnel.sock");
    let daemon = ztunnels_daemon(node, &socket);
    let ztunnel = start(&socket);
    wait_state(&daemon, "synced");
    (daemon, ztunnel)
}

/// `redirector daemon` of `node` serving ztunnel at `socket`, its metrics on loopback.
fn ztunnels_daemon(node: &TestNode, socket: &Path) -> Daemon {
    let socket = socket.display().to_string();
    Daemon::start_with(
        &node.root,
        &node.node,
        &node.state,
        &["--metrics-addr", "127.0.0.1:0", "--ztunnel-socket", &socket],
    )
}

/// istio's ztunnel (`ZTUNNEL_BIN`) in a namespace and cgroup of its own, in in-pod mode at
/// the agent's `socket`, its workloads read from `workloads`, its certificates fake. Fields
/// drop in order: the process before its namespace and cgroup.
struct RealZtunnel {
    process: ChildGuard,
    netns: NetNs,
    _cgroup: Cgroup,
}

impl RealZtunnel {
    fn start(hint: &str, socket: &Path, workloads: &Path) -> RealZtunnel {
        let bin = std::env::var("ZTUNNEL_BIN").expect("ZTUNNEL_BIN");
        let netns = NetNs::new(hint);
        let cgroup = Cgroup::new(hint);
        let process = Spawn::new(bin)
            .env("INPOD_UDS", socket)
            .env("XDS_ADDRESS", "")
            .env("LOCAL_XDS_PATH", workloads)
            .env("FAKE_CA", "true")
            .env("NODE_NAME", "node")
            .netns(&netns)
            .cgroup(&cgroup)
            .spawn();
        RealZtunnel {
            process,
            netns,
            _cgroup: cgroup,
        }
    }
}

/// The chained plugin's network configuration on an ambient network: the daemon at
/// `socket`, the pods' labels read at `cri`, the pod in `netns` with its address.
fn ambient_conf(node: &TestNode, socket: &Path, cri: &FakeCri, netns: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "pods",
        "type": "redirector-cni",
        "dialect": "ambient",
        "socket": socket,
        "criSocket": cri.socket(),
        "pinRoot": node.root.path(),
        "stateDir": node.state.path(),
        "excludeNamespaces": ["kube-system", "istio-system"],
        "ambientNamespaces": [],
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": netns}],
            "ips": [{"address": "10.1.0.2/16", "interface": 0}]
        }
    })
}

/// CNI_ARGS for pod `default/NAME` with `uid`, as containerd writes them.
fn cni_args(name: &str, uid: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=x;K8S_POD_UID={uid}")
}

/// The uid kubelet named the pod's cgroup after (`pod<uid>`).
fn uid_of(cgroup: &Cgroup) -> String {
    let name = cgroup.path().file_name().unwrap().to_string_lossy();
    name.strip_prefix("pod").expect("a pod's cgroup").to_owned()
}

/// The chained plugin as the runtime calls it: a pod labelled
/// `istio.io/dataplane-mode=ambient` (its labels from the CRI) is enrolled through the
/// daemon with ztunnel and its traffic goes through the stand-in; pods without the label
/// are left alone; DEL takes the pod out and tells ztunnel, and a second DEL passes.
#[test]
fn the_chained_plugin_enrolls_a_labelled_pod_through_the_daemon_and_del_takes_it_out() {
    privileged!();
    let node = TestNode::new("amb-cni");
    let topology = Topology::under(&node.node, "amb-cni");
    let _servers = PodServers::start(&topology);
    let (daemon, ztunnel) =
        synced_with_standin(&node, |at| StandInProcess::start("amb-cni-zt", at));
    let cri = FakeCri::start("amb-cni-cri");
    let plugin = CniPlugin::new();
    let uid = uid_of(&topology.pod_cgroup);
    let netns = topology.pod.path().display().to_string();
    let conf = ambient_conf(&node, daemon.socket(), &cri, &topology.pod.path());
    cri.sandbox(
        "sb-app",
        &[("app", "web"), ("istio.io/dataplane-mode", "ambient")],
        &[],
    );

    let add = plugin.call_with_args(&cni_args("app", &uid), "ADD", "sb-app", &netns, &conf);
    if ambient_not_served(&node.root).is_some() {
        // Fails closed, saying why; nothing of the pod kept.
        let err = failed(add);
        assert_eq!(err["code"], 100, "{err}");
        let msg = err["msg"].as_str().unwrap_or("");
        assert!(
            msg.contains("ambient pods need ztunnel's programs"),
            "{err}"
        );
        assert!(daemon.pod_names().is_empty(), "{:?}", daemon.pod_names());
        return;
    }
    let result = succeeded(add);
    // Chained: the previous result, passed on.
    assert_eq!(result["ips"][0]["address"], "10.1.0.2/16", "{result}");
    ztunnel.wait_line("the pod enrolled", &format!("added {uid}"));
    assert_eq!(daemon.pod_names(), ["default/app"], "{}", daemon.log());
    assert_traffic_through(&topology, &ztunnel, AppSeenFrom::Loopback);
    // Its programs at its own cgroup, which the plugin found by the pod's uid.
    assert!(!cgroup_attachments(topology.pod_cgroup.path()).is_empty());
    // CHECK: the pod is enrolled as planned.
    succeeded(plugin.call_with_args(&cni_args("app", &uid), "CHECK", "sb-app", &netns, &conf));

    // Not labelled, labelled out, or unknown to the runtime: left alone, ADD passes.
    cri.sandbox("sb-plain", &[("app", "plain")], &[]);
    cri.sandbox("sb-out", &[("istio.io/dataplane-mode", "none")], &[]);
    for (sandbox, name) in [
        ("sb-plain", "plain"),
        ("sb-out", "out"),
        ("sb-unknown", "unknown"),
    ] {
        let other = NetNs::new(&format!("amb-cni-{name}"));
        let path = other.path().display().to_string();
        let conf = ambient_conf(&node, daemon.socket(), &cri, &other.path());
        let args = cni_args(name, &format!("{name}-uid"));
        succeeded(plugin.call_with_args(&args, "ADD", sandbox, &path, &conf));
        succeeded(plugin.call_with_args(&args, "DEL", sandbox, &path, &conf));
    }
    assert_eq!(daemon.pod_names(), ["default/app"]);

    // DEL: ztunnel told, the capture gone, the pod's connections straight again.
    succeeded(plugin.call_with_args(&cni_args("app", &uid), "DEL", "sb-app", &netns, &conf));
    ztunnel.wait_line("the pod taken out", &format!("deleted {uid}"));
    assert_nothing_kept_of(&daemon, &topology.pod, None);
    assert_service_reached(&topology);
    // Again, the namespace gone as after the runtime's teardown: still passes.
    succeeded(plugin.call_with_args(&cni_args("app", &uid), "DEL", "sb-app", "", &conf));
}

/// A labelled pod's ADD fails — a CNI error, the runtime retries the pod's start — when
/// ztunnel never acks or the daemon is down, and nothing of the pod is left; a pod outside
/// the mesh passes ADD with the daemon down.
#[test]
fn an_ambient_pods_add_fails_when_ztunnel_never_acks_or_the_daemon_is_down() {
    privileged!();
    let node = TestNode::new("amb-cnf");
    let pod_cgroup = Cgroup::pod_under(&node.node);
    let pod = NetNs::new("amb-cnf-pod");
    let netns = pod.path().display().to_string();
    let uid = uid_of(&pod_cgroup);
    let cri = FakeCri::start("amb-cnf-cri");
    cri.sandbox("sb-app", &[("istio.io/dataplane-mode", "ambient")], &[]);
    cri.sandbox("sb-plain", &[], &[]);
    let plugin = CniPlugin::new();
    let args = cni_args("app", &uid);

    // No daemon: fails closed for the meshed pod (try again later), open for the other.
    let nowhere = node.state.path().join("no-daemon.sock");
    let conf = ambient_conf(&node, &nowhere, &cri, &pod.path());
    let err = failed(plugin.call_with_args(&args, "ADD", "sb-app", &netns, &conf));
    assert_eq!(err["code"], 11, "{err}");
    assert_contains(err["msg"].as_str().unwrap_or(""), "not reachable");
    succeeded(plugin.call_with_args(
        &cni_args("plain", "plain-uid"),
        "ADD",
        "sb-plain",
        &netns,
        &conf,
    ));
    succeeded(plugin.call_with_args(&args, "DEL", "sb-app", &netns, &conf));

    // ztunnel connected but silent: the add fails once the agent gives up on its ack.
    let (daemon, ztunnel) =
        synced_with_standin(&node, |at| StandInProcess::start_silent("amb-cnf-zt", at));
    let conf = ambient_conf(&node, daemon.socket(), &cri, &pod.path());
    let err = failed(plugin.call_with_args(&args, "ADD", "sb-app", &netns, &conf));
    assert_eq!(err["code"], 100, "{err}");
    let msg = err["msg"].as_str().unwrap_or("");
    if ambient_not_served(&node.root).is_none() {
        assert!(
            msg.contains("ztunnel") && msg.contains("nothing of the pod was kept"),
            "{err}"
        );
        ztunnel.wait_line("the add unanswered", &format!("silent on {uid}"));
    } else {
        assert!(
            msg.contains("ambient pods need ztunnel's programs"),
            "{err}"
        );
    }
    assert_nothing_kept_of(&daemon, &pod, Some(&pod_cgroup));
    // The runtime's DEL of the failed sandbox passes.
    succeeded(plugin.call_with_args(&args, "DEL", "sb-app", &netns, &conf));
}

/// The label that enrolls a pod in ambient, and the one that opts it out.
const LABEL_AMBIENT: (&str, &str) = ("istio.io/dataplane-mode", "ambient");
const LABEL_NONE: (&str, &str) = ("istio.io/dataplane-mode", "none");

/// The chained plugin's ambient entry (the daemon's socket of `node`, the pods' labels at
/// `cri`, namespace `shop` listed), chained after ptp in a configuration file of `dir` as
/// install-cni leaves it — the rules the daemon's repair reads — and the same entry as the
/// runtime passes it to the plugin for the pod in `netns`.
fn chain_ambient_network(dir: &Path, node: &TestNode, cri: &FakeCri, netns: &Path) -> Value {
    let socket = node.state.path().join("redirector.sock");
    let mut conf = ambient_conf(node, &socket, cri, netns);
    conf["ambientNamespaces"] = json!(["shop"]);
    let mut entry = conf.clone();
    for key in ["cniVersion", "name", "prevResult"] {
        entry.as_object_mut().unwrap().remove(key);
    }
    let list = json!({"cniVersion": "1.0.0", "name": "pods", "plugins": [{"type": "ptp"}, entry]});
    std::fs::write(dir.join("10-pods.conflist"), list.to_string()).unwrap();
    conf
}

/// `redirector daemon` of `node` repairing every second (`mode`: capture or report) by the
/// plugin's rules in `conf_dir`, the sandboxes read from `cri`; ztunnel's agent at
/// `ztunnel` when given.
fn repairing_daemon(
    node: &TestNode,
    conf_dir: &Path,
    cri: &FakeCri,
    mode: &str,
    ztunnel: Option<&Path>,
) -> Daemon {
    let (conf_dir, cri) = (conf_dir.display(), cri.socket().display());
    let mut flags = format!(
        "--metrics-addr 127.0.0.1:0 --cri-socket {cri} --cni-conf-dir {conf_dir} \
         --repair {mode} --repair-interval 1"
    );
    if let Some(socket) = ztunnel {
        flags.push_str(&format!(" --ztunnel-socket {}", socket.display()));
    }
    node.daemon_with(&flags)
}

/// The lines the stand-in ztunnel printed since the last read, once it is quiet for a
/// moment.
fn ztunnel_lines(ztunnel: &StandInProcess) -> Vec<String> {
    std::iter::from_fn(|| ztunnel.process.next_line(Duration::from_millis(300))).collect()
}

/// On containerd the plugin cannot read a sandbox's labels during its own ADD, so a pod
/// enrolled by its label alone is left alone there. The daemon's next repair round reads
/// the running sandboxes and their labels from the CRI and enrolls it through the API's
/// own add: ztunnel told, its traffic through the stand-in from then on. Sandboxes
/// unlabelled or labelled `none` (in a listed namespace) stay alone, and an enrolled pod is
/// not enrolled again; the repaired pod is the plugin's: its CNI DEL takes it out, ztunnel
/// told.
#[test]
fn a_pod_labelled_ambient_that_its_add_left_alone_is_enrolled_by_the_next_repair_round() {
    privileged!();
    let node = TestNode::new("amb-rep");
    let topology = Topology::under(&node.node, "amb-rep");
    let _servers = PodServers::start(&topology);
    let cri = FakeCri::start("amb-rep-cri");
    let conf_dir = StateDir::new("amb-rep-conf");
    let conf = chain_ambient_network(conf_dir.path(), &node, &cri, &topology.pod.path());
    let zsocket = node.state.path().join("ztunnel.sock");
    let daemon = repairing_daemon(&node, conf_dir.path(), &cri, "capture", Some(&zsocket));
    let ztunnel = StandInProcess::start("amb-rep-zt", &zsocket);
    wait_state(&daemon, "synced");
    let uid = uid_of(&topology.pod_cgroup);
    let netns = topology.pod.path().display().to_string();

    // ADD, the sandbox unknown to the runtime as containerd's is: its label unread, the pod
    // left alone.
    let plugin = CniPlugin::new();
    let args = cni_args("app", &uid);
    succeeded(plugin.call_with_args(&args, "ADD", "sb-app", &netns, &conf));
    assert!(daemon.pod_names().is_empty(), "{:?}", daemon.pod_names());

    // Running: listed with its labels, beside two sandboxes the rules leave alone.
    let (plain, out) = (NetNs::new("amb-rep-plain"), NetNs::new("amb-rep-out"));
    let plain_label = [("app", "plain")];
    cri.running(
        "sb-plain",
        "default/plain",
        "plain-uid",
        &plain.path(),
        &plain_label,
    );
    cri.running("sb-out", "shop/out", "out-uid", &out.path(), &[LABEL_NONE]);
    let pod_ns = topology.pod.path();
    let labels = [("app", "web"), LABEL_AMBIENT];
    cri.running("sb-app", "default/app", &uid, &pod_ns, &labels);

    if let Some(why) = ambient_not_served(&node.root) {
        // The enrollment fails as the API's add does, logged and counted, nothing kept.
        daemon.wait_until("the failed enrollment is not counted", || {
            daemon.has_metric("redirector_pods_uncaptured 1")
        });
        let log = daemon.log();
        assert_contains(&log, "repairing pod default/app (sandbox sb-app)");
        assert!(
            log.contains("ambient pods need ztunnel's programs"),
            "{why}\n{log}"
        );
        assert!(daemon.pod_names().is_empty(), "{:?}", daemon.pod_names());
        return;
    }
    ztunnel.wait_line(
        "the pod enrolled by a repair round",
        &format!("added {uid}"),
    );
    daemon.wait_until("the repair is not counted", || {
        daemon.has_metric("redirector_pods_repaired_total 1")
            && daemon.has_metric("redirector_pods_uncaptured 0")
    });
    assert_eq!(daemon.pod_names(), ["default/app"]);
    assert!(
        daemon
            .log()
            .contains("repaired pod default/app (sandbox sb-app)"),
        "{}",
        daemon.log()
    );
    assert_traffic_through(&topology, &ztunnel, AppSeenFrom::Loopback);
    // Two more rounds: nothing else is sent to ztunnel, nothing else is enrolled.
    std::thread::sleep(Duration::from_millis(2500));
    let sent: Vec<String> = ztunnel_lines(&ztunnel)
        .into_iter()
        .filter(|l| l.starts_with("added") || l.starts_with("kept"))
        .collect();
    assert!(sent.is_empty(), "{sent:?}");
    assert_eq!(daemon.pod_names(), ["default/app"]);
    assert!(daemon.has_metric("redirector_pods_repaired_total 1"));

    // The plugin's pod like any other: the runtime's teardown DELs it, ztunnel told.
    cri.remove("sb-app");
    succeeded(plugin.call_with_args(&args, "DEL", "sb-app", &netns, &conf));
    ztunnel.wait_line("the pod taken out", &format!("deleted {uid}"));
    assert_nothing_kept_of(&daemon, &topology.pod, None);
}

/// `--repair report` enrolls nothing: the labelled pod is logged and counted
/// (`redirector_pods_uncaptured`), ztunnel is sent nothing. A daemon that is not ztunnel's
/// agent repairs no pod of an ambient network, and says why once.
#[test]
fn repair_in_report_mode_or_without_ztunnel_enrolls_no_ambient_pod() {
    privileged!();
    let node = TestNode::new("amb-rpt");
    let pod = NetNs::new("amb-rpt-pod");
    let cri = FakeCri::start("amb-rpt-cri");
    let conf_dir = StateDir::new("amb-rpt-conf");
    chain_ambient_network(conf_dir.path(), &node, &cri, &pod.path());
    let pod_ns = pod.path();
    cri.running(
        "sb-app",
        "default/app",
        "app-uid",
        &pod_ns,
        &[LABEL_AMBIENT],
    );

    let zsocket = node.state.path().join("ztunnel.sock");
    let daemon = repairing_daemon(&node, conf_dir.path(), &cri, "report", Some(&zsocket));
    let ztunnel = StandInProcess::start("amb-rpt-zt", &zsocket);
    wait_state(&daemon, "synced");
    daemon.wait_until("the labelled pod is not reported", || {
        daemon.has_metric("redirector_pods_uncaptured 1")
    });
    let reported =
        "pod default/app (sandbox sb-app) should be captured and is not (--repair report)";
    assert!(daemon.log().contains(reported), "{}", daemon.log());
    std::thread::sleep(Duration::from_millis(2500));
    assert!(daemon.pod_names().is_empty(), "{:?}", daemon.pod_names());
    assert!(daemon.has_metric("redirector_pods_repaired_total 0"));
    let sent: Vec<String> = ztunnel_lines(&ztunnel)
        .into_iter()
        .filter(|l| l.starts_with("added"))
        .collect();
    assert!(sent.is_empty(), "{sent:?}");
    daemon.terminate();
    drop(ztunnel);

    // Not ztunnel's agent: the rounds pass the ambient network by, saying so once.
    let daemon = repairing_daemon(&node, conf_dir.path(), &cri, "capture", None);
    let why = "without --ztunnel-socket they are not repaired";
    daemon.wait_until("the daemon does not say why", || daemon.log().contains(why));
    std::thread::sleep(Duration::from_millis(2500));
    assert!(daemon.pod_names().is_empty(), "{:?}", daemon.pod_names());
    assert_eq!(daemon.log().matches(why).count(), 1, "{}", daemon.log());
}

/// A repair enrollment that fails is logged, counted uncaptured and tried again at the
/// next round, and leaves nothing of the pod: with ztunnel away (no add is tried), then
/// with a ztunnel that never acks (the add is undone); with one that acks, the pod is
/// enrolled and its traffic goes through it.
#[test]
fn a_failed_repair_enrollment_keeps_nothing_and_is_tried_again_next_round() {
    privileged!();
    let node = TestNode::new("amb-rpf");
    let topology = Topology::under(&node.node, "amb-rpf");
    let _servers = PodServers::start(&topology);
    let cri = FakeCri::start("amb-rpf-cri");
    let conf_dir = StateDir::new("amb-rpf-conf");
    chain_ambient_network(conf_dir.path(), &node, &cri, &topology.pod.path());
    let uid = uid_of(&topology.pod_cgroup);
    let pod_ns = topology.pod.path();
    cri.running("sb-app", "default/app", &uid, &pod_ns, &[LABEL_AMBIENT]);

    // ztunnel away: counted, said, not tried.
    let zsocket = node.state.path().join("ztunnel.sock");
    let daemon = repairing_daemon(&node, conf_dir.path(), &cri, "capture", Some(&zsocket));
    daemon.wait_until("the pod waiting for ztunnel is not counted", || {
        daemon.has_metric("redirector_pods_uncaptured 1")
            && daemon.log().contains("ztunnel is not connected")
    });
    assert_nothing_kept(&daemon, &topology);

    // A ztunnel that never acks: the add is tried and undone, and tried again.
    let silent = StandInProcess::start_silent("amb-rpf-zt", &zsocket);
    if let Some(why) = ambient_not_served(&node.root) {
        daemon.wait_until("the refused enrollment is not logged", || {
            daemon
                .log()
                .contains("ambient pods need ztunnel's programs")
        });
        assert!(daemon.has_metric("redirector_pods_uncaptured 1"), "{why}");
        assert_nothing_kept(&daemon, &topology);
        return;
    }
    silent.wait_line("the add unanswered", &format!("silent on {uid}"));
    let failures = || {
        let log = daemon.log();
        let failed = |l: &&str| {
            l.contains("repairing pod default/app (sandbox sb-app)")
                && l.contains("nothing of the pod was kept")
        };
        log.lines().filter(failed).count()
    };
    daemon.wait_until("the failed enrollment is not logged", || failures() >= 1);
    assert!(daemon.has_metric("redirector_pods_uncaptured 1"));
    assert!(daemon.has_metric("redirector_pods_repaired_total 0"));
    // Tried again at a later round, and failed again. (The stand-in's own lines cannot
    // tell: ztunnel's reconnection after the unanswered add is sent a snapshot too.)
    daemon.wait_until("the enrollment is not tried again", || failures() >= 2);
    // ztunnel gone, maybe while a third add waits: that one fails, and the rounds after it
    // try none, so what the failed adds left can be looked at with no add under way.
    let away = "ztunnel is not connected";
    let said_away = daemon.log().matches(away).count();
    drop(silent);
    daemon.wait_until("no round after the failed add", || {
        daemon.log().matches(away).count() > said_away
    });
    assert!(daemon.has_metric("redirector_pods_uncaptured 1"));
    assert_nothing_kept(&daemon, &topology);

    // A ztunnel that acks: enrolled at a following round.
    let ztunnel = StandInProcess::start("amb-rpf-zt2", &zsocket);
    ztunnel.wait_line("the pod enrolled", &format!("added {uid}"));
    daemon.wait_until("the repair is not counted", || {
        daemon.has_metric("redirector_pods_repaired_total 1")
            && daemon.has_metric("redirector_pods_uncaptured 0")
    });
    assert_eq!(daemon.pod_names(), ["default/app"]);
    assert_traffic_through(&topology, &ztunnel, AppSeenFrom::Loopback);
}

/// Nothing of the pod of `topology` is kept: no record, no programs at its cgroup, no
/// route back in its namespace.
fn assert_nothing_kept(daemon: &Daemon, topology: &Topology) {
    assert_nothing_kept_of(daemon, &topology.pod, Some(&topology.pod_cgroup));
}

/// Nothing of the pod in `pod` is kept: no record, no route back in its namespace, and no
/// programs at `cgroup` where the test looks at it.
fn assert_nothing_kept_of(daemon: &Daemon, pod: &NetNs, cgroup: Option<&Cgroup>) {
    assert!(daemon.pod_names().is_empty(), "{:?}", daemon.pod_names());
    if let Some(cgroup) = cgroup {
        assert!(cgroup_attachments(cgroup.path()).is_empty());
    }
    let rules = pod.run(&["ip", "rule", "list"]);
    assert!(
        !rules.contains("lookup 100"),
        "the route back is left: {rules}"
    );
}

/// CNI GC of an ambient pod whose sandbox the runtime no longer has: the daemon tells
/// ztunnel (`DelWorkload`) before the capture goes, as at DEL. With the daemon down, GC
/// takes the capture out itself, and the restarted daemon's snapshot leaves the pod out.
#[test]
fn cni_gc_of_an_ambient_pod_tells_ztunnel_first() {
    privileged!();
    let node = TestNode::new("amb-gc");
    let topology = Topology::under(&node.node, "amb-gc");
    let _servers = PodServers::start(&topology);
    let (daemon, ztunnel) = synced_with_standin(&node, |at| StandInProcess::start("amb-gc-zt", at));
    if ambient_not_served(&node.root).is_some() {
        // No ambient pod can be enrolled here, so none is collected.
        return;
    }
    let cri = FakeCri::start("amb-gc-cri");
    cri.sandbox("sb-1", &[LABEL_AMBIENT], &[]);
    cri.sandbox("sb-2", &[LABEL_AMBIENT], &[]);
    let plugin = CniPlugin::new();
    let uid = uid_of(&topology.pod_cgroup);
    let args = cni_args("app", &uid);
    let netns = topology.pod.path().display().to_string();
    let conf = ambient_conf(&node, daemon.socket(), &cri, &topology.pod.path());
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([]);

    // The runtime no longer has the pod's sandbox: GC asks the daemon, ztunnel is told.
    succeeded(plugin.call_with_args(&args, "ADD", "sb-1", &netns, &conf));
    ztunnel.wait_line("the pod enrolled", &format!("added {uid}"));
    succeeded(plugin.call_with_args(&args, "GC", "", "", &gc));
    ztunnel.wait_line("the pod collected", &format!("deleted {uid}"));
    assert_nothing_kept(&daemon, &topology);
    assert_service_reached(&topology);

    // The daemon down: GC passes, the capture out; ztunnel is not told until the daemon's
    // next snapshot, which no longer names the pod.
    succeeded(plugin.call_with_args(&args, "ADD", "sb-2", &netns, &conf));
    ztunnel.wait_line("the pod enrolled again", &format!("added {uid}"));
    let killed = daemon.kill();
    ztunnel.wait_line("the agent gone", "agent gone");
    succeeded(plugin.call_with_args(&args, "GC", "", "", &gc));
    assert!(cgroup_attachments(topology.pod_cgroup.path()).is_empty());
    let daemon = killed.restart();
    wait_state(&daemon, "synced");
    assert!(daemon.pod_names().is_empty(), "{:?}", daemon.pod_names());
    let sent = ztunnel_lines(&ztunnel);
    assert!(!sent.contains(&format!("kept {uid}")), "{sent:?}");
}
