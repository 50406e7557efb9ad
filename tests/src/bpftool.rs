//! What the kernel says, through bpftool: tests check kernel state with it rather than
//! with redirector's own bookkeeping.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::process::{within, EVENTUALLY};

fn bpftool_json(args: &[&str]) -> Value {
    let out = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running bpftool {args:?}: {e} (apt-get install bpftool)"));
    assert!(
        out.status.success(),
        "bpftool {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    if text.trim().is_empty() {
        return Value::Array(Vec::new());
    }
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bpftool {args:?} output: {e}: {text}"))
}

fn ids(value: &Value) -> Vec<u64> {
    let items = match value {
        Value::Array(items) => items.clone(),
        other => vec![other.clone()],
    };
    items
        .iter()
        .filter_map(|v| v.get("id").and_then(Value::as_u64))
        .collect()
}

/// Programs attached to a cgroup (its own attachments, not inherited ones): (id, attach type, name).
pub fn cgroup_attachments(cgroup: &Path) -> Vec<(u64, String, String)> {
    let path = cgroup.to_string_lossy();
    let out = Command::new("bpftool")
        .args(["-j", "cgroup", "show", &path])
        .output()
        .unwrap_or_else(|e| panic!("running bpftool: {e} (apt-get install bpftool)"));
    if !out.status.success() {
        // bpftool 7 asks newer kernels' query fields, which 5.10 refuses: asked directly.
        return queried_attachments(cgroup);
    }
    let v = bpftool_json(&["cgroup", "show", &path]);
    v.as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            (
                a.get("id").and_then(Value::as_u64).unwrap_or_default(),
                a.get("attach_type")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                a.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

/// [`cgroup_attachments`] by BPF_PROG_QUERY for each cgroup hook redirector uses (attach
/// types by number).
fn queried_attachments(cgroup: &Path) -> Vec<(u64, String, String)> {
    use redirector::sys::bpf_sys;
    use std::os::fd::AsFd;
    let dir = std::fs::File::open(cgroup)
        .unwrap_or_else(|e| panic!("opening cgroup {}: {e}", cgroup.display()));
    let mut found = Vec::new();
    // sock_create, sock_ops, connect4/6, sendmsg4/6, recvmsg4/6, getsockopt, getpeername4/6.
    for attach_type in [2u32, 3, 10, 11, 14, 15, 19, 20, 21, 29, 30] {
        let (_, ids) = bpf_sys::cgroup_programs(dir.as_fd(), attach_type).unwrap_or_else(|e| {
            panic!("querying {} for type {attach_type}: {e}", cgroup.display())
        });
        for id in ids {
            let name = bpf_sys::program_by_id(id)
                .and_then(|p| bpf_sys::program_id_and_name(p.as_fd()))
                .map(|(_, name)| name)
                .unwrap_or_default();
            found.push((u64::from(id), attach_type.to_string(), name));
        }
    }
    found
}

/// The definition of the map pinned at `path`: (id, value size, capacity).
pub fn pinned_map(path: &Path) -> (u64, u64, u64) {
    let v = bpftool_json(&["map", "show", "pinned", &path.to_string_lossy()]);
    let field = |name: &str| {
        v.get(name)
            .and_then(Value::as_u64)
            .unwrap_or_else(|| panic!("bpftool map show: no {name} in {v}"))
    };
    (field("id"), field("bytes_value"), field("max_entries"))
}

/// The kernel id of the object pinned at `path` (`kind`: prog, map or link).
pub fn pinned_id(kind: &str, path: &Path) -> u64 {
    let v = bpftool_json(&[kind, "show", "pinned", &path.to_string_lossy()]);
    ids(&v)
        .first()
        .copied()
        .unwrap_or_else(|| panic!("no {kind} id for {}", path.display()))
}

/// The program pinned at `path`: how often it ran and for how long (ns), counted while
/// [`BpfStats`] is on.
pub fn program_runs(path: &Path) -> (u64, u64) {
    let v = bpftool_json(&["prog", "show", "pinned", &path.to_string_lossy()]);
    let field = |name: &str| v.get(name).and_then(Value::as_u64).unwrap_or(0);
    (field("run_cnt"), field("run_time_ns"))
}

/// `kernel.bpf_stats_enabled` on (the kernel counts each program's runs and time) until
/// dropped, then as it was.
pub struct BpfStats {
    was: String,
}

impl BpfStats {
    const SWITCH: &'static str = "/proc/sys/kernel/bpf_stats_enabled";

    pub fn on() -> Self {
        let was = std::fs::read_to_string(Self::SWITCH).unwrap_or_else(|_| "0".into());
        std::fs::write(Self::SWITCH, "1").expect("enabling bpf_stats");
        BpfStats { was }
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::SWITCH, self.was.trim());
    }
}

/// Ids of every loaded object of `kind` (prog, map or link).
pub fn loaded_ids(kind: &str) -> Vec<u64> {
    ids(&bpftool_json(&[kind, "show"]))
}

/// Wait until none of `ids` is loaded any more (the kernel frees objects asynchronously);
/// returns those still present after `timeout`.
pub fn wait_gone(kind: &str, ids: &[u64], timeout: Duration) -> Vec<u64> {
    let mut left = ids.to_vec();
    within(timeout, || {
        let loaded = loaded_ids(kind);
        left.retain(|id| loaded.contains(id));
        left.is_empty()
    });
    left
}

/// Waits until every link pinned under `root` of the pods of `cookies` is detached (their
/// namespaces and cgroups are gone); panics naming one that is not after [`EVENTUALLY`].
#[track_caller]
pub fn wait_pods_detached(root: &crate::redirector::PinRoot, cookies: &[u64]) {
    for link in crate::redirector::pins_under(root.path()) {
        let name = link.file_name().unwrap().to_string_lossy().into_owned();
        if cookies.iter().any(|c| name.starts_with(&format!("{c}_"))) {
            assert!(wait_link_detached(&link, EVENTUALLY), "{name}");
        }
    }
}

/// Wait until the cgroup or network-namespace link pinned at `path` is detached (its
/// cgroup or namespace is gone; the kernel releases both asynchronously); whether it is.
pub fn wait_link_detached(path: &Path, timeout: Duration) -> bool {
    let detached = within(timeout, || {
        let v = bpftool_json(&["link", "show", "pinned", &path.to_string_lossy()]);
        let link = v.as_array().and_then(|a| a.first()).unwrap_or(&v);
        let target = ["netns_ino", "cgroup_id"]
            .iter()
            .find_map(|field| link.get(field).and_then(|i| i.as_u64()));
        target == Some(0)
    });
    detached.is_some()
}
