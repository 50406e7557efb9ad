//! Carrying the original destination from `connect()` to the proxy's `SO_ORIGINAL_DST`.
//!
//! connect → (socket cookie) → sock_ops ACTIVE_ESTABLISHED → (connection 4-tuple + netns)
//! → getsockopt on the proxy's accepted socket. The close of the socket whose callback
//! recorded the entry removes it (the app's, or for inbound connections the proxy's);
//! both maps are LRU, so connections that never reach a proxy age out.

use core::{
    net::Ipv4Addr,
    ptr::{addr_of_mut, write_volatile},
};

use aya_ebpf::{
    bindings::BPF_SOCK_OPS_STATE_CB_FLAG,
    helpers::generated::bpf_get_socket_cookie,
    programs::{SockAddrContext, SockOpsContext, SockoptContext},
    EbpfContext,
};
use redirector_common::{
    kernel_abi::{IPPROTO_UDP, SOL_IP, SOL_IPV6, SO_ORIGINAL_DST},
    pod_flags, OrigDst, Reason, AF_INET, AF_INET6, DNS_CAPTURE_PORT,
};

use crate::{
    addr::{self, SocketEnds},
    counters::count,
    maps::{self, DNS_ORIG_BY_COOKIE, ORIG_DST_BY_CONN, ORIG_DST_BY_COOKIE, POD_CONFIG},
};

const TCP_CLOSE: u32 = 7;
const SOCKADDR_IN_LEN: usize = 16;
const SOCKADDR_IN6_LEN: usize = 28;

/// The ends of a socket seen through `struct bpf_sock`.
///
/// # Safety
/// `sk` is a non-null socket pointer from the program's context.
#[inline(always)]
unsafe fn bpf_sock_ends(sk: *const aya_ebpf::bindings::bpf_sock) -> SocketEnds {
    // SAFETY: the caller passes a non-null bpf_sock of the context; the verifier checks
    // every field read.
    unsafe {
        let (local, remote) = if (*sk).family == u32::from(AF_INET6) {
            (
                addr::v6_or_mapped((*sk).src_ip6),
                addr::v6_or_mapped((*sk).dst_ip6),
            )
        } else {
            (addr::v4((*sk).src_ip4), addr::v4((*sk).dst_ip4))
        };
        // src_port is host order; dst_port is the network-order port.
        SocketEnds::new(
            (local, (*sk).src_port as u16),
            (remote, u16::from_be((*sk).dst_port)),
        )
    }
}

/// The ends of a sock_ops socket.
#[inline(always)]
pub fn sock_ops_ends(ctx: &SockOpsContext) -> SocketEnds {
    // SAFETY: `ops` is the program's context; the verifier checks every field read.
    let ops = unsafe { &*ctx.ops };
    // local_port is host order; remote_port is the network-order port in the upper half.
    let local_port = ops.local_port as u16;
    let remote_port = u16::from_be((ops.remote_port >> 16) as u16);
    let (local, remote) = if ops.family == u32::from(AF_INET6) {
        (
            addr::v6_or_mapped(ops.local_ip6),
            addr::v6_or_mapped(ops.remote_ip6),
        )
    } else {
        (addr::v4(ops.local_ip4), addr::v4(ops.remote_ip4))
    };
    SocketEnds::new((local, local_port), (remote, remote_port))
}

/// Whether a socket's peer is on loopback (127.0.0.1, ::1 or IPv4-mapped 127.0.0.1), as
/// every redirected app socket's is (its peer is the proxy): the proxy's own upstream
/// connections, among others, skip every lookup.
#[inline(always)]
fn peer_is_loopback(family: u32, ip4: u32, ip6: [u32; 4]) -> bool {
    let v4_loopback = |be: u32| be == u32::from_ne_bytes(Ipv4Addr::LOCALHOST.octets());
    if family == u32::from(AF_INET6) {
        ip6 == [0, 0, 0, u32::from_ne_bytes([0, 0, 0, 1])]
            || (addr::is_v4_mapped(ip6) && v4_loopback(ip6[3]))
    } else {
        v4_loopback(ip4)
    }
}

/// sock_ops ACTIVE_ESTABLISHED, the app's side: its connect() was redirected if its cookie
/// has an entry. The app's socket is then watched, so that its close removes the entry:
/// watching it rather than the proxy's saves the proxy's side a lookup and, where the proxy
/// closes first, a state callback (6.18, bpf_stats: sock_ops 18 → 17 runs a connection).
pub fn app_established<const ON_CGROUP: bool>(ctx: &SockOpsContext) {
    // SAFETY: `ops` is the program's context; the verifier checks every field read.
    let ops = unsafe { &*ctx.ops };
    if !peer_is_loopback(ops.family, ops.remote_ip4, ops.remote_ip6) {
        return;
    }
    // SAFETY: called with the program's own context.
    let socket_cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // SAFETY: the value is copied out at once.
    let Some(&orig) = (unsafe { ORIG_DST_BY_COOKIE.get(socket_cookie) }) else {
        return;
    };
    let netns_cookie = maps::pod_cookie::<ON_CGROUP, _>(ctx);
    let key = sock_ops_ends(ctx).seen_by_client(netns_cookie);
    if ORIG_DST_BY_CONN.insert(key, orig, 0).is_ok() {
        watch_state(ctx);
    }
    let _ = ORIG_DST_BY_COOKIE.remove(socket_cookie);
}

#[inline(always)]
fn watch_state(ctx: &SockOpsContext) {
    let _ = ctx.set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32);
}

/// sock_ops PASSIVE_ESTABLISHED, the proxy's side of an inbound connection (recorded by
/// sk_lookup): watch its state so the entry goes when the connection closes. A peer on
/// loopback is an app of the pod, whose own socket is watched (above). Socket-local storage
/// would make the entry go with the socket, without these callbacks, but creating it
/// measured dearer than they are (6.18, bpf_stats: +0.7 µs a connection in getsockopt,
/// where the proxy's socket got it, against about 0.55 µs for the sock_ops work it saved).
pub fn proxy_established<const ON_CGROUP: bool>(ctx: &SockOpsContext) {
    // SAFETY: `ops` is the program's context; the verifier checks every field read.
    let ops = unsafe { &*ctx.ops };
    if peer_is_loopback(ops.family, ops.remote_ip4, ops.remote_ip6) {
        return;
    }
    let netns_cookie = maps::pod_cookie::<ON_CGROUP, _>(ctx);
    let key = sock_ops_ends(ctx).seen_by_proxy(netns_cookie);
    // SAFETY: only tested for presence.
    if unsafe { ORIG_DST_BY_CONN.get(key) }.is_some() {
        watch_state(ctx);
    }
}

/// sock_ops STATE_CB: only the sockets watched above ask for it; their close removes the
/// entry. One with its peer on loopback is the app's, any other the proxy's. A miss as the
/// app's is a proxy's socket that an earlier release watched (it watched every proxy's
/// socket), met across an upgrade: its entry is removed as the proxy's.
pub fn closed<const ON_CGROUP: bool>(ctx: &SockOpsContext) {
    if ctx.arg(1) != TCP_CLOSE {
        return;
    }
    // SAFETY: `ops` is the program's context; the verifier checks every field read.
    let ops = unsafe { &*ctx.ops };
    let ends = sock_ops_ends(ctx);
    let netns_cookie = maps::pod_cookie::<ON_CGROUP, _>(ctx);
    if peer_is_loopback(ops.family, ops.remote_ip4, ops.remote_ip6)
        && ORIG_DST_BY_CONN
            .remove(ends.seen_by_client(netns_cookie))
            .is_ok()
    {
        return;
    }
    let _ = ORIG_DST_BY_CONN.remove(ends.seen_by_proxy(netns_cookie));
}

/// The original destination of a redirected app socket, by its connection. Only sockets
/// whose peer is one of the pod's capture ports on loopback look it up: the proxy's
/// accepted sockets, which come here at every accept that asks for the peer, pay one
/// config lookup, not the connection's.
///
/// # Safety
/// `sk` is the context's non-null socket.
#[inline(always)]
unsafe fn redirected_peer(
    ctx: &SockAddrContext,
    sk: *mut aya_ebpf::bindings::bpf_sock,
) -> Option<OrigDst> {
    // SAFETY: `sk` is the caller's; the config stays valid (RCU) for this run; the value
    // is copied out at once.
    unsafe {
        if !peer_is_loopback((*sk).family, (*sk).dst_ip4, (*sk).dst_ip6) {
            return None;
        }
        let netns_cookie = maps::netns_cookie(ctx);
        let cfg = POD_CONFIG.get(netns_cookie)?;
        let peer_port = u16::from_be((*sk).dst_port);
        if peer_port != cfg.outbound_port
            && peer_port != cfg.inbound_port
            && peer_port != DNS_CAPTURE_PORT
        {
            return None;
        }
        // The app asks on its own socket.
        let key = bpf_sock_ends(sk).seen_by_client(netns_cookie);
        ORIG_DST_BY_CONN.get(key).copied()
    }
}

/// Answer `SO_ORIGINAL_DST` for a redirected connection exactly as conntrack would:
/// a `sockaddr_in` (SOL_IP) or `sockaddr_in6` (SOL_IPV6) with the original address and port.
pub fn getsockopt<const ON_CGROUP: bool>(ctx: &SockoptContext) {
    let so = ctx.sockopt;
    // SAFETY: `sockopt` is the program's context; the verifier checks every field read.
    let (level, optname) = unsafe { ((*so).level, (*so).optname) };
    if optname != SO_ORIGINAL_DST || (level != SOL_IP && level != SOL_IPV6) {
        return;
    }
    // SAFETY: as above.
    let sk = unsafe { (*so).__bindgen_anon_1.sk };
    if sk.is_null() {
        return;
    }
    // The proxy asks on its accepted socket.
    // SAFETY: `sk` is the context's non-null socket.
    let (ends, netns_cookie) = (
        unsafe { bpf_sock_ends(sk) },
        maps::pod_cookie::<ON_CGROUP, _>(ctx),
    );
    // SAFETY: the value is copied out at once.
    let orig = match unsafe { ORIG_DST_BY_CONN.get(ends.seen_by_proxy(netns_cookie)) } {
        Some(orig) => *orig,
        None => match unredirected(&ends, netns_cookie) {
            Some(own) => own,
            None => return,
        },
    };
    // conntrack answers SOL_IP for IPv4 connections and SOL_IPV6 for IPv6 ones.
    let written = match (level, orig.family) {
        (SOL_IP, AF_INET) => write_sockaddr_in(ctx, &orig),
        (SOL_IPV6, AF_INET6) => write_sockaddr_in6(ctx, &orig),
        _ => false,
    };
    if written {
        count(netns_cookie, Reason::OrigDstAnswered);
    }
}

/// A connection no program redirected that came from outside the pod to its inbound
/// capture port, asked about by a pod that wants conntrack's answer for it (its own
/// destination): what Linkerd's proxy expects of a client that reached its inbound port
/// directly, which it would otherwise drop. Only there: a redirected connection whose
/// entry is gone, answered with the outbound listener's own address, would have the proxy
/// connect to itself.
#[inline(always)]
fn unredirected(
    ends: &SocketEnds,
    netns_cookie: redirector_common::NetnsCookie,
) -> Option<OrigDst> {
    if ends.remote_is_loopback() {
        return None;
    }
    // SAFETY: the value stays valid (RCU) for this run of the program; it is only read.
    let cfg = unsafe { POD_CONFIG.get(netns_cookie) }?;
    if cfg.flags & pod_flags::ORIG_DST_OF_UNREDIRECTED == 0 || ends.local_port() != cfg.inbound_port
    {
        return None;
    }
    Some(ends.local_as_orig())
}

#[inline(always)]
fn write_sockaddr_in(ctx: &SockoptContext, orig: &OrigDst) -> bool {
    let so = ctx.sockopt;
    // SAFETY: optval..optval_end is the buffer the kernel hands the program; every write
    // is within SOCKADDR_IN_LEN of its start, checked against its end first.
    unsafe {
        let start = (*so).__bindgen_anon_2.optval as *mut u8;
        let end = (*so).__bindgen_anon_3.optval_end as *mut u8;
        if start.add(SOCKADDR_IN_LEN) > end {
            return false;
        }
        write_volatile(start as *mut u16, AF_INET);
        write_volatile(start.add(2) as *mut u16, orig.port.to_be());
        write_volatile(start.add(4) as *mut u32, orig.addr.0[0]);
        write_volatile(start.add(8) as *mut u32, 0);
        write_volatile(start.add(12) as *mut u32, 0);
        write_volatile(addr_of_mut!((*so).optlen), SOCKADDR_IN_LEN as i32);
        write_volatile(addr_of_mut!((*so).retval), 0);
    }
    true
}

#[inline(always)]
fn write_sockaddr_in6(ctx: &SockoptContext, orig: &OrigDst) -> bool {
    let so = ctx.sockopt;
    // SAFETY: as in write_sockaddr_in, within SOCKADDR_IN6_LEN.
    unsafe {
        let start = (*so).__bindgen_anon_2.optval as *mut u8;
        let end = (*so).__bindgen_anon_3.optval_end as *mut u8;
        if start.add(SOCKADDR_IN6_LEN) > end {
            return false;
        }
        write_volatile(start as *mut u16, AF_INET6);
        write_volatile(start.add(2) as *mut u16, orig.port.to_be());
        write_volatile(start.add(4) as *mut u32, 0); // flowinfo
        write_volatile(start.add(8) as *mut u32, orig.addr.0[0]);
        write_volatile(start.add(12) as *mut u32, orig.addr.0[1]);
        write_volatile(start.add(16) as *mut u32, orig.addr.0[2]);
        write_volatile(start.add(20) as *mut u32, orig.addr.0[3]);
        write_volatile(start.add(24) as *mut u32, 0); // scope id
        write_volatile(addr_of_mut!((*so).optlen), SOCKADDR_IN6_LEN as i32);
        write_volatile(addr_of_mut!((*so).retval), 0);
    }
    true
}

/// cgroup/getpeername4 and 6: the app's redirected socket reports the peer it connected
/// to, as it does with iptables' REDIRECT (whose NAT the socket never sees), not the proxy.
pub fn getpeername<const V6: bool>(ctx: &SockAddrContext) {
    let sa = ctx.sock_addr;
    // SAFETY: `sock_addr` is the program's context; the verifier checks the read.
    let sk = unsafe { (*sa).__bindgen_anon_1.sk };
    if sk.is_null() {
        return;
    }
    // SAFETY: `sk` is the context's non-null socket; helpers get the program's context;
    // map values are copied out at once.
    let orig = unsafe {
        if (*sk).protocol == u32::from(IPPROTO_UDP) {
            let cookie = bpf_get_socket_cookie(ctx.as_ptr());
            DNS_ORIG_BY_COOKIE.get(cookie).copied()
        } else {
            redirected_peer(ctx, sk)
        }
    };
    if let Some(orig) = orig {
        addr::write_sock_addr::<V6>(sa, orig);
    }
}
