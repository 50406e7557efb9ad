//! The meshes' dialects a node's pod settings are written in. The daemon's API, the CNI
//! plugin and the pods' records name a pod's flags with their dialect; this is the one
//! place that turns them into the engine's [`PodSpec`], so that `pods/` never reads a
//! mesh's flags itself.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{engine::spec::PodSpec, istio::RunOptions};

/// Which command line a pod's flags are: istio-iptables' or Linkerd's proxy-init's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    #[default]
    Istio,
    Linkerd,
}

impl Dialect {
    pub fn is_istio(&self) -> bool {
        *self == Dialect::Istio
    }

    pub fn name(self) -> &'static str {
        match self {
            Dialect::Istio => "istio",
            Dialect::Linkerd => "linkerd",
        }
    }

    /// The command the flags are written for, as argv[0].
    fn command(self) -> &'static str {
        match self {
            Dialect::Istio => "istio-iptables",
            Dialect::Linkerd => "proxy-init",
        }
    }
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

/// The flags of a pod the daemon's API is asked to capture by name: `args` overridden by
/// the mesh's pod `annotations`; `Err` with the reason when an annotation opts the pod
/// out (only an explicit opt-out holds: the API was asked for this pod).
pub fn requested(
    dialect: Dialect,
    args: &[String],
    annotations: &BTreeMap<String, String>,
) -> Result<Result<PodFlags, String>, String> {
    let args = match dialect {
        Dialect::Istio => {
            use crate::istio::annotations::{flags, left_alone, Rules};
            let rules = Rules {
                require_status: false,
                exclude_namespaces: &[],
            };
            if let Some(why) = left_alone(rules, None, annotations) {
                return Ok(Err(why));
            }
            flags(args, annotations)
        }
        Dialect::Linkerd => crate::linkerd::node::flags(args, annotations, false)?,
    };
    Ok(Ok(PodFlags { dialect, args }))
}

/// Whether a run option was given.
type Given = fn(&RunOptions) -> bool;

/// Run options that make no sense for a pod the daemon or the plugin manages.
const NOT_FOR_THE_DAEMON: [(&str, Given); 5] = [
    ("--cleanup-only (use `pod del`)", |r| r.cleanup_only),
    ("--dry-run / --simulate", |r| r.dry_run),
    ("--run-validation", |r| r.run_validation),
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
pub fn pod_spec(flags: &PodFlags) -> Result<PodSpec, String> {
    let argv =
        std::iter::once(flags.dialect.command().to_owned()).chain(flags.args.iter().cloned());
    let no_env = std::collections::HashMap::<String, String>::new();
    let (capture, run) = match flags.dialect {
        Dialect::Istio => {
            let cfg = crate::istio::parse_istio_iptables(argv, &no_env)
                .map_err(|err| err.to_string().trim().to_owned())?;
            (cfg.capture, cfg.run)
        }
        Dialect::Linkerd => {
            let cfg = crate::linkerd::parse_proxy_init(argv, &no_env)
                .map_err(|err| err.to_string().trim().to_owned())?;
            (cfg.capture, cfg.run)
        }
    };
    if let Some((flag, _)) = NOT_FOR_THE_DAEMON.iter().find(|(_, given)| given(&run)) {
        return Err(format!("{flag} is not accepted by the daemon"));
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
        let err = pod_spec(&flags(Dialect::Istio, &["--incoming-proxy-port=4143"])).unwrap_err();
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
            let err = pod_spec(&flags(dialect, &args)).unwrap_err();
            assert!(
                err.contains("is not accepted by the daemon"),
                "{dialect:?} {args:?}: {err}"
            );
        }
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
