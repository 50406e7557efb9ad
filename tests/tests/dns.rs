//! Privileged tests of DNS capture (`--redirect-dns`, `--capture-all-dns`) with real DNS
//! traffic: a DNS server in the service netns, the stand-in for istio's DNS proxy in the
//! pod (uid 1337, 127.0.0.1:15053 and [::1]:15053, forwarding to that server and answering
//! with its own address), and clients in the pod: hand-built queries over unconnected UDP
//! (sendmsg hook), connected UDP (connect hook) and TCP, which report the reply's source as
//! `recvfrom` gives it; glibc's resolver over UDP and TCP; and c-ares (node), which drops a
//! UDP reply whose source is not the server it asked — the check that the recvmsg
//! programs' source restoration exists for (glibc 2.36 does not make it on its connected
//! socket: see `redirector_tests::dns`).
//!
//! Run as root, one at a time:
//! `cargo build -p redirector -p redirector-tests --bins && REDIRECTOR_BIN=$PWD/target/debug/redirector
//!  cargo test -p redirector-tests --test dns -- --test-threads=1`

use std::net::Ipv6Addr;

use redirector_tests::dns::protocol::DnsOutcome;
use redirector_tests::dns::{
    require_node, use_dnsprobe_bin, DnsClient, DnsMode, DnsServer, ResolvConf, DNS_PORT,
    DNS_PROXY_PORT, PROXY_ANSWER_V4, PROXY_ANSWER_V6,
};
use redirector_tests::prelude::*;
use redirector_tests::proxied_pod::{assert_on_proxy, start_outbound_proxy};

/// What the real server (resolv.conf's, on the service's own addresses) answers.
const REAL_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const REAL_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
/// A DNS server that is not in resolv.conf, in the service netns, and its answer.
const OTHER_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const OTHER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10);
const OTHER_ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);

/// A pod whose resolv.conf names the service netns's addresses, where the real DNS server
/// runs; the DNS proxy and an outbound TCP proxy (15001, to see TCP captured by `-i '*'`) in
/// the pod. Fields drop in order: processes, then the pins, then the namespaces.
struct DnsPod {
    dns_proxy: ChildGuard,
    _servers: Vec<ChildGuard>,
    pins: PinRoot,
    /// resolv.conf for redirector: both service addresses.
    resolv: ResolvConf,
    topo: Topology,
}

impl DnsPod {
    fn new(hint: &str) -> Self {
        use_dnsprobe_bin(env!("CARGO_BIN_EXE_dnsprobe"));
        let topo = Topology::new(hint);
        topo.add_service_addr(OTHER_V4.into());
        topo.add_service_addr(OTHER_V6.into());
        let real = DnsServer::server(&topo.service, "real", REAL_V4, Some(REAL_V6))
            .listen(topo.service_addr(false, DNS_PORT))
            .listen(topo.service_addr(true, DNS_PORT))
            .start();
        let other = DnsServer::server(&topo.service, "other", OTHER_ANSWER, None)
            .listen(SocketAddr::new(OTHER_V4.into(), DNS_PORT))
            .listen(SocketAddr::new(OTHER_V6.into(), DNS_PORT))
            .start();
        let outbound = start_outbound_proxy(&topo, "outbound");
        let dns_proxy =
            DnsServer::proxy(&topo.pod, "dns-proxy", topo.service_addr(false, DNS_PORT))
                .listen_proxy_port()
                .cgroup(&topo.pod_cgroup)
                .user(PROXY_UID, PROXY_UID)
                .start();
        let servers = [topo.service_ip4().into(), topo.service_ip6().into()];
        DnsPod {
            dns_proxy,
            _servers: vec![real, other, outbound],
            pins: PinRoot::new(hint),
            resolv: ResolvConf::new(hint, &servers, false),
            topo,
        }
    }

    /// `redirector istio-iptables` with the standard injection flags plus `extra`, and
    /// `--resolv-conf` pointing at the pod's resolv.conf.
    fn install(&self, extra: &[&str]) {
        let mut args: Vec<&str> = STANDARD_INJECTION.to_vec();
        args.extend(extra);
        let resolv = self.resolv.path().to_string_lossy().into_owned();
        args.extend(["--resolv-conf", &resolv]);
        install(&self.topo.pod, &self.topo.pod_cgroup, &self.pins, &args);
    }

    fn client(&self, uid: u32, gid: u32) -> DnsClient<'_> {
        DnsClient::new(&self.topo, Some(&self.topo.pod_cgroup), uid, gid)
    }

    fn app(&self) -> DnsClient<'_> {
        self.client(APP_UID, APP_UID)
    }

    fn real(&self, v6: bool) -> SocketAddr {
        self.topo.service_addr(v6, DNS_PORT)
    }

    /// Waits for the DNS proxy's line about a query over `proto` from the app.
    fn expect_forwarded(&self, proto: &str) {
        let want = format!("proto={proto} ");
        self.dns_proxy
            .wait_line(&format!("a forwarded {proto} query"), EVENTUALLY, |l| {
                l.starts_with("forwarded ") && l.contains(&want) && l.ends_with("result=ok")
            });
    }
}

/// A resolver library resolved the name to exactly `want` (any order).
#[track_caller]
fn assert_resolved(outcome: &DnsOutcome, want: &[IpAddr]) {
    match outcome {
        DnsOutcome::Resolved { addrs, .. } => {
            let mut got = addrs.clone();
            got.sort();
            assert_eq!(got, want, "the resolver's addresses");
        }
        other => panic!("expected the resolver to resolve to {want:?}, got {other:?}"),
    }
}

/// A DNS reply with the single address `answer`, from `from` (UDP) or no source (TCP).
#[track_caller]
fn assert_reply(outcome: &DnsOutcome, answer: Ipv4Addr, from: Option<SocketAddr>) {
    let want = DnsOutcome::Reply {
        rcode: 0,
        addrs: vec![answer.into()],
        from,
    };
    assert_eq!(*outcome, want, "expected answer {answer} from {from:?}");
}

/// The reply `mode` gives when `server` answers `answer`: UDP shows the source.
#[track_caller]
fn assert_answer(outcome: &DnsOutcome, mode: DnsMode, answer: Ipv4Addr, server: SocketAddr) {
    let from = (mode != DnsMode::Tcp).then_some(server);
    assert_reply(outcome, answer, from);
}

/// `client`'s query to `server` over `mode` got the answer `answer` ([`assert_answer`]).
#[track_caller]
fn assert_query(client: &DnsClient, server: SocketAddr, mode: DnsMode, answer: Ipv4Addr) {
    assert_answer(&client.query(server, mode), mode, answer, server);
}

/// The A and AAAA answers `v4` and `v6`, sorted.
fn answers(v4: Ipv4Addr, v6: Ipv6Addr) -> Vec<IpAddr> {
    let mut want = vec![IpAddr::from(v4), IpAddr::from(v6)];
    want.sort();
    want
}

fn proxy_answers() -> Vec<IpAddr> {
    answers(PROXY_ANSWER_V4, PROXY_ANSWER_V6)
}

fn real_answers() -> Vec<IpAddr> {
    answers(REAL_V4, REAL_V6)
}

#[test]
fn app_queries_go_through_the_dns_proxy_and_the_resolvers_accept_the_replies() {
    privileged!();
    let pod = DnsPod::new("dnsapp");
    let app = pod.app();
    let udp_conf = ResolvConf::new("dnsapp", &[pod.topo.service_ip4().into()], false);
    let tcp_conf = ResolvConf::new("dnsappvc", &[pod.topo.service_ip4().into()], true);
    let real = pod.real(false);
    let node = require_node();
    // Control: without redirector the real server answers.
    assert_resolved(&app.resolve(&udp_conf), &real_answers());
    assert_resolved(&app.resolve(&tcp_conf), &real_answers());
    if let Some(node) = &node {
        assert_resolved(&app.resolve_c_ares(node, &udp_conf), &[REAL_V4.into()]);
    }
    for mode in DnsMode::ALL {
        assert_query(&app, real, mode, REAL_V4);
    }

    pod.install(&["--redirect-dns"]);
    // glibc (connected UDP, A and AAAA at once; then TCP) got the proxy's answers.
    assert_resolved(&app.resolve(&udp_conf), &proxy_answers());
    pod.expect_forwarded("udp");
    assert_resolved(&app.resolve(&tcp_conf), &proxy_answers());
    pod.expect_forwarded("tcp");
    // c-ares took them too: their source was restored to the server it asked.
    if let Some(node) = &node {
        assert_resolved(
            &app.resolve_c_ares(node, &udp_conf),
            &[PROXY_ANSWER_V4.into()],
        );
    }
    // Each kernel path on its own: sendmsg (unconnected), connect (UDP and TCP).
    for mode in DnsMode::ALL {
        assert_query(&app, real, mode, PROXY_ANSWER_V4);
    }
    // An IPv4 server through an IPv6 socket (v4-mapped).
    let mapped = SocketAddr::new(pod.topo.service_ip4().to_ipv6_mapped().into(), DNS_PORT);
    for mode in DnsMode::ALL {
        assert_query(&app, mapped, mode, PROXY_ANSWER_V4);
    }
}

/// Whether `pin` is a pod's link (`links/<cookie>_<hook>`) of a hook starting with one of
/// `hooks`.
fn is_link_of(pin: &Path, hooks: &[&str]) -> bool {
    let name = pin.file_name().unwrap_or_default().to_string_lossy();
    let hook = name.split_once('_').map_or("", |(_, hook)| hook);
    pin.parent().is_some_and(|d| d.ends_with("links")) && hooks.iter().any(|h| hook.starts_with(h))
}

/// Proves that the source checks above test the restoration: with the recvmsg programs
/// detached (their pins removed), the proxy still answers, but the reply's source is
/// 127.0.0.1:15053 and c-ares drops it.
#[test]
fn without_the_recvmsg_programs_replies_come_from_the_proxy_and_c_ares_drops_them() {
    privileged!();
    let pod = DnsPod::new("dnsnorecv");
    let app = pod.app();
    let conf = ResolvConf::new("dnsnorecv", &[pod.topo.service_ip4().into()], false);
    let real = pod.real(false);
    pod.install(&["--redirect-dns"]);
    assert_query(&app, real, DnsMode::UdpConnected, PROXY_ANSWER_V4);
    let recvmsg_pins: Vec<_> = pins_under(pod.pins.path())
        .into_iter()
        .filter(|p| is_link_of(p, &["recvmsg"]))
        .collect();
    assert_eq!(
        recvmsg_pins.len(),
        2,
        "recvmsg4 and recvmsg6 pins: {recvmsg_pins:?}"
    );
    for pin in &recvmsg_pins {
        std::fs::remove_file(pin).unwrap_or_else(|e| panic!("unpinning {}: {e}", pin.display()));
    }
    let proxy_port = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), DNS_PROXY_PORT);
    for mode in [DnsMode::Udp, DnsMode::UdpConnected] {
        assert_reply(&app.query(real, mode), PROXY_ANSWER_V4, Some(proxy_port));
    }
    if let Some(node) = require_node() {
        match app.resolve_c_ares(&node, &conf) {
            DnsOutcome::Error { kind, .. } if kind == "cares:ETIMEOUT" => {}
            other => panic!("c-ares should drop replies from 127.0.0.1:15053, got {other:?}"),
        }
        pod.expect_forwarded("udp");
    }
}

#[test]
fn proxy_owner_and_servers_not_in_resolv_conf_are_not_captured() {
    privileged!();
    let pod = DnsPod::new("dnsowner");
    let real = pod.real(false);
    let other = SocketAddr::new(OTHER_V4.into(), DNS_PORT);
    pod.install(&["--redirect-dns"]);
    // The proxy's own queries (uid 1337, and gid 1337 alone) reach the real server.
    for (uid, gid) in [(PROXY_UID, PROXY_UID), (APP_UID, PROXY_UID)] {
        for mode in DnsMode::ALL {
            let outcome = pod.client(uid, gid).query(real, mode);
            assert_answer(&outcome, mode, REAL_V4, real);
        }
    }
    // A server that is not in resolv.conf: UDP passes; TCP is ordinary outbound TCP, which
    // `-i '*'` sends to the outbound proxy as istio's rules do.
    let app = pod.app();
    for mode in [DnsMode::Udp, DnsMode::UdpConnected] {
        assert_query(&app, other, mode, OTHER_ANSWER);
    }
    assert_outbound_proxy(&app.query(other, DnsMode::Tcp), other);

    // --capture-all-dns: every server's port 53, over both protocols; the proxy still passes.
    pod.install(&["--redirect-dns", "--capture-all-dns"]);
    for mode in DnsMode::ALL {
        assert_query(&app, other, mode, PROXY_ANSWER_V4);
        let proxy = pod.client(PROXY_UID, PROXY_UID).query(other, mode);
        assert_answer(&proxy, mode, OTHER_ANSWER, other);
    }
    let other6 = SocketAddr::new(OTHER_V6.into(), DNS_PORT);
    assert_query(&app, other6, DnsMode::Udp, PROXY_ANSWER_V4);
}

/// A TCP query that landed on the outbound (15001) probe proxy, with `orig` as its original
/// destination.
#[track_caller]
fn assert_outbound_proxy(outcome: &DnsOutcome, orig: SocketAddr) {
    let DnsOutcome::NotDns(line) = outcome else {
        panic!("expected the outbound TCP proxy with orig {orig}, got {outcome:?}");
    };
    assert_on_proxy(&ConnOutcome::from_server_line(line), "outbound", orig);
}

#[test]
fn ipv6_server_is_captured_and_its_address_restored() {
    privileged!();
    let pod = DnsPod::new("dnsv6");
    let app = pod.app();
    let conf = ResolvConf::new("dnsv6", &[pod.topo.service_ip6().into()], false);
    let tcp_conf = ResolvConf::new("dnsv6vc", &[pod.topo.service_ip6().into()], true);
    let real6 = pod.real(true);
    let node = require_node();
    assert_resolved(&app.resolve(&conf), &real_answers());
    for mode in DnsMode::ALL {
        assert_query(&app, real6, mode, REAL_V4);
    }
    pod.install(&["--redirect-dns"]);
    assert_resolved(&app.resolve(&conf), &proxy_answers());
    assert_resolved(&app.resolve(&tcp_conf), &proxy_answers());
    if let Some(node) = &node {
        assert_resolved(&app.resolve_c_ares(node, &conf), &[PROXY_ANSWER_V4.into()]);
    }
    for mode in DnsMode::ALL {
        assert_query(&app, real6, mode, PROXY_ANSWER_V4);
        let proxy = pod.client(PROXY_UID, PROXY_UID).query(real6, mode);
        assert_answer(&proxy, mode, REAL_V4, real6);
    }
}

#[test]
fn without_redirect_dns_nothing_of_dns_is_captured_and_switching_off_detaches() {
    privileged!();
    let pod = DnsPod::new("dnsoff");
    let app = pod.app();
    let conf = ResolvConf::new("dnsoff", &[pod.topo.service_ip4().into()], false);
    let real = pod.real(false);
    let check_off = |when: &str| {
        assert_resolved(&app.resolve(&conf), &real_answers());
        for mode in [DnsMode::Udp, DnsMode::UdpConnected] {
            assert_query(&app, real, mode, REAL_V4);
        }
        // TCP to port 53 is ordinary TCP: `-i '*'` captures it to 15001, not 15053.
        let tcp = app.query(real, DnsMode::Tcp);
        assert!(
            matches!(&tcp, DnsOutcome::NotDns(_)),
            "{when}: TCP DNS should be outbound TCP: {tcp:?}"
        );
        assert_outbound_proxy(&tcp, real);
    };
    pod.install(&[]);
    check_off("never on");
    pod.install(&["--redirect-dns"]);
    assert_query(&app, real, DnsMode::Udp, PROXY_ANSWER_V4);
    pod.install(&[]);
    check_off("switched off");
    let dns_pins: Vec<_> = pins_under(pod.pins.path())
        .into_iter()
        .filter(|p| is_link_of(p, &["recvmsg", "sendmsg"]))
        .collect();
    assert_eq!(dns_pins, Vec::<PathBuf>::new(), "UDP programs still pinned");
}
