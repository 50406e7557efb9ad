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

fn is_stale(name: &str) -> bool {
    owner_pid(name).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// Deletes stale kit-made network namespaces and cgroups; returns what it removed.
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
