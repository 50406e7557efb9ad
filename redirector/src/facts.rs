//! Facts about a pod that shape its plan, read from its network namespace (addresses,
//! interfaces, routes), its resolv.conf and its cgroup.

use std::{
    fs, io,
    net::IpAddr,
    path::{Path, PathBuf},
};

use redirector_common::{decision::INBOUND_PASSTHROUGH_V6, NetnsCookie};

use crate::netns::{Netns, NetnsError};

#[derive(Debug, thiserror::Error)]
pub enum FactsError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("listing the pod's addresses: {0}")]
    Addresses(io::Error),
    #[error("listing the pod's interfaces: {0}")]
    Interfaces(io::Error),
    #[error("listing the pod's routes: {0}")]
    Routes(io::Error),
}

/// Facts about the pod that shape its plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    pub netns_cookie: NetnsCookie,
    /// Non-loopback addresses of the pod: connections to them leave through `lo`.
    pub local_addrs: Vec<IpAddr>,
    /// The pod's own cgroup (init-container mode); `None` when the node's cgroup links
    /// cover it (daemon mode).
    pub cgroup: Option<PathBuf>,
    /// The pod's interfaces: name and ifindex.
    pub interfaces: Vec<(String, u32)>,
    /// The pod's DNS servers (resolv.conf `nameserver` lines).
    pub dns_servers: Vec<IpAddr>,
    /// The pod's unicast routes of the main table: destination and output ifindex.
    pub routes: Vec<(ipnet::IpNet, u32)>,
}

impl PodFacts {
    /// IPv6 handling is on when the pod has a global or unique-local IPv6 address, as
    /// istio-iptables decides it.
    pub fn has_ipv6(&self) -> bool {
        self.local_addrs.iter().any(IpAddr::is_ipv6)
    }

    /// Read the facts of the pod in `netns` whose cgroup is `cgroup`.
    pub fn gather(
        netns: &Netns,
        cgroup: Option<PathBuf>,
        resolv_conf: &Path,
    ) -> Result<Self, FactsError> {
        let read = netns.run(read_namespace)?;
        Self::assemble(netns, read, cgroup, resolv_conf)
    }

    /// Open the namespace at `path` and read the facts of the pod in it, on one thread.
    pub fn open_and_gather(
        path: &Path,
        cgroup: Option<PathBuf>,
        resolv_conf: &Path,
    ) -> Result<(Netns, Self), FactsError> {
        let (netns, read) = Netns::open_and_run(path, read_namespace)?;
        let facts = Self::assemble(&netns, read, cgroup, resolv_conf)?;
        Ok((netns, facts))
    }

    fn assemble(
        netns: &Netns,
        read: Result<NamespaceFacts, FactsError>,
        cgroup: Option<PathBuf>,
        resolv_conf: &Path,
    ) -> Result<Self, FactsError> {
        let (local_addrs, interfaces, routes) = read?;
        Ok(PodFacts {
            netns_cookie: netns.cookie(),
            local_addrs,
            cgroup,
            interfaces,
            dns_servers: dns_servers(resolv_conf),
            routes,
        })
    }
}

/// What is read inside a pod's namespace: addresses, interfaces, routes.
type NamespaceFacts = (Vec<IpAddr>, Vec<(String, u32)>, Vec<(ipnet::IpNet, u32)>);

fn read_namespace() -> Result<NamespaceFacts, FactsError> {
    Ok((local_addresses()?, interfaces()?, routes()?))
}

/// The addresses of the calling thread's network namespace that are local but not loopback.
/// Link-local IPv6 addresses are left out (every veth has one, and they never carry
/// service traffic), and so is ::6.
pub fn local_addresses() -> Result<Vec<IpAddr>, FactsError> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(FactsError::Addresses(io::Error::last_os_error()));
    }
    let mut addrs = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list returned by getifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family tells its real type.
        let ip = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes())
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::from(sin6.sin6_addr.s6_addr)
                }
                _ => continue,
            }
        };
        let link_local = matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80);
        // ::6 is the inbound passthrough source we add to lo ourselves.
        let passthrough = ip == IpAddr::V6(INBOUND_PASSTHROUGH_V6);
        if !ip.is_loopback() && !link_local && !passthrough && !addrs.contains(&ip) {
            addrs.push(ip);
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(addrs)
}

/// The interfaces of the calling thread's network namespace: (name, ifindex).
pub fn interfaces() -> Result<Vec<(String, u32)>, FactsError> {
    // SAFETY: if_nameindex returns an array terminated by a zero entry, freed below.
    let head = unsafe { libc::if_nameindex() };
    if head.is_null() {
        return Err(FactsError::Interfaces(io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut cur = head;
    // SAFETY: walking the array up to its terminating entry, then freeing it once.
    unsafe {
        while (*cur).if_index != 0 {
            let name = std::ffi::CStr::from_ptr((*cur).if_name)
                .to_string_lossy()
                .into_owned();
            out.push((name, (*cur).if_index));
            cur = cur.add(1);
        }
        libc::if_freenameindex(head);
    }
    Ok(out)
}

/// The unicast routes of the main table of the calling thread's network namespace: destination
/// and output interface (RTM_GETROUTE dump).
fn routes() -> Result<Vec<(ipnet::IpNet, u32)>, FactsError> {
    const NETLINK_ROUTE: i32 = 0;
    const RTM_GETROUTE: u16 = 26;
    const RT_TABLE_MAIN: u8 = 254;
    const RTN_UNICAST: u8 = 1;
    const RTA_DST: u16 = 1;
    const RTA_OIF: u16 = 4;
    const RTMSG_LEN: usize = 12;
    let mut routes = Vec::new();
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let mut rtmsg = [0u8; RTMSG_LEN];
        rtmsg[0] = family;
        use crate::netlink::{NLM_F_DUMP, NLM_F_REQUEST};
        let request = crate::netlink::message(RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, &rtmsg);
        crate::netlink::exchange(NETLINK_ROUTE, &request, |_, body| {
            // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
            if body.len() < RTMSG_LEN || body[4] != RT_TABLE_MAIN || body[7] != RTN_UNICAST {
                return;
            }
            let dst_len = body[1];
            let (mut dst, mut oif) = (None, None);
            let mut attrs = &body[RTMSG_LEN..];
            while attrs.len() >= 4 {
                let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
                let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
                if len < 4 || len > attrs.len() {
                    break;
                }
                let value = &attrs[4..len];
                match (kind, value.len()) {
                    (RTA_DST, 4) => {
                        dst = Some(IpAddr::from(<[u8; 4]>::try_from(value).expect("4 bytes")))
                    }
                    (RTA_DST, 16) => {
                        dst = Some(IpAddr::from(<[u8; 16]>::try_from(value).expect("16 bytes")))
                    }
                    (RTA_OIF, 4) => {
                        oif = Some(u32::from_ne_bytes(value.try_into().expect("4 bytes")))
                    }
                    _ => {}
                }
                attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
            }
            // No RTA_DST: the default route.
            let dst = dst.unwrap_or(if family == libc::AF_INET as u8 {
                IpAddr::from([0u8; 4])
            } else {
                IpAddr::from([0u8; 16])
            });
            if let (Ok(net), Some(oif)) = (ipnet::IpNet::new(dst, dst_len), oif) {
                routes.push((net, oif));
            }
        })
        .map_err(FactsError::Routes)?;
    }
    Ok(routes)
}

/// The `nameserver` addresses of a resolv.conf; a missing file means none.
pub fn dns_servers(resolv_conf: &Path) -> Vec<IpAddr> {
    parse_nameservers(&fs::read_to_string(resolv_conf).unwrap_or_default())
}

fn parse_nameservers(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "nameserver").then_some(())?;
            // A scoped IPv6 server (fe80::1%eth0) is matched on its address.
            words.next()?.split('%').next()?.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nameservers_from_resolv_conf() {
        let text = "# comment\nsearch default.svc.cluster.local\nnameserver 10.96.0.10\nnameserver fd00::a%eth0\nnameserver bogus\noptions ndots:5\n";
        let want: Vec<IpAddr> = vec!["10.96.0.10".parse().unwrap(), "fd00::a".parse().unwrap()];
        assert_eq!(parse_nameservers(text), want);
    }
}
