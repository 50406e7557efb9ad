//! cgroup/recvmsg4 and recvmsg6: a reply from the DNS proxy carries the address of the
//! server the query was sent to, so the resolver library accepts it.

use aya_ebpf::{helpers::generated::bpf_get_socket_cookie, programs::SockAddrContext, EbpfContext};
use core::net::Ipv4Addr;

use redirector_common::{kernel_abi::V4_MAPPED_WORD, DNS_CAPTURE_PORT};

use crate::{addr, maps::DNS_ORIG_BY_COOKIE};

/// recvmsg programs cannot refuse; 1 lets the message through.
const KEEP: i32 = 1;

pub fn recvmsg4(ctx: &SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: `sock_addr` is the program's context; the verifier checks the read.
    let from_proxy = unsafe { (*sa).user_ip4 } == u32::from_ne_bytes(Ipv4Addr::LOCALHOST.octets());
    restore::<false>(ctx, from_proxy)
}

pub fn recvmsg6(ctx: &SockAddrContext) -> i32 {
    // SAFETY: `sock_addr` is the program's context; the verifier checks the read.
    let ip = unsafe { (*ctx.sock_addr).user_ip6 };
    let v6_loopback = ip == [0, 0, 0, u32::from_ne_bytes([0, 0, 0, 1])];
    let mapped_loopback = ip
        == [
            0,
            0,
            V4_MAPPED_WORD,
            u32::from_ne_bytes(Ipv4Addr::LOCALHOST.octets()),
        ];
    restore::<true>(ctx, v6_loopback || mapped_loopback)
}

#[inline(always)]
fn restore<const V6: bool>(ctx: &SockAddrContext, from_loopback: bool) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: `sock_addr` is the program's context; the verifier checks the read.
    if !from_loopback || unsafe { (*sa).user_port } != u32::from(DNS_CAPTURE_PORT.to_be()) {
        return KEEP;
    }
    // SAFETY: called with the program's own context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // SAFETY: the value is copied out at once.
    if let Some(orig) = unsafe { DNS_ORIG_BY_COOKIE.get(cookie) } {
        addr::write_sock_addr::<V6>(sa, *orig);
    }
    KEEP
}
