//! Privileged tests of inbound capture: a client in the peer netns connects over the veth
//! to the pod's address; sk_lookup hands the connection to the proxy's inbound listener,
//! whose SO_ORIGINAL_DST (= the accepted socket's local address) is where it was going.

use std::net::{Ipv6Addr, SocketAddrV6};

use redirector_tests::prelude::*;
use redirector_tests::proxied_pod::{assert_on_proxy, assert_served};
use redirector_tests::redirector::install_with_interfaces;
use redirector_tests::twin_pods::{self, start_proxy};

/// Ports the app serves in the pod: a normal one, one in `-d`, and the tunnel port.
const APP_PORT: u16 = 8080;
const EXCLUDED_PORT: u16 = 15021;
const TUNNEL_PORT: u16 = 15008;

fn start_app(topo: &Topology) -> ChildGuard {
    twin_pods::start_app(topo, &[APP_PORT, EXCLUDED_PORT, TUNNEL_PORT])
}

/// The sidecar's inbound listener, as envoy has it: all addresses, port 15006.
fn start_inbound_proxy(topo: &Topology) -> ChildGuard {
    let addrs = ["0.0.0.0:15006", "[::]:15006"].map(|a| a.parse().unwrap());
    start_proxy(topo, "inbound", addrs, (PROXY_UID, PROXY_UID))
}

/// A client outside the pod (in the service netns) connecting to the pod.
fn from_outside(topo: &Topology, dst: SocketAddr) -> ConnOutcome {
    connect_from(&topo.service, None, APP_UID, APP_UID, dst, None)
}

#[track_caller]
fn assert_inbound_proxy(outcome: &ConnOutcome, orig: SocketAddr) {
    assert_on_proxy(outcome, "inbound", orig);
}

#[track_caller]
fn assert_app(outcome: &ConnOutcome, local: SocketAddr) {
    assert_served(outcome, "app", local);
}

#[test]
fn inbound_connections_reach_the_proxy_except_excluded_and_tunnel_ports() {
    privileged!();
    let topo = Topology::new("inbound");
    let _app = start_app(&topo);
    let _proxy = start_inbound_proxy(&topo);
    let root = PinRoot::new("inbound");
    install(&topo.pod, &topo.pod_cgroup, &root, &STANDARD_INJECTION);
    for v6 in [false, true] {
        let dst = topo.pod_addr(v6, APP_PORT);
        assert_inbound_proxy(&from_outside(&topo, dst), dst);
        for port in [EXCLUDED_PORT, TUNNEL_PORT] {
            let dst = topo.pod_addr(v6, port);
            assert_app(&from_outside(&topo, dst), dst);
        }
    }
    // Inside the pod, the app calling its own address is not inbound traffic.
    let own = topo.pod_addr(false, APP_PORT);
    assert_app(&topo.connect(APP_UID, APP_UID, own), own);
}

#[test]
fn inbound_port_list_captures_only_listed_ports() {
    privileged!();
    let topo = Topology::new("inlist");
    let _app = start_app(&topo);
    let _proxy = start_inbound_proxy(&topo);
    let root = PinRoot::new("inlist");
    let listed_ports = format!("-b {EXCLUDED_PORT}");
    install(&topo.pod, &topo.pod_cgroup, &root, &words(&listed_ports));
    let listed = topo.pod_addr(false, EXCLUDED_PORT);
    assert_inbound_proxy(&from_outside(&topo, listed), listed);
    let other = topo.pod_addr(false, APP_PORT);
    assert_app(&from_outside(&topo, other), other);
}

#[test]
fn proxy_listener_is_found_before_after_and_across_restarts() {
    privileged!();
    let topo = Topology::new("inrestart");
    let _app = start_app(&topo);
    let dst = topo.pod_addr(false, APP_PORT);
    // Listening before redirector ran: found in the pod's socket table.
    let proxy = start_inbound_proxy(&topo);
    let root = PinRoot::new("inrestart");
    install(&topo.pod, &topo.pod_cgroup, &root, &STANDARD_INJECTION);
    assert_inbound_proxy(&from_outside(&topo, dst), dst);
    // Restarted: registered again when it listens.
    drop(proxy);
    let proxy = start_inbound_proxy(&topo);
    assert_inbound_proxy(&from_outside(&topo, dst), dst);
    drop(proxy);
    // With no listener the connection is not handed to the app behind the proxy's back.
    let outcome = from_outside(&topo, dst);
    assert!(
        !matches!(outcome, ConnOutcome::Served { .. }),
        "inbound traffic bypassed the mesh with no proxy: {outcome:?}"
    );
    // Started after: registered at listen().
    let _proxy = start_inbound_proxy(&topo);
    assert_inbound_proxy(&from_outside(&topo, dst), dst);
}

#[test]
fn excluded_and_virtual_interfaces() {
    privileged!();
    let topo = Topology::new("iniface");
    let _app = start_app(&topo);
    let _inbound = start_inbound_proxy(&topo);
    let outbound = ["0.0.0.0:15001", "[::]:15001"].map(|a| a.parse().unwrap());
    let _outbound = start_proxy(&topo, "outbound", outbound, (PROXY_UID, PROXY_UID));
    let root = PinRoot::new("iniface");
    let dst = topo.pod_addr(false, APP_PORT);
    // -c: nothing arriving on the pod's eth0 is captured.
    let mut args: Vec<&str> = STANDARD_INJECTION.to_vec();
    args.extend(["-c", "eth0"]);
    // Without ingress_ifindex (a kernel before 5.17) each list is refused instead.
    if install_with_interfaces(&topo.pod, &topo.pod_cgroup, &root, &args, "-c") {
        assert_app(&from_outside(&topo, dst), dst);
    }
    // -k: what arrives on eth0 is the pod's own outbound traffic, captured to 15001 when
    // its destination is in -i.
    let mut args: Vec<&str> = STANDARD_INJECTION.to_vec();
    args.extend(["-k", "eth0"]);
    if install_with_interfaces(&topo.pod, &topo.pod_cgroup, &root, &args, "-k") {
        assert_on_proxy(&from_outside(&topo, dst), "outbound", dst);
    }
    let args = ["-b", "*", "-i", "10.255.0.0/16", "-k", "eth0"];
    if install_with_interfaces(&topo.pod, &topo.pod_cgroup, &root, &args, "-k") {
        assert_app(&from_outside(&topo, dst), dst);
    }
}

/// The pod's link-local address, given before setup (nodad: usable at once), and the
/// peer's on the same link.
const POD_LINK_LOCAL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0xbeef);
const PEER_LINK_LOCAL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0xcafe);

fn add_link_local(netns: &NetNs, ip: Ipv6Addr) {
    netns.run(&words(&format!("ip -6 addr add {ip}/64 dev eth0 nodad")));
}

/// The pod's link-local address as the peer dials it: scoped to the peer's eth0.
fn link_local_from_peer(topo: &Topology, port: u16) -> SocketAddr {
    let line = topo.service.run(&["ip", "-o", "link", "show", "eth0"]);
    let ifindex = line.split(':').next().unwrap().trim().parse().unwrap();
    SocketAddrV6::new(POD_LINK_LOCAL, port, 0, ifindex).into()
}

/// An address of the pod's subnet the pod is given after its setup (a secondary IP).
fn later_address(topo: &Topology) -> IpAddr {
    let [a, b, c, _] = topo.pod_ip4().octets();
    Ipv4Addr::new(a, b, c, 50).into()
}

/// Landed on the inbound listener with the original destination's address and port (the
/// scope of a link-local destination is the peer's, not part of what the proxy reads).
#[track_caller]
fn assert_inbound_proxy_at(outcome: &ConnOutcome, ip: IpAddr, port: u16) {
    match outcome {
        ConnOutcome::Proxied {
            name,
            orig: Some(orig),
            ..
        } if name == "inbound" => assert_eq!((orig.ip(), orig.port()), (ip, port)),
        other => panic!("expected the inbound proxy with orig {ip} port {port}, got {other:?}"),
    }
}

/// A dual-stack pod's link-local address carries connections from a peer on the link as
/// its other addresses do: they land on the sidecar's inbound listener, as istio's
/// ip6tables rules send them. An address the pod gains after an init container set it up
/// is refused, never served by the app past the sidecar.
#[test]
fn link_local_and_later_addresses_never_bypass_the_inbound_listener() {
    privileged!();
    let topo = Topology::new("inll");
    add_link_local(&topo.pod, POD_LINK_LOCAL);
    add_link_local(&topo.service, PEER_LINK_LOCAL);
    let _app = start_app(&topo);
    let _proxy = start_inbound_proxy(&topo);
    let root = PinRoot::new("inll");
    install(&topo.pod, &topo.pod_cgroup, &root, &STANDARD_INJECTION);

    let dst = link_local_from_peer(&topo, APP_PORT);
    assert_inbound_proxy_at(&from_outside(&topo, dst), POD_LINK_LOCAL.into(), APP_PORT);
    // Excluded ports on it reach the app, as on the pod's other addresses.
    let excluded = link_local_from_peer(&topo, EXCLUDED_PORT);
    assert!(
        matches!(from_outside(&topo, excluded), ConnOutcome::Served { ref name, .. } if name == "app")
    );

    let later = later_address(&topo);
    topo.add_pod_addr(later);
    let outcome = from_outside(&topo, SocketAddr::new(later, APP_PORT));
    assert!(
        matches!(outcome, ConnOutcome::Refused),
        "a connection to an address added after setup must be refused: {outcome:?}"
    );
}

/// Through the daemon, an address a pod gains after its setup is added to the pod once a
/// connection to it was refused: connections to it then land on the inbound listener, and
/// none is ever served by the app directly.
#[test]
fn the_daemon_adds_an_address_the_pod_gained_after_setup() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("inlater");
    let daemon = Daemon::start(&root, &node, &state);
    let topo = Topology::under(&node, "inlater");
    let _app = start_app(&topo);
    let _proxy = start_inbound_proxy(&topo);
    daemon.add(&topo.pod, "default/later", &STANDARD_INJECTION);
    let dst = topo.pod_addr(false, APP_PORT);
    assert_inbound_proxy(&from_outside(&topo, dst), dst);

    let later = later_address(&topo);
    topo.add_pod_addr(later);
    let started = Instant::now();
    let dst = SocketAddr::new(later, APP_PORT);
    let mut refused = 0;
    let outcome = loop {
        match from_outside(&topo, dst) {
            ConnOutcome::Refused if started.elapsed() < EVENTUALLY => {
                refused += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            other => break other,
        }
    };
    eprintln!(
        "connections to the new address: {refused} refused, then on the proxy after {:?}",
        started.elapsed()
    );
    assert!(
        !matches!(outcome, ConnOutcome::Refused),
        "still refused after {:?}; daemon log:\n{}",
        started.elapsed(),
        daemon.log()
    );
    assert_inbound_proxy_at(&outcome, later, APP_PORT);
    // The log line follows the pod's new entries, which the connection may have beaten.
    daemon.assert_logged("new address");
    assert_inbound_proxy_at(&from_outside(&topo, dst), later, APP_PORT);
}
