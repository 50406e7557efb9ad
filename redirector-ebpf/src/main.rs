//! redirector's kernel side, for kernels from 5.10. Three programs come in two variants,
//! the loader choosing by what the kernel has: `*_cgroup_cookie` read the pod's netns
//! cookie from its cgroup where sock_ops and getsockopt programs cannot call
//! `bpf_get_netns_cookie` (before 5.15); `steer_sk_lookup_by_address` does without
//! `ingress_ifindex` (before 5.17).
//!
//! Entry points are thin: each calls into a module that returns the program's verdict.
#![no_std]
#![no_main]

mod addr;
mod counters;
mod dns;
mod inbound;
mod maps;
mod orig_dst;
mod outbound;
mod trace;
mod ztunnel;

use aya_ebpf::{
    macros::{cgroup_sock_addr, cgroup_sockopt, sk_lookup, sock_ops},
    programs::{SkLookupContext, SockAddrContext, SockOpsContext, SockoptContext},
};

#[cgroup_sock_addr(connect4)]
pub fn capture_connect4(ctx: SockAddrContext) -> i32 {
    outbound::connect4(&ctx)
}

#[cgroup_sock_addr(connect6)]
pub fn capture_connect6(ctx: SockAddrContext) -> i32 {
    outbound::connect6(&ctx)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn capture_sendmsg4(ctx: SockAddrContext) -> i32 {
    outbound::sendmsg4(&ctx)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn capture_sendmsg6(ctx: SockAddrContext) -> i32 {
    outbound::sendmsg6(&ctx)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn restore_recvmsg4(ctx: SockAddrContext) -> i32 {
    dns::recvmsg4(&ctx)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn restore_recvmsg6(ctx: SockAddrContext) -> i32 {
    dns::recvmsg6(&ctx)
}

#[cgroup_sock_addr(getpeername4)]
pub fn restore_getpeername4(ctx: SockAddrContext) -> i32 {
    orig_dst::getpeername::<false>(&ctx);
    1
}

#[cgroup_sock_addr(getpeername6)]
pub fn restore_getpeername6(ctx: SockAddrContext) -> i32 {
    orig_dst::getpeername::<true>(&ctx);
    1
}

/// Runs for every TCP event of every socket in the cgroup (about 14 a connection between
/// two sockets of the pod, which no flag turns off); four kinds have work, the rest
/// return at once.
#[sock_ops]
pub fn track_sock_ops(ctx: SockOpsContext) -> u32 {
    sock_ops::<false>(&ctx)
}

#[sock_ops]
pub fn track_sock_ops_cgroup_cookie(ctx: SockOpsContext) -> u32 {
    sock_ops::<true>(&ctx)
}

#[inline(always)]
fn sock_ops<const ON_CGROUP: bool>(ctx: &SockOpsContext) -> u32 {
    use aya_ebpf::bindings::{
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_TCP_LISTEN_CB,
    };
    match ctx.op() {
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB => orig_dst::app_established::<ON_CGROUP>(ctx),
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => orig_dst::proxy_established::<ON_CGROUP>(ctx),
        BPF_SOCK_OPS_STATE_CB => orig_dst::closed::<ON_CGROUP>(ctx),
        BPF_SOCK_OPS_TCP_LISTEN_CB => inbound::register_listener::<ON_CGROUP>(ctx),
        _ => {}
    }
    1
}

/// At ztunnel's cgroup (Istio ambient; needs `bpf_get_netns_cookie` in sock_ops, 5.15): its
/// sockets live in the network namespaces of the pods it proxies.
#[sock_ops]
pub fn track_ztunnel(ctx: SockOpsContext) -> u32 {
    use aya_ebpf::bindings::{
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_TCP_CONNECT_CB, BPF_SOCK_OPS_TCP_LISTEN_CB,
    };
    match ctx.op() {
        BPF_SOCK_OPS_TCP_CONNECT_CB => ztunnel::upstream_connecting(&ctx),
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB => ztunnel::upstream_established(&ctx),
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => orig_dst::proxy_established::<false>(&ctx),
        BPF_SOCK_OPS_STATE_CB => orig_dst::closed::<false>(&ctx),
        BPF_SOCK_OPS_TCP_LISTEN_CB => inbound::register_listener::<false>(&ctx),
        _ => {}
    }
    1
}

#[sk_lookup]
pub fn steer_sk_lookup(ctx: SkLookupContext) -> u32 {
    inbound::sk_lookup::<true>(&ctx)
}

#[sk_lookup]
pub fn steer_sk_lookup_by_address(ctx: SkLookupContext) -> u32 {
    inbound::sk_lookup::<false>(&ctx)
}

#[cgroup_sockopt(getsockopt)]
pub fn answer_getsockopt(ctx: SockoptContext) -> i32 {
    orig_dst::getsockopt::<false>(&ctx);
    1
}

#[cgroup_sockopt(getsockopt)]
pub fn answer_getsockopt_cgroup_cookie(ctx: SockoptContext) -> i32 {
    orig_dst::getsockopt::<true>(&ctx);
    1
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// SAFETY: the kernel reads the program license from this section; nothing else is
// named LICENSE in the object.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
