//! The outbound capture decision, in istio-iptables' rule order (nat OUTPUT → ISTIO_OUTPUT).
//!
//! The eBPF `connect4`/`connect6` programs and user space (`explain`, tests) run this same
//! function; only the way sets are looked up differs ([`PodLookups`]).

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::maps::{
    inbound_capture, owner_group_mode, pod_flags, port_as_address, CidrList, PodConfig, PortSet,
    MAX_IFACES, MAX_OWNERS,
};
use crate::Reason;

/// 127.0.0.6 / ::6: the source the proxy binds for inbound passthrough connections.
pub const INBOUND_PASSTHROUGH_V4: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 6);
pub const INBOUND_PASSTHROUGH_V6: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6);

/// Value of a [`CidrList::Route`] entry whose route leaves through a `-c` interface.
pub const ROUTE_VIA_EXCLUDED_INTERFACE: u8 = 1;

/// istio's DNS proxy port: captured DNS goes here.
pub const DNS_CAPTURE_PORT: u16 = 15053;
const DNS_PORT: u16 = 53;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    /// The IP protocol number.
    pub const fn number(self) -> u8 {
        match self {
            Protocol::Tcp => crate::kernel_abi::IPPROTO_TCP,
            Protocol::Udp => crate::kernel_abi::IPPROTO_UDP,
        }
    }
}

/// A `connect()` (TCP or UDP) or UDP `sendmsg()` as the kernel sees it before it happens.
#[derive(Clone, Copy, Debug)]
pub struct OutboundAttempt {
    pub protocol: Protocol,
    pub dst: IpAddr,
    pub dst_port: u16,
    /// The address the socket is bound to (unspecified if none).
    pub src: IpAddr,
    pub uid: u32,
    pub gid: u32,
}

/// Set membership for one pod.
pub trait PodLookups {
    fn port_in(&self, set: PortSet, port: u16) -> bool;
    /// The value of the longest prefix of `list` that holds `addr`.
    fn cidr_value(&self, list: CidrList, addr: IpAddr) -> Option<u8>;

    fn cidr_in(&self, list: CidrList, addr: IpAddr) -> bool {
        self.cidr_value(list, addr).is_some()
    }

    /// Whether `port` is in a list of port ranges ([`CidrList::OutboundExcludePorts`] or
    /// [`CidrList::InboundExcludePorts`]).
    fn port_range_in(&self, list: CidrList, port: u16) -> bool {
        self.cidr_in(list, IpAddr::V4(port_as_address(port)))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// To the outbound capture port (`-p`).
    Capture,
    /// To the inbound capture port (`-z`): the proxy calling its own pod.
    CaptureInbound,
    /// To the DNS proxy ([`DNS_CAPTURE_PORT`]).
    CaptureDns,
    /// Left alone, for this reason.
    Pass(Reason),
}

impl Verdict {
    pub const fn reason(self) -> Reason {
        match self {
            Verdict::Capture => Reason::Redirected,
            Verdict::CaptureInbound => Reason::RedirectedInbound,
            Verdict::CaptureDns => Reason::RedirectedDns,
            Verdict::Pass(reason) => reason,
        }
    }
}

/// Whether `id` is among the first `count` entries of `list`. Indexes a fixed-size array
/// with a constant-bounded loop: a slice of map-given length is beyond the verifier.
#[inline(always)]
fn listed<const N: usize>(list: &[u32; N], count: u8, id: u32) -> bool {
    let count = u32::from(count);
    let mut i = 0;
    while i < N {
        if i as u32 >= count {
            return false;
        }
        if list[i] == id {
            return true;
        }
        i += 1;
    }
    false
}

/// Whether a connection to `dst` leaves through `lo` (a local address of the pod).
#[inline(always)]
fn is_local<L: PodLookups>(dst: IpAddr, lookups: &L) -> bool {
    match dst {
        IpAddr::V4(v4) => v4.is_loopback() || lookups.cidr_in(CidrList::Local, dst),
        IpAddr::V6(v6) => v6.is_loopback() || lookups.cidr_in(CidrList::Local, dst),
    }
}

/// The loopback CIDR of the pod (`ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`, 127.0.0.1/32 by
/// default) for IPv4, ::1 for IPv6.
#[inline(always)]
fn in_loopback_cidr(cfg: &PodConfig, dst: IpAddr) -> bool {
    match dst {
        IpAddr::V4(v4) => {
            u32::from_ne_bytes(v4.octets()) & cfg.loopback_v4_mask == cfg.loopback_v4_addr
        }
        IpAddr::V6(v6) => v6 == Ipv6Addr::LOCALHOST,
    }
}

/// Whether DNS to `dst` is captured: every address with `--capture-all-dns`, else the
/// resolv.conf servers.
#[inline(always)]
fn dns_server<L: PodLookups>(cfg: &PodConfig, dst: IpAddr, lookups: &L) -> bool {
    cfg.flags & pod_flags::CAPTURE_ALL_DNS != 0 || lookups.cidr_in(CidrList::DnsServer, dst)
}

/// Decide what happens to a TCP connection from a pod, first matching rule wins.
#[inline(always)]
pub fn decide_outbound<L: PodLookups>(
    cfg: &PodConfig,
    conn: &OutboundAttempt,
    lookups: &L,
) -> Verdict {
    // 0. -c: nat OUTPUT's `-o IFACE -j RETURN` comes before ISTIO_OUTPUT. The pod's route
    //    for the destination says which interface it leaves through.
    if cfg.exclude_iface_count > 0
        && lookups.cidr_value(CidrList::Route, conn.dst) == Some(ROUTE_VIA_EXCLUDED_INTERFACE)
    {
        return Verdict::Pass(Reason::PassedInterface);
    }
    let listed_in = |empty: u32| cfg.flags & empty == 0;
    // 1. -o, and port ranges never captured.
    if listed_in(pod_flags::NO_OUTBOUND_EXCLUDE_PORTS)
        && lookups.port_in(PortSet::OutboundExclude, conn.dst_port)
    {
        return Verdict::Pass(Reason::PassedExcludedPort);
    }
    if cfg.flags & pod_flags::OUTBOUND_EXCLUDE_PORT_RANGES != 0
        && lookups.port_range_in(CidrList::OutboundExcludePorts, conn.dst_port)
    {
        return Verdict::Pass(Reason::PassedExcludedPort);
    }
    // 2. -o lo -s 127.0.0.6 / ::6
    let passthrough = match conn.src {
        IpAddr::V4(v4) => v4 == INBOUND_PASSTHROUGH_V4,
        IpAddr::V6(v6) => v6 == INBOUND_PASSTHROUGH_V6,
    };
    if passthrough {
        return Verdict::Pass(Reason::PassedInboundPassthrough);
    }
    // 3. Proxy owners, each uid then each gid, three rules apiece; the first two are TCP
    //    rules. With DNS capture, istio keeps TCP port 53 out of the uids' rules (both) and
    //    out of the gids' second rule only.
    let tcp = conn.protocol == Protocol::Tcp;
    let dns_port = cfg.flags & pod_flags::DNS_CAPTURE != 0 && conn.dst_port == DNS_PORT;
    // istio drops the lo RETURN rules when an -i CIDR is a loopback address.
    let lo_returns = cfg.flags & pod_flags::INCLUDE_HAS_LOOPBACK == 0;
    // Whether the destination is the pod's own, looked up once: only the owners' rules and
    // a pod whose local destinations all pass ask.
    let local_pass = cfg.flags & pod_flags::LOCAL_DESTINATIONS_PASS != 0;
    let local = tcp
        && (cfg.proxy_uid_count > 0 || cfg.proxy_gid_count > 0 || local_pass)
        && is_local(conn.dst, lookups);
    // istio-cni's DNS rules (an ambient pod's) come before its pass of local destinations:
    // UDP 53 is left alone only when it leaves through lo (`! -o lo`), TCP 53 only to the
    // loopback CIDR (`! -d 127.0.0.1/32`).
    if local_pass && dns_port {
        let left_alone = if tcp {
            in_loopback_cidr(cfg, conn.dst)
        } else {
            is_local(conn.dst, lookups)
        };
        if left_alone {
            return Verdict::Pass(Reason::PassedLoopback);
        }
        if dns_server(cfg, conn.dst, lookups) {
            return Verdict::CaptureDns;
        }
    }
    // Local destinations passing (Linkerd's `-o lo -j RETURN`) for every owner, before the
    // owners' rules, so that the proxy calling its own pod is never sent inbound.
    if local_pass && local {
        return Verdict::Pass(Reason::PassedLoopback);
    }
    let local_not_proxy = local && !dns_port && lo_returns;
    // istio's three rules per id, unrolled: the first id's `! --uid-owner` RETURN catches
    // every other caller on lo, so only the first id is compared apart from the rest. What
    // only the owner's own connections need is worked out on their branch: fewer
    // conditions carried through the lists keep the verifier's walk of connect4/6 short.
    for (list, count, caller, uids) in [
        (&cfg.proxy_uids, cfg.proxy_uid_count, conn.uid, true),
        (&cfg.proxy_gids, cfg.proxy_gid_count, conn.gid, false),
    ] {
        if count == 0 {
            continue;
        }
        if local_not_proxy && list[0] != caller {
            return Verdict::Pass(Reason::PassedLocalNotProxy);
        }
        if listed::<MAX_OWNERS>(list, count, caller) {
            // The proxy calling its own pod (not through the loopback CIDR, not the
            // tunnel port) goes to the inbound port; the uids' rule leaves out DNS.
            let own_pod = local
                && !(uids && dns_port)
                && conn.dst_port != cfg.tunnel_port
                && !in_loopback_cidr(cfg, conn.dst);
            return if own_pod {
                Verdict::CaptureInbound
            } else {
                Verdict::Pass(Reason::PassedProxyOwner)
            };
        }
    }
    // 4. Owner groups.
    let in_groups = listed::<MAX_OWNERS>(&cfg.owner_groups, cfg.owner_group_count, conn.gid);
    match cfg.owner_group_mode {
        owner_group_mode::INCLUDE if !in_groups => return Verdict::Pass(Reason::PassedOwnerGroup),
        owner_group_mode::EXCLUDE if in_groups => return Verdict::Pass(Reason::PassedOwnerGroup),
        _ => {}
    }
    // 5. DNS (ISTIO_OUTPUT_DNS): port 53 to a resolv.conf server, or to any address with
    //    --capture-all-dns, TCP and UDP.
    if dns_port && dns_server(cfg, conn.dst, lookups) {
        return Verdict::CaptureDns;
    }
    // The rest of ISTIO_OUTPUT ends in ISTIO_REDIRECT, a TCP rule.
    if !tcp {
        return Verdict::Pass(Reason::PassedNotTcp);
    }
    // 6. The loopback CIDR (IPv4, from the env) and ::1.
    if in_loopback_cidr(cfg, conn.dst) {
        return Verdict::Pass(Reason::PassedLoopback);
    }
    // 7. -x
    if listed_in(pod_flags::NO_EXCLUDE_CIDRS) && lookups.cidr_in(CidrList::Exclude, conn.dst) {
        return Verdict::Pass(Reason::PassedExcludedCidr);
    }
    // 8. -q
    if listed_in(pod_flags::NO_OUTBOUND_INCLUDE_PORTS)
        && lookups.port_in(PortSet::OutboundInclude, conn.dst_port)
    {
        return Verdict::Capture;
    }
    // 9. -i
    if cfg.flags & pod_flags::CAPTURE_ALL_OUTBOUND != 0
        || (listed_in(pod_flags::NO_INCLUDE_CIDRS) && lookups.cidr_in(CidrList::Include, conn.dst))
    {
        return Verdict::Capture;
    }
    Verdict::Pass(Reason::PassedNotIncluded)
}

/// A TCP connection arriving at the pod from outside, as sk_lookup sees it.
#[derive(Clone, Copy, Debug)]
pub struct InboundAttempt {
    pub dst: IpAddr,
    /// Where the connection comes from.
    pub src: IpAddr,
    pub dst_port: u16,
    /// Interface the connection came in on.
    pub ifindex: u32,
}

/// What happens to a TCP connection arriving at the pod from outside (nat PREROUTING →
/// ISTIO_INBOUND). Connections made inside the pod are decided by [`decide_outbound`] only.
#[inline(always)]
pub fn decide_inbound<L: PodLookups>(
    cfg: &PodConfig,
    conn: &InboundAttempt,
    lookups: &L,
) -> Verdict {
    // -k (inserted first): traffic from a virtual interface is outbound traffic of the pod.
    if listed::<MAX_IFACES>(&cfg.virt_ifaces, cfg.virt_iface_count, conn.ifindex) {
        let included = cfg.flags & pod_flags::CAPTURE_ALL_OUTBOUND != 0
            || lookups.cidr_in(CidrList::Include, conn.dst);
        return if included {
            Verdict::Capture
        } else {
            Verdict::Pass(Reason::PassedInterface)
        };
    }
    // -c
    if listed::<MAX_IFACES>(&cfg.exclude_ifaces, cfg.exclude_iface_count, conn.ifindex) {
        return Verdict::Pass(Reason::PassedInterface);
    }
    if conn.dst_port == cfg.tunnel_port {
        return Verdict::Pass(Reason::PassedInboundPort);
    }
    // Port ranges never captured come first, whichever ports are captured.
    if cfg.flags & pod_flags::INBOUND_EXCLUDE_PORT_RANGES != 0
        && lookups.port_range_in(CidrList::InboundExcludePorts, conn.dst_port)
    {
        return Verdict::Pass(Reason::PassedInboundPort);
    }
    let captured = match cfg.inbound_capture {
        inbound_capture::ALL => !lookups.port_in(PortSet::InboundExclude, conn.dst_port),
        inbound_capture::LIST => lookups.port_in(PortSet::InboundInclude, conn.dst_port),
        _ => false,
    };
    if !captured {
        return Verdict::Pass(Reason::PassedInboundPort);
    }
    if cfg.flags & pod_flags::INBOUND_EXCLUDE_SOURCES != 0
        && lookups.cidr_in(CidrList::InboundExcludeSource, conn.src)
    {
        return Verdict::Pass(Reason::PassedExcludedCidr);
    }
    Verdict::CaptureInbound
}
