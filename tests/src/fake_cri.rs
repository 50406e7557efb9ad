//! A container runtime's CRI socket that answers PodSandboxStatus alone, from sandboxes
//! the test declares: the labels and annotations a plugin reads there. An undeclared
//! sandbox is not found, as containerd answers for a sandbox whose network it is still
//! setting up. Every other method is unimplemented.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use k8s_cri::v1::{PodSandboxStatus, PodSandboxStatusRequest, PodSandboxStatusResponse};
use tonic::{
    body::Body,
    codegen::{http, BoxFuture, Service},
    server::{Grpc, NamedService, UnaryService},
};

use crate::daemon::StateDir;

type Sandboxes = Arc<Mutex<BTreeMap<String, PodSandboxStatus>>>;

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
        let map = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let status = PodSandboxStatus {
            id: id.to_owned(),
            labels: map(labels),
            annotations: map(annotations),
            ..Default::default()
        };
        self.sandboxes.lock().unwrap().insert(id.to_owned(), status);
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
        if request.uri().path() != "/runtime.v1.RuntimeService/PodSandboxStatus" {
            return Box::pin(async {
                let status =
                    tonic::Status::unimplemented("the fake CRI answers PodSandboxStatus only");
                Ok(status.into_http())
            });
        }
        let method = SandboxStatus(Arc::clone(&self.0));
        Box::pin(async move {
            let mut grpc = Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(method, request).await)
        })
    }
}

struct SandboxStatus(Sandboxes);

impl UnaryService<PodSandboxStatusRequest> for SandboxStatus {
    type Response = PodSandboxStatusResponse;
    type Future = BoxFuture<tonic::Response<Self::Response>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<PodSandboxStatusRequest>) -> Self::Future {
        let id = request.into_inner().pod_sandbox_id;
        let found = self.0.lock().unwrap().get(&id).cloned();
        Box::pin(async move {
            let status =
                found.ok_or_else(|| tonic::Status::not_found(format!("sandbox {id} not found")))?;
            Ok(tonic::Response::new(PodSandboxStatusResponse {
                status: Some(status),
                ..Default::default()
            }))
        })
    }
}
