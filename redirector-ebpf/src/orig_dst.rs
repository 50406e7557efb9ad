//! Carrying the original destination from `connect()` to the proxy's `SO_ORIGINAL_DST`.
//!
//! connect → (socket cookie) → sock_ops ACTIVE_ESTABLISHED → (connection 4-tuple + netns)
//! → getsockopt on the proxy's accepted socket. The proxy-side socket's close removes the
//! entry; both maps are LRU, so connections that never reach a proxy age out.

use core::net::IpAddr;
use core::ptr::{addr_of_mut, write_volatile};

use aya_ebpf::{
    bindings::{
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG,
    },
    helpers::generated::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    programs::{SockAddrContext, SockOpsContext, SockoptContext},
    EbpfContext,
};
use redirector_common::{ConnKey, OrigDst, Reason, AF_INET, AF_INET6};

use crate::{
    addr,
    counters::count,
    maps::{DNS_ORIG_BY_COOKIE, ORIG_DST_BY_CONN, ORIG_DST_BY_COOKIE},
};

const TCP_CLOSE: u32 = 7;
const IPPROTO_UDP: u32 = 17;
const SOL_IP: i32 = 0;
const SOL_IPV6: i32 = 41;
/// `SO_ORIGINAL_DST` (SOL_IP) and `IP6T_SO_ORIGINAL_DST` (SOL_IPV6) share the number.
const SO_ORIGINAL_DST: i32 = 80;
const SOCKADDR_IN_LEN: usize = 16;
const SOCKADDR_IN6_LEN: usize = 28;

/// An endpoint of a TCP socket: address and host-order port.
#[derive(Clone, Copy)]
struct Endpoint {
    ip: IpAddr,
    port: u16,
}

#[inline(always)]
fn conn_key(netns_cookie: u64, client: Endpoint, proxy: Endpoint) -> ConnKey {
    let (family, client_ip) = addr::raw(client.ip);
    let (_, proxy_ip) = addr::raw(proxy.ip);
    ConnKey {
        netns_cookie,
        client: client_ip,
        proxy: proxy_ip,
        client_port: client.port,
        proxy_port: proxy.port,
        family: u32::from(family),
    }
}

/// (local, remote) endpoints of a socket seen through `struct bpf_sock`.
///
/// # Safety
/// `sk` is a non-null socket pointer from the program's context.
#[inline(always)]
unsafe fn sock_endpoints(sk: *const aya_ebpf::bindings::bpf_sock) -> (Endpoint, Endpoint) {
    unsafe {
        let (local_ip, remote_ip) = if (*sk).family == u32::from(AF_INET6) {
            (
                addr::v6_or_mapped((*sk).src_ip6),
                addr::v6_or_mapped((*sk).dst_ip6),
            )
        } else {
            (addr::v4((*sk).src_ip4), addr::v4((*sk).dst_ip4))
        };
        (
            Endpoint {
                ip: local_ip,
                port: (*sk).src_port as u16,
            },
            // dst_port is the network-order port.
            Endpoint {
                ip: remote_ip,
                port: u16::from_be((*sk).dst_port),
            },
        )
    }
}

/// (local, remote) endpoints of a sock_ops socket.
#[inline(always)]
fn sock_ops_endpoints(ctx: &SockOpsContext) -> (Endpoint, Endpoint) {
    let ops = unsafe { &*ctx.ops };
    // local_port is host order; remote_port is the network-order port in the upper half.
    let local_port = ops.local_port as u16;
    let remote_port = u16::from_be((ops.remote_port >> 16) as u16);
    let (local_ip, remote_ip) = if ops.family == u32::from(AF_INET6) {
        (
            addr::v6_or_mapped(ops.local_ip6),
            addr::v6_or_mapped(ops.remote_ip6),
        )
    } else {
        (addr::v4(ops.local_ip4), addr::v4(ops.remote_ip4))
    };
    (
        Endpoint {
            ip: local_ip,
            port: local_port,
        },
        Endpoint {
            ip: remote_ip,
            port: remote_port,
        },
    )
}

pub fn sock_ops(ctx: &SockOpsContext) {
    let op = ctx.op();
    if op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB {
        // The app's side: its connect() was redirected if its cookie has an entry.
        let socket_cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        let Some(orig) = (unsafe { ORIG_DST_BY_COOKIE.get(socket_cookie) }) else {
            return;
        };
        let orig = *orig;
        let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
        let (local, remote) = sock_ops_endpoints(ctx);
        let _ = ORIG_DST_BY_CONN.insert(conn_key(netns_cookie, local, remote), orig, 0);
        let _ = ORIG_DST_BY_COOKIE.remove(socket_cookie);
    } else if op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB {
        // The proxy's side: watch its state so the entry goes when the connection closes.
        let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
        let (local, remote) = sock_ops_endpoints(ctx);
        let key = conn_key(netns_cookie, remote, local);
        if unsafe { ORIG_DST_BY_CONN.get(key) }.is_some() {
            let _ = ctx.set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32);
        }
    } else if op == BPF_SOCK_OPS_STATE_CB && ctx.arg(1) == TCP_CLOSE {
        let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
        let (local, remote) = sock_ops_endpoints(ctx);
        let _ = ORIG_DST_BY_CONN.remove(conn_key(netns_cookie, remote, local));
    }
}

/// Answer `SO_ORIGINAL_DST` for a redirected connection exactly as conntrack would:
/// a `sockaddr_in` (SOL_IP) or `sockaddr_in6` (SOL_IPV6) with the original address and port.
pub fn getsockopt(ctx: &SockoptContext) {
    let so = ctx.sockopt;
    let (level, optname) = unsafe { ((*so).level, (*so).optname) };
    if optname != SO_ORIGINAL_DST || (level != SOL_IP && level != SOL_IPV6) {
        return;
    }
    let sk = unsafe { (*so).__bindgen_anon_1.sk };
    if sk.is_null() {
        return;
    }
    let (local, remote) = unsafe { sock_endpoints(sk) };
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let Some(orig) = (unsafe { ORIG_DST_BY_CONN.get(conn_key(netns_cookie, remote, local)) })
    else {
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
    let sk = unsafe { (*sa).__bindgen_anon_1.sk };
    if sk.is_null() {
        return;
    }
    let orig = unsafe {
        if (*sk).protocol == IPPROTO_UDP {
            let cookie = bpf_get_socket_cookie(ctx.as_ptr());
            DNS_ORIG_BY_COOKIE.get(&cookie).copied()
        } else {
            let (local, remote) = sock_endpoints(sk);
            let netns_cookie = bpf_get_netns_cookie(ctx.as_ptr());
            ORIG_DST_BY_CONN
                .get(&conn_key(netns_cookie, local, remote))
                .copied()
        }
    };
    if let Some(orig) = orig {
        addr::write_sock_addr::<V6>(sa, orig);
    }
}
