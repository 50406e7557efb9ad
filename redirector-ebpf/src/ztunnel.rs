//! Istio ambient: ztunnel proxies an enrolled pod from inside the pod's network namespace,
//! its sockets made there by its own process, in its own cgroup. This program runs at
//! ztunnel's cgroup. It registers ztunnel's capture listeners in each pod's namespace for
//! sk_lookup, removes the original destination of an inbound connection when ztunnel's
//! socket closes, and takes care of ztunnel's connections to the pod's own apps — its
//! upstreams, made from the client's address (`IP_TRANSPARENT`):
//!
//! - recorded until their handshake completes, so that sk_lookup lets them through rather
//!   than capturing them again (istio-cni's rules tell them by ztunnel's mark, which
//!   sk_lookup cannot see);
//! - marked 0x111 before the SYN is sent, so that the app's replies, to an address that is
//!   not the pod's, are routed back to ztunnel by the pod's policy route (istio-cni has
//!   conntrack carry that mark; here the kernel's `tcp_fwmark_accept` does).

use aya_ebpf::{helpers::generated::bpf_setsockopt, programs::SockOpsContext, EbpfContext};
use redirector_common::{
    kernel_abi::{SOL_SOCKET, SO_MARK, ZTUNNEL_REPLY_MARK},
    PodAddrKey,
};

use crate::{
    maps::{self, POD_BY_ADDR, ZTUNNEL_UPSTREAMS},
    orig_dst::sock_ops_ends,
};

/// sock_ops TCP_CONNECT (the source port chosen, the SYN not yet sent): a connection of
/// ztunnel's to an address of the namespace it is made in.
pub fn upstream_connecting(ctx: &SockOpsContext) {
    let netns_cookie = maps::netns_cookie(ctx);
    let ends = sock_ops_ends(ctx);
    let (family, raw) = ends.remote_raw();
    let key = PodAddrKey {
        addr: raw,
        family: u32::from(family),
    };
    // SAFETY: the value is copied out at once.
    if unsafe { POD_BY_ADDR.get(key) }.copied() != Some(netns_cookie) {
        return;
    }
    let mut mark: u32 = ZTUNNEL_REPLY_MARK;
    // SAFETY: the helper gets the program's context and a 4-byte value it only reads.
    unsafe {
        bpf_setsockopt(
            ctx.as_ptr(),
            SOL_SOCKET,
            SO_MARK,
            (&mut mark as *mut u32).cast(),
            size_of::<u32>() as i32,
        );
    }
    let _ = ZTUNNEL_UPSTREAMS.insert(ends.seen_by_client(netns_cookie), 1, 0);
}

/// sock_ops ACTIVE_ESTABLISHED: once the handshake is done, sk_lookup no longer sees the
/// connection.
pub fn upstream_established(ctx: &SockOpsContext) {
    let netns_cookie = maps::netns_cookie(ctx);
    let _ = ZTUNNEL_UPSTREAMS.remove(sock_ops_ends(ctx).seen_by_client(netns_cookie));
}
