//! Leftovers of test processes that were killed before their guards ran (SIGKILL, abort).
//!
//! Only names this kit makes are considered (`rdt-<pid>-…`), and only when process `<pid>` no
//! longer exists, so the state of a test binary still running is never touched.

use std::path::Path;

use crate::cgroup::cgroup2_root;
use crate::NAME_PREFIX;

/// The pid encoded in a kit-made name, if `name` is one.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(NAME_PREFIX)?.strip_prefix('-')?;
    rest.split('-').next()?.parse().ok()
}

/// Whether `name` is kit-made and its owner is gone. A killed process stays a zombie until
/// its parent reaps it, which an init that reaps lazily may not do for seconds: that counts
/// as gone.
pub(crate) fn is_stale(name: &str) -> bool {
    owner_pid(name).is_some_and(|pid| !is_alive(pid))
}

pub(crate) fn is_alive(pid: u32) -> bool {
    // /proc/PID/stat is `pid (comm) state …`; comm may contain spaces and parentheses.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// Deletes stale kit-made network namespaces, cgroups, pin roots and state directories;
/// returns what it removed.
/// Meant for a test runner (e.g. xtask) before a run, not for tests themselves.
pub fn remove_stale_leftovers() -> Vec<String> {
    let mut removed = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        for name in entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
        {
            if is_stale(&name) {
                let ok = std::process::Command::new("ip")
                    .args(["netns", "del", &name])
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    removed.push(format!("netns {name}"));
                }
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(cgroup2_root()) {
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if is_stale(&name) && crate::cgroup::remove_tree(&entry.path()).is_ok() {
                removed.push(format!("cgroup {}", entry.path().display()));
            }
        }
    }
    removed.extend(remove_stale_dirs());
    removed
}

/// Stale kit-made pin roots (bpffs: removing the pins detaches their links) and state
/// directories (a tmpfs mounted on one is unmounted first).
fn remove_stale_dirs() -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mounted: Vec<&str> = (mounts.lines())
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    let mut removed = Vec::new();
    for parent in [Path::new("/sys/fs/bpf").to_path_buf(), std::env::temp_dir()] {
        let Ok(entries) = std::fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let path = entry.path();
            if !is_stale(&name) || !path.is_dir() {
                continue;
            }
            if mounted.iter().any(|m| Path::new(m) == path) {
                let unmounted = std::process::Command::new("umount").arg(&path).status();
                if !unmounted.is_ok_and(|s| s.success()) {
                    continue;
                }
            }
            if std::fs::remove_dir_all(&path).is_ok() {
                removed.push(format!("directory {}", path.display()));
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kit_names_with_a_dead_owner_are_stale() {
        assert_eq!(owner_pid("rdt-123-4-pod"), Some(123));
        assert_eq!(owner_pid("rdtx-123-4-pod"), None);
        assert_eq!(owner_pid("cni-1234"), None);
        assert!(!is_stale(&format!("rdt-{}-0-pod", std::process::id())));
        assert!(!is_stale("some-other-netns"));
    }
}
