//! Pods in a user namespace of their own (Kubernetes `hostUsers: false`).
//!
//! The programs compare the caller's ids as `bpf_get_current_uid_gid()` gives them: ids of
//! the initial user namespace. A proxy running as 1337 inside a pod whose user namespace
//! maps 0–65535 to 100000–165535 is 101337 there, so the configured ids are translated
//! through the pod's `uid_map`/`gid_map` when the pod is set up — as iptables' owner match
//! maps ids through the namespace's user namespace. The pod's user namespace is the one
//! that owns its network namespace; its maps are read from a process in it.

use std::{
    fs, io,
    os::{
        fd::{AsRawFd, BorrowedFd},
        unix::fs::MetadataExt,
    },
    path::Path,
    sync::OnceLock,
};

use crate::sys::pod_cgroup::ns_id;

/// The ids of a user namespace as `/proc/<pid>/uid_map` (or `gid_map`) lists them to a
/// reader outside it: (first id inside, first id outside, count).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdMap(Vec<(u32, u32, u32)>);

/// What no process in the namespace can run as: an id the map does not cover becomes this
/// (`(uid_t)-1`, never a valid id), so a rule naming it matches nothing, as in iptables.
pub const UNMAPPED: u32 = u32::MAX;

impl IdMap {
    pub fn parse(text: &str) -> Result<Self, String> {
        let ranges = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                let fields: Vec<u32> = line
                    .split_whitespace()
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .map_err(|_| format!("not an id map line: {line:?}"))?;
                match fields[..] {
                    [inside, outside, count] => Ok((inside, outside, count)),
                    _ => Err(format!("not an id map line: {line:?}")),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(IdMap(ranges))
    }

    /// The id outside the namespace that `id` inside it is, or [`UNMAPPED`].
    pub fn to_outside(&self, id: u32) -> u32 {
        self.0
            .iter()
            .find(|(inside, _, count)| id >= *inside && id - inside < *count)
            .map_or(UNMAPPED, |(inside, outside, _)| outside + (id - inside))
    }
}

/// The uid and gid maps of a pod's user namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodIds {
    pub uids: IdMap,
    pub gids: IdMap,
}

#[derive(Debug, thiserror::Error)]
pub enum UserNsError {
    #[error("finding the user namespace that owns the pod's network namespace: {0}")]
    Owner(io::Error),
    #[error("the pod's network namespace belongs to user namespace {0} (hostUsers: false), and no process runs in it to read its uid and gid maps from")]
    NoProcess(u64),
    #[error("reading {path}: {reason}")]
    Map { path: String, reason: String },
}

/// The id maps of the user namespace owning the network namespace open as `netns`, or
/// `None` when that is the caller's own user namespace (every pod but a user-namespaced
/// one). The maps are read from the first process found in that user namespace.
pub fn of_netns(netns: BorrowedFd<'_>) -> Result<Option<PodIds>, UserNsError> {
    // NS_GET_USERNS (the user namespace owning a namespace) from libc: the request's
    // encoding and type (`libc::Ioctl`) follow the target.
    // SAFETY: an ioctl on a descriptor we own; it returns a new descriptor or -1.
    let fd = unsafe { libc::ioctl(netns.as_raw_fd(), libc::NS_GET_USERNS) };
    if fd < 0 {
        return Err(UserNsError::Owner(io::Error::last_os_error()));
    }
    // SAFETY: the ioctl returned a descriptor that nothing else owns.
    let owner = unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let owner = owner.metadata().map_err(UserNsError::Owner)?;
    let id = (owner.dev(), owner.ino());
    if Some(id) == own_user_ns() {
        return Ok(None);
    }
    let pid = process_in(id).ok_or(UserNsError::NoProcess(id.1))?;
    let read = |name: &str| {
        let path = Path::new("/proc").join(pid.to_string()).join(name);
        let map_err = |reason: String| UserNsError::Map {
            path: path.display().to_string(),
            reason,
        };
        fs::read_to_string(&path)
            .map_err(|e| map_err(e.to_string()))
            .and_then(|text| IdMap::parse(&text).map_err(map_err))
    };
    Ok(Some(PodIds {
        uids: read("uid_map")?,
        gids: read("gid_map")?,
    }))
}

/// The caller's own user namespace (device, inode), read once.
fn own_user_ns() -> Option<(u64, u64)> {
    static OWN: OnceLock<Option<(u64, u64)>> = OnceLock::new();
    *OWN.get_or_init(|| ns_id(Path::new("/proc/self/ns/user")))
}

/// A process whose user namespace is `id` (device, inode): one pass over /proc, made only
/// for a user-namespaced pod.
fn process_in(id: (u64, u64)) -> Option<u32> {
    fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| ns_id(&Path::new("/proc").join(pid.to_string()).join("ns/user")) == Some(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_translated_through_every_range() {
        let map = IdMap::parse("         0     100000      65536\n  70000 5 10\n").unwrap();
        assert_eq!(map.to_outside(1337), 101337);
        assert_eq!(map.to_outside(0), 100000);
        assert_eq!(map.to_outside(65535), 165535);
        assert_eq!(map.to_outside(65536), UNMAPPED);
        assert_eq!(map.to_outside(70009), 14);
        assert_eq!(map.to_outside(70010), UNMAPPED);
    }

    #[test]
    fn a_malformed_map_names_its_line() {
        let err = IdMap::parse("0 100000\n").unwrap_err();
        assert!(err.contains("0 100000"), "{err}");
        assert!(IdMap::parse("0 x 1").is_err());
    }
}
