//! `--scale`: 10,000 pods through the daemon's API on one connection (a daemon sized for
//! them with `--max-pods`), then removed again:
//! the time of each add and each removal (so pod 10,000's can be held against pod 10's),
//! kernel and daemon memory per pod, and `redirector_request_seconds` quantiles from the
//! daemon's own metrics.

use std::time::Instant;

use redirector_tests::cgroup::Cgroup;
use redirector_tests::daemon::{Daemon, StateDir};
use redirector_tests::redirector::{map_fill, PinRoot, STANDARD_INJECTION};
use redirector_tests::NetNs;

use crate::sequence::{Api, MemoryMarks, Sequence};
use crate::stats::median;

#[derive(Debug, Default, serde::Serialize)]
pub struct Scale {
    /// The adds, with kernel memory at the milestones.
    pub adds: Sequence,
    /// Wall time of each removal, in the order the pods were added (the first with every
    /// pod on the node, the last with one).
    pub removal_ms: Vec<f64>,
    /// The daemon's resident memory before the first pod and after the last, KiB.
    pub daemon_rss_kib: (u64, u64),
    /// Quantiles (0.5, 0.9, 0.99) of `redirector_request_seconds` by op, in ms, from its
    /// histogram's buckets, with the count.
    pub request_ms: Vec<(String, [f64; 3], u64)>,
    /// Entries of each map with every pod installed.
    pub map_fill: Vec<(String, u64)>,
    /// The object's locked memory (maps and programs), bytes, and its largest maps.
    pub object_memlock: u64,
    pub map_memlock: Vec<(String, u64)>,
}

impl Scale {
    /// Median time per add around pod `n` (the 10 pods ending there), ms.
    pub fn add_ms_at(&self, n: usize) -> f64 {
        window(&self.adds.per_pod_ms, n)
    }

    /// Median time per removal with about `n` pods on the node, ms.
    pub fn removal_ms_with(&self, n: usize) -> f64 {
        let all = self.removal_ms.len();
        window(&self.removal_ms, all + 1 - n.min(all) + 9)
    }
}

/// The median of the 10 values ending at the `n`th (1-based).
fn window(v: &[f64], n: usize) -> f64 {
    let end = n.min(v.len());
    median(&v[end.saturating_sub(10)..end])
}

pub fn run(pods: usize) -> Scale {
    let root = PinRoot::new("bscale");
    let node = Cgroup::new("bscalenode");
    let state = StateDir::on_tmpfs("bscalestate");
    let max_pods = pods.to_string();
    let daemon = Daemon::start_with(
        &root,
        &node,
        &state,
        &["--metrics-addr", "127.0.0.1:0", "--max-pods", &max_pods],
    );
    let made: Vec<NetNs> = (0..pods).map(|_| NetNs::new("bscale")).collect();
    let mut api = Api::connect(daemon.socket());
    let mut out = Scale {
        adds: Sequence {
            mode: "daemon: API, one connection",
            pods,
            ..Sequence::default()
        },
        ..Scale::default()
    };
    let rss_before = daemon.rss_kib();
    let mut marks = MemoryMarks::start(Some(state.path()));
    let start = Instant::now();
    for (i, ns) in made.iter().enumerate() {
        let req = serde_json::json!({
            "op": "add", "netns": ns.path(), "name": format!("scale/p{i}"), "args": STANDARD_INJECTION,
        });
        let t = Instant::now();
        api.ask(&req, "\"ok\":true");
        out.adds.per_pod_ms.push(t.elapsed().as_secs_f64() * 1e3);
        marks.after(i + 1, &mut out.adds);
    }
    out.adds.total_s = marks.seconds_since(start);
    out.daemon_rss_kib = (rss_before, daemon.rss_kib());
    out.map_fill = map_fill(&root);
    if let Some(id) = redirector_tests::redirector::object_ids(&root).first() {
        let object = root.path().join("objects").join(id);
        (out.object_memlock, out.map_memlock) = crate::memory::object_memlock(&object);
    }
    // Reading every map (bpftool) leaves the caches cold and the kernel freeing what it
    // read: the first removals would measure that, not the pods on the node.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let start = Instant::now();
    for i in 0..pods {
        let req = serde_json::json!({"op": "del", "name": format!("scale/p{i}")});
        let t = Instant::now();
        api.ask(&req, "\"removed\"");
        out.removal_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    out.adds.removal_s = Some(start.elapsed().as_secs_f64());
    let (_, metrics) = daemon.http_get("/metrics");
    out.request_ms = request_quantiles(&metrics);
    drop(api);
    drop((daemon, made, root, node, state));
    out
}

/// Quantiles of each op's `redirector_request_seconds` histogram, linear within a bucket.
fn request_quantiles(text: &str) -> Vec<(String, [f64; 3], u64)> {
    let mut ops: Vec<(String, Vec<(f64, u64)>)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("redirector_request_seconds_bucket{") else {
            continue;
        };
        let Some((labels, count)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels.split(',').find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == name).then(|| v.trim_matches('"').to_owned())
            })
        };
        let (Some(op), Some(le)) = (label("op"), label("le")) else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::NAN)
        };
        let count = count.trim().parse::<f64>().unwrap_or(0.0) as u64;
        match ops.iter_mut().find(|(o, _)| *o == op) {
            Some((_, buckets)) => buckets.push((le, count)),
            None => ops.push((op, vec![(le, count)])),
        }
    }
    ops.into_iter()
        .filter_map(|(op, mut buckets)| {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let total = buckets.last()?.1;
            (total > 0).then(|| {
                let q = [0.5, 0.9, 0.99].map(|q| bucket_quantile(&buckets, total, q) * 1e3);
                (op, q, total)
            })
        })
        .collect()
}

/// The `q` quantile of cumulative `(upper bound, count)` buckets.
fn bucket_quantile(buckets: &[(f64, u64)], total: u64, q: f64) -> f64 {
    let rank = q * total as f64;
    let mut below = (0.0, 0u64);
    for &(le, count) in buckets {
        if count as f64 >= rank {
            if le.is_infinite() {
                return below.0;
            }
            let inside = (count - below.1) as f64;
            let frac = if inside > 0.0 {
                (rank - below.1 as f64) / inside
            } else {
                0.0
            };
            return below.0 + (le - below.0) * frac;
        }
        below = (le, count);
    }
    below.0
}
