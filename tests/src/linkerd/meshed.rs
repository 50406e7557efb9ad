//! A pod Linkerd meshed, as a node captures it (the daemon's `pod add --dialect linkerd` or
//! the CNI plugin in `"dialect": "linkerd"`): the injector's proxy-init flags and the
//! annotations that mark and configure such a pod, a peer to call, the app, and stand-ins
//! for the proxy's two listeners (4140 outbound, 4143 inbound) run as the proxy's uid.
//!
//! ```text
//!  pod netns (Topology)                                   peer netns ("svc")
//!  proxy    127.0.0.1:4140 [::1]:4140  uid 2102, reads SO_ORIGINAL_DST
//!  inbound  0.0.0.0:4143   [::]:4143   uid 2102, reads SO_ORIGINAL_DST
//!  app      *:8080 *:4190 *:5000       uid 1000          svc  *:80 *:443 *:4567 *:6443 *:8080
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::linkerd::cases::LINKERD_PROXY_UID;
use crate::probe::connect_from;
use crate::proxied_pod::{assert_on_proxy, assert_served};
use crate::scenario::Family;
use crate::twin_pods::{start_app, start_peer, start_proxy, wildcard, APP, INBOUND_PROXY, SERVICE};
use crate::{Cgroup, ChildGuard, ConnOutcome, Topology, APP_UID};

/// The annotation Linkerd's injector sets on every pod it injected a proxy into.
pub const PROXY_VERSION: &str = "linkerd.io/proxy-version";
/// A value of [`PROXY_VERSION`], as a released injector writes it.
pub const A_PROXY_VERSION: &str = "stable-2.14.10";

pub const OUTGOING_PROXY_PORT: u16 = 4140;
pub const INCOMING_PROXY_PORT: u16 = 4143;
/// The proxy's control port: in the injector's inbound ignore list only.
pub const CONTROL_PORT: u16 = 4190;
/// A port in the injector's outbound (and inbound) ignore lists.
pub const IGNORED_OUTBOUND_PORT: u16 = 4567;
/// A plain port: captured both ways under the injector's flags.
pub const PLAIN_PORT: u16 = 8080;

/// The injector's proxy-init flags (docs/linkerd.md#how-linkerd-runs-it) without the iptables
/// plumbing, which has no meaning for a node: what a Linkerd network's `args` carry.
pub const INJECTOR_FLAGS: [&str; 6] = [
    "--incoming-proxy-port=4143",
    "--outgoing-proxy-port=4140",
    "--proxy-uid=2102",
    "--inbound-ports-to-ignore=4190,4191,4567,4568",
    "--outbound-ports-to-ignore=4567,4568",
    "--ipv6=false",
];

/// The name the outbound stand-in reports: the kit's own, so that
/// [`crate::assert_proxied`] and the CRI kit's `assert_lands_on_proxy` read it.
pub const OUTBOUND_PROXY: &str = "proxy";

/// Ports the peer answers on, both families.
const PEER_PORTS: [u16; 5] = [80, 443, IGNORED_OUTBOUND_PORT, 6443, PLAIN_PORT];
/// Ports the app answers on, both families (at least 1024: it runs as an ordinary user).
const APP_PORTS: [u16; 3] = [PLAIN_PORT, CONTROL_PORT, 5000];

/// A pod with Linkerd's proxy stand-ins, an app and a peer; not captured until the test
/// asks the node to. Fields drop in order: the processes, then the namespaces and cgroup.
pub struct MeshedPod {
    _servers: Vec<ChildGuard>,
    pub topo: Topology,
}

impl MeshedPod {
    /// A pod whose cgroup is below the node cgroup `node` (as kubelet places a pod's).
    /// The probe binary must be set first ([`crate::use_probe_bin`]).
    pub fn under(node: &Cgroup, hint: &str) -> Self {
        let topo = Topology::under(node, hint);
        let owner = (LINKERD_PROXY_UID, LINKERD_PROXY_UID);
        let peer = start_peer(&topo, &PEER_PORTS);
        let loopback = [
            Ipv4Addr::LOCALHOST.into(),
            IpAddr::from(Ipv6Addr::LOCALHOST),
        ];
        let outbound = loopback.map(|ip| SocketAddr::new(ip, OUTGOING_PROXY_PORT));
        let outbound = start_proxy(&topo, OUTBOUND_PROXY, outbound, owner);
        let inbound = Family::BOTH.map(|family| wildcard(family, INCOMING_PROXY_PORT));
        let inbound = start_proxy(&topo, INBOUND_PROXY, inbound, owner);
        let app = start_app(&topo, &APP_PORTS);
        MeshedPod {
            _servers: vec![peer, outbound, inbound, app],
            topo,
        }
    }

    /// The peer's address of the family `v6`, with `port`.
    pub fn peer(&self, v6: bool, port: u16) -> SocketAddr {
        self.topo.service_addr(v6, port)
    }

    /// The pod's own address of the family `v6`, with `port`.
    pub fn pod_addr(&self, v6: bool, port: u16) -> SocketAddr {
        self.topo.pod_addr(v6, port)
    }

    /// A client of the pod (its netns and cgroup), as `uid` (and gid `uid`), connects to
    /// `dst`.
    pub fn connect(&self, uid: u32, dst: SocketAddr) -> ConnOutcome {
        self.topo.connect(uid, uid, dst)
    }

    /// A client in the peer's netns (outside the pod) connects to `dst`.
    pub fn connect_from_peer(&self, dst: SocketAddr) -> ConnOutcome {
        connect_from(&self.topo.service, None, APP_UID, APP_UID, dst, None)
    }

    /// The path of the pod's netns, as a runtime passes it (`CNI_NETNS`).
    pub fn netns_path(&self) -> String {
        self.topo.pod.path().display().to_string()
    }
}

/// The connection landed on the outbound listener (4140), which read `orig`.
#[track_caller]
pub fn assert_outbound(outcome: &ConnOutcome, orig: SocketAddr) {
    assert_on_proxy(outcome, OUTBOUND_PROXY, orig);
}

/// The connection landed on the inbound listener (4143), which read `orig`.
#[track_caller]
pub fn assert_inbound(outcome: &ConnOutcome, orig: SocketAddr) {
    assert_on_proxy(outcome, INBOUND_PROXY, orig);
}

/// The connection reached the peer at `dst` directly (not redirected).
#[track_caller]
pub fn assert_peer(outcome: &ConnOutcome, dst: SocketAddr) {
    assert_served(outcome, SERVICE, dst);
}

/// The connection reached the app at `dst` directly (not redirected).
#[track_caller]
pub fn assert_app(outcome: &ConnOutcome, dst: SocketAddr) {
    assert_served(outcome, APP, dst);
}
