//! What identifies the pod we run for and what we read from it: its network namespace
//! (cookie and addresses) and its cgroup.

use std::{
    fs, io,
    net::IpAddr,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error("entering network namespace {path}: {source}")]
    EnterNetns { path: String, source: io::Error },
    #[error("reading the network namespace cookie (needs Linux 5.14+): {0}")]
    NetnsCookie(io::Error),
    #[error("listing the pod's addresses: {0}")]
    Addresses(io::Error),
    #[error("no cgroup v2 mount found in /proc/self/mountinfo")]
    NoCgroup2,
    #[error("reading /proc/self/cgroup: {0}")]
    OwnCgroup(io::Error),
    #[error("this process runs in the root cgroup (or its cgroup cannot be found in the mounted hierarchy), which has no parent to attach to; pass --cgroup")]
    RootCgroup,
    #[error("--cgroup {path} is not a cgroup v2 directory")]
    NotCgroup2 { path: String },
}

/// Facts about the pod that shape its plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    pub netns_cookie: u64,
    /// Non-loopback addresses of the pod: connections to them leave through `lo`.
    pub local_addrs: Vec<IpAddr>,
    pub cgroup: PathBuf,
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
}

/// Move this (single-threaded) process into the network namespace at `path`.
pub fn enter_netns(path: &Path) -> Result<(), PodError> {
    let err = |source| PodError::EnterNetns {
        path: path.display().to_string(),
        source,
    };
    let ns = fs::File::open(path).map_err(err)?;
    // SAFETY: setns on a file descriptor we own; affects only the calling thread, and the
    // process has no other threads yet.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(err(io::Error::last_os_error()));
    }
    Ok(())
}

/// The cookie of the calling thread's network namespace.
pub fn netns_cookie() -> Result<u64, PodError> {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0")
        .or_else(|_| std::net::UdpSocket::bind("[::1]:0"))
        .map_err(PodError::NetnsCookie)?;
    let mut cookie = 0u64;
    let mut len = size_of::<u64>() as libc::socklen_t;
    // SAFETY: the buffer and its length describe `cookie`.
    let ret = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &mut len,
        )
    };
    if ret != 0 {
        return Err(PodError::NetnsCookie(io::Error::last_os_error()));
    }
    Ok(cookie)
}

/// The addresses of the current network namespace that are local but not loopback.
/// Link-local IPv6 addresses are left out (every veth has one, and they never carry
/// service traffic), and so is ::6.
pub fn local_addresses() -> Result<Vec<IpAddr>, PodError> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(PodError::Addresses(io::Error::last_os_error()));
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
        let passthrough = ip == IpAddr::V6(std::net::Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6));
        if !ip.is_loopback() && !link_local && !passthrough && !addrs.contains(&ip) {
            addrs.push(ip);
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(addrs)
}

/// The interfaces of the current network namespace: (name, ifindex).
pub fn interfaces() -> Result<Vec<(String, u32)>, PodError> {
    // SAFETY: if_nameindex returns an array terminated by a zero entry, freed below.
    let head = unsafe { libc::if_nameindex() };
    if head.is_null() {
        return Err(PodError::Addresses(io::Error::last_os_error()));
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

/// Add ::6/128 to `lo`, as istio-iptables does when IPv6 is on: the proxy binds it as the
/// source of inbound passthrough connections over IPv6 (127.0.0.6 is already in 127/8).
pub fn add_inbound_passthrough_v6() -> io::Result<()> {
    const NETLINK_ROUTE: i32 = 0;
    const RTM_NEWADDR: u16 = 20;
    const IFA_ADDRESS: u16 = 1;
    const IFA_LOCAL: u16 = 2;
    const IFA_F_NODAD: u8 = 0x02;
    const RT_SCOPE_HOST: u8 = 254;
    // SAFETY: a NUL-terminated name.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if lo == 0 {
        return Err(io::Error::last_os_error());
    }
    let addr = std::net::Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6).octets();
    // struct ifaddrmsg, then two rtattrs holding the address.
    let mut body = vec![libc::AF_INET6 as u8, 128, IFA_F_NODAD, RT_SCOPE_HOST];
    body.extend_from_slice(&lo.to_ne_bytes());
    for kind in [IFA_LOCAL, IFA_ADDRESS] {
        body.extend_from_slice(&20u16.to_ne_bytes());
        body.extend_from_slice(&kind.to_ne_bytes());
        body.extend_from_slice(&addr);
    }
    use crate::netlink::{NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST};
    let request = crate::netlink::message(
        RTM_NEWADDR,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        &body,
    );
    match crate::netlink::exchange(NETLINK_ROUTE, &request, |_, _| {}) {
        Err(err) if err.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        other => other,
    }
}

/// The unicast routes of the main table of the current network namespace: destination
/// and output interface (RTM_GETROUTE dump).
pub fn routes() -> io::Result<Vec<(ipnet::IpNet, u32)>> {
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
        })?;
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

/// The cgroup v2 mount point, from /proc/self/mountinfo.
pub fn cgroup2_mount() -> Result<PathBuf, PodError> {
    let info = fs::read_to_string("/proc/self/mountinfo").map_err(|_| PodError::NoCgroup2)?;
    info.lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            (right.split_whitespace().next()? == "cgroup2")
                .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
        })
        .ok_or(PodError::NoCgroup2)
}

/// The pod cgroup: `explicit` if given, else the parent of this process's own cgroup
/// (an init container runs in a child of its pod's cgroup).
pub fn pod_cgroup(explicit: Option<&Path>) -> Result<PathBuf, PodError> {
    let path = match explicit {
        Some(path) => path.to_path_buf(),
        None => {
            let mount = cgroup2_mount()?;
            own_cgroup(&mount)?
                .parent()
                .ok_or(PodError::RootCgroup)?
                .to_path_buf()
        }
    };
    if !is_cgroup2_dir(&path) {
        return Err(PodError::NotCgroup2 {
            path: path.display().to_string(),
        });
    }
    Ok(path)
}

/// This process's cgroup, as a directory under `mount`.
fn own_cgroup(mount: &Path) -> Result<PathBuf, PodError> {
    let own = fs::read_to_string("/proc/self/cgroup").map_err(PodError::OwnCgroup)?;
    let rel = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or(PodError::NoCgroup2)?
        .trim();
    if rel != "/" {
        return Ok(mount.join(rel.trim_start_matches('/')));
    }
    // "/" is the root of our cgroup namespace: with a private cgroup namespace (the default
    // for containers on cgroup v2) and the host's hierarchy mounted, our cgroup is the
    // directory that lists our pid.
    find_cgroup_of(mount, std::process::id()).ok_or(PodError::RootCgroup)
}

/// The cgroup under `mount` whose cgroup.procs lists `pid` (breadth first; pod cgroups
/// are shallow).
fn find_cgroup_of(mount: &Path, pid: u32) -> Option<PathBuf> {
    let pid = pid.to_string();
    let mut queue = std::collections::VecDeque::from([mount.to_path_buf()]);
    while let Some(dir) = queue.pop_front() {
        if fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|p| p.lines().any(|l| l == pid)) {
            return Some(dir);
        }
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        queue.extend(
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    None
}

/// The filesystem magic number of the filesystem holding `path`.
fn fs_magic(path: &Path) -> Option<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs into a zeroed struct we own, with a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st.f_type as i64)
}

fn is_cgroup2_dir(path: &Path) -> bool {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    path.is_dir() && fs_magic(path) == Some(CGROUP2_SUPER_MAGIC)
}

/// Whether `path` is on a mounted bpffs.
pub fn is_bpffs(path: &Path) -> bool {
    const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
    fs_magic(path) == Some(BPF_FS_MAGIC)
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
