//! The node's pod sandboxes, read from the container runtime's CRI socket as kubelet
//! reads them: which are ready, who their pod is (namespace, name, uid), its labels and
//! annotations, and their network namespace.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use k8s_cri::v1::{
    runtime_service_client::RuntimeServiceClient, ListPodSandboxRequest, PodSandboxFilter,
    PodSandboxState, PodSandboxStateValue, PodSandboxStatusRequest, VersionRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

/// containerd's CRI socket.
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

/// A ready pod sandbox.
#[derive(Clone, Debug)]
pub struct Sandbox {
    pub id: String,
    pub namespace: String,
    pub name: String,
    /// The pod's uid (empty where the runtime has none).
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Its network namespace, from the runtime's verbose status.
    pub netns: PathBuf,
}

/// A connection to a runtime's CRI socket.
pub struct Runtime(RuntimeServiceClient<Channel>);

/// The name and version of the runtime at `socket`, asked once, from outside any async
/// runtime (`redirector check`); at most a few seconds.
pub fn runtime_version(socket: &Path) -> anyhow::Result<(String, String)> {
    ask_once(
        socket,
        std::time::Duration::from_secs(3),
        |mut runtime| async move { runtime.version().await },
    )
}

/// One question to the runtime at `socket`, from outside any async runtime, answered
/// within `timeout` or an error saying the socket does not answer.
fn ask_once<T, F, Fut>(socket: &Path, timeout: std::time::Duration, ask: F) -> anyhow::Result<T>
where
    F: FnOnce(Runtime) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let asked = async {
        tokio::time::timeout(timeout, async {
            ask(Runtime::connect(socket).await?).await
        })
        .await
        .with_context(|| format!("the CRI socket {} does not answer", socket.display()))?
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting an async runtime")?
        .block_on(asked)
}

/// A sandbox's labels and annotations, as the runtime keeps them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxMeta {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// The labels and annotations of sandbox `id`, asked once (PodSandboxStatus), from outside
/// any async runtime (the CNI plugin), within `timeout`; `None` when the runtime does not
/// know the sandbox. containerd adds a sandbox to what it answers for only once its
/// network is set up and its pause process runs, so during the sandbox's own CNI ADD it
/// answers NotFound.
pub fn sandbox_meta(
    socket: &Path,
    id: &str,
    timeout: std::time::Duration,
) -> anyhow::Result<Option<SandboxMeta>> {
    ask_once(socket, timeout, |mut runtime| async move {
        runtime.sandbox_meta(id).await
    })
}

/// A gRPC channel to the unix socket `socket` (tonic speaks TCP URIs; the URI here is
/// only a placeholder).
pub async fn channel(socket: &Path) -> anyhow::Result<Channel> {
    let path = socket.to_path_buf();
    Endpoint::try_from("http://localhost")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .with_context(|| format!("connecting to the CRI socket {}", socket.display()))
}

impl Runtime {
    pub async fn connect(socket: &Path) -> anyhow::Result<Self> {
        Ok(Runtime(RuntimeServiceClient::new(channel(socket).await?)))
    }

    /// The runtime's name and version (`containerd`, `v2.0.4`).
    pub async fn version(&mut self) -> anyhow::Result<(String, String)> {
        let version = self
            .0
            .version(VersionRequest::default())
            .await
            .context("Version")?
            .into_inner();
        Ok((version.runtime_name, version.runtime_version))
    }

    /// Sandbox `id`'s labels and annotations; `None` when the runtime does not know it.
    pub async fn sandbox_meta(&mut self, id: &str) -> anyhow::Result<Option<SandboxMeta>> {
        let status = self
            .0
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.to_owned(),
                verbose: false,
            })
            .await;
        let status = match status {
            Ok(status) => status.into_inner().status.unwrap_or_default(),
            Err(err) if err.code() == tonic::Code::NotFound => return Ok(None),
            Err(err) => return Err(err).with_context(|| format!("PodSandboxStatus {id}")),
        };
        Ok(Some(SandboxMeta {
            labels: status.labels.into_iter().collect(),
            annotations: status.annotations.into_iter().collect(),
        }))
    }

    /// Every ready sandbox whose network namespace the runtime reports (a host-network
    /// sandbox has none of its own and is left out).
    pub async fn ready_sandboxes(&mut self) -> anyhow::Result<Vec<Sandbox>> {
        let filter = PodSandboxFilter {
            state: Some(PodSandboxStateValue {
                state: PodSandboxState::SandboxReady.into(),
            }),
            ..Default::default()
        };
        let items = self
            .0
            .list_pod_sandbox(ListPodSandboxRequest {
                filter: Some(filter),
            })
            .await
            .context("ListPodSandbox")?
            .into_inner()
            .items;
        let mut sandboxes = Vec::with_capacity(items.len());
        for item in items {
            let status = self
                .0
                .pod_sandbox_status(PodSandboxStatusRequest {
                    pod_sandbox_id: item.id.clone(),
                    verbose: true,
                })
                .await
                .with_context(|| format!("PodSandboxStatus {}", item.id))?
                .into_inner();
            let Some(netns) = status.info.get("info").and_then(|info| netns_of(info)) else {
                continue;
            };
            let metadata = item.metadata.unwrap_or_default();
            sandboxes.push(Sandbox {
                id: item.id,
                namespace: metadata.namespace,
                name: metadata.name,
                uid: metadata.uid,
                labels: item.labels.into_iter().collect(),
                annotations: item.annotations.into_iter().collect(),
                netns,
            });
        }
        Ok(sandboxes)
    }
}

/// The network namespace in a sandbox's verbose info (containerd's JSON): the path in its
/// runtime spec when this process sees it, else its pause process's (the runtime may keep
/// its namespaces in a directory not mounted here; with hostPID the pid is the host's).
/// `None` for a sandbox in the host's network.
fn netns_of(info: &str) -> Option<PathBuf> {
    netns_candidates(info)
        .into_iter()
        .find(|path| path.exists())
}

/// The namespace paths [`netns_of`] chooses from, in order of preference.
fn netns_candidates(info: &str) -> Vec<PathBuf> {
    let Ok(info) = serde_json::from_str::<serde_json::Value>(info) else {
        return Vec::new();
    };
    let Some(namespaces) = info["runtimeSpec"]["linux"]["namespaces"].as_array() else {
        return Vec::new();
    };
    let Some(network) = namespaces.iter().find(|ns| ns["type"] == "network") else {
        return Vec::new();
    };
    let spec = network["path"]
        .as_str()
        .filter(|path| !path.is_empty())
        .map(PathBuf::from);
    let pause = info["pid"]
        .as_u64()
        .filter(|pid| *pid > 0)
        .map(|pid| PathBuf::from(format!("/proc/{pid}/ns/net")));
    spec.into_iter().chain(pause).collect()
}

#[cfg(test)]
mod tests {
    use super::netns_candidates;
    use std::path::PathBuf;

    #[test]
    fn the_network_namespace_comes_from_the_runtime_spec_or_the_pause_process() {
        let spec = r#"{"pid": 42, "runtimeSpec": {"linux": {"namespaces": [
            {"type": "pid"}, {"type": "network", "path": "/var/run/netns/cni-1"}]}}}"#;
        assert_eq!(
            netns_candidates(spec),
            [
                PathBuf::from("/var/run/netns/cni-1"),
                PathBuf::from("/proc/42/ns/net")
            ]
        );
        let pause =
            r#"{"pid": 42, "runtimeSpec": {"linux": {"namespaces": [{"type": "network"}]}}}"#;
        assert_eq!(netns_candidates(pause), [PathBuf::from("/proc/42/ns/net")]);
        // A host-network sandbox has no network namespace of its own.
        let host = r#"{"pid": 42, "runtimeSpec": {"linux": {"namespaces": [{"type": "pid"}]}}}"#;
        assert!(netns_candidates(host).is_empty());
        assert!(netns_candidates("not json").is_empty());
    }
}
