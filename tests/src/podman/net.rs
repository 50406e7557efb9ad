//! The network of a podman pod, set up by the test instead of a CNI plugin.
//!
//! The pod is created with `--network none`: podman gives its infra container a fresh netns
//! with only `lo`, and the test then does what a CNI ADD would — a veth pair between that
//! netns and a service [`NetNs`] of the kit, addresses, default routes — before any container
//! of the pod runs. Nothing is added to the host's namespace (no veth end, no address, no
//! route, no NAT rule, no `ip_forward`), so the pod can reach only the service namespace,
//! which does not forward.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::netns::run_checked;
use crate::topology::{add_veth, address_iface, default_routes, PairAddresses};
use crate::NetNs;

/// Interface name on both ends, as in a real pod.
pub const IFACE: &str = "eth0";

/// ```text
///  pod netns (podman's, held by the infra container)      service netns (the kit's)
///  eth0 10.202.N.1/24 fd00:202:N::1/64   ──veth──   eth0 10.202.N.2/24 fd00:202:N::2/64
///  default via 10.202.N.2 / fd00:202:N::2
/// ```
/// The veth pair lives only in the two namespaces and disappears with them.
#[derive(Debug)]
pub struct PodNetwork {
    pod_netns: PathBuf,
    subnet: u8,
}

impl PodNetwork {
    /// Links the netns of process `pod_pid` (the pod's infra container) to `service`.
    pub fn link(pod_pid: u32, service: &NetNs) -> Self {
        let net = PodNetwork {
            pod_netns: PathBuf::from(format!("/proc/{pod_pid}/ns/net")),
            subnet: PairAddresses::fresh_subnet(),
        };
        add_veth(service, IFACE, IFACE, &pod_pid.to_string());
        let pod_run = |args: &[&str]| {
            net.run_in_pod(args);
        };
        let service_run = |args: &[&str]| {
            service.run(args);
        };
        address_iface(pod_run, IFACE, net.pod_ip4(), net.pod_ip6());
        address_iface(service_run, IFACE, net.service_ip4(), net.service_ip6());
        net.run_in_pod(&["ip", "link", "set", "lo", "up"]);
        default_routes(pod_run, net.service_ip4(), net.service_ip6());
        net
    }

    /// `/proc/<infra pid>/ns/net`.
    pub fn pod_netns(&self) -> &Path {
        &self.pod_netns
    }

    /// Runs `args` inside the pod's netns (`nsenter --net=`); panics on failure.
    pub fn run_in_pod(&self, args: &[&str]) -> String {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.pod_netns.display()))
            .args(args);
        let out = run_checked(&mut cmd, None, &args.join(" "));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn pod_ip4(&self) -> Ipv4Addr {
        PairAddresses::PODMAN.pod_ip4(self.subnet)
    }

    pub fn service_ip4(&self) -> Ipv4Addr {
        PairAddresses::PODMAN.service_ip4(self.subnet)
    }

    pub fn pod_ip6(&self) -> Ipv6Addr {
        PairAddresses::PODMAN.pod_ip6(self.subnet)
    }

    pub fn service_ip6(&self) -> Ipv6Addr {
        PairAddresses::PODMAN.service_ip6(self.subnet)
    }

    pub fn service_addr(&self, v6: bool, port: u16) -> SocketAddr {
        PairAddresses::PODMAN.service_addr(self.subnet, v6, port)
    }

    pub fn pod_addr(&self, v6: bool, port: u16) -> SocketAddr {
        PairAddresses::PODMAN.pod_addr(self.subnet, v6, port)
    }
}

/// The cookie of the netns at `path` (see [`crate::netns::cookie_at`]).
pub use crate::netns::cookie_at as netns_cookie;
