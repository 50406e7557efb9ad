//! What `/metrics` shows, in Prometheus' text format (prometheus-client): the daemon's own
//! request latency, errors and repair counts, and the node as a walk finds it — pods,
//! decisions by reason, map fill.
//!
//! Decisions are node-wide totals by reason unless `--metrics-per-pod`: per pod they name
//! every pod of the node (namespace/name, netns cookie), which is for whoever operates the
//! node, and a series per pod and reason is what a scrape costs at thousands of pods.
//! Every scrape is served from one snapshot at most a second old ([`super::snapshot`]).

use std::sync::{Arc, OnceLock};

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
use redirector_common::{Reason, COUNTER_SLOTS};

use crate::node_check::Unservable;
use crate::pods::{records::PodRecord, Pods};
use crate::zds::agent::Agent;

use super::{
    decision_totals::DecisionTotals,
    snapshot::{Rendered, Snapshots},
};
use crate::{
    engine::live_pod::counters_of,
    store::{NodeMaps, ObjectPins, OpenMaps},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PodDecisionLabels {
    pod: String,
    netns_cookie: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MapLabels {
    object: String,
    map: String,
}

/// What the daemon measures itself, whether it is ready, and the snapshot scrapes share.
pub struct Metrics {
    requests: Family<OpLabels, Histogram>,
    errors: Family<OpLabels, Counter>,
    /// Pods the repair captured (`--repair capture`).
    repaired: Counter,
    /// Pods the plugin's rules capture that nothing captured, as the last repair round
    /// found them.
    uncaptured: Gauge,
    pods: OnceLock<Arc<Pods>>,
    /// Why the node cannot be served, when the daemon found it so at start.
    unservable: OnceLock<Unservable>,
    /// The ZDS agent, with `--ztunnel-socket`.
    ztunnel: OnceLock<Agent>,
    /// Decisions by pod (`--metrics-per-pod`) rather than node-wide.
    per_pod: bool,
    snapshots: Snapshots<NodeWalk>,
}

/// What one walk of the node keeps for the next: the objects' maps open, and what pods
/// gone since had counted.
#[derive(Default)]
struct NodeWalk {
    maps: OpenMaps,
    totals: DecisionTotals,
}

impl Metrics {
    pub fn new(per_pod: bool) -> Self {
        Metrics {
            requests: Family::new_with_constructor(|| {
                // 0.1 ms to ~0.4 s.
                Histogram::new(exponential_buckets(0.0001, 2.0, 13))
            }),
            errors: Family::default(),
            repaired: Counter::default(),
            uncaptured: Gauge::default(),
            pods: OnceLock::new(),
            unservable: OnceLock::new(),
            ztunnel: OnceLock::new(),
            per_pod,
            snapshots: Snapshots::new(NodeWalk::default()),
        }
    }

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
    pub fn ready(&self, pods: Arc<Pods>) {
        let _ = self.pods.set(pods);
    }

    /// Whether the start-up reconcile is done.
    pub fn is_ready(&self) -> bool {
        self.pods.get().is_some()
    }

    /// The node cannot be served: never ready, and `/metrics` says why.
    pub fn unservable_node(&self, why: Unservable) {
        let _ = self.unservable.set(why);
    }

    /// ztunnel is served: `/metrics` says whether it is connected.
    pub fn ztunnel(&self, agent: Agent) {
        let _ = self.ztunnel.set(agent);
    }

    /// Why the node cannot be served, if the daemon found it so.
    pub fn unservable(&self) -> Option<&Unservable> {
        self.unservable.get()
    }

    /// The text of `/metrics`: the latest snapshot, or a new one if it is a second old.
    pub async fn scrape(self: &Arc<Self>) -> Rendered {
        let metrics = Arc::clone(self);
        self.snapshots.get(move |walk| metrics.render(walk)).await
    }

    fn render(&self, walk: &mut NodeWalk) -> Result<String, String> {
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
        let unservable = Family::<ReasonLabels, Gauge>::default();
        if let Some(why) = self.unservable.get() {
            let labels = ReasonLabels {
                reason: why.reason.label().to_owned(),
            };
            unservable.get_or_create(&labels).set(1);
        }
        registry.register(
            "node_unservable",
            "1, by reason, when the daemon found at start that this node cannot be served: nothing is pinned or chained, and pods start without capture",
            unservable,
        );
        if let Some(agent) = self.ztunnel.get() {
            let state = Family::<StateLabels, Gauge>::default();
            let labels = StateLabels {
                state: agent.ztunnel().label().to_owned(),
            };
            state.get_or_create(&labels).set(1);
            registry.register(
                "ztunnel",
                "1 for ztunnel's state on the ZDS socket: away (not connected), syncing (the snapshot of the node's pods not yet acknowledged), synced",
                state,
            );
        }
        if let Some(pods) = self.pods.get() {
            register_pods(&mut registry, pods, self.per_pod, walk)?;
        }
        let mut text = String::new();
        encode(&mut text, &registry).map_err(|e| e.to_string())?;
        Ok(text)
    }
}

/// The node's state as it is now: pods, their decisions, map fill.
fn register_pods(
    registry: &mut Registry,
    pods: &Pods,
    per_pod: bool,
    walk: &mut NodeWalk,
) -> Result<(), String> {
    let records = pods.records.all().map_err(|e| e.to_string())?;
    let managed = Gauge::<i64>::default();
    managed.set(records.len() as i64);
    registry.register("pods", "Pods the daemon manages", managed);
    let outside = Gauge::<i64>::default();
    outside.set(pods.outside_count() as i64);
    registry.register(
        "pods_outside_node_cgroup",
        "Pods whose processes run outside the node cgroup the programs are attached at: not captured",
        outside,
    );
    let on_node = Gauge::<i64>::default();
    on_node.set(records.iter().filter(|r| r.cgroup.is_none()).count() as i64);
    registry.register(
        "pods_on_node_cgroup_programs",
        "Pods whose own cgroup is not known: they rely on the programs attached at the node cgroup, which every pod below it then runs",
        on_node,
    );
    let objects = pods.root.objects().map_err(|e| e.to_string())?;
    walk.maps.retain_loaded(&objects);
    let counted = pod_counters(&records, &objects, &mut walk.maps);
    if per_pod {
        let decisions = Family::<PodDecisionLabels, Counter>::default();
        for (record, counters) in &counted {
            for (reason, count) in by_reason(counters) {
                let labels = PodDecisionLabels {
                    pod: record.name.clone().unwrap_or_default(),
                    netns_cookie: record.netns_cookie.to_string(),
                    reason: reason.name().to_owned(),
                };
                decisions.get_or_create(&labels).inc_by(count);
            }
        }
        registry.register(
            "decisions",
            "Connections decided by the kernel programs, by pod and reason",
            decisions,
        );
    } else {
        let totals = (walk.totals).update(counted.iter().map(|(r, c)| (r.cookie(), *c)));
        let decisions = Family::<DecisionLabels, Counter>::default();
        for (reason, count) in by_reason(&totals) {
            let labels = DecisionLabels {
                reason: reason.name().to_owned(),
            };
            decisions.get_or_create(&labels).inc_by(count);
        }
        registry.register(
            "decisions",
            "Connections decided by the kernel programs on the node, by reason (by pod too with --metrics-per-pod)",
            decisions,
        );
    }
    let entries = Family::<MapLabels, Gauge>::default();
    let capacity = Family::<MapLabels, Gauge>::default();
    for object in &objects {
        for (map, used, max) in NodeMaps::fill(object).map_err(|e| e.to_string())? {
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

/// Each recorded pod that is set up, with its counters from the object holding its links.
fn pod_counters<'r>(
    records: &'r [PodRecord],
    objects: &[ObjectPins],
    maps: &mut OpenMaps,
) -> Vec<(&'r PodRecord, [u64; COUNTER_SLOTS])> {
    let mut counted = Vec::with_capacity(records.len());
    for record in records {
        let cookie = record.cookie();
        let holder = (objects.iter()).find(|o| o.pod(cookie).is_linked().unwrap_or(false));
        let Some(maps) = holder.and_then(|object| maps.get(object).ok()) else {
            continue;
        };
        counted.push((record, counters_of(maps, cookie)));
    }
    counted
}

/// The reasons with a count, and their counts.
fn by_reason(counters: &[u64; COUNTER_SLOTS]) -> impl Iterator<Item = (Reason, u64)> + '_ {
    Reason::ALL
        .into_iter()
        .map(|reason| (reason, counters[reason as usize]))
        .filter(|(_, count)| *count > 0)
}
