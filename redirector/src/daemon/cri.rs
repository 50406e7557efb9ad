//! The node's pod sandboxes, read from the container runtime's CRI socket as kubelet
//! reads them: which are ready, their namespace, name and annotations, and their network
//! namespace.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use k8s_cri::v1::{
    runtime_service_client::RuntimeServiceClient, ListPodSandboxRequest, PodSandboxFilter,
    PodSandboxState, PodSandboxStateValue, PodSandboxStatusRequest,
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
    pub annotations: BTreeMap<String, String>,
    /// Its network namespace, from the runtime's verbose status.
    pub netns: PathBuf,
}

/// A connection to a runtime's CRI socket.
pub struct Runtime(RuntimeServiceClient<Channel>);

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
                annotations: item.annotations.into_iter().collect(),
                netns,
            });
        }
        Ok(sandboxes)
    }
}

/// The network namespace in a sandbox's verbose info (containerd's JSON): the path in its
/// runtime spec, else its pause process's. `None` for a sandbox in the host's network.
fn netns_of(info: &str) -> Option<PathBuf> {
    let info: serde_json::Value = serde_json::from_str(info).ok()?;
    let namespaces = info["runtimeSpec"]["linux"]["namespaces"].as_array()?;
    let network = namespaces.iter().find(|ns| ns["type"] == "network")?;
    match network["path"].as_str() {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        // A new namespace made with the pause process: its pid's.
        _ => info["pid"]
            .as_u64()
            .filter(|pid| *pid > 0)
            .map(|pid| PathBuf::from(format!("/proc/{pid}/ns/net"))),
    }
}

#[cfg(test)]
mod tests {
    use super::netns_of;
    use std::path::PathBuf;

    #[test]
    fn the_network_namespace_comes_from_the_runtime_spec_or_the_pause_process() {
        let spec = r#"{"pid": 42, "runtimeSpec": {"linux": {"namespaces": [
            {"type": "pid"}, {"type": "network", "path": "/var/run/netns/cni-1"}]}}}"#;
        assert_eq!(netns_of(spec), Some(PathBuf::from("/var/run/netns/cni-1")));
        let pause =
            r#"{"pid": 42, "runtimeSpec": {"linux": {"namespaces": [{"type": "network"}]}}}"#;
        assert_eq!(netns_of(pause), Some(PathBuf::from("/proc/42/ns/net")));
        // A host-network sandbox has no network namespace of its own.
        let host = r#"{"pid": 42, "runtimeSpec": {"linux": {"namespaces": [{"type": "pid"}]}}}"#;
        assert_eq!(netns_of(host), None);
        assert_eq!(netns_of("not json"), None);
    }
}
