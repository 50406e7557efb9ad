//! Repair of pods the plugin never saw: pods that started before the DaemonSet came up,
//! or while a network plugin's rewrite of the configuration had dropped its entry. At
//! start and every `--repair-interval`, the node's ready sandboxes are read from the
//! container runtime (CRI), and each one the plugin's own rules would capture — the
//! `redirector-cni` entry of the network configuration the runtime loads: its `args`,
//! `requireSidecarStatus` and `excludeNamespaces`, with the pod's annotations — but that
//! the daemon has no record of is captured now, through the same path as `pod add`. The
//! rules are the mesh's, asked through the seam (`mesh::node_flags`) as the plugin asks.
//!
//! Late capture takes effect for what the pod does from then on: connections it opened
//! before stay as they were (direct), new ones are captured; a proxy already listening is
//! registered as a CNI ADD would.

use std::{path::PathBuf, time::Duration};

use crate::{
    cni::conf::NetConf, engine::live_pod::LivePod, install_cni::chained_entry, mesh,
    sys::netns::Netns,
};

use crate::cri::Sandbox;
use crate::pods::{records::CniAttachment, Pods};

/// What the daemon does with a pod the plugin's rules capture but nothing captured.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepairMode {
    /// Nothing: no runtime is asked.
    Off,
    /// Count and log it (`redirector_pods_uncaptured`).
    Report,
    /// Capture it (`redirector_pods_repaired_total`).
    Capture,
}

#[derive(Clone, Debug)]
pub struct RepairConfig {
    pub mode: RepairMode,
    pub cri_socket: PathBuf,
    pub interval: Duration,
    /// Where the network configuration holding the plugin's entry is.
    pub cni_conf_dir: PathBuf,
}

/// What one round found.
#[derive(Debug, Default)]
pub struct Round {
    /// Pods captured now, as `namespace/name`.
    pub captured: Vec<String>,
    /// Pods to capture, left uncaptured (report mode, or a capture that failed).
    pub uncaptured: Vec<String>,
}

/// The plugin's entry in the configuration the runtime loads, as the plugin would read
/// it; `None` when there is none (install-cni has not chained it yet).
pub fn plugin_conf(conf_dir: &std::path::Path) -> anyhow::Result<Option<NetConf>> {
    let Some(entry) = chained_entry(conf_dir)? else {
        return Ok(None);
    };
    Ok(Some(serde_json::from_value(entry).map_err(|e| {
        anyhow::anyhow!("the redirector-cni entry in {}: {e}", conf_dir.display())
    })?))
}

impl Pods {
    /// Capture (or with `capture` false, only count) every sandbox in `sandboxes` that
    /// the plugin's rules in `conf` capture and that is neither recorded nor installed.
    pub fn repair(&self, sandboxes: &[Sandbox], conf: &NetConf, capture: bool) -> Round {
        let mut round = Round::default();
        // An ambient pod is enrolled with ztunnel through the daemon's agent, which a
        // repair round does not hold: ambient networks are not repaired.
        if conf.dialect == mesh::Dialect::Ambient {
            return round;
        }
        for sandbox in sandboxes {
            let pod = format!("{}/{}", sandbox.namespace, sandbox.name);
            let network = conf.network();
            let pod_meta = mesh::PodMeta::annotated(Some(&sandbox.namespace), &sandbox.annotations);
            let (flags, spec) = match mesh::node_flags(conf.dialect, &network, &pod_meta) {
                Ok(Ok(settings)) => settings,
                Ok(Err(_left_alone)) => continue,
                Err(err) => {
                    tracing::warn!("pod {pod}: {err}");
                    round.uncaptured.push(pod);
                    continue;
                }
            };
            // A namespace gone since the runtime listed it is nothing to repair.
            let Ok(netns) = Netns::open(&sandbox.netns) else {
                continue;
            };
            let cookie = netns.cookie();
            let recorded = matches!(
                self.records.by_container(&sandbox.id, Some(cookie)),
                Ok(Some(_))
            );
            if recorded || LivePod::open(&self.root, cookie).is_ok() {
                continue;
            }
            if !capture {
                tracing::warn!(
                    "pod {pod} (sandbox {}) should be captured and is not (--repair report)",
                    sandbox.id
                );
                round.uncaptured.push(pod);
                continue;
            }
            match self.add(
                &sandbox.netns,
                Some(pod.clone()),
                (flags, &spec),
                Some(CniAttachment {
                    container_id: sandbox.id.clone(),
                    network: conf.name.clone(),
                }),
                // The sandbox runs: its cgroup is found from its processes.
                None,
            ) {
                Ok(_) => {
                    tracing::info!(
                        "repaired pod {pod} (sandbox {}): captured now; its connections opened before stay direct",
                        sandbox.id
                    );
                    round.captured.push(pod);
                }
                Err(err) => {
                    tracing::warn!("repairing pod {pod} (sandbox {}): {err}", sandbox.id);
                    round.uncaptured.push(pod);
                }
            }
        }
        round
    }
}
