//! cgroup/connect4 and connect6: outbound capture.

use core::net::IpAddr;
use core::ptr::{addr_of_mut, write_volatile};

use aya_ebpf::{
    helpers::{bpf_get_current_uid_gid, generated::bpf_get_netns_cookie, generated::bpf_get_socket_cookie},
    maps::lpm_trie::Key,
    programs::SockAddrContext,
    EbpfContext,
};
use redirector_common::{
    decide_outbound, pod_flags, Cidr4Key, Cidr6Key, CidrList, OrigDst, OutboundAttempt,
    PodConfig, PodLookups, PortKey, PortSet, Reason, Verdict, CIDR_KEY_FIXED_BITS,
};

use crate::{
    addr,
    counters::count,
    maps::{CIDRS_V4, CIDRS_V6, ORIG_DST_BY_COOKIE, POD_CONFIG, PORT_SETS},
};

/// Let the connect() proceed (possibly rewritten).
const ALLOW: i32 = 1;
/// Refuse the connect() with EPERM.
const REFUSE: i32 = 0;
const SOCK_STREAM: u32 = 1;

/// One pod's sets, looked up in the shared maps under its netns cookie.
pub struct PodMaps {
    pub netns_cookie: u64,
}

impl PodLookups for PodMaps {
    #[inline(always)]
    fn port_in(&self, set: PortSet, port: u16) -> bool {
        unsafe { PORT_SETS.get(&PortKey::new(self.netns_cookie, set, port)) }.is_some()
    }

    #[inline(always)]
    fn cidr_in(&self, list: CidrList, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => {
                let data = Cidr4Key { netns_cookie: self.netns_cookie, list: list as u32, addr: v4.octets() };
                CIDRS_V4.get(Key::new(CIDR_KEY_FIXED_BITS + 32, data)).is_some()
            }
            IpAddr::V6(v6) => {
                let data = Cidr6Key {
                    netns_cookie: self.netns_cookie,
                    list: list as u32,
                    addr: v6.octets(),
                    _pad: 0,
                };
                CIDRS_V6.get(Key::new(CIDR_KEY_FIXED_BITS + 128, data)).is_some()
            }
        }
    }
}

pub fn connect4(ctx: &SockAddrContext) -> i32 {
    let sa = unsafe { &*ctx.sock_addr };
    if sa.type_ != SOCK_STREAM {
        return ALLOW;
    }
    let src = unsafe { (*sa.__bindgen_anon_1.sk).src_ip4 };
    let src = if src == 0 { addr::unspecified() } else { addr::v4(src) };
    capture(ctx, addr::v4(sa.user_ip4), src, false)
}

pub fn connect6(ctx: &SockAddrContext) -> i32 {
    let sa = unsafe { &*ctx.sock_addr };
    if sa.type_ != SOCK_STREAM {
        return ALLOW;
    }
    let dst_words = sa.user_ip6;
    let src = unsafe { (*sa.__bindgen_anon_1.sk).src_ip6 };
    capture(ctx, addr::v6_or_mapped(dst_words), addr::v6_or_mapped(src), true)
}

#[inline(always)]
fn capture(ctx: &SockAddrContext, dst: IpAddr, src: IpAddr, v6_socket: bool) -> i32 {
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let Some(cfg) = (unsafe { POD_CONFIG.get(&netns_cookie) }) else {
        return ALLOW;
    };
    if dst.is_ipv6() && cfg.flags & pod_flags::IPV6 == 0 {
        return ALLOW;
    }
    let sa = unsafe { &*ctx.sock_addr };
    let uid_gid = bpf_get_current_uid_gid();
    let attempt = OutboundAttempt {
        dst,
        dst_port: u16::from_be(sa.user_port as u16),
        src,
        uid: uid_gid as u32,
        gid: (uid_gid >> 32) as u32,
    };
    let verdict = decide_outbound(cfg, &attempt, &PodMaps { netns_cookie });
    let port = match verdict {
        Verdict::Pass(reason) => {
            count(netns_cookie, reason);
            return ALLOW;
        }
        Verdict::Capture => cfg.outbound_port,
        Verdict::CaptureInbound => cfg.inbound_port,
    };
    redirect(ctx, cfg, netns_cookie, &attempt, port, v6_socket, verdict.reason())
}

#[inline(always)]
fn redirect(
    ctx: &SockAddrContext,
    cfg: &PodConfig,
    netns_cookie: u64,
    attempt: &OutboundAttempt,
    port: u16,
    v6_socket: bool,
    reason: Reason,
) -> i32 {
    let (family, raw) = addr::raw(attempt.dst);
    let orig = OrigDst { addr: raw, port: attempt.dst_port, family };
    let socket_cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if ORIG_DST_BY_COOKIE.insert(&socket_cookie, &orig, 0).is_err() {
        count(netns_cookie, Reason::FailedClosed);
        return if cfg.flags & pod_flags::FAIL_OPEN != 0 { ALLOW } else { REFUSE };
    }
    let sa = ctx.sock_addr;
    let port_be = u32::from(port.to_be());
    // Each field is written on its own: a merged 8-byte store is rejected by the verifier.
    unsafe {
        if !v6_socket {
            write_volatile(addr_of_mut!((*sa).user_ip4), u32::from_ne_bytes([127, 0, 0, 1]));
        } else {
            // The v6 loopback, or the v4 one mapped when the socket speaks IPv4.
            let words = match attempt.dst {
                IpAddr::V4(_) => [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), u32::from_ne_bytes([127, 0, 0, 1])],
                IpAddr::V6(_) => [0, 0, 0, u32::from_ne_bytes([0, 0, 0, 1])],
            };
            write_volatile(addr_of_mut!((*sa).user_ip6[0]), words[0]);
            write_volatile(addr_of_mut!((*sa).user_ip6[1]), words[1]);
            write_volatile(addr_of_mut!((*sa).user_ip6[2]), words[2]);
            write_volatile(addr_of_mut!((*sa).user_ip6[3]), words[3]);
        }
        write_volatile(addr_of_mut!((*sa).user_port), port_be);
    }
    count(netns_cookie, reason);
    ALLOW
}
