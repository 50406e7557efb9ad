//! Carrying the original destination from `connect()` to the proxy's `SO_ORIGINAL_DST`.
//!
//! connect → (socket cookie) → sock_ops ACTIVE_ESTABLISHED → (connection 4-tuple + netns)
//! → getsockopt on the proxy's accepted socket. The proxy-side socket's close removes the
//! entry; both maps are LRU, so connections that never reach a proxy age out.

use core::ptr::{addr_of_mut, write_volatile};

use aya_ebpf::{
    bindings::{
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG,
    },
    helpers::generated::bpf_get_socket_cookie,
    programs::{SockAddrContext, SockOpsContext, SockoptContext},
    EbpfContext,
};
use redirector_common::{
    kernel_abi::{IPPROTO_UDP, SOL_IP, SOL_IPV6, SO_ORIGINAL_DST},
    OrigDst, Reason, AF_INET, AF_INET6,
};

use crate::{
    addr::{self, SocketEnds},
    counters::count,
    maps::{self, DNS_ORIG_BY_COOKIE, ORIG_DST_BY_CONN, ORIG_DST_BY_COOKIE},
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
fn sock_ops_ends(ctx: &SockOpsContext) -> SocketEnds {
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

pub fn sock_ops(ctx: &SockOpsContext) {
    let op = ctx.op();
    if op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB {
        // The app's side: its connect() was redirected if its cookie has an entry.
        // SAFETY: called with the program's own context.
        let socket_cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        // SAFETY: the value is copied out at once.
        let Some(orig) = (unsafe { ORIG_DST_BY_COOKIE.get(socket_cookie) }) else {
            return;
        };
        let orig = *orig;
        let netns_cookie = maps::netns_cookie(ctx);
        let key = sock_ops_ends(ctx).seen_by_client(netns_cookie);
        let _ = ORIG_DST_BY_CONN.insert(key, orig, 0);
        let _ = ORIG_DST_BY_COOKIE.remove(socket_cookie);
    } else if op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB {
        // The proxy's side: watch its state so the entry goes when the connection closes.
        let netns_cookie = maps::netns_cookie(ctx);
        let key = sock_ops_ends(ctx).seen_by_proxy(netns_cookie);
        // SAFETY: only tested for presence.
        if unsafe { ORIG_DST_BY_CONN.get(key) }.is_some() {
            let _ = ctx.set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32);
        }
    } else if op == BPF_SOCK_OPS_STATE_CB && ctx.arg(1) == TCP_CLOSE {
        // Only the proxy's sockets ask for state callbacks (above).
        let netns_cookie = maps::netns_cookie(ctx);
        let _ = ORIG_DST_BY_CONN.remove(sock_ops_ends(ctx).seen_by_proxy(netns_cookie));
    }
}

/// Answer `SO_ORIGINAL_DST` for a redirected connection exactly as conntrack would:
/// a `sockaddr_in` (SOL_IP) or `sockaddr_in6` (SOL_IPV6) with the original address and port.
pub fn getsockopt(ctx: &SockoptContext) {
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
    let (ends, netns_cookie) = (unsafe { bpf_sock_ends(sk) }, maps::netns_cookie(ctx));
    // SAFETY: the value is copied out at once.
    let Some(orig) = (unsafe { ORIG_DST_BY_CONN.get(ends.seen_by_proxy(netns_cookie)) }) else {
        return;
    };
    let orig = *orig;
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
            DNS_ORIG_BY_COOKIE.get(&cookie).copied()
        } else {
            // The app asks on its own socket.
            let key = bpf_sock_ends(sk).seen_by_client(maps::netns_cookie(ctx));
            ORIG_DST_BY_CONN.get(&key).copied()
        }
    };
    if let Some(orig) = orig {
        addr::write_sock_addr::<V6>(sa, orig);
    }
}
