//! Cgroup v2: where the hierarchy is mounted and which cgroup is the pod's.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use crate::sys::fs_kind::is_cgroup2_dir;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup v2 mount found in /proc/self/mountinfo")]
    NoCgroup2,
    #[error("reading /proc/self/cgroup: {0}")]
    OwnCgroup(io::Error),
    #[error("this process runs in the root cgroup (or its cgroup cannot be found in the mounted hierarchy), which has no parent to attach to; pass --cgroup")]
    RootCgroup,
    #[error("reading /proc/{pid}/cgroup: {source}")]
    ProcessCgroup { pid: u32, source: io::Error },
    #[error(
        "process {pid} runs in the root cgroup, or its cgroup is not in the mounted hierarchy"
    )]
    ProcessNotFound { pid: u32 },
    #[error("this process's cgroup {own} is a child of the root cgroup: its parent would be the whole node; pass --cgroup")]
    ParentIsRoot { own: String },
    #[error("--cgroup {path} is not a cgroup v2 directory")]
    NotCgroup2 { path: String },
}

/// The cgroup v2 mount point, from /proc/self/mountinfo.
pub fn cgroup2_mount() -> Result<PathBuf, CgroupError> {
    let points = crate::sys::mounts::mount_points("cgroup2").map_err(|_| CgroupError::NoCgroup2)?;
    points.into_iter().next().ok_or(CgroupError::NoCgroup2)
}

/// The pod cgroup: `explicit` if given, else the parent of this process's own cgroup
/// (an init container runs in a child of its pod's cgroup).
pub fn pod_cgroup(explicit: Option<&Path>) -> Result<PathBuf, CgroupError> {
    let path = match explicit {
        Some(path) => path.to_path_buf(),
        None => {
            let mount = cgroup2_mount()?;
            let own = own_cgroup(&mount)?;
            let parent = own.parent().ok_or(CgroupError::RootCgroup)?;
            if parent == mount {
                return Err(CgroupError::ParentIsRoot {
                    own: own.display().to_string(),
                });
            }
            parent.to_path_buf()
        }
    };
    if !is_cgroup2_dir(&path) {
        return Err(CgroupError::NotCgroup2 {
            path: path.display().to_string(),
        });
    }
    Ok(path)
}

/// This process's cgroup, as a directory under `mount`.
fn own_cgroup(mount: &Path) -> Result<PathBuf, CgroupError> {
    cgroup_of(mount, std::process::id())
}

/// The cgroup of process `pid`, as a directory under the cgroup2 mount point.
pub fn cgroup_of_pid(pid: u32) -> Result<PathBuf, CgroupError> {
    cgroup_of(&cgroup2_mount()?, pid).map_err(|err| match err {
        CgroupError::OwnCgroup(source) => CgroupError::ProcessCgroup { pid, source },
        CgroupError::RootCgroup => CgroupError::ProcessNotFound { pid },
        other => other,
    })
}

fn cgroup_of(mount: &Path, pid: u32) -> Result<PathBuf, CgroupError> {
    let listed =
        fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(CgroupError::OwnCgroup)?;
    let rel = listed
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or(CgroupError::NoCgroup2)?
        .trim();
    if rel != "/" && !rel.split('/').any(|part| part == "..") {
        return Ok(mount.join(rel.trim_start_matches('/')));
    }
    // "/" is the root of our cgroup namespace, and a path with ".." one outside it: with a
    // private cgroup namespace (the default for containers on cgroup v2) and the host's
    // hierarchy mounted, the process's cgroup is the directory that lists its pid.
    // The hierarchy's root itself lists it when it runs in the root cgroup: no pod there.
    find_cgroup_of(mount, pid)
        .filter(|dir| dir != mount)
        .ok_or(CgroupError::RootCgroup)
}

/// The cgroup under `mount` whose cgroup.procs lists `pid` (breadth first; pod cgroups
/// are shallow).
fn find_cgroup_of(mount: &Path, pid: u32) -> Option<PathBuf> {
    let pid = pid.to_string();
    let mut found = None;
    walk_cgroups(mount, |dir| {
        let listed =
            fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|p| p.lines().any(|l| l == pid));
        if listed {
            found = Some(dir.to_path_buf());
        }
        !listed
    });
    found
}

/// Visits `top` and every cgroup below it, breadth first, while `visit` returns true.
pub fn walk_cgroups(top: &Path, mut visit: impl FnMut(&Path) -> bool) {
    let mut queue = std::collections::VecDeque::from([top.to_path_buf()]);
    while let Some(dir) = queue.pop_front() {
        if !visit(&dir) {
            return;
        }
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        queue.extend(
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
}
