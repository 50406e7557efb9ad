//! A pod and a service, each in its own netns, joined by a veth pair.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::probe::connect_from;
use crate::process::{within, EVENTUALLY};
use crate::{next_id, words, Cgroup, ConnOutcome, NetNs};

/// Name of the veth end in both namespaces (the pod's looks like a real pod's interface, for
/// istio's `-c`/`-k` interface options).
pub const POD_IFACE: &str = "eth0";
pub const SERVICE_IFACE: &str = "eth0";

/// ```text
///  pod netns                                service netns
///  eth0 10.200.N.1/24 fd00:200:N::1/64 ──veth── eth0 10.200.N.2/24 fd00:200:N::2/64
///  default via 10.200.N.2 / fd00:200:N::2
///  pod_cgroup: <cgroup2>/rdt-…-pod
/// ```
///
/// The pod's default routes point at the service namespace, so a connect to any address is
/// routable from the pod (as in a real pod) and reaches either a capture rule or the service
/// namespace, which answers on its own addresses and drops everything else (forwarding is
/// off in a new netns). Nothing leaves the two namespaces.
///
/// The veth pair is created inside the namespaces (`peer … netns`), so its names never touch
/// the host's namespace; deleting the namespaces deletes it. Fields drop in order: pod,
/// service, cgroup — drop the processes running in them first (declare them later).
#[derive(Debug)]
pub struct Topology {
    pub pod: NetNs,
    pub service: NetNs,
    pub pod_cgroup: Cgroup,
    subnet: u8,
}

impl Topology {
    pub fn new(hint: &str) -> Self {
        Self::with_cgroup(hint, Cgroup::new(&format!("{hint}pod")))
    }

    /// A pod whose cgroup is below `node`, named as kubelet names a pod's (`pod<uid>`): a
    /// daemon finds it from the pod's processes and attaches the programs there.
    pub fn under(node: &Cgroup, hint: &str) -> Self {
        Self::with_cgroup(hint, Cgroup::pod_under(node))
    }

    fn with_cgroup(hint: &str, pod_cgroup: Cgroup) -> Self {
        Self::with_pod(hint, NetNs::new(&format!("{hint}pod")), pod_cgroup)
    }

    /// A pod in the namespace `pod` (made elsewhere, e.g. owned by a user namespace).
    pub fn with_pod(hint: &str, pod: NetNs, pod_cgroup: Cgroup) -> Self {
        let topology = Topology {
            pod,
            service: NetNs::new(&format!("{hint}svc")),
            pod_cgroup,
            subnet: PairAddresses::fresh_subnet(),
        };
        add_veth(
            &topology.pod,
            POD_IFACE,
            SERVICE_IFACE,
            topology.service.name(),
        );
        let pod_run = |args: &[&str]| {
            topology.pod.run(args);
        };
        let service_run = |args: &[&str]| {
            topology.service.run(args);
        };
        address_iface(pod_run, POD_IFACE, topology.pod_ip4(), topology.pod_ip6());
        address_iface(
            service_run,
            SERVICE_IFACE,
            topology.service_ip4(),
            topology.service_ip6(),
        );
        default_routes(pod_run, topology.service_ip4(), topology.service_ip6());
        topology
    }

    /// The N in 10.200.N.0/24 and fd00:200:N::/64.
    pub fn subnet(&self) -> u8 {
        self.subnet
    }

    pub fn pod_ip4(&self) -> Ipv4Addr {
        PairAddresses::TOPOLOGY.pod_ip4(self.subnet)
    }

    pub fn service_ip4(&self) -> Ipv4Addr {
        PairAddresses::TOPOLOGY.service_ip4(self.subnet)
    }

    pub fn pod_ip6(&self) -> Ipv6Addr {
        PairAddresses::TOPOLOGY.pod_ip6(self.subnet)
    }

    pub fn service_ip6(&self) -> Ipv6Addr {
        PairAddresses::TOPOLOGY.service_ip6(self.subnet)
    }

    /// The service's address of the same family as `v6`, with `port`.
    pub fn service_addr(&self, v6: bool, port: u16) -> SocketAddr {
        PairAddresses::TOPOLOGY.service_addr(self.subnet, v6, port)
    }

    /// The pod's address of the same family as `v6`, with `port`.
    pub fn pod_addr(&self, v6: bool, port: u16) -> SocketAddr {
        PairAddresses::TOPOLOGY.pod_addr(self.subnet, v6, port)
    }

    /// Another address of the pod (/32 or /128 on its eth0), e.g. a second pod IP.
    pub fn add_pod_addr(&self, ip: IpAddr) {
        add_host_addr(&self.pod, POD_IFACE, ip);
    }

    /// Another address the service namespace answers on (/32 or /128 on its eth0), e.g. a
    /// stand-in for an "external" destination; the pod reaches it over its default route.
    pub fn add_service_addr(&self, ip: IpAddr) {
        add_host_addr(&self.service, SERVICE_IFACE, ip);
    }

    /// Waits (up to [`EVENTUALLY`]) until neither end of the veth pair has a tentative IPv6
    /// address: their link-local addresses go through duplicate address detection (a second
    /// or two), and until then neighbour discovery fails, so the first IPv6 packet between
    /// the two is lost — TCP sends its SYN again, a UDP query is not.
    pub fn wait_ipv6_ready(&self) {
        for (netns, iface) in [(&self.pod, POD_IFACE), (&self.service, SERVICE_IFACE)] {
            let args = ["ip", "-6", "addr", "show", "dev", iface, "tentative"];
            let ready = within(EVENTUALLY, || netns.run(&args).trim().is_empty());
            let name = netns.name();
            assert!(
                ready.is_some(),
                "{iface} of {name} still has a tentative IPv6 address"
            );
        }
    }

    /// `probe connect dst` from the pod: its netns and its cgroup, as `uid`/`gid`.
    pub fn connect(&self, uid: u32, gid: u32, dst: SocketAddr) -> ConnOutcome {
        connect_from(&self.pod, Some(&self.pod_cgroup), uid, gid, dst, None)
    }

    /// Panics unless a packet the pod sends to any of `dsts` stays in the test's two
    /// namespaces: each has only `lo` and its end of the veth pair (so the pod reaches
    /// nothing but the peer), and the peer has no route to any of `dsts` (so it neither
    /// answers nor forwards it, whatever its forwarding sysctls). Call it before a test
    /// connects to an address no test namespace owns (e.g. Linkerd's validator's 1.1.1.1).
    pub fn assert_no_route_out(&self, dsts: &[IpAddr]) {
        for (netns, role) in [(&self.pod, "pod"), (&self.service, "peer")] {
            let links = netns.run(&["ip", "-o", "link", "show"]);
            let mut names: Vec<&str> = links
                .lines()
                .filter_map(|line| line.split(": ").nth(1))
                .map(|name| name.split('@').next().unwrap_or(name))
                .collect();
            names.sort_unstable();
            assert_eq!(
                names,
                ["eth0", "lo"],
                "the {role} namespace {} must have only lo and its veth end:\n{links}",
                netns.name()
            );
        }
        for dst in dsts {
            let out = self
                .service
                .try_run(&["ip", "route", "get", &dst.to_string()]);
            assert!(
                !out.status.success(),
                "the peer namespace {} has a route to {dst}: {}",
                self.service.name(),
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
}

/// A veth pair made inside `netns` (`iface`), its peer (`peer`) moved straight into
/// `peer_netns` (a netns name or a pid): the host namespace never sees either end.
pub(crate) fn add_veth(netns: &NetNs, iface: &str, peer: &str, peer_netns: &str) {
    netns.run(&[
        "ip", "link", "add", iface, "type", "veth", "peer", "name", peer, "netns", peer_netns,
    ]);
}

/// `v4`/24 and `v6`/64 on `iface`, then `iface` up; `run` runs an `ip` command in the
/// interface's namespace.
pub(crate) fn address_iface(run: impl Fn(&[&str]), iface: &str, v4: Ipv4Addr, v6: Ipv6Addr) {
    run(&["ip", "addr", "add", &format!("{v4}/24"), "dev", iface]);
    // nodad: usable at once instead of "tentative" for a second or two.
    run(&words(&format!("ip -6 addr add {v6}/64 dev {iface} nodad")));
    run(&["ip", "link", "set", iface, "up"]);
}

/// Default routes via `v4` and `v6`; `run` runs an `ip` command in the pod's namespace.
pub(crate) fn default_routes(run: impl Fn(&[&str]), v4: Ipv4Addr, v6: Ipv6Addr) {
    run(&words(&format!("ip route add default via {v4}")));
    run(&words(&format!("ip -6 route add default via {v6}")));
}

fn add_host_addr(netns: &NetNs, iface: &str, ip: IpAddr) {
    let command = match ip {
        IpAddr::V4(ip) => format!("ip addr add {ip}/32 dev {iface}"),
        IpAddr::V6(ip) => format!("ip -6 addr add {ip}/128 dev {iface} nodad"),
    };
    netns.run(&words(&command));
}

/// How a pod and its peer "service" namespace are addressed: 10.<net>.<subnet>.1 and .2,
/// fd00:<net>:<subnet>::1 and ::2. Each kind of test topology has its own `net`, so two
/// kinds never collide.
#[derive(Clone, Copy, Debug)]
pub struct PairAddresses {
    pub net: u8,
}

impl PairAddresses {
    /// The kit's [`Topology`].
    pub const TOPOLOGY: PairAddresses = PairAddresses { net: 200 };

    pub fn pod_ip4(self, subnet: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, subnet, 1)
    }

    pub fn service_ip4(self, subnet: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, subnet, 2)
    }

    pub fn pod_ip6(self, subnet: u8) -> Ipv6Addr {
        self.ip6(subnet, 1)
    }

    pub fn service_ip6(self, subnet: u8) -> Ipv6Addr {
        self.ip6(subnet, 2)
    }

    /// fd00:<net>:<subnet>::`host`.
    fn ip6(self, subnet: u8, host: u16) -> Ipv6Addr {
        let net = 0x200 + u16::from(self.net - 200);
        Ipv6Addr::new(0xfd00, net, subnet.into(), 0, 0, 0, 0, host)
    }

    /// A subnet N distinct per pair in this process and, very likely, across processes, so
    /// addresses in logs say which test they belong to (the namespaces are isolated anyway,
    /// so a clash would be harmless).
    pub fn fresh_subnet() -> u8 {
        ((std::process::id() + next_id()) % 250 + 1) as u8
    }

    pub fn pod_addr(self, subnet: u8, v6: bool, port: u16) -> SocketAddr {
        let ips: [IpAddr; 2] = [self.pod_ip4(subnet).into(), self.pod_ip6(subnet).into()];
        SocketAddr::new(ips[usize::from(v6)], port)
    }

    pub fn service_addr(self, subnet: u8, v6: bool, port: u16) -> SocketAddr {
        let ips: [IpAddr; 2] = [
            self.service_ip4(subnet).into(),
            self.service_ip6(subnet).into(),
        ];
        SocketAddr::new(ips[usize::from(v6)], port)
    }
}
