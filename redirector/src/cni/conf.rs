//! The network configuration a runtime passes on stdin, and the CNI versions it may ask in.

use std::{collections::BTreeMap, path::PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

use super::error::{code, CniError};
use crate::mesh::{Dialect, Network};

/// The version this plugin answers VERSION in when the configuration names none.
pub const VERSION: &str = "1.1.0";

/// Every version a configuration may ask for. flannel, Calico, Cilium and kindnet write
/// 0.3.1, and a runtime passes the list's version to every plugin in it.
pub const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The namespaces left alone when the configuration names none (comma-separated).
pub const DEFAULT_EXCLUDED_NAMESPACES: &str = "kube-system";

/// The network configuration on stdin: the spec's keys and ours.
#[derive(Debug, Deserialize)]
pub struct NetConf {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// The network's name: the pods this plugin sets up are recorded under it.
    #[serde(default)]
    pub name: Option<String>,
    /// Which mesh's flags `args` are and whose rules choose the pods: `istio` (the
    /// default), `linkerd` or `ambient`.
    #[serde(default)]
    pub dialect: Dialect,
    /// The flags for the pods of this network (a list), in `dialect`; the spec's `args`
    /// object convention is accepted and ignored.
    #[serde(default)]
    pub args: Value,
    /// The daemon's API socket (default: the daemon's default): an ambient network's pods
    /// are enrolled through it; other dialects' pods need no daemon running.
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// The container runtime's CRI socket (default: containerd's), where an ambient
    /// network's pods' labels are read.
    #[serde(default, rename = "criSocket")]
    pub cri_socket: Option<PathBuf>,
    #[serde(default, rename = "pinRoot")]
    pub pin_root: Option<PathBuf>,
    #[serde(default, rename = "stateDir")]
    pub state_dir: Option<PathBuf>,
    /// Pods of these namespaces (`K8S_POD_NAMESPACE`) are never captured.
    #[serde(default = "default_excluded", rename = "excludeNamespaces")]
    pub exclude_namespaces: Vec<String>,
    #[serde(default, rename = "prevResult")]
    pub prev_result: Option<Value>,
    /// containerd sends `null` for parts it has nothing for.
    #[serde(default, rename = "runtimeConfig")]
    pub runtime_config: Option<RuntimeConfig>,
    #[serde(default, rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Option<Vec<Attachment>>,
    /// Every other key: the dialect's mesh reads its own from them (istio's
    /// `requireSidecarStatus`, Linkerd's `linkerd` and `controlPlaneNamespace`).
    #[serde(flatten)]
    pub mesh_keys: Map<String, Value>,
}

fn default_excluded() -> Vec<String> {
    DEFAULT_EXCLUDED_NAMESPACES
        .split(',')
        .map(String::from)
        .collect()
}

#[derive(Debug, Default, Deserialize)]
pub struct RuntimeConfig {
    /// containerd passes the pod's annotations to a plugin declaring this capability
    /// (`null` when the pod has none).
    #[serde(default, rename = "io.kubernetes.cri.pod-annotations")]
    pub pod_annotations: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
}

impl NetConf {
    /// The network's settings for its pods, as the dialect's mesh reads them.
    pub fn network(&self) -> Network<'_> {
        Network {
            args: &self.args,
            exclude_namespaces: &self.exclude_namespaces,
            keys: &self.mesh_keys,
        }
    }

    /// The pod's annotations (none when the runtime passed none).
    pub fn annotations(&self) -> BTreeMap<String, String> {
        self.runtime_config
            .as_ref()
            .and_then(|r| r.pod_annotations.clone())
            .unwrap_or_default()
    }
}

/// The network configuration from its JSON, checked for a version and type this plugin
/// speaks.
pub fn parse_conf(json: &str) -> Result<NetConf, CniError> {
    let conf: NetConf = serde_json::from_str(json).map_err(|e| {
        CniError::new(code::DECODE, "decoding the network configuration").details(e)
    })?;
    if !SUPPORTED.contains(&conf.cni_version.as_str()) {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "cniVersion {} is not supported (supported: {})",
                conf.cni_version,
                SUPPORTED.join(", ")
            ),
        ));
    }
    if conf.kind != "redirector-cni" {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            format!("type {:?} is not redirector-cni", conf.kind),
        ));
    }
    Ok(conf)
}

/// The version a VERSION call is answered in: the configuration's, when it names one this
/// plugin speaks (VERSION's stdin may be anything).
pub fn asked_version(stdin: &str) -> &'static str {
    serde_json::from_str::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_owned))
        .and_then(|asked| SUPPORTED.into_iter().find(|v| *v == asked))
        .unwrap_or(VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(version: &str) -> String {
        format!(r#"{{"cniVersion":"{version}","name":"k8s-pod-network","type":"redirector-cni"}}"#)
    }

    #[test]
    fn every_version_in_use_is_accepted() {
        for version in SUPPORTED {
            let parsed = parse_conf(&conf(version)).unwrap();
            assert_eq!(parsed.cni_version, version);
        }
        let err = parse_conf(&conf("0.2.0")).unwrap_err();
        assert_eq!(err.code, code::INCOMPATIBLE_VERSION);
        assert!(
            err.msg.contains("0.2.0") && err.msg.contains("0.3.1"),
            "{}",
            err.msg
        );
    }

    #[test]
    fn defaults_capture_only_injected_pods_outside_kube_system() {
        let parsed = parse_conf(&conf("0.3.1")).unwrap();
        assert!(!parsed.mesh_keys.contains_key("requireSidecarStatus"));
        assert_eq!(parsed.exclude_namespaces, ["kube-system"]);
        let open = parse_conf(
            r#"{"cniVersion":"1.0.0","type":"redirector-cni","requireSidecarStatus":false,"excludeNamespaces":[]}"#,
        )
        .unwrap();
        assert_eq!(open.mesh_keys["requireSidecarStatus"], false);
        assert!(open.exclude_namespaces.is_empty());
    }

    #[test]
    fn version_is_answered_in_the_version_asked() {
        assert_eq!(asked_version(&conf("0.3.1")), "0.3.1");
        assert_eq!(asked_version("{}"), VERSION);
        assert_eq!(asked_version(&conf("9.9.9")), VERSION);
        assert_eq!(asked_version("not json"), VERSION);
    }
}
