//! cgroup/connect4, connect6 and UDP sendmsg4/6: outbound capture (TCP, and DNS over UDP).

use core::net::IpAddr;

use aya_ebpf::{
    helpers::{bpf_get_current_uid_gid, generated::bpf_get_socket_cookie},
    programs::SockAddrContext,
    EbpfContext,
};
use redirector_common::{
    decide_outbound, pod_flags,
    trace::{DST_V6, FORMAT as TRACE_FORMAT, OUTBOUND, SRC_V6},
    OrigDst, OutboundAttempt, PodConfig, Protocol, RawIp, Reason, TraceRecord, Verdict, AF_INET6,
    DNS_CAPTURE_PORT,
};

use crate::{
    addr,
    counters::count_raw,
    maps::{self, PodMaps, DNS_ORIG_BY_COOKIE, ORIG_DST_BY_COOKIE, POD_CONFIG},
    trace,
};

/// Let the connect() proceed (possibly rewritten).
const ALLOW: i32 = 1;
/// Refuse the connect() with EPERM.
const REFUSE: i32 = 0;
const SOCK_STREAM: u32 = 1;
const SOCK_DGRAM: u32 = 2;

#[inline(always)]
fn protocol(sa: &aya_ebpf::bindings::bpf_sock_addr) -> Option<Protocol> {
    match sa.type_ {
        SOCK_STREAM => Some(Protocol::Tcp),
        SOCK_DGRAM => Some(Protocol::Udp),
        _ => None,
    }
}

/// The socket's bound IPv4 address, if any.
#[inline(always)]
fn bound_v4(sa: &aya_ebpf::bindings::bpf_sock_addr) -> IpAddr {
    // SAFETY: a connect/sendmsg context always has its socket; the verifier checks the read.
    let src = unsafe { (*sa.__bindgen_anon_1.sk).src_ip4 };
    if src == 0 {
        addr::unspecified()
    } else {
        addr::v4(src)
    }
}

pub fn connect4(ctx: &SockAddrContext) -> i32 {
    // SAFETY: `sock_addr` is the program's context; the verifier checks every field read.
    let sa = unsafe { &*ctx.sock_addr };
    let Some(protocol) = protocol(sa) else {
        return ALLOW;
    };
    capture::<false>(ctx, protocol, addr::v4(sa.user_ip4), bound_v4(sa))
}

pub fn connect6(ctx: &SockAddrContext) -> i32 {
    // SAFETY: `sock_addr` is the program's context; the verifier checks every field read.
    let sa = unsafe { &*ctx.sock_addr };
    let Some(protocol) = protocol(sa) else {
        return ALLOW;
    };
    // SAFETY: a connect/sendmsg context always has its socket; the verifier checks the read.
    let src = unsafe { (*sa.__bindgen_anon_1.sk).src_ip6 };
    capture::<true>(
        ctx,
        protocol,
        addr::v6_or_mapped(sa.user_ip6),
        addr::v6_or_mapped(src),
    )
}

/// UDP `sendto()` on an unconnected socket (connected ones went through connect).
pub fn sendmsg4(ctx: &SockAddrContext) -> i32 {
    // SAFETY: `sock_addr` is the program's context; the verifier checks every field read.
    let sa = unsafe { &*ctx.sock_addr };
    capture::<false>(ctx, Protocol::Udp, addr::v4(sa.user_ip4), bound_v4(sa))
}

pub fn sendmsg6(ctx: &SockAddrContext) -> i32 {
    // SAFETY: `sock_addr` is the program's context; the verifier checks every field read.
    let sa = unsafe { &*ctx.sock_addr };
    // SAFETY: a connect/sendmsg context always has its socket; the verifier checks the read.
    let src = unsafe { (*sa.__bindgen_anon_1.sk).src_ip6 };
    capture::<true>(
        ctx,
        Protocol::Udp,
        addr::v6_or_mapped(sa.user_ip6),
        addr::v6_or_mapped(src),
    )
}

#[inline(always)]
fn capture<const V6: bool>(
    ctx: &SockAddrContext,
    protocol: Protocol,
    dst: IpAddr,
    src: IpAddr,
) -> i32 {
    let netns_cookie = maps::netns_cookie(ctx);
    // SAFETY: the value stays valid (RCU) for this run of the program; it is only read.
    let Some(cfg) = (unsafe { POD_CONFIG.get(netns_cookie) }) else {
        return ALLOW;
    };
    if dst.is_ipv6() && cfg.flags & pod_flags::IPV6 == 0 {
        return ALLOW;
    }
    // SAFETY: `sock_addr` is the program's context; the verifier checks every field read.
    let sa = unsafe { &*ctx.sock_addr };
    let uid_gid = bpf_get_current_uid_gid();
    let attempt = OutboundAttempt {
        protocol,
        dst,
        dst_port: u16::from_be(sa.user_port as u16),
        src,
        uid: uid_gid as u32,
        gid: (uid_gid >> 32) as u32,
    };
    let verdict = decide_outbound(cfg, &attempt, &PodMaps { netns_cookie });
    let (reason, port) = match verdict {
        Verdict::Pass(reason) => (reason, 0),
        Verdict::Capture => (verdict.reason(), cfg.outbound_port),
        Verdict::CaptureInbound => (verdict.reason(), cfg.inbound_port),
        Verdict::CaptureDns => (verdict.reason(), DNS_CAPTURE_PORT),
    };
    // Every rule's path meets here (see trace::settle).
    let Some((reason, port)) = trace::settle(reason, port) else {
        return fail_closed(cfg);
    };
    let (reason, port, verdict) = if port == 0 {
        (reason, 0, ALLOW)
    } else {
        redirect::<V6>(ctx, cfg, &attempt, port, reason)
    };
    count_raw(netns_cookie, reason);
    if trace::on(cfg) {
        let (src, dst, families) = traced_addresses::<V6>(ctx, protocol, port);
        trace::write(TraceRecord {
            format: TRACE_FORMAT,
            reason,
            direction: OUTBOUND,
            protocol: protocol.number(),
            dst_port: attempt.dst_port,
            to: port,
            netns_cookie: netns_cookie.get(),
            uid: attempt.uid,
            gid: attempt.gid,
            src,
            dst,
            families,
            _reserved: [0; 7],
        });
    }
    verdict
}

/// The addresses of a traced decision, read again from the context (the socket's bound
/// address, and the destination unless it was rewritten) or from the original destination
/// just recorded: taking them from the decision's `IpAddr`s instead made the verifier
/// walk a conversion at the end of every path (connect6's load three times as long).
#[inline(always)]
fn traced_addresses<const V6: bool>(
    ctx: &SockAddrContext,
    protocol: Protocol,
    port: u16,
) -> (RawIp, RawIp, u8) {
    use core::ptr::read_volatile;
    // SAFETY: `sock_addr` is the program's context, with its socket; the verifier checks
    // each field read (and V6 is a constant of the program, as the verifier requires).
    let (src, mut dst) = unsafe {
        let sa = ctx.sock_addr;
        let sk = (*sa).__bindgen_anon_1.sk;
        if V6 {
            (
                RawIp(read_volatile(&(*sk).src_ip6)),
                RawIp(read_volatile(&(*sa).user_ip6)),
            )
        } else {
            (
                RawIp::from_v4_be(read_volatile(&(*sk).src_ip4)),
                RawIp::from_v4_be(read_volatile(&(*sa).user_ip4)),
            )
        }
    };
    let mut families = if V6 { SRC_V6 | DST_V6 } else { 0 };
    if port != 0 {
        // Rewritten to the proxy: the original is in the map it was just recorded in.
        // SAFETY: called with the program's own context.
        let socket_cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        // SAFETY: the value is copied out at once.
        let orig = unsafe {
            match protocol {
                Protocol::Tcp => ORIG_DST_BY_COOKIE.get(socket_cookie),
                Protocol::Udp => DNS_ORIG_BY_COOKIE.get(socket_cookie),
            }
        };
        if let Some(orig) = orig {
            dst = orig.addr;
            families &= !DST_V6;
            if orig.family == AF_INET6 {
                families |= DST_V6;
            }
        }
    }
    (src, dst, families)
}

/// The verdict when a capture cannot be carried out: refuse, unless the pod fails open.
#[inline(always)]
fn fail_closed(cfg: &PodConfig) -> i32 {
    if cfg.flags & pod_flags::FAIL_OPEN != 0 {
        ALLOW
    } else {
        REFUSE
    }
}

/// Record the original destination and rewrite the connect to the proxy on `port`.
/// Returns the reason to count, where it went and the program's verdict: `(FailedClosed,
/// 0, REFUSE)` when the original destination could not be recorded, unless the pod fails
/// open. The verdict is decided here, on the failure's own branch: computed after the
/// branches meet, the compiler makes it an OR of two conditions, whose result 6.1's
/// verifier no longer knows to be 0 or 1.
#[inline(always)]
fn redirect<const V6: bool>(
    ctx: &SockAddrContext,
    cfg: &PodConfig,
    attempt: &OutboundAttempt,
    port: u16,
    reason: u8,
) -> (u8, u16, i32) {
    let (family, raw) = addr::raw(attempt.dst);
    let orig = OrigDst {
        addr: raw,
        port: attempt.dst_port,
        family,
    };
    // SAFETY: called with the program's own context.
    let socket_cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // TCP: for SO_ORIGINAL_DST once established; UDP (DNS): for the replies' source.
    let recorded = match attempt.protocol {
        Protocol::Tcp => ORIG_DST_BY_COOKIE.insert(socket_cookie, orig, 0),
        Protocol::Udp => DNS_ORIG_BY_COOKIE.insert(socket_cookie, orig, 0),
    };
    if recorded.is_err() {
        return (Reason::FailedClosed as u8, 0, fail_closed(cfg));
    }
    // The proxy on this host: 127.0.0.1 (IPv4-mapped on an IPv6 socket) or ::1.
    let loopback = match attempt.dst {
        IpAddr::V4(_) => IpAddr::V4(core::net::Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(core::net::Ipv6Addr::LOCALHOST),
    };
    let (family, raw) = addr::raw(loopback);
    addr::write_sock_addr::<V6>(
        ctx.sock_addr,
        OrigDst {
            addr: raw,
            port,
            family,
        },
    );
    (reason, port, ALLOW)
}
