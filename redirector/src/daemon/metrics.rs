//! The daemon's HTTP endpoints: `/metrics` (Prometheus text format, by prometheus-client),
//! `/healthz` and `/readyz` (200 only once the start-up reconcile is done).
//!
//! Decision counters and map fill are read from the maps at each scrape, so they are
//! exact whoever set the pods up; request latency and errors are the daemon's own.

use std::sync::{Arc, OnceLock};

use axum::{extract::State, http::StatusCode, routing::get, Router};
use prometheus_client::{
    encoding::{text::encode, EncodeLabelSet},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Registry,
};
use redirector_common::Reason;

use super::pods::Node;
use crate::{live_pod::LivePod, store::NodeMaps};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    pod: String,
    netns_cookie: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MapLabels {
    object: String,
    map: String,
}

/// What the daemon measures itself, and whether it is ready.
pub struct Metrics {
    requests: Family<OpLabels, Histogram>,
    errors: Family<OpLabels, Counter>,
    /// Pods the repair captured (`--repair capture`).
    repaired: Counter,
    /// Pods the plugin's rules capture that nothing captured, as the last repair round
    /// found them.
    uncaptured: Gauge,
    node: OnceLock<Arc<Node>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Family::new_with_constructor(|| {
                // 0.1 ms to ~0.4 s.
                Histogram::new(exponential_buckets(0.0001, 2.0, 13))
            }),
            errors: Family::default(),
            repaired: Counter::default(),
            uncaptured: Gauge::default(),
            node: OnceLock::new(),
        }
    }
}

impl Metrics {
    /// One API request: how long it took, and whether it failed.
    pub fn observe(&self, op: &str, seconds: f64, failed: bool) {
        let labels = OpLabels { op: op.to_owned() };
        self.requests.get_or_create(&labels).observe(seconds);
        if failed {
            self.errors.get_or_create(&labels).inc();
        }
    }

    /// A repair round: `captured` pods captured now, `uncaptured` left so.
    pub fn repaired(&self, captured: usize, uncaptured: usize) {
        self.repaired.inc_by(captured as u64);
        self.uncaptured.set(uncaptured as i64);
    }

    /// The start-up reconcile is done: serve `/readyz` and the node's metrics.
    pub fn ready(&self, node: Arc<Node>) {
        let _ = self.node.set(node);
    }

    fn render(&self) -> Result<String, String> {
        let mut registry = Registry::with_prefix("redirector");
        registry.register(
            "request_seconds",
            "API requests by operation (add is a pod's whole setup)",
            self.requests.clone(),
        );
        registry.register(
            "request_errors",
            "API requests that failed, by operation",
            self.errors.clone(),
        );
        registry.register(
            "pods_repaired",
            "Pods started before the plugin (or while its entry was missing) captured by the repair",
            self.repaired.clone(),
        );
        registry.register(
            "pods_uncaptured",
            "Pods the plugin's rules capture that are not captured, at the last repair round",
            self.uncaptured.clone(),
        );
        if let Some(node) = self.node.get() {
            register_node(&mut registry, node)?;
        }
        let mut text = String::new();
        encode(&mut text, &registry).map_err(|e| e.to_string())?;
        Ok(text)
    }
}

/// The node's state as it is now: pods, their decisions, map fill.
fn register_node(registry: &mut Registry, node: &Node) -> Result<(), String> {
    let records = node.records.all().map_err(|e| e.to_string())?;
    let pods = Gauge::<i64>::default();
    pods.set(records.len() as i64);
    registry.register("pods", "Pods the daemon manages", pods);
    let outside = Gauge::<i64>::default();
    outside.set(node.outside_count() as i64);
    registry.register(
        "pods_outside_node_cgroup",
        "Pods whose processes run outside the node cgroup the programs are attached at: not captured",
        outside,
    );
    let decisions = Family::<DecisionLabels, Counter>::default();
    for record in &records {
        let Ok(live) = LivePod::open(&node.root, record.cookie()) else {
            continue;
        };
        let counters = live.counters();
        for reason in Reason::ALL {
            let count = counters[reason as usize];
            if count > 0 {
                let labels = DecisionLabels {
                    pod: record.name.clone().unwrap_or_default(),
                    netns_cookie: record.netns_cookie.to_string(),
                    reason: reason.name().to_owned(),
                };
                decisions.get_or_create(&labels).inc_by(count);
            }
        }
    }
    registry.register(
        "decisions",
        "Connections decided by the kernel programs, by pod and reason",
        decisions,
    );
    let entries = Family::<MapLabels, Gauge>::default();
    let capacity = Family::<MapLabels, Gauge>::default();
    for object in node.root.objects().map_err(|e| e.to_string())? {
        for (map, used, max) in NodeMaps::fill(&object).map_err(|e| e.to_string())? {
            let labels = MapLabels {
                object: object.id().to_string(),
                map: map.to_owned(),
            };
            entries.get_or_create(&labels).set(used as i64);
            capacity.get_or_create(&labels).set(i64::from(max));
        }
    }
    registry.register("map_entries", "Entries in each map", entries);
    registry.register("map_capacity", "Capacity of each map", capacity);
    Ok(())
}

/// The HTTP routes.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(metrics)
}

async fn scrape(State(metrics): State<Arc<Metrics>>) -> (StatusCode, String) {
    match tokio::task::spawn_blocking(move || metrics.render()).await {
        Ok(Ok(text)) => (StatusCode::OK, text),
        Ok(Err(err)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")),
    }
}

async fn readyz(State(metrics): State<Arc<Metrics>>) -> (StatusCode, &'static str) {
    if metrics.node.get().is_some() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "reconciling\n")
    }
}
