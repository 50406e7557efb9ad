//! The daemon's HTTP servers. `--metrics-addr` serves `/metrics` (and `/healthz`,
//! `/readyz`); `--health-addr` serves `/healthz` and `/readyz` alone. They are apart so
//! that kubelet's probes, which go to the pod's address — the node's, for a host-network
//! pod — can be answered there while the metrics, which describe every pod of the node,
//! stay on loopback.

use std::{net::SocketAddr, sync::Arc};

use axum::{
    extract::State,
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use tokio::net::{TcpListener, TcpSocket};
use tracing::info;

use super::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("binding {flag} {addr}: {source}")]
    Bind {
        flag: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("starting the HTTP servers' thread: {0}")]
    Runtime(std::io::Error),
}

/// Which server, and what it serves.
#[derive(Clone, Copy, Debug)]
pub enum Server {
    /// `--metrics-addr`: `/metrics`, `/healthz`, `/readyz`.
    Metrics,
    /// `--health-addr`: `/healthz`, `/readyz`.
    Health,
}

impl Server {
    fn flag(self) -> &'static str {
        match self {
            Server::Metrics => "--metrics-addr",
            Server::Health => "--health-addr",
        }
    }

    fn router(self, metrics: Arc<Metrics>) -> Router {
        let health = Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz));
        let routes = match self {
            Server::Metrics => health.route("/metrics", get(scrape)),
            Server::Health => health,
        };
        routes.with_state(metrics)
    }
}

/// Connections waiting to be accepted: a wave of scrapes past it would wait for the
/// clients' SYN retransmit, a second. The kernel caps it at `net.core.somaxconn`.
const BACKLOG: u32 = 1024;

/// Bind each server's address now (a bad one fails the start, naming its flag), then
/// serve them from a thread and runtime of their own: a burst of scrapes takes at most
/// that thread's CPU, and never queues the API's requests behind its connections.
pub fn start(servers: &[(Server, SocketAddr)], metrics: &Arc<Metrics>) -> Result<(), HttpError> {
    if servers.is_empty() {
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(HttpError::Runtime)?;
    let mut bound = Vec::new();
    {
        // The listeners are the runtime's.
        let _runtime = runtime.enter();
        for &(server, addr) in servers {
            let flag = server.flag();
            let bind_error = |source| HttpError::Bind { flag, addr, source };
            let listener = listen(addr).map_err(bind_error)?;
            let local = listener.local_addr().map_err(bind_error)?;
            match server {
                Server::Metrics => info!("metrics on http://{local}/metrics"),
                Server::Health => info!("health on http://{local}/healthz"),
            }
            bound.push((server, listener));
        }
    }
    let metrics = Arc::clone(metrics);
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            yield_to_the_api();
            runtime.block_on(serve(bound, metrics))
        })
        .map(drop)
        .map_err(HttpError::Runtime)
}

fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // A restarted daemon binds again while its predecessor's connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// How much lower than the daemon's the HTTP thread's priority is (nice): under a burst of
/// scrapes on a busy node, pod setups get the CPU first.
const NICER: libc::c_int = 10;

/// Lower the calling thread's priority by [`NICER`] (a thread's nice value is its own on
/// Linux); a failure is only logged.
fn yield_to_the_api() {
    // SAFETY: gettid, getpriority and setpriority on the calling thread; no memory is
    // passed. (getpriority's -1 for an error is a valid value too: a nice of 9 then.)
    let set = unsafe {
        let tid = libc::gettid() as libc::id_t;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid);
        libc::setpriority(libc::PRIO_PROCESS, tid, now + NICER)
    };
    if set != 0 {
        tracing::warn!(
            "lowering the HTTP thread's priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Serve every listener until the process ends.
async fn serve(listeners: Vec<(Server, TcpListener)>, metrics: Arc<Metrics>) {
    let mut servers = tokio::task::JoinSet::new();
    for (server, listener) in listeners {
        let app = server.router(Arc::clone(&metrics));
        servers.spawn(async move {
            if let Err(err) = axum::serve(listener, app).await {
                tracing::error!("the {} server stopped: {err}", server.flag());
            }
        });
    }
    while servers.join_next().await.is_some() {}
}

/// What prometheus-client writes: OpenMetrics 1.0 text (counters as `<name>_total` samples
/// of a `<name>` family, `# EOF` last). Served as such rather than rewritten into the older
/// Prometheus text format: Prometheus and the agents that scrape it parse OpenMetrics, and
/// read as the older format its counters would become untyped families.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

async fn scrape(State(metrics): State<Arc<Metrics>>) -> Response {
    match metrics.scrape().await {
        Ok(body) => ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Err(why) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{why}\n")).into_response(),
    }
}

async fn readyz(State(metrics): State<Arc<Metrics>>) -> (StatusCode, String) {
    if let Some(unservable) = metrics.unservable() {
        (StatusCode::SERVICE_UNAVAILABLE, format!("{unservable}\n"))
    } else if metrics.is_ready() {
        (StatusCode::OK, "ready\n".to_owned())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "reconciling\n".to_owned())
    }
}
