//! The seam between the meshes and the rest of redirector. Every mesh is a folder beside
//! [`common`] (`istio/`, `linkerd/`) that imports only `common` and the engine's spec, and
//! one arm of [`Dialect`]; what the node's ways in (`cni/`, `daemon/`, `install_cni/`,
//! `cli/`) need of a mesh they ask here, through [`Mesh`]:
//!
//! - its command line → the engine's [`PodSpec`] ([`pod_spec`]);
//! - which pods of a node it captures and with what flags: the chained plugin's network
//!   ([`node_flags`]) and the daemon's API ([`requested`]);
//! - its injector's defaults and its set-up command's name (in [`Dialect`]).
//!
//! Each mesh's own command (`redirector istio-iptables`, `redirector linkerd-proxy-init`)
//! reads its full configuration from its folder directly.

pub mod ambient;
pub mod common;
mod error;
pub mod istio;
pub mod linkerd;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use self::common::RunOptions;
pub use self::error::MeshError;
use crate::engine::spec::{CaptureConfig, PodSpec};
use crate::zds::{agent::Workload, wire::WorkloadInfo};

/// A pod's annotations (or labels), by key.
pub type Annotations = BTreeMap<String, String>;

/// Which mesh a pod's flags are written for: the one place a mesh is registered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    #[default]
    Istio,
    Linkerd,
    /// Istio ambient: ztunnel proxies the pod from its own process, told of it over ZDS.
    Ambient,
}

impl Dialect {
    /// The mesh itself.
    pub fn mesh(self) -> &'static dyn Mesh {
        match self {
            Dialect::Istio => &istio::Istio,
            Dialect::Linkerd => &linkerd::Linkerd,
            Dialect::Ambient => &ambient::Ambient,
        }
    }

    pub fn is_istio(&self) -> bool {
        *self == Dialect::Istio
    }

    pub fn name(self) -> &'static str {
        match self {
            Dialect::Istio => "istio",
            Dialect::Linkerd => "linkerd",
            Dialect::Ambient => "ambient",
        }
    }

    /// The mesh's set-up command, as argv[0] of its flags.
    fn command(self) -> &'static str {
        match self {
            Dialect::Istio => "istio-iptables",
            Dialect::Linkerd => "proxy-init",
            Dialect::Ambient => "ambient",
        }
    }

    /// The flags the mesh's injector gives its set-up command, without iptables plumbing:
    /// the default for a node's pods of this mesh.
    pub fn injector_defaults(self) -> Vec<String> {
        let flags: &[&str] = match self {
            Dialect::Istio => &istio::annotations::STANDARD_INJECTION,
            Dialect::Linkerd => &linkerd::INJECTOR_DEFAULTS,
            // No injector: a pod's flags say who it is (`pod add --dialect ambient`).
            Dialect::Ambient => &[],
        };
        flags.iter().map(|flag| flag.to_string()).collect()
    }
}

/// What one mesh gives the rest of redirector. Implemented once per mesh folder.
pub trait Mesh: Sync {
    /// A command line (`argv[0]` included) read as the mesh's own command reads it, with no
    /// env vars; refused if it asks for a run a node's pod cannot have (beyond the run
    /// options every mesh shares, which [`pod_spec`] checks).
    fn read_flags(&self, argv: Vec<String>) -> Result<(CaptureConfig, RunOptions), MeshError>;

    /// The flags of a pod the daemon's API is asked to capture by name: `args` overridden
    /// by the pod's `annotations`; left alone only on an explicit opt-out (the API was
    /// asked for this pod).
    fn requested(&self, args: &[String], annotations: &Annotations) -> Selected;

    /// The chained plugin's rules: the flags of `pod` on `network`, or why the pod is left
    /// alone.
    fn node_flags(&self, network: &Network<'_>, pod: &PodMeta<'_>) -> Selected;

    /// For a mesh whose node proxy (ztunnel) is told of its pods: the pod's uid and
    /// workload, read from its recorded flags. Meshes with a proxy in every pod have none.
    fn ztunnel_workload(&self, _args: &[String]) -> Option<(String, WorkloadInfo)> {
        None
    }
}

/// The pod's workload as ztunnel is told of it, if its mesh has a ztunnel; `netns` is
/// where its network namespace is.
pub fn ztunnel_workload(flags: &PodFlags, netns: &std::path::Path) -> Option<Workload> {
    let (uid, info) = flags.dialect.mesh().ztunnel_workload(&flags.args)?;
    Some(Workload {
        uid,
        info,
        netns: netns.to_path_buf(),
    })
}

/// A pod as a node's rules see it.
#[derive(Debug, Clone, Copy)]
pub struct PodMeta<'a> {
    /// Its namespace, name and uid, where the runtime names them.
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    pub uid: Option<&'a str>,
    pub annotations: &'a Annotations,
    /// Its labels, where they could be read: the runtime passes a plugin none, and asking
    /// the CRI for them may find nothing yet (see `cni::labels`).
    pub labels: Option<&'a Annotations>,
}

impl<'a> PodMeta<'a> {
    /// A pod known by its namespace and annotations only.
    pub fn annotated(namespace: Option<&'a str>, annotations: &'a Annotations) -> Self {
        PodMeta {
            namespace,
            name: None,
            uid: None,
            annotations,
            labels: None,
        }
    }
}

/// A mesh's answer for a pod.
pub type Selected = Result<Selection, MeshError>;

/// A network configuration's settings for its pods, as the chained plugin reads them.
#[derive(Debug, Clone, Copy)]
pub struct Network<'a> {
    /// The network's flags, in its dialect: a list (the spec's `args` object convention
    /// means none), read only for a pod the mesh captures.
    pub args: &'a Value,
    /// Namespaces whose pods are never captured.
    pub exclude_namespaces: &'a [String],
    /// The configuration's other keys: each mesh reads its own (istio's
    /// `requireSidecarStatus`, Linkerd's `linkerd` and `controlPlaneNamespace`).
    pub keys: &'a Map<String, Value>,
}

impl Network<'_> {
    /// [`Network::args`] as a list of flags.
    pub fn arg_list(&self) -> Result<Vec<String>, MeshError> {
        match self.args {
            Value::Array(items) => items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| MeshError::Settings("args must be a list of strings".to_owned())),
            _ => Ok(Vec::new()),
        }
    }

    /// The mesh's own keys, read as `T`; a key of the wrong type is an error naming it.
    pub fn mesh_keys<T: serde::de::DeserializeOwned>(&self) -> Result<T, MeshError> {
        serde_json::from_value(Value::Object(self.keys.clone()))
            .map_err(|e| MeshError::Settings(format!("the network configuration: {e}")))
    }

    /// Why a pod of `namespace` is left alone by the network's namespace list.
    pub fn excluded(&self, namespace: Option<&str>) -> Option<String> {
        let ns = namespace.filter(|ns| self.exclude_namespaces.iter().any(|e| e == ns))?;
        Some(format!("namespace {ns} is excluded (excludeNamespaces)"))
    }
}

/// Whether a pod is captured, and with what flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    Capture(Vec<String>),
    /// Why it is left alone.
    LeftAlone(String),
}

/// A pod's flags in their dialect, as a record keeps them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFlags {
    pub dialect: Dialect,
    pub args: Vec<String>,
}

impl PodFlags {
    pub fn istio(args: Vec<String>) -> Self {
        PodFlags {
            dialect: Dialect::Istio,
            args,
        }
    }
}

/// The daemon's API: the flags of a pod it is asked to capture by name, in `dialect`
/// (see [`Mesh::requested`]); `None` with the reason when an annotation opts it out.
pub fn requested(
    dialect: Dialect,
    args: &[String],
    annotations: &Annotations,
) -> Result<Result<PodFlags, String>, MeshError> {
    Ok(match dialect.mesh().requested(args, annotations)? {
        Selection::Capture(args) => Ok(PodFlags { dialect, args }),
        Selection::LeftAlone(why) => Err(why),
    })
}

/// The chained plugin: the flags and spec of `pod` on `network`, in `dialect`; `Err` with
/// the reason when the pod is left alone.
pub fn node_flags(
    dialect: Dialect,
    network: &Network<'_>,
    pod: &PodMeta<'_>,
) -> Result<Result<(PodFlags, PodSpec), String>, MeshError> {
    let args = match dialect.mesh().node_flags(network, pod)? {
        Selection::Capture(args) => args,
        Selection::LeftAlone(why) => return Ok(Err(why)),
    };
    let flags = PodFlags { dialect, args };
    let spec = pod_spec(&flags)?;
    Ok(Ok((flags, spec)))
}

/// Whether a run option was given.
type Given = fn(&RunOptions) -> bool;

/// Run options that make no sense for a pod the daemon or the plugin manages.
const NOT_FOR_THE_DAEMON: [(&str, Given); 4] = [
    ("--cleanup-only (use `pod del`)", |r| r.cleanup_only),
    ("--dry-run / --simulate", |r| r.dry_run),
    (
        "--network-namespace / --netns (the request names the pod's namespace)",
        |r| r.network_namespace.is_some(),
    ),
    (
        "--cgroup (the daemon's programs are attached at the node cgroup)",
        |r| r.cgroup.is_some(),
    ),
];

/// Parse a node pod's flags exactly as the dialect's own command does, with no env vars:
/// a pod's settings come from its request alone.
pub fn pod_spec(flags: &PodFlags) -> Result<PodSpec, MeshError> {
    let argv = std::iter::once(flags.dialect.command().to_owned())
        .chain(flags.args.iter().cloned())
        .collect();
    let (capture, run) = flags.dialect.mesh().read_flags(argv)?;
    if let Some((flag, _)) = NOT_FOR_THE_DAEMON.iter().find(|(_, given)| given(&run)) {
        return Err(MeshError::NotForTheDaemon(flag));
    }
    Ok(PodSpec {
        capture,
        resolv_conf: run.resolv_conf,
        allow_host_netns: run.allow_host_netns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(dialect: Dialect, args: &[&str]) -> PodFlags {
        PodFlags {
            dialect,
            args: args.iter().map(|a| a.to_string()).collect(),
        }
    }

    #[test]
    fn each_dialect_reads_its_own_flags() {
        let istio = pod_spec(&flags(Dialect::Istio, &["-p", "15001", "-z", "15006"])).unwrap();
        assert_eq!(istio.capture.outbound_port, 15001);
        assert!(!istio.capture.local_destinations_pass);
        let linkerd = pod_spec(&flags(
            Dialect::Linkerd,
            &[
                "--incoming-proxy-port=4143",
                "--outgoing-proxy-port=4140",
                "--proxy-uid=2102",
            ],
        ))
        .unwrap();
        assert_eq!(
            (linkerd.capture.outbound_port, linkerd.capture.inbound_port),
            (4140, 4143)
        );
        assert!(linkerd.capture.local_destinations_pass);
        // The short flags clash: -p is istio's outbound port and Linkerd's inbound one.
        let err = pod_spec(&flags(Dialect::Istio, &["--incoming-proxy-port=4143"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("incoming-proxy-port"), "{err}");
    }

    #[test]
    fn run_options_a_managed_pod_cannot_have_are_refused_in_both_dialects() {
        for (dialect, args) in [
            (Dialect::Istio, vec!["-p", "15001", "--dry-run"]),
            (
                Dialect::Linkerd,
                vec!["-p", "4143", "-o", "4140", "--simulate"],
            ),
            (
                Dialect::Linkerd,
                vec!["-p", "4143", "-o", "4140", "--netns", "/proc/1/ns/net"],
            ),
            (Dialect::Istio, vec!["--cleanup-only"]),
        ] {
            let err = pod_spec(&flags(dialect, &args)).unwrap_err().to_string();
            assert!(
                err.contains("is not accepted by the daemon"),
                "{dialect:?} {args:?}: {err}"
            );
        }
    }

    #[test]
    fn the_unused_tproxy_settings_are_the_same_in_both_dialects() {
        let istio = pod_spec(&flags(Dialect::Istio, &[])).unwrap().capture;
        let linkerd = pod_spec(&flags(Dialect::Linkerd, &["-p", "4143", "-o", "4140"]))
            .unwrap()
            .capture;
        assert_eq!(
            (linkerd.tproxy_mark, linkerd.tproxy_route_table),
            (istio.tproxy_mark, istio.tproxy_route_table)
        );
    }

    #[test]
    fn a_dialect_is_named_in_lowercase() {
        assert_eq!(
            serde_json::to_string(&Dialect::Linkerd).unwrap(),
            "\"linkerd\""
        );
        assert_eq!(
            serde_json::from_str::<Dialect>("\"istio\"").unwrap(),
            Dialect::Istio
        );
    }
}
