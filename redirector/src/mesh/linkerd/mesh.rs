//! Linkerd as one of redirector's meshes: what the node's ways in ask of it, standing in
//! for linkerd-cni. For a pod of the node, in this order:
//!
//! 1. [`left_alone`]: only pods Linkerd injected are captured;
//! 2. [`proxy_init_args`]: linkerd-cni's `"linkerd": {…}` settings as proxy-init flags;
//! 3. [`flags`]: the pod's annotations ([`with_namespace_defaults`](super::annotations::with_namespace_defaults)
//!    where the namespace's are at hand) applied over them, control-plane pods skipping
//!    the API server;
//! 4. [`parse_proxy_init`] on `["proxy-init", flags…]`.

use serde::Deserialize;
use serde_json::Value;

use super::{
    annotations::{flags, left_alone},
    cni_config::proxy_init_args,
    parse_proxy_init,
};
use crate::engine::spec::CaptureConfig;
use crate::mesh::{
    common::env::NoEnv, Annotations, Mesh, MeshError, Network, PodMeta, RunOptions, Selected,
    Selection,
};

pub struct Linkerd;

/// Linkerd's keys of a network configuration.
#[derive(Deserialize)]
struct NetworkKeys {
    /// linkerd-cni's settings: proxy-init's flags as keys.
    #[serde(default)]
    linkerd: Option<Value>,
    /// The namespace of Linkerd's control plane, whose pods also skip the API server's
    /// ports.
    #[serde(
        default = "default_control_plane_namespace",
        rename = "controlPlaneNamespace"
    )]
    control_plane_namespace: String,
}

fn default_control_plane_namespace() -> String {
    "linkerd".to_owned()
}

impl Mesh for Linkerd {
    fn read_flags(&self, argv: Vec<String>) -> Result<(CaptureConfig, RunOptions), MeshError> {
        let cfg = parse_proxy_init(argv, &NoEnv).map_err(MeshError::flags)?;
        Ok((cfg.capture, cfg.run))
    }

    fn requested(&self, args: &[String], annotations: &Annotations) -> Selected {
        flags(args, annotations, false)
            .map(Selection::Capture)
            .map_err(MeshError::Settings)
    }

    fn node_flags(&self, network: &Network<'_>, pod: &PodMeta<'_>) -> Selected {
        if let Some(why) = left_alone(pod.namespace, network.exclude_namespaces, pod.annotations) {
            return Ok(Selection::LeftAlone(why));
        }
        let keys: NetworkKeys = network.mesh_keys()?;
        let mut defaults = network.arg_list()?;
        if let Some(linkerd) = &keys.linkerd {
            defaults.extend(proxy_init_args(linkerd).map_err(MeshError::Settings)?);
        }
        let control_plane = pod
            .namespace
            .is_some_and(|ns| ns == keys.control_plane_namespace);
        flags(&defaults, pod.annotations, control_plane)
            .map(Selection::Capture)
            .map_err(MeshError::Settings)
    }
}
