//! cgroup/recvmsg4 and recvmsg6: a reply from the DNS proxy carries the address of the
//! server the query was sent to, so the resolver library accepts it.

use core::ptr::{addr_of_mut, write_volatile};

use aya_ebpf::{helpers::generated::bpf_get_socket_cookie, programs::SockAddrContext, EbpfContext};
use redirector_common::{AF_INET, AF_INET6, DNS_CAPTURE_PORT};

use crate::maps::DNS_ORIG_BY_COOKIE;

/// recvmsg programs cannot refuse; 1 lets the message through.
const KEEP: i32 = 1;

pub fn recvmsg4(ctx: &SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    let (ip, port) = unsafe { ((*sa).user_ip4, (*sa).user_port) };
    if port != u32::from(DNS_CAPTURE_PORT.to_be()) || ip != u32::from_ne_bytes([127, 0, 0, 1]) {
        return KEEP;
    }
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let Some(orig) = (unsafe { DNS_ORIG_BY_COOKIE.get(cookie) }) else {
        return KEEP;
    };
    if orig.family == AF_INET {
        unsafe {
            write_volatile(addr_of_mut!((*sa).user_ip4), orig.addr.0[0]);
            write_volatile(addr_of_mut!((*sa).user_port), u32::from(orig.port.to_be()));
        }
    }
    KEEP
}

pub fn recvmsg6(ctx: &SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    let (ip, port) = unsafe { ((*sa).user_ip6, (*sa).user_port) };
    let v6_loopback = ip == [0, 0, 0, u32::from_ne_bytes([0, 0, 0, 1])];
    let mapped_loopback = ip
        == [
            0,
            0,
            u32::from_ne_bytes([0, 0, 0xff, 0xff]),
            u32::from_ne_bytes([127, 0, 0, 1]),
        ];
    if port != u32::from(DNS_CAPTURE_PORT.to_be()) || !(v6_loopback || mapped_loopback) {
        return KEEP;
    }
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let Some(orig) = (unsafe { DNS_ORIG_BY_COOKIE.get(cookie) }) else {
        return KEEP;
    };
    let words = match orig.family {
        AF_INET6 => orig.addr.0,
        _ => [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), orig.addr.0[0]],
    };
    unsafe {
        write_volatile(addr_of_mut!((*sa).user_ip6[0]), words[0]);
        write_volatile(addr_of_mut!((*sa).user_ip6[1]), words[1]);
        write_volatile(addr_of_mut!((*sa).user_ip6[2]), words[2]);
        write_volatile(addr_of_mut!((*sa).user_ip6[3]), words[3]);
        write_volatile(addr_of_mut!((*sa).user_port), u32::from(orig.port.to_be()));
    }
    KEEP
}
