//! Kernel memory: what the loaded object locks (maps and programs), and the kernel's own
//! accounting (/proc/meminfo) across many pods.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Slab + Percpu + VmallocUsed from /proc/meminfo, in bytes: where map entries, links,
/// pins and per-CPU counters live.
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

/// [`kernel_bytes`] held by what is alive: the kernel's reclaimable caches (unused dentries
/// and inodes, which come and go by hundreds of megabytes on a busy machine) dropped
/// first, then read once it has stopped moving (no change of 64 KiB or more for 2 s, 20 s
/// at most), for what is freed in the background. A pod's pins and records stay: bpffs
/// and tmpfs hold their dentries. With `tmpfs`, the pages its files take are added: the
/// daemon's records, which a node keeps in memory (the machine-wide Shmem moves with every
/// other process's shared memory).
pub fn retained_kernel_bytes(tmpfs: Option<&Path>) -> u64 {
    const STILL: u64 = 64 * 1024;
    let deadline = Instant::now() + Duration::from_secs(20);
    // "2": reclaimable slab objects (dentries and inodes), not the page cache.
    std::fs::write("/proc/sys/vm/drop_caches", "2").expect("dropping the kernel's caches");
    let (mut since, mut at) = (Instant::now(), kernel_bytes());
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let now = kernel_bytes();
        if now.abs_diff(at) >= STILL {
            (since, at) = (Instant::now(), now);
        } else if since.elapsed() >= Duration::from_secs(2) || Instant::now() > deadline {
            return now + tmpfs.map_or(0, used_bytes);
        }
    }
}

/// The bytes the files of the filesystem at `mount` take (its blocks in use).
fn used_bytes(mount: &Path) -> u64 {
    let path = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes()).expect("a path");
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and room for the result.
    let rc = unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) };
    assert_eq!(rc, 0, "statvfs {}", mount.display());
    // SAFETY: statvfs succeeded, so it filled `stat`.
    let stat = unsafe { stat.assume_init() };
    (stat.f_blocks - stat.f_bfree) * stat.f_frsize
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
