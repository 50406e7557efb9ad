//! The node's eBPF object: loaded once, pinned, and reused by every later run.

use std::{borrow::Cow, fs, io, os::fd::OwnedFd};

use aya::{
    maps::MapData,
    programs::{CgroupSockAddr, CgroupSockopt, Program, SkLookup, SockOps},
    EbpfLoader,
};
use redirector_common::names;

use super::{
    pins::{ObjectId, ObjectPins, PinRoot},
    programs::{ProgramKind, ProgramSpec, POD_PROGRAMS, ZTUNNEL_FEATURES, ZTUNNEL_PROGRAMS},
    sizing::PodCapacity,
};
use crate::sys::bpf_sys;
use crate::sys::fs_error::{fs_err, FsError};

/// The object built from redirector-ebpf, embedded at build time (empty when the binary
/// was built without bpf-linker).
static EMBEDDED: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/redirector"));

/// [`EMBEDDED`]'s id, computed by the build (`object_hash`): naming the object then reads
/// none of its pages, which an apply that finds it pinned never needs.
const EMBEDDED_HASH: &str = include_str!(concat!(env!("OUT_DIR"), "/redirector.id"));

/// Env var naming an eBPF object file to use instead of the embedded one: to roll a node
/// to a rebuilt kernel side without a new binary, and to test that pods move over.
pub const OBJECT_OVERRIDE_ENV: &str = "REDIRECTOR_EBPF_OBJECT";

/// An eBPF object to load: its bytes, the pods its maps are sized for, and their id,
/// computed once.
#[derive(Debug)]
pub struct EbpfObject {
    bytes: Cow<'static, [u8]>,
    capacity: PodCapacity,
    id: ObjectId,
}

impl EbpfObject {
    pub fn new(bytes: Cow<'static, [u8]>) -> Self {
        let hash = redirector_common::identity::object_hash(&bytes);
        Self::of_hash(bytes, hash, PodCapacity::SHIPPED)
    }

    /// Bytes hashing to `bytes_hash` with the per-pod maps sized for `capacity` pods: each
    /// size is another object, with its own id ([`crate::store::sizing`]).
    fn of_hash(bytes: Cow<'static, [u8]>, bytes_hash: u64, capacity: PodCapacity) -> Self {
        EbpfObject {
            bytes,
            capacity,
            id: ObjectId::from_hash(capacity.object_hash(bytes_hash)),
        }
    }

    /// An object already pinned under a pin root, known by its id alone.
    pub fn pinned(id: ObjectId) -> Self {
        EbpfObject {
            bytes: Cow::Borrowed(&[]),
            capacity: PodCapacity::SHIPPED,
            id,
        }
    }

    pub fn capacity(&self) -> PodCapacity {
        self.capacity
    }

    /// The embedded object, or the file named by [`OBJECT_OVERRIDE_ENV`], as shipped.
    pub fn configured() -> Result<Self, ObjectError> {
        Self::configured_for(PodCapacity::SHIPPED)
    }

    /// [`Self::configured`], its per-pod maps sized for `capacity` pods.
    pub fn configured_for(capacity: PodCapacity) -> Result<Self, ObjectError> {
        match std::env::var_os(OBJECT_OVERRIDE_ENV) {
            Some(path) if !path.is_empty() => {
                let path = std::path::PathBuf::from(path);
                let bytes = fs::read(&path).map_err(fs_err("reading eBPF object", &path))?;
                let hash = redirector_common::identity::object_hash(&bytes);
                Ok(Self::of_hash(bytes.into(), hash, capacity))
            }
            _ => Ok(Self::of_hash(
                EMBEDDED.into(),
                u64::from_str_radix(EMBEDDED_HASH.trim(), 16)
                    .expect("build.rs writes the embedded object's id in hex"),
                capacity,
            )),
        }
    }

    pub fn id(&self) -> &ObjectId {
        &self.id
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error(
        "this redirector binary was built without its eBPF object (bpf-linker was missing); run `cargo xtask build`"
    )]
    NotEmbedded,
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("loading program {name}: {source}")]
    Program {
        name: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error("pinning {what} at {path}: {source}")]
    Pin {
        what: String,
        path: String,
        source: io::Error,
    },
    #[error(
        "pinned object at {path} is incomplete (missing {missing}); remove it with --cleanup-only"
    )]
    Incomplete { path: String, missing: String },
    #[error(transparent)]
    Kernel(#[from] crate::sys::kernel::KernelError),
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// Make sure the object is loaded and pinned under `root`; load and pin it if not.
/// The caller holds the node lock. A kernel too old for the object is refused before a load.
pub fn ensure_loaded(
    root: &PinRoot,
    object: &EbpfObject,
) -> Result<(ObjectPins, bool), ObjectError> {
    let id = object.id();
    let pins = root.object(id);
    if pins.dir().exists() {
        check_complete(&pins)?;
        return Ok((pins, false));
    }
    // Only a load needs it: a pinned object was loaded by this kernel already.
    crate::sys::kernel::check_running()?;
    let bytes = object.bytes();
    if bytes.is_empty() {
        return Err(ObjectError::NotEmbedded);
    }
    // Objects a killed run was pinning are half-made: they go (the caller holds the lock).
    root.clear_staging_objects().map_err(fs_err(
        "removing objects staged by an interrupted run in",
        &root.objects_dir(),
    ))?;
    let staging = root.staging_object(id);
    if let Err(err) = load_and_pin(bytes, object.capacity(), &staging, &[]) {
        if let Err(cleanup) = fs::remove_dir_all(staging.dir()) {
            tracing::warn!("removing {}: {cleanup}", staging.dir().display());
        }
        return Err(err);
    }
    fs::rename(staging.dir(), pins.dir()).map_err(fs_err("renaming into place", pins.dir()))?;
    Ok((pins, true))
}

fn check_complete(pins: &ObjectPins) -> Result<(), ObjectError> {
    // Two directory listings, not a stat per pin: this runs for every pod.
    let listed =
        |dir: std::path::PathBuf| super::pins::names_in(&dir).map_err(fs_err("listing", &dir));
    let (progs, maps) = (listed(pins.progs_dir())?, listed(pins.maps_dir())?);
    let has = |names: &[String], name: &str| names.iter().any(|n| n == name);
    let missing: Vec<_> = POD_PROGRAMS
        .iter()
        .filter(|p| !has(&progs, p.function))
        .map(|p| pins.program(p.function))
        .chain(
            names::ALL
                .iter()
                .filter(|m| !has(&maps, m))
                .map(|m| pins.map(m)),
        )
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(ObjectError::Incomplete {
            path: pins.dir().display().to_string(),
            missing: missing.join(", "),
        })
    }
}

/// Load `object` next to `current` (the object the node uses now) so that the new programs
/// use every map of `current`'s they can: configuration maps whose definition (type, key
/// and value size, capacity, flags) is the same in both, and the maps of connections in
/// flight ([`names::IN_FLIGHT`]) whose entries keep their shape, whatever their capacity.
/// Returns whether all maps are shared; when some are not, the new object has those of
/// its own and the caller must copy what they hold. A connection that meets the old
/// programs at connect and the new ones at accept (links switch one by one) thus keeps its
/// original destination unless its map's entries changed shape.
pub fn ensure_loaded_sharing(
    root: &PinRoot,
    object: &EbpfObject,
    current: &ObjectPins,
) -> Result<(ObjectPins, bool), ObjectError> {
    let pins = root.object(object.id());
    if !pins.dir().exists() {
        let (fresh, _) = ensure_loaded(root, object)?;
        let same = shareable_maps(&fresh, current);
        if same.is_empty() {
            return Ok((fresh, false));
        }
        // Load it again, on `current`'s maps it can share.
        fs::remove_dir_all(fresh.dir()).map_err(fs_err("removing", fresh.dir()))?;
        let staging = root.staging_object(object.id());
        let shared: Vec<(&str, std::path::PathBuf)> =
            same.iter().map(|n| (*n, current.map(n))).collect();
        if let Err(err) = load_and_pin(object.bytes(), object.capacity(), &staging, &shared) {
            if let Err(cleanup) = fs::remove_dir_all(staging.dir()) {
                tracing::warn!("removing {}: {cleanup}", staging.dir().display());
            }
            return Err(err);
        }
        fs::rename(staging.dir(), pins.dir()).map_err(fs_err("renaming into place", pins.dir()))?;
    }
    check_complete(&pins)?;
    let shared = names::ALL.iter().all(|name| {
        let id = |o: &ObjectPins| {
            MapData::from_pin(o.map(name))
                .and_then(|m| m.info())
                .map(|i| i.id())
        };
        matches!((id(&pins), id(current)), (Ok(a), Ok(b)) if a == b)
    });
    Ok((pins, shared))
}

/// The maps of `a` that can be `b`'s: see [`ensure_loaded_sharing`].
fn shareable_maps(a: &ObjectPins, b: &ObjectPins) -> Vec<&'static str> {
    let definition = |o: &ObjectPins, name: &str| {
        MapData::from_pin(o.map(name))
            .and_then(|m| m.info())
            .map(|i| {
                let in_flight = names::IN_FLIGHT.contains(&name);
                (
                    i.map_type().ok(),
                    i.key_size(),
                    i.value_size(),
                    (!in_flight).then(|| (i.max_entries(), i.map_flags())),
                )
            })
    };
    names::ALL
        .iter()
        .copied()
        .filter(
            |name| matches!((definition(a, name), definition(b, name)), (Ok(x), Ok(y)) if x == y),
        )
        .collect()
}

/// The programs verified on a second thread: connect6 (the longest walk, a third of the
/// whole), sendmsg4 and the short ones, about half of the verifier's work in all
/// (`bpf_prog_info.verified_insns`: 33k of 61k instructions walked).
const VERIFIED_ON_SECOND_THREAD: [&str; 8] = [
    "capture_connect6",
    "capture_sendmsg4",
    "track_sock_ops",
    "answer_getsockopt",
    "restore_getpeername4",
    "restore_getpeername6",
    "restore_recvmsg4",
    "restore_recvmsg6",
];

fn load_and_pin_program(
    spec: &ProgramSpec,
    program: &mut Program,
    staging: &ObjectPins,
) -> Result<(), ObjectError> {
    let path = staging.program(spec.function);
    let prog_err = |source| ObjectError::Program {
        name: spec.function,
        source,
    };
    let pin_err = |source: aya::pin::PinError| ObjectError::Pin {
        what: spec.function.into(),
        path: path.display().to_string(),
        source: io::Error::other(source.to_string()),
    };
    // The program types share no trait for load and pin: the same three steps, per type.
    macro_rules! load_and_pin {
        ($kind:ty) => {{
            let p: &mut $kind = program.try_into().map_err(prog_err)?;
            p.load().map_err(prog_err)?;
            p.pin(&path).map_err(pin_err)?;
        }};
    }
    match spec.kind {
        ProgramKind::CgroupSockAddr => load_and_pin!(CgroupSockAddr),
        ProgramKind::SockOps => load_and_pin!(SockOps),
        ProgramKind::CgroupSockopt => load_and_pin!(CgroupSockopt),
        ProgramKind::SkLookup => load_and_pin!(SkLookup),
    }
    crate::sys::fault::step("a pinned program of a new object");
    Ok(())
}

/// Load `bytes` and pin its programs and maps under `staging`, its maps named in `shared`
/// being the ones pinned at the paths given instead of new ones, and the per-pod maps
/// sized for `capacity` pods.
fn load_and_pin(
    bytes: &[u8],
    capacity: PodCapacity,
    staging: &ObjectPins,
    shared: &[(&str, std::path::PathBuf)],
) -> Result<(), ObjectError> {
    let marker = staging.format_marker(redirector_common::FORMAT);
    for dir in [
        staging.progs_dir(),
        staging.maps_dir(),
        staging.links_dir(),
        marker,
    ] {
        fs::create_dir_all(&dir).map_err(fs_err("creating", &dir))?;
    }
    crate::sys::kernel::raise_memlock_where_needed();
    let mut loader = EbpfLoader::new();
    if capacity != PodCapacity::SHIPPED {
        for (name, entries) in capacity.map_capacities() {
            loader.map_max_entries(name, entries);
        }
    }
    for (name, path) in shared {
        loader.map_pin_path(name, path.as_path());
    }
    let mut ebpf = loader.load(bytes)?;
    let mut by_name: std::collections::HashMap<&str, &mut Program> = ebpf.programs_mut().collect();
    let mut programs = Vec::with_capacity(POD_PROGRAMS.len());
    for spec in &POD_PROGRAMS {
        // A variant is loaded in the program's place, under its name, where the kernel
        // lacks what the program uses; the marker tells the attaching code.
        let function = match spec.variant {
            Some(variant) if crate::sys::kernel::needs_fallback(variant.feature) => {
                let marker = staging.variant_marker(variant.function);
                fs::create_dir_all(&marker).map_err(fs_err("creating", &marker))?;
                variant.function
            }
            _ => spec.function,
        };
        let program = by_name
            .remove(function)
            .ok_or_else(|| ObjectError::Incomplete {
                path: "embedded object".into(),
                missing: function.into(),
            })?;
        programs.push((spec, program));
    }
    // ztunnel's sock_ops program, where the kernel has what it uses (else ambient is refused
    // at enrollment, naming the features).
    let ztunnel = &ZTUNNEL_PROGRAMS[0];
    if !ZTUNNEL_FEATURES
        .iter()
        .any(|key| crate::sys::kernel::needs_fallback(key))
    {
        if let Some(program) = by_name.remove(ztunnel.function) {
            programs.push((ztunnel, program));
        }
    }
    // The verifier's walk is most of an object's load, and privileged loads verify in
    // parallel: two threads, each with about half of the walk.
    let (second, first): (Vec<_>, Vec<_>) = programs
        .into_iter()
        .partition(|(spec, _)| VERIFIED_ON_SECOND_THREAD.contains(&spec.function));
    let load_all = |group: Vec<(&ProgramSpec, &mut Program)>| {
        group
            .into_iter()
            .try_for_each(|(spec, program)| load_and_pin_program(spec, program, staging))
    };
    std::thread::scope(|scope| {
        let second = scope.spawn(|| load_all(second));
        let first = load_all(first);
        second
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            .and(first)
    })?;
    let pin = |name: &str, map: &aya::maps::Map| {
        let path = staging.map(name);
        map.pin(&path).map_err(|source| ObjectError::Pin {
            what: name.into(),
            path: path.display().to_string(),
            source: io::Error::other(source.to_string()),
        })?;
        crate::sys::fault::step("a pinned map of a new object");
        Ok::<(), ObjectError>(())
    };
    for name in names::ALL {
        let map = ebpf.map(name).ok_or_else(|| ObjectError::Incomplete {
            path: "embedded object".into(),
            missing: name.into(),
        })?;
        pin(name, map)?;
    }
    // An object built before these (an earlier release's, given by REDIRECTOR_EBPF_OBJECT
    // to roll back) has none: `redirector trace` says so, and ambient pods are refused.
    for name in names::NEWER {
        if let Some(map) = ebpf.map(name) {
            pin(name, map)?;
        }
    }
    Ok(())
}

/// Open a pinned program of an object.
pub fn open_program(pins: &ObjectPins, function: &str) -> Result<OwnedFd, ObjectError> {
    let path = pins.program(function);
    Ok(bpf_sys::obj_get(&path).map_err(fs_err("opening pinned program", &path))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_names_the_embedded_object_as_its_bytes_would() {
        std::env::remove_var(OBJECT_OVERRIDE_ENV);
        let object = EbpfObject::configured().unwrap();
        assert_eq!(object.id(), &ObjectId::of(EMBEDDED));
    }
}
