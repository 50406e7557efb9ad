//! Child cgroups of the cgroup v2 root that remove themselves.
//!
//! redirector's programs attach to a cgroup v2 directory; this machine has a hybrid layout
//! where cgroup2 is not at /sys/fs/cgroup, so the mount is looked up, never hard-coded.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use redirector::sys::cgroup::cgroup2_mount;
use redirector::sys::mounts::mount_points;

use crate::process::EVENTUALLY;
use crate::unique_name;

/// The cgroup2 mount point (the first `cgroup2` mount).
pub fn cgroup2_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| cgroup2_mount().expect("the cgroup2 mount"))
}

/// The mount points of cgroup v1 hierarchies (a hybrid layout's `name=systemd` one): runc
/// makes a container's cgroup in each of them as well as in cgroup2.
fn cgroup_v1_roots() -> Vec<PathBuf> {
    mount_points("cgroup").unwrap_or_default()
}

/// `<cgroup2>/rdt-<pid>-<n>-<hint>`, removed on drop.
///
/// Drop does not kill anything (callers own their processes and end them through
/// [`ChildGuard`](crate::ChildGuard)); it moves whatever is still inside to the root, then
/// removes the directory (and any child cgroups made under it), retrying while the kernel
/// still reports it busy from exiting tasks.
#[derive(Debug)]
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    pub fn new(hint: &str) -> Self {
        let path = cgroup2_root().join(unique_name(hint));
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", path.display()));
        Cgroup { path }
    }

    /// A cgroup below `parent` (a pod under a node cgroup), removed on drop.
    pub fn under(parent: &Cgroup, hint: &str) -> Self {
        let path = parent.path.join(unique_name(hint));
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", path.display()));
        Cgroup { path }
    }

    /// A pod's cgroup below the node cgroup `parent`, named as kubelet names one with the
    /// cgroupfs driver (`pod<uid>`, a UID unique to this process and call), removed on drop.
    pub fn pod_under(parent: &Cgroup) -> Self {
        let n = crate::next_id();
        let uid = format!("{:08x}-0000-4000-8000-{n:012x}", std::process::id());
        Self::named_under(parent, &format!("pod{uid}"))
    }

    /// The cgroup `name` below `parent`, named exactly so (as kubelet names a pod's,
    /// `pod<uid>`), removed on drop.
    pub fn named_under(parent: &Cgroup, name: &str) -> Self {
        let path = parent.path.join(name);
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", path.display()));
        Cgroup { path }
    }

    /// The cgroup `name` at the cgroup2 root, named exactly so (as kubelet names the
    /// kubepods cgroup); one an interrupted run left is removed first.
    pub fn named_at_root(name: &str) -> Self {
        let path = cgroup2_root().join(name);
        let _ = remove_tree(&path);
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", path.display()));
        Cgroup { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path as seen in /proc/<pid>/cgroup (`0::/<this>`), relative to the cgroup2 root.
    pub fn relative_path(&self) -> String {
        let rel = self
            .path
            .strip_prefix(cgroup2_root())
            .expect("cgroup under the root");
        format!("/{}", rel.display())
    }

    /// Pids currently in this cgroup (not its children).
    pub fn pids(&self) -> Vec<u32> {
        read_pids(&self.path)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Never panic here: this may run while a test is already unwinding.
        if let Err(e) = remove_tree(&self.path) {
            eprintln!("warning: cannot remove cgroup {}: {e}", self.path.display());
        }
        // What a container runtime made under this cgroup's name in the v1 hierarchies.
        let relative = self.relative_path();
        for root in cgroup_v1_roots() {
            let dir = root.join(relative.trim_start_matches('/'));
            if let Err(e) = rmdir_tree_with(&dir, &|_| {}) {
                eprintln!("warning: cannot remove cgroup {}: {e}", dir.display());
            }
        }
    }
}

fn read_pids(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Depth first: children before parents; each directory is emptied into the root first.
pub(crate) fn remove_tree(dir: &Path) -> std::io::Result<()> {
    let root_procs = cgroup2_root().join("cgroup.procs");
    rmdir_tree_with(dir, &|dir| {
        for pid in read_pids(dir) {
            // Fails harmlessly when the process has exited meanwhile.
            let _ = std::fs::write(&root_procs, pid.to_string());
        }
    })
}

/// Removes the cgroup directory `dir` and every cgroup below it, children first; a missing
/// one is no error. `before_rmdir` runs before each attempt on a directory, which is retried
/// for up to [`EVENTUALLY`] while the kernel reports it busy (EBUSY: killed tasks still
/// leaving it, which a starved emulated guest can take seconds to finish).
pub(crate) fn rmdir_tree_with(dir: &Path, before_rmdir: &dyn Fn(&Path)) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            rmdir_tree_with(&entry.path(), before_rmdir)?;
        }
    }
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        before_rmdir(dir);
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}
