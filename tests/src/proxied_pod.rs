//! A pod with a service to call and a stand-in sidecar proxy: the setting of most
//! privileged tests.

use std::ffi::OsStr;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Output;

use crate::redirector::{install, PinRoot};
use crate::twin_pods::start_proxy;
use crate::{Cgroup, ChildGuard, ConnOutcome, Landing, ProbeServer, Topology, APP_UID, PROXY_UID};

pub const SERVICE_PORT: u16 = 80;

/// A pod whose service answers on port 80 (both families) and 8080, with a stand-in proxy
/// (uid 1337, in the pod's cgroup) on 15001 over both families that reads SO_ORIGINAL_DST.
pub struct ProxiedPod {
    pub topo: Topology,
    _service: ChildGuard,
    _proxy: ChildGuard,
}

impl ProxiedPod {
    /// The probe binary must be set first ([`crate::use_probe_bin`]).
    pub fn new(hint: &str) -> Self {
        Self::with(Topology::new(hint))
    }

    /// A pod whose cgroup is below the node cgroup `node` (daemon mode).
    pub fn under(node: &Cgroup, hint: &str) -> Self {
        Self::with(Topology::under(node, hint))
    }

    /// The service and the proxy started in `topo`, set up before them.
    pub fn with(topo: Topology) -> Self {
        let service = ProbeServer::serve(&topo.service, "svc")
            .listen(topo.service_addr(false, SERVICE_PORT))
            .listen(topo.service_addr(true, SERVICE_PORT))
            .listen(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 8080))
            .start();
        let proxy = start_outbound_proxy(&topo, "proxy");
        ProxiedPod {
            topo,
            _service: service,
            _proxy: proxy,
        }
    }

    /// `redirector istio-iptables ARGS` for this pod; returns its log.
    pub fn install(&self, root: &PinRoot, args: &[&str]) -> String {
        let out = install(&self.topo.pod, &self.topo.pod_cgroup, root, args);
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// `redirector istio-iptables ARGS` for this pod, whatever its exit.
    pub fn istio_iptables(&self, root: &PinRoot, args: &[&str]) -> Output {
        crate::redirector::istio_iptables(&self.topo.pod, &self.topo.pod_cgroup, root, args)
    }

    /// `redirector istio-iptables ARGS` for this pod with the eBPF object at `object` (as
    /// another release would load it), whatever its exit.
    pub fn istio_iptables_with_object(
        &self,
        root: &PinRoot,
        object: &Path,
        args: &[&str],
    ) -> Output {
        self.istio_iptables_with_env(root, args, ("REDIRECTOR_EBPF_OBJECT", object.as_os_str()))
    }

    /// `redirector istio-iptables ARGS` for this pod with env var `key` set to `value`,
    /// whatever its exit.
    pub fn istio_iptables_with_env(
        &self,
        root: &PinRoot,
        args: &[&str],
        (key, value): (&str, &OsStr),
    ) -> Output {
        let topo = &self.topo;
        let mut cmd = crate::redirector::istio_iptables_command(&topo.pod, &topo.pod_cgroup, root);
        cmd.args(args).env(key, value);
        cmd.output().expect("running redirector istio-iptables")
    }

    /// [`crate::redirector::install_with_interfaces`] for this pod.
    pub fn install_with_interfaces(&self, root: &PinRoot, args: &[&str], flag: &str) -> bool {
        crate::redirector::install_with_interfaces(
            &self.topo.pod,
            &self.topo.pod_cgroup,
            root,
            args,
            flag,
        )
    }

    pub fn connect(&self, uid: u32, gid: u32, dst: SocketAddr) -> ConnOutcome {
        self.topo.connect(uid, gid, dst)
    }

    pub fn service(&self, v6: bool) -> SocketAddr {
        self.topo.service_addr(v6, SERVICE_PORT)
    }

    /// The app's connection (uid and gid 1000) to the service (`v6`: its IPv6 address)
    /// lands on the proxy with the service as its original destination.
    #[track_caller]
    pub fn assert_app_proxied(&self, v6: bool) {
        let dst = self.service(v6);
        assert_proxied(&self.connect(APP_UID, APP_UID, dst), dst);
    }

    /// The app's connection to the service (`v6`: its IPv6 address) reaches it directly.
    #[track_caller]
    pub fn assert_app_direct(&self, v6: bool) {
        let dst = self.service(v6);
        assert_direct(&self.connect(APP_UID, APP_UID, dst), dst);
    }
}

/// The connection reached the proxy, which read `orig` as its original destination.
#[track_caller]
pub fn assert_proxied(outcome: &ConnOutcome, orig: SocketAddr) {
    assert_on_proxy(outcome, "proxy", orig);
}

/// The connection reached proxy `proxy`, which read `orig` as its original destination,
/// and the proxy's own connection on to it reached `service` listening at `local`.
#[track_caller]
pub fn assert_forwarded(
    outcome: &ConnOutcome,
    proxy: &str,
    orig: SocketAddr,
    service: &str,
    local: SocketAddr,
) {
    let upstream = Landing::Service {
        name: service.into(),
        local,
    };
    let upstream = Some(Box::new(upstream));
    let expected = Landing::Proxy {
        name: proxy.into(),
        orig: Some(orig),
        upstream,
    };
    assert_eq!(outcome.landing(), expected, "{outcome:?}");
}

/// The connection reached the service at `dst` directly.
#[track_caller]
pub fn assert_direct(outcome: &ConnOutcome, dst: SocketAddr) {
    assert_served(outcome, "svc", dst);
}

/// The connection landed on the proxy listener named `listener`, which read `orig` as its
/// original destination.
#[track_caller]
pub fn assert_on_proxy(outcome: &ConnOutcome, listener: &str, orig: SocketAddr) {
    match outcome {
        ConnOutcome::Proxied {
            name, orig: got, ..
        } if name == listener => {
            assert_eq!(*got, Some(orig), "SO_ORIGINAL_DST seen by {listener}");
        }
        other => panic!("expected {listener} with original destination {orig}, got {other:?}"),
    }
}

/// The connection reached the server named `server` at `dst` directly (not redirected).
#[track_caller]
pub fn assert_served(outcome: &ConnOutcome, server: &str, dst: SocketAddr) {
    match outcome {
        ConnOutcome::Served { name, local, .. } if name == server => {
            assert_eq!(*local, dst, "the address {server} was reached at")
        }
        other => panic!("expected {server} at {dst} directly, got {other:?}"),
    }
}

/// Every one of `outcomes` reached the proxy, which read `orig` as the original
/// destination: none escaped the mesh, none lost its destination.
#[track_caller]
pub fn assert_all_proxied(outcomes: &[ConnOutcome], orig: SocketAddr) {
    let escaped: Vec<&ConnOutcome> = outcomes
        .iter()
        .filter(|o| {
            !matches!(o, ConnOutcome::Proxied { name, orig: got, .. } if name == "proxy" && *got == Some(orig))
        })
        .collect();
    assert!(
        escaped.is_empty(),
        "{} of {} connections did not land on the proxy with their destination: {escaped:?}",
        escaped.len(),
        outcomes.len()
    );
}

/// istio's outbound listener's stand-in named `name`: `probe proxy` on 127.0.0.1:15001 and
/// `[::1]:15001`, as uid 1337 in the pod's cgroup, reading SO_ORIGINAL_DST.
pub fn start_outbound_proxy(topo: &Topology, name: &str) -> ChildGuard {
    let addrs = ["127.0.0.1:15001", "[::1]:15001"].map(|a| a.parse().unwrap());
    start_proxy(topo, name, addrs, (PROXY_UID, PROXY_UID))
}
