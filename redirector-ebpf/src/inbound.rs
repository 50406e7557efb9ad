//! Inbound capture: sk_lookup steers connections arriving at the pod to the proxy's
//! inbound listener without rewriting packets, so the accepted socket's local address is
//! the original destination.

use core::net::IpAddr;

use aya_ebpf::{
    bindings::{bpf_sk_lookup, sk_action::SK_DROP, sk_action::SK_PASS},
    programs::{SkLookupContext, SockOpsContext},
};
use redirector_common::{
    decide_inbound, decision::INBOUND_PASSTHROUGH_V6, kernel_abi::IPPROTO_TCP, pod_flags, CidrList,
    InboundAttempt, ListenerKey, NetnsCookie, OrigDst, PodAddrKey, PodConfig, PodLookups, Reason,
    Verdict, AF_INET, AF_INET6,
};

use crate::{
    addr::{self, SocketEnds},
    counters::count,
    maps::{
        self, PodMaps, ADDR_MISSES, LISTENERS, ORIG_DST_BY_CONN, POD_BY_ADDR, POD_CONFIG,
        ZTUNNEL_UPSTREAMS,
    },
    trace,
};

/// `lo` has this index in every network namespace.
const LOOPBACK_IFINDEX: u32 = 1;

/// sock_ops TCP_LISTEN: a socket of a managed pod starts listening on a capture port.
pub fn register_listener<const ON_CGROUP: bool>(ctx: &SockOpsContext) {
    let netns_cookie = maps::pod_cookie::<ON_CGROUP, _>(ctx);
    // SAFETY: the value stays valid (RCU) for this run of the program; it is only read.
    let Some(cfg) = (unsafe { POD_CONFIG.get(netns_cookie) }) else {
        return;
    };
    let port = ctx.local_port() as u16;
    if port != cfg.inbound_port && port != cfg.outbound_port {
        return;
    }
    let family = if ctx.family() == u32::from(AF_INET6) {
        AF_INET6
    } else {
        AF_INET
    };
    let key = ListenerKey {
        netns_cookie: netns_cookie.get(),
        port,
        family,
        _pad: 0,
    };
    // A restarted proxy replaces its old listener.
    // SAFETY: `ops` is the program's context, the socket the helper takes.
    let _ = LISTENERS.update(key, unsafe { &mut *ctx.ops }, 0);
}

/// `IFINDEX`: the context has `ingress_ifindex` (5.17). Without it the interface is
/// unknown (0): "arrived on lo" is told by the destination address, which is what puts a
/// connection on lo (to a pod's own address, the kernel reports the address's interface),
/// and user space refuses a pod the interface lists (-c, -k) of.
pub fn sk_lookup<const IFINDEX: bool>(ctx: &SkLookupContext) -> u32 {
    // SAFETY: `lookup` is the program's context; the verifier checks every field read.
    let lk = unsafe { &*ctx.lookup };
    if lk.protocol != u32::from(IPPROTO_TCP) {
        return SK_PASS;
    }
    let v6 = lk.family == u32::from(AF_INET6);
    let (local, remote) = if v6 {
        (
            addr::v6_or_mapped(lk.local_ip6),
            addr::v6_or_mapped(lk.remote_ip6),
        )
    } else {
        (addr::v4(lk.local_ip4), addr::v4(lk.remote_ip4))
    };
    // A connection made inside the pod was decided on its way out (nat OUTPUT); istio's
    // PREROUTING rules never see it. It comes from one of the pod's own addresses (to the
    // pod's own address, the kernel reports the address's interface, not lo). Those on lo
    // (every redirected one: the app dialling its proxy) pass before any lookup, whichever
    // pod the address is of (6.18, bpf_stats: 85 → 50 ns a run, the address lookup
    // skipped).
    let from_pod = match remote {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6 == INBOUND_PASSTHROUGH_V6,
    };
    let ifindex = if IFINDEX { lk.ingress_ifindex } else { 0 };
    let on_lo = if IFINDEX {
        ifindex == LOOPBACK_IFINDEX
    } else {
        local.is_loopback()
    };
    if from_pod || on_lo {
        return SK_PASS;
    }
    let (family, raw) = addr::raw(local);
    let addr_key = PodAddrKey {
        addr: raw,
        family: u32::from(family),
    };
    // SAFETY: the value is copied out at once.
    let Some(&netns_cookie) = (unsafe { POD_BY_ADDR.get(addr_key) }) else {
        return unknown_address(ifindex, addr_key, remote == local);
    };
    // SAFETY: the value stays valid (RCU) for this run of the program; it is only read.
    let Some(cfg) = (unsafe { POD_CONFIG.get(netns_cookie) }) else {
        return SK_PASS;
    };
    // IPv6 is captured in both directions or in neither.
    if local.is_ipv6() && cfg.flags & pod_flags::IPV6 == 0 {
        return SK_PASS;
    }
    let local_port = lk.local_port as u16;
    if cfg.flags & pod_flags::ZTUNNEL != 0
        && from_ztunnel(netns_cookie, (local, local_port), (remote, lk.remote_port))
    {
        return SK_PASS;
    }
    let lookups = PodMaps { netns_cookie };
    if lookups.cidr_in(CidrList::Local, remote) {
        return SK_PASS;
    }
    let attempt = InboundAttempt {
        dst: local,
        src: remote,
        dst_port: local_port,
        ifindex,
    };
    let port = match decide_inbound(cfg, &attempt, &lookups) {
        Verdict::CaptureInbound => cfg.inbound_port,
        Verdict::Capture => cfg.outbound_port,
        // Not an inbound outcome.
        Verdict::CaptureDns => return SK_PASS,
        Verdict::Pass(reason) => {
            decided(lk, cfg, netns_cookie, reason, 0);
            return SK_PASS;
        }
    };
    // The listener of the packet's family, else a dual-stack IPv6 one.
    let mut key = ListenerKey {
        netns_cookie: netns_cookie.get(),
        port,
        family: if v6 { AF_INET6 } else { AF_INET },
        _pad: 0,
    };
    let mut steered = LISTENERS.redirect_sk_lookup(ctx, key, 0).is_ok();
    if !steered && !v6 {
        key.family = AF_INET6;
        steered = LISTENERS.redirect_sk_lookup(ctx, key, 0).is_ok();
    }
    if !steered {
        decided(lk, cfg, netns_cookie, Reason::NoInboundListener, 0);
        return if cfg.flags & pod_flags::FAIL_OPEN != 0 {
            SK_PASS
        } else {
            SK_DROP
        };
    }
    record(
        netns_cookie,
        local,
        local_port,
        remote,
        u16::from_be(lk.remote_port),
    );
    decided(lk, cfg, netns_cookie, Reason::SteeredInbound, port);
    SK_PASS
}

/// Whether ztunnel is making this connection (to the pod's app, from the client's address):
/// its sock_ops program recorded it at connect. `remote_port` is in network order.
#[inline(always)]
fn from_ztunnel(netns_cookie: NetnsCookie, local: (IpAddr, u16), remote: (IpAddr, u16)) -> bool {
    let ends = SocketEnds::new(local, (remote.0, u16::from_be(remote.1)));
    // SAFETY: only tested for presence.
    unsafe { ZTUNNEL_UPSTREAMS.get(ends.seen_by_proxy(netns_cookie)) }.is_some()
}

/// A lookup for an address no pod was set up with. This program runs only in captured
/// namespaces, but sk_lookup has no helper that names the namespace (not even on 6.18),
/// so the pod — whether and where to steer — is not known: the address is one the pod
/// gained after setup (a secondary IP, a later interface). The pod's own connections
/// pass; any other is refused, never let past the sidecar, and the address is noted for
/// user space, which adds it to its pod: the client's retransmitted SYN then lands on the
/// proxy. `to_itself`: the connection comes from the address it goes to, so from the pod.
#[inline(always)]
fn unknown_address(ifindex: u32, key: PodAddrKey, to_itself: bool) -> u32 {
    if to_itself {
        return SK_PASS;
    }
    let _ = ADDR_MISSES.insert(key, ifindex, 0);
    SK_DROP
}

/// Count a decision, and trace it when the pod is traced; `to` is the port steered to.
#[inline(always)]
fn decided(
    lk: &bpf_sk_lookup,
    cfg: &PodConfig,
    netns_cookie: NetnsCookie,
    reason: Reason,
    to: u16,
) {
    count(netns_cookie, reason);
    if trace::on(cfg) {
        trace::inbound(lk, netns_cookie, reason, to);
    }
}

/// The proxy's accepted socket will ask SO_ORIGINAL_DST: its local address is the
/// original destination, keyed as that socket will see the connection.
#[inline(always)]
fn record(
    netns_cookie: NetnsCookie,
    local: IpAddr,
    local_port: u16,
    remote: IpAddr,
    remote_port: u16,
) {
    let (family, local_raw) = addr::raw(local);
    let key =
        SocketEnds::new((local, local_port), (remote, remote_port)).seen_by_proxy(netns_cookie);
    let orig = OrigDst {
        addr: local_raw,
        port: local_port,
        family,
    };
    let _ = ORIG_DST_BY_CONN.insert(key, orig, 0);
}
