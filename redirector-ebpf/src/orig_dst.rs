//! Carrying the original destination from `connect()` to the proxy's `SO_ORIGINAL_DST`.
//!
//! connect → (the app socket's storage) → sock_ops ACTIVE_ESTABLISHED → (connection 4-tuple
//! + netns) → the proxy's first `SO_ORIGINAL_DST` on its accepted socket → (that socket's
//! storage). Socket storage goes with its socket; the 4-tuple map is LRU, so connections
//! whose proxy never asks age out. sock_ops therefore needs no state callbacks.

use core::ptr::{addr_of_mut, write_volatile};

use core::net::Ipv4Addr;

use aya_ebpf::{
    helpers::generated::bpf_get_socket_cookie,
    programs::{SockAddrContext, SockOpsContext, SockoptContext},
    EbpfContext,
};
use redirector_common::{
    kernel_abi::{IPPROTO_UDP, SOL_IP, SOL_IPV6, SO_ORIGINAL_DST},
    socket_side, OrigDst, Reason, AF_INET, AF_INET6,
};

use crate::{
    addr::{self, SocketEnds},
    counters::count,
    maps::{self, DNS_ORIG_BY_COOKIE, ORIG_DST_BY_CONN, ORIG_DST_BY_COOKIE},
    socket_storage,
};

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

/// Whether a socket's peer is the proxy on this host (127.0.0.1, ::1 or IPv4-mapped
/// 127.0.0.1), as every redirected app socket's is: other sockets skip the lookups kept
/// for connections made before an upgrade from an object without socket storage.
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

/// sock_ops ACTIVE_ESTABLISHED: the app's side. Its connect() was redirected if its socket
/// holds an original destination; the proxy's accepted socket will ask for it by the
/// connection's 4-tuple, the one thing both sockets know.
pub fn established(ctx: &SockOpsContext) {
    // SAFETY: `ops` is the program's context; the verifier checks every field read.
    let ops = unsafe { &*ctx.ops };
    if !peer_is_loopback(ops.family, ops.remote_ip4, ops.remote_ip6) {
        return;
    }
    // SAFETY: as above.
    let sk = unsafe { ops.__bindgen_anon_2.sk };
    if sk.is_null() {
        return;
    }
    // SAFETY: `sk` is the context's non-null socket.
    let orig = match unsafe { socket_storage::get(sk) } {
        Some(entry) if entry.side == socket_side::APP => entry.orig,
        Some(_) => return,
        None => {
            // A connect() that an object without socket storage redirected just before
            // an upgrade: its original destination is by socket cookie.
            // SAFETY: called with the program's own context.
            let socket_cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
            // SAFETY: the value is copied out at once.
            let Some(&orig) = (unsafe { ORIG_DST_BY_COOKIE.get(socket_cookie) }) else {
                return;
            };
            let _ = ORIG_DST_BY_COOKIE.remove(socket_cookie);
            orig
        }
    };
    let key = sock_ops_ends(ctx).seen_by_client(maps::netns_cookie(ctx));
    let _ = ORIG_DST_BY_CONN.insert(key, orig, 0);
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
    let netns_cookie = maps::netns_cookie(ctx);
    // The proxy asks on its accepted socket: from its second ask on, the answer is the
    // socket's own.
    // SAFETY: `sk` is the context's non-null socket.
    let orig = match unsafe { socket_storage::get(sk) } {
        Some(entry) if entry.side == socket_side::PROXY => entry.orig,
        _ => {
            // SAFETY: `sk` is the context's non-null socket.
            let key = unsafe { bpf_sock_ends(sk) }.seen_by_proxy(netns_cookie);
            // SAFETY: the value is copied out at once.
            let Some(&orig) = (unsafe { ORIG_DST_BY_CONN.get(&key) }) else {
                return;
            };
            // The first ask moves it into the socket, to go with it; kept by connection
            // when the socket has no room.
            // SAFETY: `sk` is the context's non-null socket.
            if unsafe { socket_storage::set(sk, orig, socket_side::PROXY) } {
                let _ = ORIG_DST_BY_CONN.remove(&key);
            }
            orig
        }
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
        } else if !peer_is_loopback((*sk).family, (*sk).dst_ip4, (*sk).dst_ip6) {
            None
        } else {
            // The app asks on its own socket.
            match socket_storage::get(sk) {
                Some(entry) if entry.side == socket_side::APP => Some(entry.orig),
                Some(_) => None,
                // Redirected by an object without socket storage, before an upgrade.
                None => {
                    let key = bpf_sock_ends(sk).seen_by_client(maps::netns_cookie(ctx));
                    ORIG_DST_BY_CONN.get(&key).copied()
                }
            }
        }
    };
    if let Some(orig) = orig {
        addr::write_sock_addr::<V6>(sa, orig);
    }
}
