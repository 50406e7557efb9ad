//! The cgroup parent a test's pods are created under, in every mounted hierarchy.
//!
//! With `cgroup_manager = "cgroupfs"` on a hybrid host, runc makes each pod's cgroup in the
//! cgroup2 tree *and* in every v1 hierarchy, and podman's `pod rm` leaves some of them behind
//! (measured with podman 4.3: the pod's directory stays in the unified and the `name=systemd`
//! hierarchies). Giving the pods a parent of our own (`--cgroup-parent`) keeps the host's
//! shared `libpod_parent` untouched and lets the guard remove every directory podman made.

use std::path::{Path, PathBuf};

/// `/<name>` in every cgroup hierarchy; its subtree is removed on drop (empty directories
/// only: `rmdir` never removes a cgroup that still has processes, so nothing is killed).
#[derive(Debug)]
pub struct CgroupParent {
    name: String,
}

impl CgroupParent {
    /// Nothing is created here: runc creates the directories when the first pod starts.
    pub fn new(name: &str) -> Self {
        CgroupParent {
            name: name.to_owned(),
        }
    }

    /// The value for `podman pod create --cgroup-parent`.
    pub fn podman_arg(&self) -> String {
        format!("/{}", self.name)
    }

    /// The directories this parent has (or would have) in each hierarchy.
    pub fn dirs(&self) -> Vec<PathBuf> {
        hierarchy_mounts()
            .into_iter()
            .map(|mount| mount.join(&self.name))
            .collect()
    }

    /// Directories of the parent that still exist.
    pub fn existing(&self) -> Vec<PathBuf> {
        self.dirs().into_iter().filter(|d| d.is_dir()).collect()
    }

    /// Removes every directory of the parent, children first; returns what could not be
    /// removed (with the reason). Retries briefly while exiting tasks keep a cgroup busy.
    pub fn remove(&self) -> Vec<String> {
        let mut failed = Vec::new();
        for dir in self.dirs() {
            if let Err(e) = rmdir_tree(&dir) {
                failed.push(format!("{}: {e}", dir.display()));
            }
        }
        failed
    }
}

impl Drop for CgroupParent {
    fn drop(&mut self) {
        for failure in self.remove() {
            eprintln!("warning: cannot remove cgroup {failure}");
        }
    }
}

/// Mount points of every cgroup filesystem (v1 hierarchies and cgroup2), from
/// /proc/self/mountinfo (field 5 is the mount point, the type follows the lone `-`).
pub fn hierarchy_mounts() -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            matches!(fstype, "cgroup" | "cgroup2")
                .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
        })
        .collect();
    mounts.sort();
    mounts.dedup();
    mounts
}

/// Removes `dir` and the cgroups below it, children first (empty ones only: nothing is
/// moved out or killed), retrying while exiting tasks keep one busy.
pub(crate) fn rmdir_tree(dir: &Path) -> std::io::Result<()> {
    crate::cgroup::rmdir_tree_with(dir, &|_| {})
}
