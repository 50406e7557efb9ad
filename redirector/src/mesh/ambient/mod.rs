//! Istio ambient as one of redirector's meshes. No proxy runs in the pod: ztunnel, one per
//! node, proxies it from inside its network namespace, from ztunnel's own process and
//! cgroup; the daemon is ztunnel's node agent (ZDS) and the programs do what istio-cni's
//! in-pod rules do. An ambient pod's flags are this dialect's own command line, which
//! `redirector pod add --dialect ambient` writes: who the pod is (ztunnel's workload) and
//! the few settings istio's annotations change.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net};

use crate::engine::spec::{
    CaptureConfig, CidrSelection, InterceptionMode, OwnerGroups, PortSelection,
};
use crate::mesh::{
    Annotations, Mesh, MeshError, Network, PodMeta, RunOptions, Selected, Selection,
};
use crate::zds::wire::WorkloadInfo;

pub mod select;
#[cfg(test)]
mod tests;

/// ztunnel's ports inside the pod's network namespace.
pub const OUTBOUND_PORT: u16 = 15001;
pub const INBOUND_PORT: u16 = 15006;
/// HBONE: other ztunnels' tunnels arrive here, never captured.
pub const HBONE_PORT: u16 = 15008;

/// The source istio-cni's host rules give kubelet's probes (SNAT), left alone as istio-cni
/// leaves it; here the node's own addresses are left alone too, with no host rules.
pub const PROBE_SOURCE: Ipv4Addr = Ipv4Addr::new(169, 254, 7, 127);

/// The pod annotation that leaves its inbound traffic uncaptured.
pub const BYPASS_INBOUND: &str = "ambient.istio.io/bypass-inbound-capture";
/// The pod annotation that turns its DNS capture on or off.
pub const DNS_CAPTURE: &str = "ambient.istio.io/dns-capture";
/// The label (here read as an annotation too) that takes a pod out of ambient.
pub const DATAPLANE_MODE: &str = "istio.io/dataplane-mode";
/// The injector's mark of a pod with a sidecar, which ambient leaves to its sidecar.
const SIDECAR_STATUS: &str = "sidecar.istio.io/status";

pub struct Ambient;

/// An ambient pod's command line, as the records keep it.
#[derive(clap::Parser, Debug, Clone, PartialEq, Eq)]
// A setting given twice (the network's flags, then a pod's annotation) takes the last.
#[command(name = "ambient", args_override_self = true)]
pub struct AmbientArgs {
    /// The pod's uid: ztunnel's key for it.
    #[arg(long, value_name = "UID")]
    pub pod_uid: String,
    /// The pod's `namespace/name`.
    #[arg(long, value_name = "NS/NAME", value_parser = namespaced)]
    pub name: (String, String),
    #[arg(long, value_name = "SA", default_value = "default")]
    pub service_account: String,
    /// DNS (UDP and TCP port 53, to any address) goes to ztunnel's DNS proxy (15053).
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pub dns_capture: bool,
    /// Inbound connections are left alone (`ambient.istio.io/bypass-inbound-capture`).
    #[arg(long)]
    pub bypass_inbound_capture: bool,
    /// An address of the node: connections from it (kubelet's probes, host-network pods)
    /// are never captured inbound (repeatable).
    #[arg(long = "node-address", value_name = "IP")]
    pub node_addresses: Vec<IpAddr>,
}

fn namespaced(text: &str) -> Result<(String, String), String> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(format!("{text:?} is not NAMESPACE/NAME")),
    }
}

impl AmbientArgs {
    /// `argv` (`argv[0]` included) as the dialect reads it.
    pub fn read(argv: Vec<String>) -> Result<Self, MeshError> {
        use clap::Parser as _;
        AmbientArgs::try_parse_from(argv).map_err(|e| MeshError::Settings(e.to_string()))
    }

    /// The flags `args` (no `argv[0]`), as a pod's record keeps them.
    pub fn of(args: &[String]) -> Result<Self, MeshError> {
        Self::read(
            std::iter::once("ambient".to_owned())
                .chain(args.iter().cloned())
                .collect(),
        )
    }

    /// What the programs capture for the pod: istio-cni's in-pod rules.
    pub fn capture(&self) -> CaptureConfig {
        let host = |ip: IpAddr| IpNet::from(ip);
        CaptureConfig {
            outbound_port: OUTBOUND_PORT,
            inbound_port: INBOUND_PORT,
            tunnel_port: HBONE_PORT,
            // ztunnel's sockets are told apart by their cgroup, not their owner.
            proxy_uids: vec![],
            proxy_gids: vec![],
            inbound_mode: InterceptionMode::Redirect,
            inbound_ports: if self.bypass_inbound_capture {
                PortSelection::None
            } else {
                PortSelection::All
            },
            inbound_exclude_ports: vec![],
            exclude_interfaces: vec![],
            outbound_cidrs: CidrSelection::All,
            // istio-cni lets connections to the probe source through.
            exclude_cidrs: vec![host(IpAddr::V4(PROBE_SOURCE))],
            outbound_include_ports: vec![],
            outbound_exclude_ports: vec![],
            kube_virt_interfaces: vec![],
            tproxy_mark: 0,
            tproxy_route_table: 0,
            owner_groups: OwnerGroups::All,
            loopback_v4_cidr: Ipv4Net::new_assert(Ipv4Addr::LOCALHOST, 32),
            redirect_dns: self.dns_capture,
            capture_all_dns: true,
            drop_invalid: false,
            dual_stack: true,
            fail_open: false,
            outbound_exclude_port_ranges: vec![],
            inbound_exclude_port_ranges: vec![],
            inbound_exclude_sources: std::iter::once(IpAddr::V4(PROBE_SOURCE))
                .chain(self.node_addresses.iter().copied())
                .map(host)
                .collect(),
            // istio-cni: `! -d 127.0.0.1/32 -o lo -j ACCEPT`, every local destination.
            local_destinations_pass: true,
            orig_dst_of_unredirected: false,
            ipv6_off: false,
            ztunnel: true,
        }
    }

    /// The pod as ztunnel is told of it.
    pub fn workload(&self) -> (String, WorkloadInfo) {
        (
            self.pod_uid.clone(),
            WorkloadInfo {
                name: self.name.1.clone(),
                namespace: self.name.0.clone(),
                service_account: self.service_account.clone(),
            },
        )
    }
}

/// Why a pod is left out of ambient, by its annotations (and labels, where given as such).
fn left_alone(annotations: &Annotations) -> Option<String> {
    if annotations.get(DATAPLANE_MODE).is_some_and(|m| m == "none") {
        return Some(format!("{DATAPLANE_MODE}=none"));
    }
    if annotations.contains_key(SIDECAR_STATUS) {
        return Some(format!("the pod has a sidecar ({SIDECAR_STATUS})"));
    }
    None
}

/// `args` with the pod's annotations applied.
fn with_annotations(args: &[String], annotations: &Annotations) -> Result<Vec<String>, MeshError> {
    let mut args = args.to_vec();
    if let Some(value) = annotations.get(BYPASS_INBOUND) {
        if bool_annotation(BYPASS_INBOUND, value)? {
            args.push("--bypass-inbound-capture".into());
        }
    }
    if let Some(value) = annotations.get(DNS_CAPTURE) {
        let on = bool_annotation(DNS_CAPTURE, value)?;
        args.extend(["--dns-capture".into(), on.to_string()]);
    }
    Ok(args)
}

fn bool_annotation(key: &str, value: &str) -> Result<bool, MeshError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(MeshError::Settings(format!(
            "annotation {key}={value:?}: not true or false"
        ))),
    }
}

impl Mesh for Ambient {
    fn read_flags(&self, argv: Vec<String>) -> Result<(CaptureConfig, RunOptions), MeshError> {
        let args = AmbientArgs::read(argv)?;
        let run = RunOptions {
            dry_run: false,
            cleanup_only: false,
            reconcile: true,
            force_apply: false,
            skip_rule_apply: false,
            network_namespace: None,
            allow_host_netns: false,
            cgroup: None,
            // DNS to any address is captured: the pod's servers are not read.
            resolv_conf: "/etc/resolv.conf".into(),
            pin_root: crate::store::pins::DEFAULT_ROOT.into(),
            ignored_flags: vec![],
        };
        Ok((args.capture(), run))
    }

    fn requested(&self, args: &[String], annotations: &Annotations) -> Selected {
        if let Some(why) = left_alone(annotations) {
            return Ok(Selection::LeftAlone(why));
        }
        let args = with_annotations(args, annotations)?;
        // Read now, so that a bad command line is refused before anything is set up.
        AmbientArgs::of(&args)?;
        Ok(Selection::Capture(args))
    }

    fn node_flags(&self, network: &Network<'_>, pod: &PodMeta<'_>) -> Selected {
        select::node_flags(network, pod)
    }

    fn ztunnel_workload(&self, args: &[String]) -> Option<(String, WorkloadInfo)> {
        AmbientArgs::of(args).ok().map(|a| a.workload())
    }
}
