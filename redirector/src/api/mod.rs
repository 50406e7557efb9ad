//! The daemon's local API, what its server (`daemon`) and its clients (`client`: `pod`,
//! `trace`, the CNI plugin's ambient enrollment) share: JSON lines over a unix socket. Each
//! request is one JSON object on one line; the daemon answers each with one JSON object on
//! one line. A connection may carry any number of requests.
//!
//! ```text
//! {"op":"add","netns":"/run/netns/p1","name":"default/app","args":["-p","15001",...],
//!  "annotations":{"traffic.sidecar.istio.io/excludeOutboundPorts":"3306"}}
//!  (the chained plugin adds "cni":{"container_id":"…","network":"…"})
//! {"op":"del","name":"default/app"}            (or "netns")
//! {"op":"list"}
//! {"op":"check","netns":"/run/netns/p1"}       (or "name")
//! → {"ok":true,"pods":[...]}  |  {"ok":false,"error":"..."}
//! {"op":"trace","name":"default/app"}          (or "netns"; neither: every pod)
//! → {"ok":true,...} then one decision per line, until the client closes
//! ```

use std::{collections::BTreeMap, path::PathBuf};

use serde::{Deserialize, Serialize};

use crate::{mesh::Dialect, pods::records::CniAttachment};

pub mod client;

/// Where the daemon listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/redirector/redirector.sock";

/// A pod named by its network namespace or by `namespace/name`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Capture the pod in `netns` with flags `args` in `dialect` (istio-iptables' unless
    /// it says `linkerd`), overridden by the mesh's pod `annotations` as its injector or
    /// plugin maps them.
    Add {
        netns: PathBuf,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        #[serde(default, skip_serializing_if = "Dialect::is_istio")]
        dialect: Dialect,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        annotations: BTreeMap<String, String>,
        /// The pod's own cgroup, where its programs are attached; without it, the cgroup
        /// of a process in the namespace, else the node cgroup.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cgroup: Option<PathBuf>,
        /// The CNI attachment the chained plugin asks for (an ambient pod's): the record
        /// keeps it, so that the runtime's CNI DEL and GC find the pod by its sandbox.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cni: Option<CniAttachment>,
    },
    /// Remove a pod; an unknown one is not an error (removal is idempotent).
    Del(PodRef),
    /// Every pod the daemon manages.
    List,
    /// Whether a pod's installed state is exactly its plan.
    Check(PodRef),
    /// Stream a pod's decisions (every pod's when none is named), as `redirector trace
    /// --json` prints them, until the client closes the connection.
    Trace(PodRef),
}

impl Request {
    /// The operation's name, as in the JSON and the metrics.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Add { .. } => "add",
            Request::Del(_) => "del",
            Request::List => "list",
            Request::Check(_) => "check",
            Request::Trace(_) => "trace",
        }
    }
}

/// One managed pod, as `list` and `add` report it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodInfo {
    pub name: Option<String>,
    pub netns: PathBuf,
    pub netns_cookie: u64,
    pub args: Vec<String>,
    /// `-p … -z … flags …`, from the pod's live configuration; `None` if it has none.
    pub config: Option<String>,
    /// Non-zero decision counters, by reason name.
    #[serde(default)]
    pub counters: Vec<(String, u64)>,
    /// The pod's cgroup, when its processes run outside the node cgroup the programs are
    /// attached at: then none of them runs on its sockets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outside_node_cgroup: Option<PathBuf>,
    /// The pod's own cgroup, where its programs are attached; `None`: they are the ones
    /// attached at the node cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<PodInfo>,
}

impl Response {
    pub fn failed(error: impl ToString) -> Self {
        Response {
            ok: false,
            error: Some(error.to_string()),
            ..Response::default()
        }
    }

    pub fn done(message: impl Into<String>, pods: Vec<PodInfo>) -> Self {
        Response {
            ok: true,
            message: Some(message.into()),
            pods,
            ..Response::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_tagged_json_objects() {
        let add: Request =
            serde_json::from_str(r#"{"op":"add","netns":"/run/netns/p","args":["-p","15001"]}"#)
                .unwrap();
        assert_eq!(
            add,
            Request::Add {
                netns: "/run/netns/p".into(),
                name: None,
                dialect: Dialect::Istio,
                args: vec!["-p".into(), "15001".into()],
                annotations: BTreeMap::new(),
                cgroup: None,
                cni: None,
            }
        );
        let del: Request = serde_json::from_str(r#"{"op":"del","name":"default/app"}"#).unwrap();
        assert_eq!(
            del,
            Request::Del(PodRef {
                netns: None,
                name: Some("default/app".into()),
            })
        );
        assert_eq!(
            serde_json::to_string(&Request::List).unwrap(),
            r#"{"op":"list"}"#
        );
        assert!(serde_json::from_str::<Request>(r#"{"op":"explode"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"add"}"#).is_err());
    }
}
