//! Facts about a pod that shape its plan, read from its network namespace (addresses,
//! interfaces, routes), its resolv.conf and its cgroup.

use std::{
    fs, io,
    net::IpAddr,
    os::fd::{AsFd, BorrowedFd},
    path::{Path, PathBuf},
};

use redirector_common::{decision::INBOUND_PASSTHROUGH_V6, NetnsCookie};

use crate::{
    sys::netlink::{self, NETLINK_ROUTE, NLM_F_DUMP, NLM_F_REQUEST},
    sys::netns::{Netns, NetnsError},
    sys::user_ns::{self, PodIds, UserNsError},
};

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
    #[error(transparent)]
    UserNs(#[from] UserNsError),
}

/// Facts about the pod that shape its plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    pub netns_cookie: NetnsCookie,
    /// Non-loopback addresses of the pod, link-local ones included: connections to them
    /// leave through `lo`, and inbound connections to any of them must find the pod.
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
    /// The id maps of the pod's own user namespace (`hostUsers: false`): configured uids and
    /// gids are translated through them. `None` for a pod in the caller's user namespace.
    pub ids: Option<PodIds>,
}

impl PodFacts {
    /// IPv6 handling is on when the pod has a global or unique-local IPv6 address, as
    /// istio-iptables decides it.
    pub fn has_ipv6(&self) -> bool {
        self.local_addrs
            .iter()
            .any(|ip| ip.is_ipv6() && !is_link_local_v6(ip))
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
    /// The host's own namespace is refused unless `allow_host`.
    pub fn open_and_gather(
        path: &Path,
        allow_host: bool,
        cgroup: Option<PathBuf>,
        resolv_conf: &Path,
    ) -> Result<(Netns, Self), FactsError> {
        let (netns, read) = Netns::open_pod_and_run(path, allow_host, read_namespace)?;
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
        let ids = user_ns::of_netns(netns.as_fd())?;
        Ok(PodFacts {
            netns_cookie: netns.cookie(),
            local_addrs,
            cgroup,
            interfaces,
            dns_servers: dns_servers(resolv_conf),
            routes,
            ids,
        })
    }
}

/// What is read inside a pod's namespace: addresses, interfaces, routes.
type NamespaceFacts = (Vec<IpAddr>, Vec<(String, u32)>, Vec<(ipnet::IpNet, u32)>);

/// Three rtnetlink dumps on one socket (getifaddrs and if_nameindex would make three
/// sockets and dump the links twice).
fn read_namespace() -> Result<NamespaceFacts, FactsError> {
    let sock = netlink::socket(NETLINK_ROUTE).map_err(FactsError::Interfaces)?;
    Ok((
        addresses_on(sock.as_fd())?,
        interfaces_on(sock.as_fd())?,
        routes_on(sock.as_fd())?,
    ))
}

/// The addresses of the calling thread's network namespace that are local but not loopback.
pub fn local_addresses() -> Result<Vec<IpAddr>, FactsError> {
    addresses_on(
        netlink::socket(NETLINK_ROUTE)
            .map_err(FactsError::Addresses)?
            .as_fd(),
    )
}

/// The interfaces of the calling thread's network namespace: (name, ifindex).
pub fn interfaces() -> Result<Vec<(String, u32)>, FactsError> {
    interfaces_on(
        netlink::socket(NETLINK_ROUTE)
            .map_err(FactsError::Interfaces)?
            .as_fd(),
    )
}

/// A dump request of every family's `kind` objects; `header_len` is the length of the
/// request's family header (whose first byte, the family, stays AF_UNSPEC).
fn dump(kind: u16, header_len: usize) -> Vec<u8> {
    netlink::message(kind, NLM_F_REQUEST | NLM_F_DUMP, &vec![0; header_len])
}

/// An address from an attribute of 4 or 16 bytes.
fn ip_of(value: &[u8]) -> Option<IpAddr> {
    match value.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(value).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(value).ok()?)),
        _ => None,
    }
}

/// The local, non-loopback addresses of the namespace of `sock` (RTM_GETADDR dump), as
/// getifaddrs reports them: IFA_LOCAL, else IFA_ADDRESS. Link-local addresses are in
/// (every veth has one, and a peer on the link can connect to it); ::6 is not.
fn addresses_on(sock: BorrowedFd<'_>) -> Result<Vec<IpAddr>, FactsError> {
    const RTM_GETADDR: u16 = 22;
    const IFADDRMSG_LEN: usize = 8;
    const IFA_ADDRESS: u16 = 1;
    const IFA_LOCAL: u16 = 2;
    let mut addrs = Vec::new();
    netlink::exchange_on(sock, &dump(RTM_GETADDR, IFADDRMSG_LEN), |_, body| {
        let Some(attrs) = body.get(IFADDRMSG_LEN..) else {
            return;
        };
        let (mut local, mut address) = (None, None);
        for (kind, value) in netlink::attributes(attrs) {
            match kind {
                IFA_LOCAL => local = ip_of(value),
                IFA_ADDRESS => address = ip_of(value),
                _ => {}
            }
        }
        let Some(ip) = local.or(address) else {
            return;
        };
        // ::6 is the inbound passthrough source we add to lo ourselves.
        let passthrough = ip == IpAddr::V6(INBOUND_PASSTHROUGH_V6);
        if !ip.is_loopback() && !passthrough && !addrs.contains(&ip) {
            addrs.push(ip);
        }
    })
    .map_err(FactsError::Addresses)?;
    Ok(addrs)
}

/// fe80::/10.
fn is_link_local_v6(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

/// The interfaces of the namespace of `sock` (RTM_GETLINK dump): (name, ifindex).
fn interfaces_on(sock: BorrowedFd<'_>) -> Result<Vec<(String, u32)>, FactsError> {
    const RTM_GETLINK: u16 = 18;
    const IFINFOMSG_LEN: usize = 16;
    const IFLA_IFNAME: u16 = 3;
    let mut out = Vec::new();
    netlink::exchange_on(sock, &dump(RTM_GETLINK, IFINFOMSG_LEN), |_, body| {
        let (Some(index), Some(attrs)) = (body.get(4..8), body.get(IFINFOMSG_LEN..)) else {
            return;
        };
        let index = u32::from_ne_bytes(index.try_into().expect("4 bytes"));
        let name = netlink::attributes(attrs)
            .find(|(kind, _)| *kind == IFLA_IFNAME)
            .map(|(_, value)| {
                let name = value.split(|b| *b == 0).next().unwrap_or_default();
                String::from_utf8_lossy(name).into_owned()
            });
        if let Some(name) = name {
            out.push((name, index));
        }
    })
    .map_err(FactsError::Interfaces)?;
    Ok(out)
}

/// The unicast routes of the main table of the namespace of `sock` (RTM_GETROUTE dump):
/// destination and output interface.
fn routes_on(sock: BorrowedFd<'_>) -> Result<Vec<(ipnet::IpNet, u32)>, FactsError> {
    const RTM_GETROUTE: u16 = 26;
    const RTMSG_LEN: usize = 12;
    const RT_TABLE_MAIN: u8 = 254;
    const RTN_UNICAST: u8 = 1;
    const RTA_DST: u16 = 1;
    const RTA_OIF: u16 = 4;
    let mut routes = Vec::new();
    netlink::exchange_on(sock, &dump(RTM_GETROUTE, RTMSG_LEN), |_, body| {
        // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
        if body.len() < RTMSG_LEN || body[4] != RT_TABLE_MAIN || body[7] != RTN_UNICAST {
            return;
        }
        let (family, dst_len) = (body[0], body[1]);
        let (mut dst, mut oif) = (None, None);
        for (kind, value) in netlink::attributes(&body[RTMSG_LEN..]) {
            match (kind, value.len()) {
                (RTA_DST, _) => dst = ip_of(value),
                (RTA_OIF, 4) => oif = Some(u32::from_ne_bytes(value.try_into().expect("4 bytes"))),
                _ => {}
            }
        }
        // No RTA_DST: the default route.
        let dst = match (dst, i32::from(family)) {
            (Some(dst), _) => dst,
            (None, libc::AF_INET) => IpAddr::from([0u8; 4]),
            (None, libc::AF_INET6) => IpAddr::from([0u8; 16]),
            (None, _) => return,
        };
        if let (Ok(net), Some(oif)) = (ipnet::IpNet::new(dst, dst_len), oif) {
            routes.push((net, oif));
        }
    })
    .map_err(FactsError::Routes)?;
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
