//! Repair of pods the plugin never saw: pods that started before the DaemonSet came up,
//! or while a network plugin's rewrite of the configuration had dropped its entry. At
//! start and every `--repair-interval`, the node's ready sandboxes are read from the
//! container runtime (CRI), and each one the plugin's own rules would capture — the
//! `redirector-cni` entry of the network configuration the runtime loads: its `args`,
//! `requireSidecarStatus` and `excludeNamespaces`, with the pod's annotations — but that
//! the daemon has no record of is captured now, through the same path as `pod add`. The
//! rules are the mesh's, asked through the seam (`mesh::node_flags`) as the plugin asks,
//! with what the runtime lists of each pod: its namespace, name, uid, labels and
//! annotations. An ambient network's pods are enrolled with ztunnel by the daemon as its
//! agent (`super::ambient_repair`), chosen here the same way.
//!
//! Late capture takes effect for what the pod does from then on: connections it opened
//! before stay as they were (direct), new ones are captured; a proxy already listening is
//! registered as a CNI ADD would.

use std::{path::PathBuf, time::Duration};

use crate::{
    cni::conf::NetConf,
    cri::Sandbox,
    engine::{live_pod::LivePod, spec::PodSpec},
    install_cni::chained_entry,
    mesh::{self, PodFlags},
    pods::{records::CniAttachment, Pods},
    sys::netns::Netns,
};

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

/// A sandbox the plugin's rules choose, with the settings they give its pod.
#[derive(Debug)]
pub struct Chosen {
    pub sandbox: Sandbox,
    /// `namespace/name`.
    pub pod: String,
    pub flags: PodFlags,
    pub spec: PodSpec,
}

impl Chosen {
    /// The attachment its record keeps, as the plugin's ADD would have: the runtime's CNI
    /// DEL and GC find the pod by its sandbox.
    pub fn cni(&self, conf: &NetConf) -> CniAttachment {
        CniAttachment {
            container_id: self.sandbox.id.clone(),
            network: conf.name.clone(),
        }
    }

    /// Logs that the pod is left as it is (`--repair report`).
    pub fn report(&self) {
        tracing::warn!(
            "pod {} (sandbox {}) should be captured and is not (--repair report)",
            self.pod,
            self.sandbox.id
        );
    }

    /// Logs that the pod was set up now.
    pub fn repaired(&self) {
        tracing::info!(
            "repaired pod {} (sandbox {}): captured now; its connections opened before stay direct",
            self.pod,
            self.sandbox.id
        );
    }

    /// Logs why setting the pod up failed (the next round tries again).
    pub fn failed(&self, why: &dyn std::fmt::Display) {
        tracing::warn!(
            "repairing pod {} (sandbox {}): {why}",
            self.pod,
            self.sandbox.id
        );
    }
}

/// The pod of `sandbox` as the plugin's rules see it: the runtime's list gives its labels
/// and uid too, which a CNI ADD on containerd cannot read.
fn pod_meta(sandbox: &Sandbox) -> mesh::PodMeta<'_> {
    fn given(text: &str) -> Option<&str> {
        Some(text).filter(|t| !t.is_empty())
    }
    mesh::PodMeta {
        namespace: given(&sandbox.namespace),
        name: given(&sandbox.name),
        uid: given(&sandbox.uid),
        annotations: &sandbox.annotations,
        labels: Some(&sandbox.labels),
    }
}

/// The sandboxes the plugin's rules in `conf` choose, with their settings; and the pods
/// they choose whose settings are wrong (logged), which stay uncaptured.
pub fn chosen(sandboxes: &[Sandbox], conf: &NetConf) -> (Vec<Chosen>, Vec<String>) {
    let network = conf.network();
    let (mut chosen, mut refused) = (Vec::new(), Vec::new());
    for sandbox in sandboxes {
        let pod = format!("{}/{}", sandbox.namespace, sandbox.name);
        match mesh::node_flags(conf.dialect, &network, &pod_meta(sandbox)) {
            Ok(Ok((flags, spec))) => chosen.push(Chosen {
                sandbox: sandbox.clone(),
                pod,
                flags,
                spec,
            }),
            Ok(Err(_left_alone)) => {}
            Err(err) => {
                tracing::warn!("pod {pod}: {err}");
                refused.push(pod);
            }
        }
    }
    (chosen, refused)
}

impl Pods {
    /// Whether `sandbox` is still to be set up: its namespace is there (one gone since the
    /// runtime listed it is nothing to repair), and neither a record nor the kernel has a
    /// pod in it.
    pub fn unrepaired(&self, sandbox: &Sandbox) -> bool {
        let Ok(netns) = Netns::open(&sandbox.netns) else {
            return false;
        };
        let cookie = netns.cookie();
        let recorded = matches!(
            self.records.by_container(&sandbox.id, Some(cookie)),
            Ok(Some(_))
        );
        !recorded && LivePod::open(&self.root, cookie).is_err()
    }

    /// Capture (or with `capture` false, only count) every sandbox in `sandboxes` that
    /// the plugin's rules in `conf` capture and that is neither recorded nor installed.
    /// An ambient network's pods are enrolled with ztunnel, by the daemon as its agent
    /// (`daemon::ambient_repair`): none here.
    pub fn repair(&self, sandboxes: &[Sandbox], conf: &NetConf, capture: bool) -> Round {
        if conf.dialect == mesh::Dialect::Ambient {
            return Round::default();
        }
        let (chosen, uncaptured) = chosen(sandboxes, conf);
        let mut round = Round {
            uncaptured,
            ..Round::default()
        };
        for pod in chosen.into_iter().filter(|c| self.unrepaired(&c.sandbox)) {
            if !capture {
                pod.report();
                round.uncaptured.push(pod.pod);
                continue;
            }
            let added = self.add(
                &pod.sandbox.netns,
                Some(pod.pod.clone()),
                (pod.flags.clone(), &pod.spec),
                Some(pod.cni(conf)),
                // The sandbox runs: its cgroup is found from its processes.
                None,
            );
            match added {
                Ok(_) => {
                    pod.repaired();
                    round.captured.push(pod.pod);
                }
                Err(err) => {
                    pod.failed(&err);
                    round.uncaptured.push(pod.pod);
                }
            }
        }
        round
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The plugin's entry on an ambient network listing `shop`.
    fn ambient_conf() -> NetConf {
        serde_json::from_value(json!({
            "cniVersion": "1.0.0",
            "name": "pods",
            "type": "redirector-cni",
            "dialect": "ambient",
            "excludeNamespaces": ["kube-system", "istio-system"],
            "ambientNamespaces": ["shop"],
        }))
        .unwrap()
    }

    fn pairs(pairs: &[(&str, &str)]) -> mesh::Annotations {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A ready sandbox of pod `namespace/name` (uid `NAME-uid`).
    fn sandbox(
        namespace: &str,
        name: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> Sandbox {
        Sandbox {
            id: format!("sb-{name}"),
            namespace: namespace.into(),
            name: name.into(),
            uid: format!("{name}-uid"),
            labels: pairs(labels),
            annotations: pairs(annotations),
            netns: format!("/run/netns/{name}").into(),
        }
    }

    const AMBIENT: (&str, &str) = ("istio.io/dataplane-mode", "ambient");
    const NONE: (&str, &str) = ("istio.io/dataplane-mode", "none");

    fn chosen_names(sandboxes: &[Sandbox], conf: &NetConf) -> Vec<String> {
        let (chosen, refused) = chosen(sandboxes, conf);
        assert!(refused.is_empty(), "{refused:?}");
        chosen.into_iter().map(|c| c.pod).collect()
    }

    #[test]
    fn a_sandbox_labelled_ambient_is_chosen_with_who_its_pod_is() {
        let conf = ambient_conf();
        let (chosen, refused) = chosen(&[sandbox("default", "app", &[AMBIENT], &[])], &conf);
        assert!(refused.is_empty(), "{refused:?}");
        let [pod] = &chosen[..] else {
            panic!("{chosen:?}");
        };
        assert_eq!(pod.pod, "default/app");
        assert_eq!(pod.flags.dialect, mesh::Dialect::Ambient);
        assert_eq!(
            pod.flags.args,
            ["--pod-uid", "app-uid", "--name", "default/app"]
        );
        let cni = pod.cni(&conf);
        assert_eq!(cni.container_id, "sb-app");
        assert_eq!(cni.network.as_deref(), Some("pods"));
    }

    #[test]
    fn the_label_the_annotation_and_the_namespace_list_choose_a_pod() {
        let conf = ambient_conf();
        let sandboxes = [
            sandbox("default", "labelled", &[AMBIENT], &[]),
            sandbox("default", "annotated", &[], &[AMBIENT]),
            sandbox("shop", "listed", &[("app", "cart")], &[]),
        ];
        assert_eq!(
            chosen_names(&sandboxes, &conf),
            ["default/labelled", "default/annotated", "shop/listed"]
        );
    }

    #[test]
    fn the_opt_out_a_sidecar_ztunnel_and_excluded_namespaces_are_never_chosen() {
        let conf = ambient_conf();
        let sidecar = ("sidecar.istio.io/status", "{}");
        let sandboxes = [
            sandbox("default", "plain", &[("app", "web")], &[]),
            sandbox(
                "default",
                "other-mode",
                &[("istio.io/dataplane-mode", "x")],
                &[],
            ),
            sandbox("shop", "out-by-label", &[NONE], &[]),
            sandbox("shop", "out-by-annotation", &[], &[NONE]),
            sandbox("default", "label-over-annotation", &[NONE], &[AMBIENT]),
            sandbox("default", "sidecar", &[AMBIENT], &[sidecar]),
            sandbox("shop", "ztunnel", &[("app", "ztunnel"), AMBIENT], &[]),
            sandbox("kube-system", "system", &[AMBIENT], &[]),
            sandbox("istio-system", "istiod", &[AMBIENT], &[AMBIENT]),
        ];
        assert!(chosen_names(&sandboxes, &conf).is_empty());
    }

    #[test]
    fn a_chosen_pod_the_runtime_gives_no_uid_is_refused_and_stays_uncaptured() {
        let conf = ambient_conf();
        let mut no_uid = sandbox("default", "app", &[AMBIENT], &[]);
        no_uid.uid.clear();
        let bad = sandbox(
            "default",
            "bad",
            &[AMBIENT],
            &[("ambient.istio.io/dns-capture", "yes")],
        );
        let (chosen, refused) = chosen(&[no_uid, bad], &conf);
        assert!(chosen.is_empty(), "{chosen:?}");
        assert_eq!(refused, ["default/app", "default/bad"]);
    }

    #[test]
    fn an_istio_network_chooses_by_its_annotations_whatever_the_labels() {
        let conf: NetConf = serde_json::from_value(json!({
            "cniVersion": "1.0.0",
            "type": "redirector-cni",
            "args": ["-p", "15001", "-z", "15006", "-u", "1337"],
        }))
        .unwrap();
        let sandboxes = [
            sandbox(
                "default",
                "injected",
                &[],
                &[("sidecar.istio.io/status", "{}")],
            ),
            sandbox("default", "ambient", &[AMBIENT], &[]),
        ];
        assert_eq!(chosen_names(&sandboxes, &conf), ["default/injected"]);
    }
}
