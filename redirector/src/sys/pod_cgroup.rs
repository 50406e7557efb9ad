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

/// The pod's cgroup from its UID (`K8S_POD_UID`), as kubelet names it below the node
/// cgroup `node` (kubepods, kubepods.slice) before it asks for the pod's sandbox:
/// `pod<uid>` with the cgroupfs driver, `kubepods[-<qos>]-pod<uid with underscores>.slice`
/// with systemd's, directly below `node` (Guaranteed pods) or below its QoS class's cgroup
/// (Burstable, BestEffort). `None` for a UID that is not one, or no such cgroup.
pub fn by_pod_uid(node: &Path, uid: &str) -> Option<PathBuf> {
    let is_uid = !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    if !is_uid {
        return None;
    }
    let systemd = uid.replace('-', "_");
    let mut candidates = vec![
        node.join(format!("pod{uid}")),
        node.join(format!("kubepods-pod{systemd}.slice")),
    ];
    for qos in ["burstable", "besteffort"] {
        candidates.push(node.join(qos).join(format!("pod{uid}")));
        candidates.push(
            node.join(format!("kubepods-{qos}.slice"))
                .join(format!("kubepods-{qos}-pod{systemd}.slice")),
        );
    }
    candidates.into_iter().find(|c| c.is_dir())
}

/// Whether a cgroup's directory name is a pod's as kubelet names them (`pod<uid>`,
/// `…-pod<uid>.slice`), rather than a container's inside it.
fn is_pod_cgroup_name(dir: &Path) -> bool {
    let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let uid = match name.strip_suffix(".slice") {
        Some(slice) => slice.rsplit_once("-pod").map(|(_, uid)| uid),
        None => name.strip_prefix("pod"),
    };
    uid.is_some_and(|u| {
        u.len() >= 32
            && u.bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b'_')
    })
}

/// The cgroup of the pod in `netns`, from a process in it below the node cgroup with inode
/// `node`: the nearest cgroup named as kubelet names a pod's, the process's own or an
/// ancestor. Only such a name says where the pod's cgroup is: a process's own cgroup is
/// often its container's (the sandbox's pause), whose siblings — the pod's other
/// containers — programs attached there would miss.
pub fn of_netns(netns: &Path, node: u64) -> Option<PathBuf> {
    let id = ns_id(netns)?;
    let cgroup = cgroups_of(&HashSet::from([id])).remove(&id)?;
    let node_dev = fs::metadata(&cgroup).ok()?.dev();
    let is_node =
        |dir: &Path| fs::metadata(dir).is_ok_and(|m| m.dev() == node_dev && m.ino() == node);
    if is_node(&cgroup) || !is_below(&cgroup, node) {
        return None;
    }
    cgroup
        .ancestors()
        .take_while(|dir| !is_node(dir))
        .find(|dir| is_pod_cgroup_name(dir))
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_cgroup_is_found_by_its_uid_in_either_drivers_layout() {
        let uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        let underscored = uid.replace('-', "_");
        for layout in [
            format!("pod{uid}"),
            format!("burstable/pod{uid}"),
            format!("besteffort/pod{uid}"),
            format!("kubepods-pod{underscored}.slice"),
            format!("kubepods-burstable.slice/kubepods-burstable-pod{underscored}.slice"),
            format!("kubepods-besteffort.slice/kubepods-besteffort-pod{underscored}.slice"),
        ] {
            let node = tempfile::tempdir().unwrap();
            let pod = node.path().join(&layout);
            fs::create_dir_all(&pod).unwrap();
            assert_eq!(by_pod_uid(node.path(), uid), Some(pod), "{layout}");
            assert!(is_pod_cgroup_name(&node.path().join(&layout)), "{layout}");
            assert_eq!(by_pod_uid(node.path(), "0f1e2d3c-0000"), None);
        }
        let node = tempfile::tempdir().unwrap();
        fs::create_dir_all(node.path().join("pod..")).unwrap();
        assert_eq!(by_pod_uid(node.path(), ".."), None, "not a UID");
        assert_eq!(by_pod_uid(node.path(), "../x"), None, "not a UID");
        assert!(!is_pod_cgroup_name(Path::new("/kubepods/burstable")));
        assert!(!is_pod_cgroup_name(Path::new(
            "/x/cri-containerd-0f1e2d3c.scope"
        )));
    }

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
