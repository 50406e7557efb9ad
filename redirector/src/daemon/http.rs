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
use tokio::net::TcpListener;
use tracing::info;

use super::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
#[error("binding {flag} {addr}: {source}")]
pub struct BindError {
    flag: &'static str,
    addr: SocketAddr,
    source: std::io::Error,
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

/// Bind `addr` now (a bad one fails the start, naming the flag) and serve on it from then
/// on.
pub async fn start(
    server: Server,
    addr: SocketAddr,
    metrics: Arc<Metrics>,
) -> Result<(), BindError> {
    let flag = server.flag();
    let bind_error = |source| BindError { flag, addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    match server {
        Server::Metrics => info!("metrics on http://{bound}/metrics"),
        Server::Health => info!("health on http://{bound}/healthz"),
    }
    let app = server.router(metrics);
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!("the {flag} server stopped: {err}");
        }
    });
    Ok(())
}

/// Prometheus' text exposition format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

async fn scrape(State(metrics): State<Arc<Metrics>>) -> Response {
    match metrics.scrape().await {
        Ok(body) => ([(header::CONTENT_TYPE, TEXT_FORMAT)], body).into_response(),
        Err(why) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{why}\n")).into_response(),
    }
}

async fn readyz(State(metrics): State<Arc<Metrics>>) -> (StatusCode, &'static str) {
    if metrics.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "reconciling\n")
    }
}
