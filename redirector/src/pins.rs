//! Every bpffs path redirector uses. Nothing else builds a pin path.
//!
//! ```text
//! <root>/                                  default /sys/fs/bpf/redirector
//!   objects/<object id>/progs/<program>    the node's programs, loaded once
//!   objects/<object id>/maps/<map>         the node's maps, shared by all pods
//!   objects/<object id>/pods/<netns cookie>/<program>   a pod's cgroup links
//! ```
//! A new binary with a different eBPF object gets a new object id; pods move to it when
//! their configuration is applied again, and an object with no pods left is removed.

use std::path::{Path, PathBuf};

pub const DEFAULT_ROOT: &str = "/sys/fs/bpf/redirector";
/// Marks a pin that is not in place yet. bpffs rejects names containing '.', so no
/// dotfiles.
pub const STAGING_PREFIX: &str = "staging-";
pub const BPFFS_MOUNT: &str = "/sys/fs/bpf";

#[derive(Clone, Debug)]
pub struct PinRoot(PathBuf);

impl PinRoot {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        PinRoot(root.into())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn objects_dir(&self) -> PathBuf {
        self.0.join("objects")
    }

    pub fn object(&self, id: &str) -> ObjectPins {
        ObjectPins(self.objects_dir().join(id))
    }

    /// Where an object is pinned while it is being loaded, before it is renamed into place.
    pub fn staging_object(&self, id: &str) -> ObjectPins {
        ObjectPins(
            self.objects_dir()
                .join(format!("{STAGING_PREFIX}{id}-{}", std::process::id())),
        )
    }
}

/// The pins of one loaded object.
#[derive(Clone, Debug)]
pub struct ObjectPins(PathBuf);

impl ObjectPins {
    pub fn dir(&self) -> &Path {
        &self.0
    }

    pub fn id(&self) -> String {
        self.0
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    pub fn progs_dir(&self) -> PathBuf {
        self.0.join("progs")
    }

    pub fn program(&self, name: &str) -> PathBuf {
        self.progs_dir().join(name)
    }

    pub fn maps_dir(&self) -> PathBuf {
        self.0.join("maps")
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.maps_dir().join(name)
    }

    pub fn pods_dir(&self) -> PathBuf {
        self.0.join("pods")
    }

    pub fn pod(&self, netns_cookie: u64) -> PodPins {
        PodPins(self.pods_dir().join(netns_cookie.to_string()))
    }
}

/// The link pins of one pod under one object.
#[derive(Clone, Debug)]
pub struct PodPins(PathBuf);

impl PodPins {
    pub fn dir(&self) -> &Path {
        &self.0
    }

    pub fn link(&self, program: &str) -> PathBuf {
        self.0.join(program)
    }

    /// Where a new link is pinned before it replaces the current one.
    pub fn staging_link(&self, program: &str) -> PathBuf {
        self.0.join(format!("{STAGING_PREFIX}{program}"))
    }
}
