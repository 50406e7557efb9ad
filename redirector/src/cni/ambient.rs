//! The plugin on an ambient network (`"dialect": "ambient"`): a pod the ambient rules
//! choose is enrolled through the daemon, ztunnel's node agent, with the same request as
//! `redirector pod add --dialect ambient`; its ADD ends with ztunnel's ack. The rules need
//! the pod's labels, which the runtime does not pass a plugin: they are asked of the CRI.
//! Where the runtime cannot answer yet (containerd, during the sandbox's own ADD), a pod
//! chosen by its label alone is left alone here and enrolled by the daemon's next repair
//! round (`daemon::ambient_repair`).
//!
//! Failing open for pods outside the mesh, closed for meshed ones: a pod the rules leave
//! alone passes ADD whatever the daemon's or the runtime's state; a chosen pod whose
//! enrollment fails (no daemon, no ztunnel, no ack) fails its ADD, so that its start is
//! retried and it never runs unmeshed.

use std::time::Duration;

use super::{
    cni_arg,
    conf::NetConf,
    error::{code, CniError},
    pod_namespace,
};
use crate::{
    api::{
        client::{call, CallError},
        PodRef, Request, DEFAULT_SOCKET,
    },
    cri::{sandbox_meta, CONTAINERD_SOCKET},
    mesh::{self, Annotations, Dialect, PodFlags, PodMeta},
    pods::records::{CniAttachment, PodRecord},
};

/// How long the runtime is given to answer for the pod's labels.
const CRI_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the daemon is given per read and write: an add waits for ztunnel's ack (5 s,
/// twice) after the pod's set-up.
const DAEMON_TIMEOUT: Duration = Duration::from_secs(30);

/// The pod this call is for, as the runtime names it.
struct Pod {
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    annotations: Annotations,
    /// `None` when the runtime could not say.
    labels: Option<Annotations>,
}

impl Pod {
    fn meta(&self) -> PodMeta<'_> {
        PodMeta {
            namespace: self.namespace.as_deref(),
            name: self.name.as_deref(),
            uid: self.uid.as_deref(),
            annotations: &self.annotations,
            labels: self.labels.as_ref(),
        }
    }

    fn display(&self) -> String {
        format!(
            "{}/{}",
            self.namespace.as_deref().unwrap_or("?"),
            self.name.as_deref().unwrap_or("?")
        )
    }
}

/// The pod of sandbox `container`: CNI_ARGS, the runtime's annotations, and its labels
/// from the CRI (with its annotations, where the runtime passed none).
fn pod(conf: &NetConf, container: &str) -> Pod {
    let socket = conf
        .cri_socket
        .clone()
        .unwrap_or_else(|| CONTAINERD_SOCKET.into());
    let mut annotations = conf.annotations();
    let labels = match sandbox_meta(&socket, container, CRI_TIMEOUT) {
        Ok(Some(meta)) => {
            if annotations.is_empty() {
                annotations = meta.annotations;
            }
            Some(meta.labels)
        }
        Ok(None) => {
            eprintln!("redirector-cni: sandbox {container}: the runtime does not know it yet (PodSandboxStatus: not found), so its labels are unknown");
            None
        }
        Err(err) => {
            eprintln!("redirector-cni: sandbox {container}: its labels are unknown: {err:#}");
            None
        }
    };
    Pod {
        namespace: pod_namespace(),
        name: cni_arg("K8S_POD_NAME"),
        uid: cni_arg("K8S_POD_UID"),
        annotations,
        labels,
    }
}

/// The daemon's socket of the network.
fn daemon_socket(conf: &NetConf) -> std::path::PathBuf {
    conf.socket.clone().unwrap_or_else(|| DEFAULT_SOCKET.into())
}

/// The flags of the pod of sandbox `container` when the rules enroll it.
fn chosen(conf: &NetConf, pod: &Pod) -> Result<Option<PodFlags>, CniError> {
    match mesh::node_flags(Dialect::Ambient, &conf.network(), &pod.meta()) {
        Ok(Ok((flags, _spec))) => Ok(Some(flags)),
        Ok(Err(why)) => {
            if pod.labels.is_none() {
                eprintln!(
                    "redirector-cni: pod {} left out of ambient for now: {why}; labelled, it is enrolled by the daemon's next repair round",
                    pod.display()
                );
            }
            Ok(None)
        }
        // A pod the rules choose whose settings are wrong: it must not start unmeshed.
        Err(err) => Err(CniError::new(
            code::INVALID_CONFIG,
            format!("ambient pod {}: {err}", pod.display()),
        )),
    }
}

/// ADD: enroll the pod of sandbox `container` in `netns` when the rules choose it, its
/// programs at `cgroup` when the plugin found the pod's cgroup.
pub(super) fn add(
    conf: &NetConf,
    container: &str,
    netns: &str,
    cgroup: Option<std::path::PathBuf>,
) -> Result<(), CniError> {
    let pod = pod(conf, container);
    let Some(flags) = chosen(conf, &pod)? else {
        return Ok(());
    };
    let socket = daemon_socket(conf);
    let request = Request::Add {
        netns: netns.into(),
        name: Some(pod.display()),
        dialect: Dialect::Ambient,
        // The annotations are applied already.
        args: flags.args,
        annotations: Annotations::new(),
        cgroup,
        cni: Some(CniAttachment {
            container_id: container.to_owned(),
            network: conf.name.clone(),
        }),
    };
    let response = call(&socket, &request, Some(DAEMON_TIMEOUT)).map_err(|err| match err {
        CallError::Unreachable { .. } => CniError::new(
            code::TRY_AGAIN_LATER,
            format!(
                "ambient pod {}: the redirector daemon, ztunnel's node agent, is not reachable",
                pod.display()
            ),
        )
        .details(err),
        CallError::Failed(err) => CniError::new(
            code::SETUP_FAILED,
            format!(
                "ambient pod {}: asking the daemon to enroll it",
                pod.display()
            ),
        )
        .details(format!("{err:#}")),
    })?;
    if !response.ok {
        return Err(CniError::new(
            code::SETUP_FAILED,
            format!(
                "ambient pod {}: {}",
                pod.display(),
                response.error.unwrap_or_else(|| "the daemon failed".into())
            ),
        ));
    }
    Ok(())
}

/// CHECK: whether the rules enroll the pod of sandbox `container` (its labels are known by
/// now: the sandbox runs).
pub(super) fn enrolled(conf: &NetConf, container: &str) -> Result<bool, CniError> {
    Ok(chosen(conf, &pod(conf, container))?.is_some())
}

/// DEL (or GC) of an ambient pod's `record`: the daemon tells ztunnel, then takes the
/// capture out.
/// `false` when the daemon is not reachable (the caller removes the capture itself; a
/// daemon that starts again sends ztunnel a snapshot without the pod, and ztunnel drops
/// it).
pub(super) fn del(conf: &NetConf, record: &PodRecord) -> Result<bool, CniError> {
    let request = Request::Del(PodRef {
        netns: Some(record.netns.clone()),
        name: None,
    });
    match call(&daemon_socket(conf), &request, Some(DAEMON_TIMEOUT)) {
        Ok(response) if response.ok => Ok(true),
        Ok(response) => Err(CniError::new(
            code::SETUP_FAILED,
            format!(
                "ambient pod {}: {}",
                record.name.as_deref().unwrap_or("-"),
                response.error.unwrap_or_else(|| "the daemon failed".into())
            ),
        )),
        Err(CallError::Unreachable { .. }) => {
            eprintln!(
                "redirector-cni: ambient pod {}: the daemon is not reachable; its capture is taken out here and ztunnel drops the pod at the daemon's next snapshot",
                record.name.as_deref().unwrap_or("-")
            );
            Ok(false)
        }
        Err(CallError::Failed(err)) => Err(CniError::new(
            code::SETUP_FAILED,
            format!(
                "ambient pod {}: asking the daemon to remove it",
                record.name.as_deref().unwrap_or("-")
            ),
        )
        .details(format!("{err:#}"))),
    }
}

/// Whether `record` is an ambient pod's (enrolled with ztunnel).
pub(super) fn is_ambient(record: &PodRecord) -> bool {
    record.flags().dialect == Dialect::Ambient
}
