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
