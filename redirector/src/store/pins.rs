//! Every bpffs path redirector uses. Nothing else builds a pin path.
//!
//! ```text
//! <root>/                                  default /sys/fs/bpf/redirector
//!   objects/<object id>/progs/<program>    the node's programs, loaded once
//!   objects/<object id>/maps/<map>         the node's maps, shared by all pods
//!   objects/<object id>/links/<netns cookie>_<program>  a pod's links
//!   objects/<object id>/staging/<netns cookie>_<program>  a pod's links being swapped in
//!   objects/<object id>/node/<program>     daemon mode: cgroup links at the node cgroup
//!   objects/<object id>/gc-next/<netns cookie>  where the next setup's collection of pods
//!                                          that are gone starts (an empty directory)
//! ```
//! A pod's links sit side by side with every other pod's, with no directory per pod: on
//! bpffs a directory costs an inode and a dentry, about 0.85 KiB a pod. Earlier releases
//! pinned them in `objects/<object id>/pods/<netns cookie>/<program>`; such a pod is
//! still read, updated and removed where it is, and moves to `links/` when the node's
//! object is upgraded.
//! A new binary with a different eBPF object gets a new object id; pods move to it when
//! their configuration is applied again, and an object with no pods left is removed.

use std::{
    fmt, fs, io,
    path::{Path, PathBuf},
};

use redirector_common::NetnsCookie;

use super::programs::{ProgramSpec, POD_PROGRAMS};
use crate::sys::{bpf_sys, fs_error::gone_ok, kernel};

/// Unpin the link at `path` and detach it at once. The kernel detaches an unpinned link
/// only when it frees it, which it does asynchronously (later on a loaded machine);
/// detached here, the hook runs no program of it once this returns. Unpinned first, so a
/// run killed in between leaves no pin of a detached link (its fd's close frees the link).
pub fn unpin_link(path: &Path) -> io::Result<()> {
    let link = bpf_sys::obj_get(path)?;
    fs::remove_file(path)?;
    if let Err(err) = bpf_sys::link_detach(std::os::fd::AsFd::as_fd(&link)) {
        tracing::debug!(
            "detaching {}: {err}; it detaches when freed",
            path.display()
        );
    }
    Ok(())
}

const FORMAT_PREFIX: &str = "format-";
/// Names the marker of a program loaded in its variant's form.
const VARIANT_PREFIX: &str = "variant-";
pub const DEFAULT_ROOT: &str = "/sys/fs/bpf/redirector";
/// Marks a pin that is not in place yet. bpffs rejects names containing '.', so no
/// dotfiles.
pub const STAGING_PREFIX: &str = "staging-";
pub const BPFFS_MOUNT: &str = "/sys/fs/bpf";

/// A loaded object's id: the hash of its bytes, also the name of its pin directory.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId(String);

impl ObjectId {
    /// The id of an object's bytes (a changed object gets new pins); see
    /// [`redirector_common::identity::object_hash`].
    pub fn of(bytes: &[u8]) -> Self {
        Self::from_hash(redirector_common::identity::object_hash(bytes))
    }

    /// Whether `name` is an object's directory name (16 hex digits): anything else under
    /// `objects/` — staging leftovers, files put there by hand — is not an object.
    pub fn is_id(name: &str) -> bool {
        name.len() == 16 && name.bytes().all(|b| b.is_ascii_hexdigit())
    }

    pub fn from_hash(hash: u64) -> Self {
        ObjectId(format!("{hash:016x}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

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

    pub fn object(&self, id: &ObjectId) -> ObjectPins {
        let dir = self.objects_dir().join(id.as_str());
        ObjectPins {
            legacy_pods: dir.join(LEGACY_PODS).exists(),
            dir,
            id: id.clone(),
        }
    }

    /// Where an object is pinned while it is being loaded, before it is renamed into place.
    pub fn staging_object(&self, id: &ObjectId) -> ObjectPins {
        ObjectPins {
            dir: self
                .objects_dir()
                .join(format!("{STAGING_PREFIX}{id}-{}", std::process::id())),
            id: id.clone(),
            legacy_pods: false,
        }
    }

    /// Removes objects a killed run was loading (`staging-*`, never renamed into place).
    /// The caller holds the node lock, so no live run is loading one.
    pub fn clear_staging_objects(&self) -> io::Result<()> {
        remove_prefixed_in(&self.objects_dir(), STAGING_PREFIX, |p| {
            fs::remove_dir_all(p)
        })
    }

    /// Every fully loaded object under the root (staging leftovers and foreign entries
    /// excluded), by id.
    pub fn objects(&self) -> io::Result<Vec<ObjectPins>> {
        let mut objects: Vec<ObjectPins> = names_in(&self.objects_dir())?
            .into_iter()
            .filter(|name| ObjectId::is_id(name))
            .map(|name| self.object(&ObjectId(name)))
            .collect();
        objects.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(objects)
    }

    /// Whether any fully loaded object is pinned under the root.
    pub fn has_objects(&self) -> bool {
        self.objects().is_ok_and(|objects| !objects.is_empty())
    }

    /// The running kernel's check ([`kernel::check_running`]), unless this root holds a
    /// loaded object already: bpffs lasts one boot, so that object was loaded on this
    /// kernel, after the same check. Keeps the probes off a pod's setup but for the node's
    /// first.
    pub fn check_kernel_unless_loaded(&self) -> Result<(), kernel::KernelError> {
        if self.has_objects() {
            return Ok(());
        }
        kernel::check_running()
    }
}

/// The names in a directory as they are read, unsorted; a missing directory has none.
fn read_names(dir: &Path) -> io::Result<impl Iterator<Item = io::Result<String>>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => Some(entries),
        Err(err) if err.kind() == io::ErrorKind::NotFound => None,
        Err(err) => return Err(err),
    };
    Ok(entries
        .into_iter()
        .flatten()
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned())))
}

/// The names in a directory, sorted; a missing directory has none.
pub fn names_in(dir: &Path) -> io::Result<Vec<String>> {
    let mut names = read_names(dir)?.collect::<io::Result<Vec<_>>>()?;
    names.sort();
    Ok(names)
}

/// Where earlier releases pinned each pod's links, a directory per pod.
const LEGACY_PODS: &str = "pods";

/// The pins of one loaded object.
#[derive(Clone, Debug)]
pub struct ObjectPins {
    dir: PathBuf,
    id: ObjectId,
    /// Whether an earlier release pinned pods under this object (read once, so that the
    /// pods of today's layout cost no lookup of a directory of their own).
    legacy_pods: bool,
}

impl ObjectPins {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn id(&self) -> &ObjectId {
        &self.id
    }

    pub fn progs_dir(&self) -> PathBuf {
        self.dir.join("progs")
    }

    pub fn program(&self, name: &str) -> PathBuf {
        self.progs_dir().join(name)
    }

    pub fn maps_dir(&self) -> PathBuf {
        self.dir.join("maps")
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.maps_dir().join(name)
    }

    /// Whether the object has a trace ring ([`redirector_common::names::TRACE`]): objects
    /// pinned by releases before it have none, their programs logging through aya-log.
    pub fn has_trace_ring(&self) -> bool {
        self.map(redirector_common::names::TRACE).exists()
    }

    /// Where pods' links are pinned.
    pub fn links_dir(&self) -> PathBuf {
        self.dir.join("links")
    }

    /// Where an earlier release pinned each pod's links, in a directory per pod.
    fn legacy_pods_dir(&self) -> PathBuf {
        self.dir.join(LEGACY_PODS)
    }

    /// Holds one empty directory named by the netns cookie the next collection of pods that
    /// are gone starts at (bpffs holds no plain files to write it in).
    pub fn gc_cursor_dir(&self) -> PathBuf {
        self.dir.join("gc-next")
    }

    /// The format of the map entries this object's programs read: an empty directory
    /// `format-<N>`, made when it was loaded; objects of releases before the marker read
    /// format 1.
    pub fn format(&self) -> u32 {
        read_names(&self.dir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .find_map(|name| name.strip_prefix(FORMAT_PREFIX)?.parse().ok())
            .unwrap_or(1)
    }

    /// The marker of format `format` in this object.
    pub fn format_marker(&self, format: u32) -> PathBuf {
        self.dir.join(format!("{FORMAT_PREFIX}{format}"))
    }

    /// The marker of a program loaded in its variant's form (`function` is the variant's):
    /// an empty directory, made when the object was loaded.
    pub fn variant_marker(&self, function: &str) -> PathBuf {
        self.dir.join(format!("{VARIANT_PREFIX}{function}"))
    }

    /// Whether the program of `spec` was loaded in its variant's form.
    pub fn uses_variant(&self, spec: &ProgramSpec) -> bool {
        spec.variant
            .is_some_and(|v| self.variant_marker(v.function).exists())
    }

    /// Whether the program of `spec` was loaded as the variant that reads the pod's netns
    /// cookie from the cgroup it is attached at (which user space stamps after attaching).
    pub fn reads_cookie_from_cgroup(&self, spec: &ProgramSpec) -> bool {
        spec.variant.is_some_and(|v| v.reads_cgroup_cookie) && self.uses_variant(spec)
    }

    /// Whether any program does ([`Self::reads_cookie_from_cgroup`]).
    pub fn reads_cgroup_cookie(&self) -> bool {
        POD_PROGRAMS
            .iter()
            .any(|spec| self.reads_cookie_from_cgroup(spec))
    }

    /// The node-level links of daemon mode: the cgroup programs attached once at the node
    /// cgroup, one pin per hook.
    pub fn node(&self) -> PodPins {
        PodPins::in_dir(self.dir.join("node"))
    }

    /// The links at ztunnel's cgroup (Istio ambient), one pin per hook.
    pub fn ztunnel(&self) -> PodPins {
        PodPins::in_dir(self.dir.join("ztunnel"))
    }

    /// The pod of every link pinned under this object (once per link), as the directories
    /// are read: `links/<cookie>_<hook>`, then an earlier release's `pods/<cookie>/`.
    fn pod_names(&self) -> io::Result<impl Iterator<Item = io::Result<NetnsCookie>>> {
        let links = read_names(&self.links_dir())?.map(|name| Ok(cookie_of_link(&name?)));
        let legacy = read_names(&self.legacy_pods_dir())?.map(|name| Ok(name?.parse().ok()));
        Ok(links.chain(legacy).filter_map(Result::transpose))
    }

    /// The pods with a link pinned under this object.
    pub fn pods(&self) -> io::Result<Vec<NetnsCookie>> {
        let mut pods = self.pod_names()?.collect::<io::Result<Vec<_>>>()?;
        pods.sort();
        pods.dedup();
        Ok(pods)
    }

    /// Whether any pod has a link pinned under this object: [`Self::pods`], read up to the
    /// first one.
    pub fn has_pods(&self) -> io::Result<bool> {
        self.pod_names()?
            .next()
            .transpose()
            .map(|first| first.is_some())
    }

    /// A pod's links: in `links/`, or in its directory if an earlier release made one.
    pub fn pod(&self, netns_cookie: NetnsCookie) -> PodPins {
        if self.legacy_pods {
            let legacy = self.legacy_pods_dir().join(netns_cookie.to_string());
            if fs::symlink_metadata(&legacy).is_ok() {
                return PodPins::in_dir(legacy);
            }
        }
        PodPins {
            dir: self.links_dir(),
            prefix: format!("{netns_cookie}_"),
            staging: self.dir.join("staging"),
        }
    }
}

/// The pod a pin under `links/` belongs to, by its name (`<cookie>_<program>`).
fn cookie_of_link(name: &str) -> Option<NetnsCookie> {
    name.split_once('_')?.0.parse().ok()
}

/// The link pins of one pod under one object, or of the node, one per hook: named
/// `<prefix><hook>` in `dir`. A pod's have its cookie as prefix, among other pods' in
/// `links/`, and are staged in `staging/`; the node's, and those of a pod an earlier
/// release pinned, have a directory of their own, no prefix, and are staged in it as
/// `staging-<hook>`.
#[derive(Clone, Debug)]
pub struct PodPins {
    dir: PathBuf,
    prefix: String,
    staging: PathBuf,
}

impl PodPins {
    fn in_dir(dir: PathBuf) -> Self {
        PodPins {
            staging: dir.clone(),
            dir,
            prefix: String::new(),
        }
    }

    /// Whether the links share their directory with other pods' (read hook by hook, never
    /// by listing it).
    fn is_shared(&self) -> bool {
        !self.prefix.is_empty()
    }

    /// The directory the links are pinned in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the directories links are staged and pinned in.
    pub fn make_dirs(&self) -> io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        fs::create_dir_all(&self.staging)
    }

    /// The hooks a link is pinned for (staged links excluded), sorted.
    pub fn hooks(&self) -> io::Result<Vec<String>> {
        if !self.is_shared() {
            return Ok(names_in(&self.dir)?
                .into_iter()
                .filter(|name| !name.starts_with(STAGING_PREFIX))
                .collect());
        }
        let mut hooks = self
            .shared_hooks()?
            .map(|hook| hook.map(str::to_owned))
            .collect::<io::Result<Vec<_>>>()?;
        hooks.sort();
        Ok(hooks)
    }

    /// Whether any link is pinned.
    pub fn is_linked(&self) -> io::Result<bool> {
        if !self.is_shared() {
            return Ok(self.dir.exists());
        }
        self.shared_hooks()?
            .next()
            .transpose()
            .map(|first| first.is_some())
    }

    /// The hooks pinned for a pod in the shared `links/`, each looked up by its name, as
    /// they are found.
    fn shared_hooks(&self) -> io::Result<impl Iterator<Item = io::Result<&'static str>> + '_> {
        let dir = DirFd::open(&self.dir)?;
        Ok(POD_PROGRAMS.iter().filter_map(move |program| {
            let pinned = dir
                .as_ref()?
                .has(&format!("{}{}", self.prefix, program.hook));
            pinned.map(|yes| yes.then_some(program.hook)).transpose()
        }))
    }

    pub fn link(&self, program: &str) -> PathBuf {
        self.dir.join(format!("{}{program}", self.prefix))
    }

    /// Where a new link is pinned before it replaces the current one.
    pub fn staging_link(&self, program: &str) -> PathBuf {
        if self.is_shared() {
            self.staging.join(format!("{}{program}", self.prefix))
        } else {
            self.dir.join(format!("{STAGING_PREFIX}{program}"))
        }
    }

    /// Removes links a killed run staged and never swapped in (the caller holds the node
    /// lock, so no live run is staging): unpinned, they detach. For a pod in `links/`,
    /// that is every link in `staging/`, whichever pod's: all are a killed run's.
    pub fn clear_staged(&self) -> io::Result<()> {
        let prefix = if self.is_shared() { "" } else { STAGING_PREFIX };
        remove_prefixed_in(&self.staging, prefix, |p| fs::remove_file(p))
    }

    /// Removes the links' own directory once no link is left in it; a shared one stays.
    pub fn remove_dir_if_empty(&self) -> io::Result<()> {
        if self.is_shared() || !self.hooks()?.is_empty() {
            return Ok(());
        }
        gone_ok(fs::remove_dir(&self.dir))
    }
}

/// A directory opened for looking names up in it, one path component each rather than
/// the whole path from the root.
struct DirFd(std::os::fd::OwnedFd);

impl DirFd {
    /// The directory, or `None` if there is none.
    fn open(dir: &Path) -> io::Result<Option<Self>> {
        match fs::File::open(dir) {
            Ok(file) => Ok(Some(DirFd(file.into()))),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Whether `name` is in the directory.
    fn has(&self, name: &str) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        let name = std::ffi::CString::new(name).map_err(io::Error::other)?;
        let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: a directory fd we own, a NUL-terminated name, and room for the result.
        let rc = unsafe {
            libc::fstatat(
                self.0.as_raw_fd(),
                name.as_ptr(),
                stat.as_mut_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        match rc {
            0 => Ok(true),
            _ => match io::Error::last_os_error() {
                err if err.kind() == io::ErrorKind::NotFound => Ok(false),
                err => Err(err),
            },
        }
    }
}

/// Removes every entry of `dir` named `prefix…` with `remove`; a missing `dir` has none.
fn remove_prefixed_in(
    dir: &Path,
    prefix: &str,
    remove: fn(&Path) -> io::Result<()>,
) -> io::Result<()> {
    for name in names_in(dir)?.iter().filter(|n| n.starts_with(prefix)) {
        gone_ok(remove(&dir.join(name)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ObjectId;

    #[test]
    fn object_ids_tell_objects_apart_including_trailing_zeros() {
        let bytes = b"\x7fELF object bytes".to_vec();
        assert_eq!(ObjectId::of(&bytes), ObjectId::of(&bytes.clone()));
        let mut longer = bytes.clone();
        longer.push(0);
        assert_ne!(ObjectId::of(&bytes), ObjectId::of(&longer));
        let mut changed = bytes.clone();
        changed[3] ^= 1;
        assert_ne!(ObjectId::of(&bytes), ObjectId::of(&changed));
        assert_eq!(ObjectId::of(&bytes).as_str().len(), 16);
    }
}
