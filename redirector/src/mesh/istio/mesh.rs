//! istio as one of redirector's meshes: what the node's ways in ask of it.

use serde::Deserialize;

use super::{
    annotations::{flags, left_alone, Rules},
    parse_istio_iptables,
};
use crate::engine::spec::CaptureConfig;
use crate::mesh::{
    common::env::NoEnv, Annotations, Mesh, MeshError, Network, PodMeta, RunOptions, Selected,
    Selection,
};

pub struct Istio;

/// istio's keys of a network configuration.
#[derive(Deserialize)]
struct NetworkKeys {
    /// Capture only pods the injector marked (`sidecar.istio.io/status`); on unless the
    /// configuration says `false`, since a pod with no sidecar has nothing listening on
    /// the ports its connections would be sent to.
    #[serde(default = "yes", rename = "requireSidecarStatus")]
    require_status: bool,
}

fn yes() -> bool {
    true
}

impl Mesh for Istio {
    fn read_flags(&self, argv: Vec<String>) -> Result<(CaptureConfig, RunOptions), MeshError> {
        let cfg = parse_istio_iptables(argv, &NoEnv).map_err(MeshError::flags)?;
        if cfg.own.run_validation {
            return Err(MeshError::NotForTheDaemon("--run-validation"));
        }
        Ok((cfg.capture, cfg.run))
    }

    fn requested(&self, args: &[String], annotations: &Annotations) -> Selected {
        let rules = Rules {
            require_status: false,
            exclude_namespaces: &[],
        };
        Ok(match left_alone(rules, None, annotations) {
            Some(why) => Selection::LeftAlone(why),
            None => Selection::Capture(flags(args, annotations)),
        })
    }

    fn node_flags(&self, network: &Network<'_>, pod: &PodMeta<'_>) -> Selected {
        let keys: NetworkKeys = network.mesh_keys()?;
        let rules = Rules {
            require_status: keys.require_status,
            exclude_namespaces: network.exclude_namespaces,
        };
        if let Some(why) = left_alone(rules, pod.namespace, pod.annotations) {
            return Ok(Selection::LeftAlone(why));
        }
        Ok(Selection::Capture(flags(
            &network.arg_list()?,
            pod.annotations,
        )))
    }
}
