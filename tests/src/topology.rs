//! A pod and a service, each in its own netns, joined by a veth pair.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::probe::connect_from;
use crate::{next_id, Cgroup, ConnOutcome, NetNs};

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
        let topology = Topology {
            pod: NetNs::new(&format!("{hint}pod")),
            service: NetNs::new(&format!("{hint}svc")),
            pod_cgroup: Cgroup::new(&format!("{hint}pod")),
            // Distinct per topology in this process and, very likely, across processes, so
            // addresses in logs say which test they belong to (the namespaces are isolated
            // anyway, so a clash would be harmless).
            subnet: ((std::process::id() + next_id()) % 250 + 1) as u8,
        };
        topology.pod.run(&[
            "ip",
            "link",
            "add",
            POD_IFACE,
            "type",
            "veth",
            "peer",
            "name",
            SERVICE_IFACE,
            "netns",
            topology.service.name(),
        ]);
        let (pod4, svc4) = (
            topology.pod_ip4().to_string(),
            topology.service_ip4().to_string(),
        );
        let (pod6, svc6) = (
            topology.pod_ip6().to_string(),
            topology.service_ip6().to_string(),
        );
        for (netns, iface, v4, v6) in [
            (&topology.pod, POD_IFACE, &pod4, &pod6),
            (&topology.service, SERVICE_IFACE, &svc4, &svc6),
        ] {
            netns.run(&["ip", "addr", "add", &format!("{v4}/24"), "dev", iface]);
            // nodad: usable at once instead of "tentative" for a second or two.
            netns.run(&[
                "ip",
                "-6",
                "addr",
                "add",
                &format!("{v6}/64"),
                "dev",
                iface,
                "nodad",
            ]);
            netns.run(&["ip", "link", "set", iface, "up"]);
        }
        topology
            .pod
            .run(&["ip", "route", "add", "default", "via", &svc4]);
        topology
            .pod
            .run(&["ip", "-6", "route", "add", "default", "via", &svc6]);
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

    /// Another address of the pod (/32 or /128 on its eth0), e.g. a second pod IP.
    pub fn add_pod_addr(&self, ip: IpAddr) {
        add_host_addr(&self.pod, POD_IFACE, ip);
    }

    /// Another address the service namespace answers on (/32 or /128 on its eth0), e.g. a
    /// stand-in for an "external" destination; the pod reaches it over its default route.
    pub fn add_service_addr(&self, ip: IpAddr) {
        add_host_addr(&self.service, SERVICE_IFACE, ip);
    }

    /// `probe connect dst` from the pod: its netns and its cgroup, as `uid`/`gid`.
    pub fn connect(&self, uid: u32, gid: u32, dst: SocketAddr) -> ConnOutcome {
        connect_from(&self.pod, Some(&self.pod_cgroup), uid, gid, dst, None)
    }
}

fn add_host_addr(netns: &NetNs, iface: &str, ip: IpAddr) {
    match ip {
        IpAddr::V4(ip) => netns.run(&["ip", "addr", "add", &format!("{ip}/32"), "dev", iface]),
        IpAddr::V6(ip) => netns.run(&[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("{ip}/128"),
            "dev",
            iface,
            "nodad",
        ]),
    };
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
    /// The podman pod's network.
    pub const PODMAN: PairAddresses = PairAddresses { net: 202 };

    pub fn pod_ip4(self, subnet: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, subnet, 1)
    }

    pub fn service_ip4(self, subnet: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, subnet, 2)
    }

    pub fn pod_ip6(self, subnet: u8) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0x200 + u16::from(self.net - 200), subnet.into(), 0, 0, 0, 0, 1)
    }

    pub fn service_ip6(self, subnet: u8) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0x200 + u16::from(self.net - 200), subnet.into(), 0, 0, 0, 0, 2)
    }

    pub fn service_addr(self, subnet: u8, v6: bool, port: u16) -> SocketAddr {
        let ip: IpAddr = if v6 { self.service_ip6(subnet).into() } else { self.service_ip4(subnet).into() };
        SocketAddr::new(ip, port)
    }
}
