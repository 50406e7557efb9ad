//! `redirector-cni`: a chained CNI plugin (spec 1.0.0 and 1.1.0), the binary invoked under
//! that name. ADD captures the pod before any of its containers runs, writing its entries
//! into the pinned maps itself, under the node lock, with the engine the daemon and the
//! init containers use — so no daemon is on the pod-start path. It needs the node's
//! programs pinned (a daemon has run since the node started); without them ADD fails with
//! code 11 (try again later), so the runtime retries instead of starting a pod uncaptured.
//! DEL is keyed on CNI_CONTAINERID and idempotent.

mod error;

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Read,
    path::PathBuf,
    process::ExitCode,
};

use serde::Deserialize;
use serde_json::{json, Value};

use self::error::{code, CniError};
use crate::{
    annotations,
    daemon::{
        pods::{parse_flags, remove_pod, Node},
        records::{Records, DEFAULT_STATE_DIR},
    },
    netns::Netns,
    node::node_object,
    store::{pins::DEFAULT_ROOT, EbpfObject, OpenMaps, PinRoot},
};

/// The version this plugin answers in.
pub const VERSION: &str = "1.1.0";
const SUPPORTED: [&str; 3] = ["0.4.0", "1.0.0", "1.1.0"];

/// The network configuration on stdin: the spec's keys and ours.
#[derive(Debug, Deserialize)]
struct NetConf {
    #[serde(rename = "cniVersion")]
    cni_version: String,
    #[serde(rename = "type")]
    kind: String,
    /// istio-iptables flags for the pods of this network (a list); the spec's `args`
    /// object convention is accepted and ignored.
    #[serde(default)]
    args: Value,
    /// The daemon's socket; the plugin does not need the daemon to run.
    #[serde(default)]
    #[expect(
        dead_code,
        reason = "accepted for the documented network configuration"
    )]
    socket: Option<PathBuf>,
    #[serde(default, rename = "pinRoot")]
    pin_root: Option<PathBuf>,
    #[serde(default, rename = "stateDir")]
    state_dir: Option<PathBuf>,
    /// Capture only pods the injector marked (`sidecar.istio.io/status`).
    #[serde(default, rename = "requireSidecarStatus")]
    require_status: bool,
    #[serde(default, rename = "prevResult")]
    prev_result: Option<Value>,
    /// containerd sends `null` for parts it has nothing for.
    #[serde(default, rename = "runtimeConfig")]
    runtime_config: Option<RuntimeConfig>,
    #[serde(default, rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<Attachment>>,
}

#[derive(Debug, Default, Deserialize)]
struct RuntimeConfig {
    /// containerd passes the pod's annotations to a plugin declaring this capability
    /// (`null` when the pod has none).
    #[serde(default, rename = "io.kubernetes.cri.pod-annotations")]
    pod_annotations: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
struct Attachment {
    #[serde(rename = "containerID")]
    container_id: String,
}

/// Run the plugin: the command from `CNI_COMMAND`, the configuration from stdin.
pub fn main() -> ExitCode {
    match run() {
        Ok(Some(output)) => {
            println!("{output}");
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(err) => {
            println!("{}", serde_json::to_string(&err).unwrap_or_default());
            ExitCode::FAILURE
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn required_env(name: &str) -> Result<String, CniError> {
    env(name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| CniError::new(code::INVALID_ENV, format!("{name} is not set")))
}

fn run() -> Result<Option<Value>, CniError> {
    let command = required_env("CNI_COMMAND")?;
    if command == "VERSION" {
        return Ok(Some(
            json!({ "cniVersion": VERSION, "supportedVersions": SUPPORTED }),
        ));
    }
    let conf = read_conf()?;
    crate::kernel::check_running().map_err(|e| CniError::new(code::SETUP_FAILED, e.to_string()))?;
    let plugin = Plugin::new(&conf);
    match command.as_str() {
        "ADD" => plugin.add(&conf),
        "DEL" => plugin.del().map(|()| None),
        "CHECK" => plugin.check().map(|()| None),
        "STATUS" => plugin.status().map(|()| None),
        "GC" => plugin.gc(&conf).map(|()| None),
        other => Err(CniError::new(
            code::INVALID_ENV,
            format!("unknown CNI_COMMAND {other:?}"),
        )),
    }
}

fn read_conf() -> Result<NetConf, CniError> {
    let mut stdin = String::new();
    std::io::stdin()
        .read_to_string(&mut stdin)
        .map_err(|e| CniError::new(code::DECODE, "reading the network configuration").details(e))?;
    parse_conf(&stdin)
}

/// The network configuration from its JSON, checked for a version and type this plugin
/// speaks.
fn parse_conf(json: &str) -> Result<NetConf, CniError> {
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

/// The pod's istio-iptables flags: the network's `args` overridden by the pod's istio
/// annotations, validated; `None` when the annotations say the pod is not captured.
fn pod_flags(conf: &NetConf) -> Result<Option<Vec<String>>, CniError> {
    let no_annotations = BTreeMap::new();
    let annotations = conf
        .runtime_config
        .as_ref()
        .and_then(|r| r.pod_annotations.as_ref())
        .unwrap_or(&no_annotations);
    if !annotations::captured(annotations, conf.require_status) {
        return Ok(None);
    }
    let defaults: Vec<String> = match &conf.args {
        Value::Array(items) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| CniError::new(code::INVALID_CONFIG, "args must be a list of strings"))?,
        _ => Vec::new(),
    };
    let flags = annotations::flags(&defaults, annotations);
    parse_flags(&flags).map_err(|e| CniError::new(code::INVALID_CONFIG, e))?;
    Ok(Some(flags))
}

struct Plugin {
    root: PinRoot,
    records: Records,
}

impl Plugin {
    fn new(conf: &NetConf) -> Self {
        Plugin {
            root: PinRoot::new(conf.pin_root.clone().unwrap_or_else(|| DEFAULT_ROOT.into())),
            records: Records::new(
                &conf
                    .state_dir
                    .clone()
                    .unwrap_or_else(|| DEFAULT_STATE_DIR.into()),
            ),
        }
    }

    /// The engine over the node's pinned object, or "try again later" when there is none.
    fn node(&self, unavailable: u32) -> Result<Node, CniError> {
        let object = node_object(&self.root)
            .map_err(|e| CniError::new(code::SETUP_FAILED, "reading the pins").details(e))?
            .ok_or_else(|| {
                CniError::new(
                    unavailable,
                    format!(
                        "nothing is pinned under {}: the redirector daemon has not run on this node since it started",
                        self.root.path().display()
                    ),
                )
            })?;
        Ok(Node::new(
            self.root.clone(),
            EbpfObject::pinned(object.id().clone()),
            self.records.clone(),
        ))
    }

    fn add(&self, conf: &NetConf) -> Result<Option<Value>, CniError> {
        let container = required_env("CNI_CONTAINERID")?;
        let netns = required_env("CNI_NETNS")?;
        // Chained: the result so far goes on unchanged, in the configuration's version.
        let mut result = conf.prev_result.clone().unwrap_or_else(|| json!({}));
        if let Some(object) = result.as_object_mut() {
            object.insert("cniVersion".into(), conf.cni_version.clone().into());
        }
        let Some(flags) = pod_flags(conf)? else {
            return Ok(Some(result));
        };
        let node = self.node(code::TRY_AGAIN_LATER)?;
        node.add(&PathBuf::from(netns), pod_name(), flags, Some(container))
            .map_err(|e| CniError::new(code::SETUP_FAILED, e))?;
        Ok(Some(result))
    }

    fn del(&self) -> Result<(), CniError> {
        let container = required_env("CNI_CONTAINERID")?;
        if !self.root.path().exists() {
            return Ok(());
        }
        // The namespace, while it is still there, names the record without reading the others.
        let netns_cookie = env("CNI_NETNS")
            .filter(|p| !p.is_empty())
            .and_then(|p| Netns::open(p.as_ref()).ok())
            .map(|n| n.cookie());
        let record = self
            .records
            .by_container(&container, netns_cookie)
            .map_err(|e| CniError::new(code::SETUP_FAILED, e.to_string()))?;
        // No record (e.g. the state dir was lost): the namespace, if still there.
        let cookie = record.as_ref().map(|r| r.cookie()).or(netns_cookie);
        remove_pod(
            &self.root,
            &self.records,
            record,
            cookie,
            &mut OpenMaps::default(),
        )
        .map(drop)
        .map_err(|e| CniError::new(code::SETUP_FAILED, e))
    }

    fn check(&self) -> Result<(), CniError> {
        let container = required_env("CNI_CONTAINERID")?;
        let node = self.node(code::NOT_AVAILABLE)?;
        let record = self
            .records
            .by_container(&container, None)
            .map_err(|e| CniError::new(code::SETUP_FAILED, e.to_string()))?
            .ok_or_else(|| {
                CniError::new(
                    code::SETUP_FAILED,
                    format!("no pod is set up for container {container}"),
                )
            })?;
        node.check_record(&record)
            .map(drop)
            .map_err(|e| CniError::new(code::SETUP_FAILED, e))
    }

    /// Ready when the node's programs are pinned.
    fn status(&self) -> Result<(), CniError> {
        self.node(code::NOT_AVAILABLE).map(drop)
    }

    /// Remove the pods of containers the runtime no longer has, and pods that are gone.
    fn gc(&self, conf: &NetConf) -> Result<(), CniError> {
        if !self.root.path().exists() {
            return Ok(());
        }
        if let Some(valid) = &conf.valid_attachments {
            let valid: BTreeSet<&str> = valid.iter().map(|a| a.container_id.as_str()).collect();
            let records = self
                .records
                .all()
                .map_err(|e| CniError::new(code::SETUP_FAILED, e.to_string()))?;
            let node = self.node(code::NOT_AVAILABLE)?;
            for record in records {
                let stale = record
                    .container_id
                    .as_deref()
                    .is_some_and(|id| !valid.contains(id));
                if stale {
                    let cookie = record.cookie();
                    node.remove(Some(record), Some(cookie))
                        .map_err(|e| CniError::new(code::SETUP_FAILED, e))?;
                }
            }
        }
        crate::gc::collect_stale(&self.root)
            .map(drop)
            .map_err(|e| CniError::new(code::SETUP_FAILED, e.to_string()))
    }
}

/// `namespace/name` from CNI_ARGS (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`), if given.
fn pod_name() -> Option<String> {
    let args = env("CNI_ARGS")?;
    let get = |key: &str| {
        args.split(';')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_owned())
    };
    match (get("K8S_POD_NAMESPACE"), get("K8S_POD_NAME")) {
        (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
        (None, Some(name)) => Some(name),
        _ => None,
    }
}

#[cfg(test)]
mod generated;
