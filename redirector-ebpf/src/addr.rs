//! Addresses as the kernel hands them over, turned into `core::net` types.

use core::net::{IpAddr, Ipv4Addr};

use redirector_common::{RawIp, AF_INET, AF_INET6};

#[inline(always)]
pub fn v4(be: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(be.to_ne_bytes()))
}

/// An IPv6 address; an IPv4-mapped one (`::ffff:a.b.c.d`, a dual-stack socket talking
/// IPv4) becomes the IPv4 address, because on the wire it is IPv4.
#[inline(always)]
pub fn v6_or_mapped(words: [u32; 4]) -> IpAddr {
    if is_v4_mapped(words) {
        return v4(words[3]);
    }
    IpAddr::V6(RawIp(words).v6())
}

#[inline(always)]
pub fn is_v4_mapped(words: [u32; 4]) -> bool {
    words[0] == 0 && words[1] == 0 && words[2] == u32::from_ne_bytes([0, 0, 0xff, 0xff])
}

/// The (family, raw) pair stored in maps for an address.
#[inline(always)]
pub fn raw(ip: IpAddr) -> (u16, RawIp) {
    match ip {
        IpAddr::V4(v4) => (AF_INET, RawIp::from_v4_be(u32::from_ne_bytes(v4.octets()))),
        IpAddr::V6(_) => (AF_INET6, RawIp::from_ip(ip)),
    }
}

#[inline(always)]
pub fn unspecified() -> IpAddr {
    IpAddr::V4(Ipv4Addr::UNSPECIFIED)
}

/// Write `orig` as the address of a sock_addr context: user_ip4 in an IPv4 program
/// (`V6 = false`), user_ip6 in an IPv6 one (IPv4-mapped for an IPv4 address). The verifier
/// rejects any access to the other family's field, so the family is a constant of the
/// program, not a runtime branch. Each field is written on its own: a merged 8-byte store
/// is rejected too.
#[inline(always)]
pub fn write_sock_addr<const V6: bool>(
    sa: *mut aya_ebpf::bindings::bpf_sock_addr,
    orig: redirector_common::OrigDst,
) {
    use core::ptr::{addr_of_mut, write_volatile};
    unsafe {
        if V6 {
            let words = if orig.family == AF_INET6 {
                orig.addr.0
            } else {
                [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), orig.addr.0[0]]
            };
            write_volatile(addr_of_mut!((*sa).user_ip6[0]), words[0]);
            write_volatile(addr_of_mut!((*sa).user_ip6[1]), words[1]);
            write_volatile(addr_of_mut!((*sa).user_ip6[2]), words[2]);
            write_volatile(addr_of_mut!((*sa).user_ip6[3]), words[3]);
        } else if orig.family == AF_INET {
            write_volatile(addr_of_mut!((*sa).user_ip4), orig.addr.0[0]);
        } else {
            return;
        }
        write_volatile(addr_of_mut!((*sa).user_port), u32::from(orig.port.to_be()));
    }
}
