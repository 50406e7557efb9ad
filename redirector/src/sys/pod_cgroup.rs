//! Where a pod's processes run in the cgroup2 tree, and whether that is below the node
//! cgroup the daemon's programs are attached at. A daemon pod outside it has its map
//! entries and no program runs on its sockets: captured on paper, not in the kernel (a
//! kubelet whose pods live outside the daemon's `--cgroup`, a wrong `--cgroup`).

use std::{
    collections::{HashMap, HashSet},
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::sys::cgroup::cgroup2_mount;

/// A namespace as the kernel names its nsfs file: device and inode.
pub type NetnsId = (u64, u64);

/// The namespace `path` (a bind mount, `/proc/<pid>/ns/net` or `…/ns/user`) refers to.
pub fn ns_id(path: &Path) -> Option<NetnsId> {
    fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The cgroup2 directory of one process in each of the `wanted` namespaces that has one,
/// from one pass over /proc.
pub fn cgroups_of(wanted: &HashSet<NetnsId>) -> HashMap<NetnsId, PathBuf> {
    let mut found = HashMap::new();
    let (Ok(mount), Ok(procs)) = (cgroup2_mount(), fs::read_dir("/proc")) else {
        return found;
    };
    for proc in procs.filter_map(Result::ok) {
        if found.len() == wanted.len() {
            break;
        }
        let dir = proc.path();
        let Some(id) = ns_id(&dir.join("ns/net")).filter(|id| wanted.contains(id)) else {
            continue;
        };
        if found.contains_key(&id) {
            continue;
        }
        if let Some(cgroup) = process_cgroup(&mount, &dir) {
            found.insert(id, cgroup);
        }
    }
    found
}

/// The cgroup2 directory of the process at `/proc/<pid>` (`0::<path>` of its cgroup file).
fn process_cgroup(mount: &Path, proc_dir: &Path) -> Option<PathBuf> {
    let text = fs::read_to_string(proc_dir.join("cgroup")).ok()?;
    let relative = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    // Relative to this process's cgroup namespace: resolved through the mount.
    fs::canonicalize(mount.join(relative.trim_start_matches('/'))).ok()
}

/// Whether `cgroup` is the cgroup with inode `ancestor` or below it.
pub fn is_below(cgroup: &Path, ancestor: u64) -> bool {
    let Ok(dev) = fs::metadata(cgroup).map(|m| m.dev()) else {
        return false;
    };
    cgroup
        .ancestors()
        .filter_map(|dir| fs::metadata(dir).ok())
        .any(|m| m.dev() == dev && m.ino() == ancestor)
}

/// The cgroup of the pod in `netns`, when a process of the pod runs outside the node
/// cgroup with inode `node`; `None` when it is below it or no process is found.
pub fn outside(netns: &Path, node: u64) -> Option<PathBuf> {
    let id = ns_id(netns)?;
    let cgroup = cgroups_of(&HashSet::from([id])).remove(&id)?;
    (!is_below(&cgroup, node)).then_some(cgroup)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_below_itself_and_its_ancestors_only() {
        let dir = tempfile::tempdir().unwrap();
        let child = dir.path().join("a/b");
        fs::create_dir_all(&child).unwrap();
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();
        assert!(is_below(&child, ino(dir.path())));
        assert!(is_below(&child, ino(&child)));
        let other = dir.path().join("c");
        fs::create_dir(&other).unwrap();
        assert!(!is_below(&child, ino(&other)));
    }

    #[test]
    fn this_process_is_found_in_its_own_namespace() {
        let Some(id) = ns_id(Path::new("/proc/self/ns/net")) else {
            return; // no procfs
        };
        let Ok(mount) = cgroup2_mount() else {
            return; // no cgroup2 here
        };
        let found = cgroups_of(&HashSet::from([id]));
        let cgroup = found.get(&id).expect("a process of this namespace");
        assert!(cgroup.starts_with(&mount), "{}", cgroup.display());
    }
}
