//! `redirector-cni`: a chained CNI plugin (spec 0.3.0 to 1.1.0), the binary invoked under
//! that name. ADD captures the pod before any of its containers runs, writing its entries
//! into the pinned maps itself, under the node lock, with the engine the daemon and the
//! init containers use — so no daemon is on the pod-start path.
//!
//! Only pods meant to be meshed are captured (the mesh's rules: [`mesh::node_flags`]): every other pod passes ADD
//! whatever state the node is in — nothing pinned after a reboot, no daemon, a refused
//! kernel. A pod that is to be captured needs the node's programs pinned (a daemon has run
//! since the node started); without them ADD fails with code 11 (try again later), so the
//! runtime retries instead of starting a meshed pod uncaptured — unless the daemon found
//! that this node cannot be served (`node_check`), where install-cni takes the entry out
//! and, until it has, a meshed pod starts uncaptured for its mesh's own check to stop it
//! and STATUS answers ready. DEL is keyed on
//! CNI_CONTAINERID, idempotent, and never fails for want of pins or of a usable kernel.
//!
//! An ambient network's pods are the exception: ztunnel's node agent lives in the daemon,
//! so they are enrolled through its API ([`ambient`]).

mod ambient;
pub mod conf;
mod error;

use std::{collections::BTreeSet, io::Read, path::PathBuf, process::ExitCode};

use serde_json::{json, Value};

pub use self::conf::{DEFAULT_EXCLUDED_NAMESPACES, SUPPORTED, VERSION};
use self::{
    conf::{asked_version, parse_conf, NetConf},
    error::{code, CniError},
};
use crate::{
    engine::node::node_object,
    engine::spec::PodSpec,
    mesh::{self, Dialect, PodFlags},
    pods::{
        records::{CniAttachment, PodRecord, Records, DEFAULT_STATE_DIR},
        remove_pod, PodError, Pods,
    },
    store::{pins::DEFAULT_ROOT, EbpfObject, OpenMaps, PinRoot},
    sys::netns::Netns,
};

/// Run the plugin: the command from `CNI_COMMAND`, the configuration from stdin. Results
/// and errors are answered in the version the configuration asked for.
pub fn main() -> ExitCode {
    let mut version = VERSION;
    match run(&mut version) {
        Ok(Some(output)) => {
            println!("{output}");
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(err) => {
            let err = err.in_version(version);
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

fn run(version: &mut &'static str) -> Result<Option<Value>, CniError> {
    let command = required_env("CNI_COMMAND")?;
    let stdin = read_stdin()?;
    *version = asked_version(&stdin);
    if command == "VERSION" {
        return Ok(Some(
            json!({ "cniVersion": *version, "supportedVersions": SUPPORTED }),
        ));
    }
    let conf = parse_conf(&stdin)?;
    let plugin = Plugin::new(&conf);
    match command.as_str() {
        "ADD" => plugin.add(&conf),
        "DEL" => plugin.del(&conf).map(|()| None),
        "CHECK" => plugin.check(&conf).map(|()| None),
        "STATUS" => plugin.status().map(|()| None),
        "GC" => plugin.gc(&conf).map(|()| None),
        other => Err(CniError::new(
            code::INVALID_ENV,
            format!("unknown CNI_COMMAND {other:?}"),
        )),
    }
}

fn read_stdin() -> Result<String, CniError> {
    let mut stdin = String::new();
    std::io::stdin()
        .read_to_string(&mut stdin)
        .map_err(|e| CniError::new(code::DECODE, "reading the network configuration").details(e))?;
    Ok(stdin)
}

/// The flags and spec of the pod this call is for (of `namespace`), in the network's
/// dialect: the network's flags overridden by the pod's annotations as that mesh's own
/// plugin or injector maps them, validated; `None` when the pod is left alone.
fn pod_settings(
    conf: &NetConf,
    namespace: Option<&str>,
) -> Result<Option<(PodFlags, PodSpec)>, CniError> {
    let annotations = conf.annotations();
    let pod = mesh::PodMeta::annotated(namespace, &annotations);
    mesh::node_flags(conf.dialect, &conf.network(), &pod)
        .map(Result::ok)
        .map_err(|e| CniError::new(code::INVALID_CONFIG, e.to_string()))
}

/// The kernel check, for the commands that need the programs: a kernel redirector refuses
/// cannot serve a meshed pod. Probed only while `root` holds no loaded object.
fn kernel_ready(root: &PinRoot, failure: u32) -> Result<(), CniError> {
    root.check_kernel_unless_loaded()
        .map_err(|e| CniError::new(failure, e.to_string()))
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

    /// Whether anything of a pod can be in the kernel: not with no pin root (a node just
    /// rebooted, an uninstall done) nor on a kernel redirector refuses.
    fn may_hold_kernel_state(&self) -> bool {
        self.root.path().exists() && kernel_ready(&self.root, code::SETUP_FAILED).is_ok()
    }

    /// The node's pinned object, if any.
    fn pinned(&self) -> Result<Option<EbpfObject>, CniError> {
        let object = node_object(&self.root)
            .map_err(|e| CniError::new(code::SETUP_FAILED, "reading the pins").details(e))?;
        Ok(object.map(|o| EbpfObject::pinned(o.id().clone())))
    }

    /// The engine over the node's pinned object, or `unavailable` when there is none.
    fn pods(&self, unavailable: u32) -> Result<Pods, CniError> {
        let object = self.pinned()?.ok_or_else(|| {
            CniError::new(
                unavailable,
                format!(
                    "nothing is pinned under {}: the redirector daemon has not run on this node since it started",
                    self.root.path().display()
                ),
            )
        })?;
        let pods = Pods::new(self.root.clone(), object, self.records.clone());
        Ok(match self.records.node_cgroup() {
            // Noted by a daemon whose node cgroup is gone since (a state dir that outlived
            // it): the node is not served until a daemon starts again.
            Some(node) if !node.is_dir() => {
                return Err(CniError::new(
                    unavailable,
                    format!(
                        "the node cgroup {} the daemon noted is gone: the redirector daemon has not run on this node since",
                        node.display()
                    ),
                ))
            }
            Some(node) => pods.with_node_cgroup(node),
            None => pods,
        })
    }

    fn add(&self, conf: &NetConf) -> Result<Option<Value>, CniError> {
        let container = required_env("CNI_CONTAINERID")?;
        let netns = required_env("CNI_NETNS")?;
        // Chained: the result so far goes on unchanged, in the configuration's version.
        let mut result = conf.prev_result.clone().unwrap_or_else(|| json!({}));
        if let Some(object) = result.as_object_mut() {
            object.insert("cniVersion".into(), conf.cni_version.clone().into());
        }
        if conf.dialect == Dialect::Ambient {
            ambient::add(conf, &container, &netns, self.pod_cgroup())?;
            return Ok(Some(result));
        }
        let Some(settings) = pod_settings(conf, pod_namespace().as_deref())? else {
            return Ok(Some(result));
        };
        if let Some(why) = self.records.unservable() {
            // The daemon found the node unservable and install-cni unchains this entry:
            // until then the pod starts as on a node without redirector, and its mesh's
            // own check (istio-validation, Linkerd's network validator) stops it.
            eprintln!("redirector-cni: pod left uncaptured: {why}");
            return Ok(Some(result));
        }
        kernel_ready(&self.root, code::SETUP_FAILED)?;
        let pods = self.pods(code::TRY_AGAIN_LATER)?;
        let cni = CniAttachment {
            container_id: container,
            network: conf.name.clone(),
        };
        let cgroup = self.pod_cgroup();
        let (flags, spec) = settings;
        pods.add(
            &PathBuf::from(netns),
            pod_name(),
            (flags, &spec),
            Some(cni),
            cgroup,
        )
        .map_err(|err| match err {
            // A node a newer release upgraded: the runtime retries until this node's
            // plugin is the newer release's too.
            PodError::NewerFormat(why) => CniError::new(code::TRY_AGAIN_LATER, why),
            other => CniError::new(code::SETUP_FAILED, other.to_string()),
        })?;
        Ok(Some(result))
    }

    /// The pod's cgroup, which kubelet made before asking for the sandbox: its programs
    /// go there, and no other pod runs them.
    fn pod_cgroup(&self) -> Option<PathBuf> {
        let uid = cni_arg("K8S_POD_UID")?;
        let node = self.records.node_cgroup()?;
        crate::sys::pod_cgroup::by_pod_uid(&node, &uid)
    }

    /// Best effort and repeatable: with nothing pinned (a node just rebooted, an uninstall
    /// half done) or a kernel redirector refuses, nothing of the pod can be in the kernel,
    /// and only its record goes.
    fn del(&self, conf: &NetConf) -> Result<(), CniError> {
        let container = required_env("CNI_CONTAINERID")?;
        // The namespace, while it is still there, names the record without reading the others.
        let netns_cookie = env("CNI_NETNS")
            .filter(|p| !p.is_empty())
            .and_then(|p| Netns::open(p.as_ref()).ok())
            .map(|n| n.cookie());
        let record = self
            .records
            .by_container(&container, netns_cookie)
            .map_err(|e| CniError::new(code::SETUP_FAILED, e.to_string()))?;
        // An ambient pod goes through the daemon, which tells ztunnel first.
        if let Some(record) = record.as_ref().filter(|r| ambient::is_ambient(r)) {
            if ambient::del(conf, record)? {
                return Ok(());
            }
        }
        if !self.may_hold_kernel_state() {
            if let Some(record) = record {
                self.forget(&record)?;
            }
            return Ok(());
        }
        // No record of this container: its namespace, if still there, unless a record
        // names it for another pod — a `/proc/<pid>/ns/net` path whose pid was reused, or
        // a pod set up through the API. With no record at all (the state dir was lost),
        // what is installed in the namespace goes.
        let cookie = match (&record, netns_cookie) {
            (Some(record), _) => Some(record.cookie()),
            (None, Some(cookie)) => match self.records.get(cookie) {
                Ok(Some(other)) => {
                    tracing::info!(
                        "DEL of container {container}: its namespace is pod {} now (container {}), left alone",
                        other.name.as_deref().unwrap_or("?"),
                        other.container_id.as_deref().unwrap_or("none")
                    );
                    None
                }
                Ok(None) => Some(cookie),
                Err(err) => return Err(CniError::new(code::SETUP_FAILED, err.to_string())),
            },
            (None, None) => None,
        };
        remove_pod(
            &self.root,
            &self.records,
            record,
            cookie,
            &mut OpenMaps::default(),
        )
        .map(drop)
        .map_err(|e| CniError::new(code::SETUP_FAILED, e.to_string()))
    }

    /// A pod the rules leave alone needs nothing; a captured one must be installed exactly
    /// as its flags plan it.
    fn check(&self, conf: &NetConf) -> Result<(), CniError> {
        let container = required_env("CNI_CONTAINERID")?;
        let chosen = match conf.dialect {
            Dialect::Ambient => ambient::enrolled(conf, &container)?,
            _ => pod_settings(conf, pod_namespace().as_deref())?.is_some(),
        };
        if !chosen {
            return Ok(());
        }
        kernel_ready(&self.root, code::SETUP_FAILED)?;
        let pods = self.pods(code::NOT_AVAILABLE)?;
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
        // As the pod was set up: its record's flags.
        let spec = mesh::pod_spec(&record.flags())
            .map_err(|e| CniError::new(code::SETUP_FAILED, e.to_string()))?;
        pods.check_record(&record, &spec)
            .map(drop)
            .map_err(|e| CniError::new(code::SETUP_FAILED, e.to_string()))
    }

    /// Ready when the kernel is one redirector runs on and the node's programs are pinned,
    /// or when the daemon found that this node cannot be served: it is not on its way to
    /// being served, and a failing STATUS would hold every pod of the node off it.
    fn status(&self) -> Result<(), CniError> {
        if self.records.unservable().is_some() {
            return Ok(());
        }
        kernel_ready(&self.root, code::NOT_AVAILABLE)?;
        self.pods(code::NOT_AVAILABLE).map(drop)
    }

    /// Remove the pods of containers the runtime no longer has, and pods that are gone;
    /// with nothing pinned or a refused kernel, only their records.
    /// With nothing pinned, the pod of `record` has only its record and, at its own
    /// cgroup, programs that outlive the pins (they go by their names).
    fn forget(&self, record: &PodRecord) -> Result<(), CniError> {
        if let Some(cgroup) = &record.cgroup {
            if let Err(err) = crate::engine::pod_cgroup::detach_ours(cgroup) {
                tracing::warn!("pod {}: {err}", record.name.as_deref().unwrap_or("-"));
            }
        }
        self.records
            .remove(record.cookie())
            .map_err(|e| CniError::new(code::SETUP_FAILED, e.to_string()))
    }

    fn gc(&self, conf: &NetConf) -> Result<(), CniError> {
        let failed = |e: String| CniError::new(code::SETUP_FAILED, e);
        let pods = if self.may_hold_kernel_state() {
            self.pinned()?
                .map(|object| Pods::new(self.root.clone(), object, self.records.clone()))
        } else {
            None
        };
        if let Some(valid) = &conf.valid_attachments {
            let valid: BTreeSet<&str> = valid.iter().map(|a| a.container_id.as_str()).collect();
            let records = self.records.all().map_err(|e| failed(e.to_string()))?;
            let stale = records
                .into_iter()
                .filter(|record| is_stale(record, conf.name.as_deref(), &valid));
            for record in stale {
                // An ambient pod goes through the daemon, which tells ztunnel first, as
                // at DEL; with the daemon not reachable, its capture is taken out here.
                if ambient::is_ambient(&record) && ambient::del(conf, &record)? {
                    continue;
                }
                let cookie = record.cookie();
                match &pods {
                    Some(pods) => pods
                        .remove(Some(record), Some(cookie))
                        .map(drop)
                        .map_err(|e| failed(e.to_string()))?,
                    None => self.forget(&record)?,
                }
            }
        }
        if pods.is_none() {
            return Ok(());
        }
        crate::engine::gc::collect_stale(&self.root)
            .map(drop)
            .map_err(|e| failed(e.to_string()))
    }
}

/// Whether GC of `network`, whose live containers are `valid`, removes the pod of
/// `record`: a pod of that network whose container the runtime no longer has. Pods of
/// another network, and pods set up through the API (no container), are not its own; a
/// record an earlier release wrote (no network) goes only once its namespace is gone.
fn is_stale(record: &PodRecord, network: Option<&str>, valid: &BTreeSet<&str>) -> bool {
    let Some(container) = record.container_id.as_deref() else {
        return false;
    };
    if valid.contains(container) {
        return false;
    }
    match record.network.as_deref() {
        Some(recorded) => Some(recorded) == network,
        None => !record.namespace_alive(),
    }
}

/// One of CNI_ARGS' `KEY=value` pairs.
fn cni_arg(key: &str) -> Option<String> {
    env("CNI_ARGS")?
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_owned())
}

/// The pod's namespace (`K8S_POD_NAMESPACE`), if given.
fn pod_namespace() -> Option<String> {
    cni_arg("K8S_POD_NAMESPACE")
}

/// `namespace/name` from CNI_ARGS (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`), if given.
fn pod_name() -> Option<String> {
    match (pod_namespace(), cni_arg("K8S_POD_NAME")) {
        (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
        (None, Some(name)) => Some(name),
        _ => None,
    }
}

#[cfg(test)]
mod proptests;
