//! A container runtime's CRI socket that answers PodSandboxStatus and ListPodSandbox
//! alone, from sandboxes the test declares: the labels and annotations a plugin reads
//! there, and for a sandbox declared running, its pod and network namespace as the
//! daemon's repair reads them. An undeclared sandbox is not found, as containerd answers
//! for a sandbox whose network it is still setting up. Every other method is
//! unimplemented.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use k8s_cri::v1::{
    ListPodSandboxRequest, ListPodSandboxResponse, PodSandbox, PodSandboxMetadata,
    PodSandboxStatus, PodSandboxStatusRequest, PodSandboxStatusResponse,
};
use tonic::{
    body::Body,
    codegen::{http, BoxFuture, Service},
    server::{Grpc, NamedService, UnaryService},
};

use crate::daemon::StateDir;

/// A declared sandbox: its status, and for a running one the verbose status's `info`
/// (containerd's JSON, naming its network namespace).
#[derive(Clone)]
struct Declared {
    status: PodSandboxStatus,
    info: Option<String>,
}

type Sandboxes = Arc<Mutex<BTreeMap<String, Declared>>>;

fn string_map(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The runtime, served on a thread of its own until dropped.
pub struct FakeCri {
    socket: PathBuf,
    sandboxes: Sandboxes,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: StateDir,
}

impl FakeCri {
    pub fn start(hint: &str) -> FakeCri {
        let dir = StateDir::new(hint);
        let socket = dir.path().join("cri.sock");
        let sandboxes = Sandboxes::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, listening) = std::sync::mpsc::channel();
        let service = RuntimeService(Arc::clone(&sandboxes));
        let path = socket.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("an async runtime for the fake CRI");
            runtime.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&path)
                    .unwrap_or_else(|e| panic!("binding {}: {e}", path.display()));
                ready.send(()).unwrap();
                tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::UnixListenerStream::new(listener),
                        async {
                            let _ = stopped.await;
                        },
                    )
                    .await
                    .expect("serving the fake CRI");
            });
        });
        listening.recv().expect("the fake CRI listening");
        FakeCri {
            socket,
            sandboxes,
            stop: Some(stop),
            thread: Some(thread),
            _dir: dir,
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sandbox `id` is known from now on, with `labels` and `annotations`.
    pub fn sandbox(&self, id: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) {
        let status = PodSandboxStatus {
            id: id.to_owned(),
            labels: string_map(labels),
            annotations: string_map(annotations),
            ..Default::default()
        };
        let declared = Declared { status, info: None };
        self.sandboxes
            .lock()
            .unwrap()
            .insert(id.to_owned(), declared);
    }

    /// Sandbox `id` runs pod `namespace/name` from now on (its `uid`, `labels`, no
    /// annotation): listed ready, its network namespace `netns` in its verbose status.
    pub fn running(&self, id: &str, pod: &str, uid: &str, netns: &Path, labels: &[(&str, &str)]) {
        let (namespace, name) = pod.split_once('/').expect("a pod as namespace/name");
        let status = PodSandboxStatus {
            id: id.to_owned(),
            metadata: Some(PodSandboxMetadata {
                name: name.to_owned(),
                uid: uid.to_owned(),
                namespace: namespace.to_owned(),
                attempt: 0,
            }),
            state: k8s_cri::v1::PodSandboxState::SandboxReady.into(),
            labels: string_map(labels),
            ..Default::default()
        };
        let info = serde_json::json!({"runtimeSpec": {"linux": {"namespaces": [
            {"type": "network", "path": netns}
        ]}}});
        let declared = Declared {
            status,
            info: Some(info.to_string()),
        };
        self.sandboxes
            .lock()
            .unwrap()
            .insert(id.to_owned(), declared);
    }

    /// Sandbox `id` is gone from now on.
    pub fn remove(&self, id: &str) {
        self.sandboxes.lock().unwrap().remove(id);
    }
}

impl Drop for FakeCri {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The CRI's runtime service, PodSandboxStatus only.
#[derive(Clone)]
struct RuntimeService(Sandboxes);

impl NamedService for RuntimeService {
    const NAME: &'static str = "runtime.v1.RuntimeService";
}

impl Service<http::Request<Body>> for RuntimeService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let sandboxes = Arc::clone(&self.0);
        match request.uri().path() {
            "/runtime.v1.RuntimeService/PodSandboxStatus" => Box::pin(async move {
                let mut grpc = Grpc::new(tonic_prost::ProstCodec::default());
                Ok(grpc.unary(SandboxStatus(sandboxes), request).await)
            }),
            "/runtime.v1.RuntimeService/ListPodSandbox" => Box::pin(async move {
                let mut grpc = Grpc::new(tonic_prost::ProstCodec::default());
                Ok(grpc.unary(ListSandboxes(sandboxes), request).await)
            }),
            _ => Box::pin(async {
                let status = tonic::Status::unimplemented(
                    "the fake CRI answers PodSandboxStatus and ListPodSandbox only",
                );
                Ok(status.into_http())
            }),
        }
    }
}

struct SandboxStatus(Sandboxes);

impl UnaryService<PodSandboxStatusRequest> for SandboxStatus {
    type Response = PodSandboxStatusResponse;
    type Future = BoxFuture<tonic::Response<Self::Response>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<PodSandboxStatusRequest>) -> Self::Future {
        let request = request.into_inner();
        let id = request.pod_sandbox_id;
        let found = self.0.lock().unwrap().get(&id).cloned();
        Box::pin(async move {
            let declared =
                found.ok_or_else(|| tonic::Status::not_found(format!("sandbox {id} not found")))?;
            let info = match (request.verbose, declared.info) {
                (true, Some(info)) => [("info".to_owned(), info)].into(),
                _ => Default::default(),
            };
            Ok(tonic::Response::new(PodSandboxStatusResponse {
                status: Some(declared.status),
                info,
                ..Default::default()
            }))
        })
    }
}

/// ListPodSandbox: the declared sandboxes in the state the filter asks for.
struct ListSandboxes(Sandboxes);

impl UnaryService<ListPodSandboxRequest> for ListSandboxes {
    type Response = ListPodSandboxResponse;
    type Future = BoxFuture<tonic::Response<Self::Response>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<ListPodSandboxRequest>) -> Self::Future {
        let state = request
            .into_inner()
            .filter
            .and_then(|filter| filter.state)
            .map(|wanted| wanted.state);
        let items = self
            .0
            .lock()
            .unwrap()
            .values()
            .map(|declared| &declared.status)
            .filter(|status| state.is_none_or(|wanted| wanted == status.state))
            .map(|status| PodSandbox {
                id: status.id.clone(),
                metadata: status.metadata.clone(),
                state: status.state,
                labels: status.labels.clone(),
                annotations: status.annotations.clone(),
                ..Default::default()
            })
            .collect();
        Box::pin(async move { Ok(tonic::Response::new(ListPodSandboxResponse { items })) })
    }
}
