//! Host state that a container runtime may change outside its own directories, recorded
//! before a test and restored or checked after it.
//!
//! Measured with podman 4.3 here: with `--network none` and the settings of
//! [`Podman`](crate::podman::Podman) it changes none of the host's network state; the one
//! thing it still writes outside its configured directories is c/image's blob-info cache
//! (`/var/lib/containers/cache`, a fixed path for root) when it builds its pause image.

use std::path::{Path, PathBuf};

use crate::NAME_PREFIX;

const FORWARDING: [&str; 2] = [
    "/proc/sys/net/ipv4/ip_forward",
    "/proc/sys/net/ipv6/conf/all/forwarding",
];

/// The host's forwarding switches, restored on drop if anything changed them (CNI's ptp and
/// bridge plugins turn `ip_forward` on and never back off).
#[derive(Debug)]
pub struct ForwardingGuard {
    saved: Vec<(PathBuf, String)>,
}

impl ForwardingGuard {
    pub fn new() -> Self {
        let saved = FORWARDING
            .iter()
            .filter_map(|p| Some((PathBuf::from(p), std::fs::read_to_string(p).ok()?)))
            .collect();
        ForwardingGuard { saved }
    }

    /// The switches whose value differs from the one recorded: `(path, before, now)`.
    pub fn changed(&self) -> Vec<(PathBuf, String, String)> {
        self.saved
            .iter()
            .filter_map(|(path, before)| {
                let now = std::fs::read_to_string(path).unwrap_or_default();
                (now != *before).then(|| (path.clone(), before.trim().into(), now.trim().into()))
            })
            .collect()
    }
}

impl Default for ForwardingGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ForwardingGuard {
    fn drop(&mut self) {
        for (path, before, _) in self.changed() {
            if let Err(e) = std::fs::write(&path, &before) {
                eprintln!(
                    "warning: cannot restore {} to {before}: {e}",
                    path.display()
                );
            }
        }
    }
}

/// A host directory that did not exist when the guard was made and that a runtime creates
/// as a cache: removed on drop, but only while everything in it is under one of `allowed`
/// (relative paths), so a directory someone else filled meanwhile is left alone.
#[derive(Debug)]
pub struct RemoveIfCreated {
    path: PathBuf,
    existed: bool,
    allowed: Vec<PathBuf>,
}

impl RemoveIfCreated {
    pub fn new(path: impl Into<PathBuf>, allowed: &[&str]) -> Self {
        let path = path.into();
        let existed = path.exists();
        Self::adopt(path, allowed, existed)
    }

    /// A guard for a directory whose earlier state is known from elsewhere (e.g. recorded
    /// by a test process that was killed before its guard ran).
    pub fn adopt(path: impl Into<PathBuf>, allowed: &[&str], existed: bool) -> Self {
        RemoveIfCreated {
            path: path.into(),
            existed,
            allowed: allowed.iter().map(PathBuf::from).collect(),
        }
    }

    /// Whether the directory existed before.
    pub fn existed(&self) -> bool {
        self.existed
    }

    fn only_allowed_inside(&self) -> bool {
        files_under(&self.path).iter().all(|file| {
            file.strip_prefix(&self.path)
                .is_ok_and(|rel| self.allowed.iter().any(|a| rel.starts_with(a)))
        })
    }
}

impl Drop for RemoveIfCreated {
    fn drop(&mut self) {
        if self.existed || !self.path.exists() {
            return;
        }
        if !self.only_allowed_inside() {
            eprintln!(
                "warning: leaving {}: it holds more than {:?}",
                self.path.display(),
                self.allowed
            );
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            eprintln!("warning: cannot remove {}: {e}", self.path.display());
        }
    }
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// What a runtime's networking would leave on the host, in a form to compare before and
/// after a test. Names made by this kit (`rdt-…`) are left out: other tests running at the
/// same time create and delete them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNetState {
    /// /run/netns entries not made by the kit (podman names its own `netns-<uuid>`).
    pub foreign_netns: Vec<String>,
    /// Entries of /var/lib/cni (CNI's cache and host-local's IP reservations).
    pub cni_state: Vec<String>,
}

impl HostNetState {
    pub fn now() -> Self {
        let names = |dir: &str| -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect();
            names.sort();
            names
        };
        let kit_prefix = format!("{NAME_PREFIX}-");
        HostNetState {
            foreign_netns: names("/run/netns")
                .into_iter()
                .filter(|n| !n.starts_with(&kit_prefix))
                .collect(),
            cni_state: names("/var/lib/cni"),
        }
    }
}
