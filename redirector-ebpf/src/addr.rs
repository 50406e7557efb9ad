//! Addresses as the kernel hands them over, turned into `core::net` types.

use core::net::{IpAddr, Ipv4Addr};

use redirector_common::{
    kernel_abi::V4_MAPPED_WORD, ClientEnd, ConnKey, Endpoint, NetnsCookie, OrigDst, ProxyEnd,
    RawIp, AF_INET, AF_INET6,
};

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
    words[0] == 0 && words[1] == 0 && words[2] == V4_MAPPED_WORD
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
pub fn write_sock_addr<const V6: bool>(sa: *mut aya_ebpf::bindings::bpf_sock_addr, orig: OrigDst) {
    use core::ptr::{addr_of_mut, write_volatile};
    // SAFETY: `sa` is the program's sock_addr context; the verifier checks each field
    // written (and rejects the other family's field, hence the constant V6).
    unsafe {
        if V6 {
            let words = if orig.family == AF_INET6 {
                orig.addr.0
            } else {
                [0, 0, V4_MAPPED_WORD, orig.addr.0[0]]
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

/// The two ends of a TCP socket as that socket sees them. A connection key is made from
/// the side it is seen by, so the client and proxy ends cannot be swapped by mistake.
#[derive(Clone, Copy)]
pub struct SocketEnds {
    family: u16,
    local: Endpoint,
    remote: Endpoint,
}

impl SocketEnds {
    /// From (address, host-order port) of the local and the remote end.
    #[inline(always)]
    pub fn new(local: (IpAddr, u16), remote: (IpAddr, u16)) -> Self {
        let (family, local_addr) = raw(local.0);
        let (_, remote_addr) = raw(remote.0);
        SocketEnds {
            family,
            local: Endpoint {
                addr: local_addr,
                port: local.1,
            },
            remote: Endpoint {
                addr: remote_addr,
                port: remote.1,
            },
        }
    }

    /// The socket's own port.
    #[inline(always)]
    pub fn local_port(&self) -> u16 {
        self.local.port
    }

    /// The other end's family and address.
    #[inline(always)]
    pub fn remote_raw(&self) -> (u16, RawIp) {
        (self.family, self.remote.addr)
    }

    /// Whether the other end is on loopback (127.0.0.0/8, ::1).
    #[inline(always)]
    pub fn remote_is_loopback(&self) -> bool {
        let words = self.remote.addr.0;
        if self.family == AF_INET6 {
            words == [0, 0, 0, u32::from_ne_bytes([0, 0, 0, 1])]
        } else {
            words[0].to_ne_bytes()[0] == 127
        }
    }

    /// The socket's own address and port, as an original destination.
    #[inline(always)]
    pub fn local_as_orig(&self) -> OrigDst {
        OrigDst {
            addr: self.local.addr,
            port: self.local.port,
            family: self.family,
        }
    }

    /// The connection's key, seen from the client's socket (the app's): it is the local end.
    #[inline(always)]
    pub fn seen_by_client(self, netns_cookie: NetnsCookie) -> ConnKey {
        ConnKey::new(
            netns_cookie.get(),
            self.family,
            ClientEnd(self.local),
            ProxyEnd(self.remote),
        )
    }

    /// The connection's key, seen from the proxy's accepted socket: it is the local end.
    #[inline(always)]
    pub fn seen_by_proxy(self, netns_cookie: NetnsCookie) -> ConnKey {
        ConnKey::new(
            netns_cookie.get(),
            self.family,
            ClientEnd(self.remote),
            ProxyEnd(self.local),
        )
    }
}
