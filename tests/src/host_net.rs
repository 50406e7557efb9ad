//! The host's network state a container runtime's CNI plugins change outside the
//! runtime's own directories, recorded before a test and restored or checked after it.

use std::path::{Path, PathBuf};

use crate::NAME_PREFIX;

const FORWARDING: [&str; 2] = [
    "/proc/sys/net/ipv4/ip_forward",
    "/proc/sys/net/ipv6/conf/all/forwarding",
];

/// The host's forwarding switches, restored on drop if anything changed them (CNI's ptp and
/// bridge plugins turn them on and never back off).
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

    /// Writes back the recorded value of every switch that changed; never panics.
    pub fn restore(&self) {
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

impl Default for ForwardingGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ForwardingGuard {
    fn drop(&mut self) {
        self.restore();
    }
}

/// What a runtime's networking would leave on the host, in a form to compare before and
/// after a test. Names made by this kit (`rdt-…`) are left out: other tests running at the
/// same time create and delete them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNetState {
    /// /run/netns entries not made by the kit.
    pub foreign_netns: Vec<String>,
    /// Files and directories under /var/lib/cni (libcni's result cache, host-local's
    /// reservations in its default directory).
    pub cni_state: Vec<PathBuf>,
    /// The host namespace's interfaces (a ptp or bridge plugin's host end).
    pub links: Vec<String>,
}

impl HostNetState {
    pub fn now() -> Self {
        let kit_prefix = format!("{NAME_PREFIX}-");
        let mut cni_state = Vec::new();
        entries_under(Path::new("/var/lib/cni"), &mut cni_state);
        cni_state.sort();
        HostNetState {
            foreign_netns: names("/run/netns")
                .into_iter()
                .filter(|n| !n.starts_with(&kit_prefix))
                .collect(),
            cni_state,
            links: names("/sys/class/net"),
        }
    }
}

/// The sorted entry names of `dir` (none if it does not exist).
fn names(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

fn entries_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            entries_under(&path, out);
        }
        out.push(path);
    }
}
