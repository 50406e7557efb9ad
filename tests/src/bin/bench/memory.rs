//! Kernel memory: what the loaded object locks (maps and programs), and the kernel's own
//! accounting (/proc/meminfo) across many pods.

use std::path::Path;
use std::process::Command;

/// Slab + Percpu + VmallocUsed from /proc/meminfo, in bytes: where map entries, links and
/// per-CPU counters live.
pub fn kernel_bytes() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").expect("reading /proc/meminfo");
    info.lines()
        .filter_map(|l| {
            let (key, rest) = l.split_once(':')?;
            matches!(key, "Slab" | "Percpu" | "VmallocUsed")
                .then(|| rest.split_whitespace().next()?.parse::<u64>().ok())
                .flatten()
        })
        .sum::<u64>()
        * 1024
}

/// The memory the object under `objects/<id>` locks: `bytes_memlock` of every pinned map
/// and program, by bpftool.
pub fn object_memlock(object_dir: &Path) -> (u64, Vec<(String, u64)>) {
    let mut maps = Vec::new();
    let mut total = 0;
    for (kind, sub) in [("map", "maps"), ("prog", "progs")] {
        for entry in std::fs::read_dir(object_dir.join(sub))
            .into_iter()
            .flatten()
            .flatten()
        {
            let out = Command::new("bpftool")
                .args([kind, "show", "pinned"])
                .arg(entry.path())
                .arg("-j")
                .output()
                .expect("running bpftool");
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let bytes = v["bytes_memlock"].as_u64().unwrap_or(0);
            total += bytes;
            if kind == "map" {
                maps.push((entry.file_name().to_string_lossy().into_owned(), bytes));
            }
        }
    }
    maps.sort_by_key(|m| std::cmp::Reverse(m.1));
    (total, maps)
}
