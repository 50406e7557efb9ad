//! Executing a pod's diff against the kernel.
//!
//! Writes are made with an undo log, and new links are created and pinned at staging
//! paths first; only when every write succeeded are they renamed over the pod's current
//! links (an atomic swap on bpffs per link, undone link by link if a rename fails). A
//! failure before the swap is complete leaves the pod exactly as it was. Removals come
//! after, and every one that fails is reported.

use std::{
    fs, io,
    os::fd::{AsFd, OwnedFd},
    path::PathBuf,
    time::{Duration, Instant},
};

use aya::maps::{lpm_trie::Key, MapError, PerCpuValues};
use redirector_common::{Counters, NetnsCookie, PodAddrKey, PodConfig};

use crate::sys::bpf_sys;
use crate::{
    engine::diff::{self, AttachTargets, Mode, Write},
    engine::error::{write_err, EngineError},
    engine::observe,
    engine::observe::lookup,
    engine::plan::PodPlan,
    engine::pod_keys::PodKeys,
    engine::remove::{collect_if_unused, key_of, remove, retire, unpinned},
    store::{
        cgroup_cookie::CookieStamps,
        ensure_loaded, open_program,
        programs::{AttachTarget, ProgramKind, POD_PROGRAMS},
        EbpfObject, NodeLock, NodeMaps, ObjectId, ObjectPins, OpenMaps, PinRoot, PodPins,
    },
    sys::fault,
    sys::fs_error::{fs_err, FsError},
    sys::netns::Netns,
};

/// What an apply did, for the log.
#[derive(Debug)]
pub struct ApplyReport {
    pub object_id: ObjectId,
    /// How long loading the object took, when this run loaded it.
    pub object_load_time: Option<Duration>,
    /// How long the pod's own part took: observing, writing, swapping, removing.
    pub pod_time: Duration,
    /// Objects this pod was moved away from.
    pub moved_from: Vec<ObjectId>,
    /// Capture listeners that existed before and were registered now.
    pub listeners: Vec<String>,
}

/// Whether the pod already had exactly its plan.
#[derive(Debug)]
pub enum Outcome {
    /// Nothing was installed for the pod.
    New(ApplyReport),
    /// Something else was installed; it was made to match the plan.
    Replaced(ApplyReport),
    /// Exactly the plan was installed; nothing was done.
    Unchanged,
}

/// Make the pod in `netns` what `plan` describes, under the object `object` (loaded and
/// pinned first if this node does not have it yet), with the maps `maps` keeps open.
/// `known`, the keys earlier applies of the pod may have written (its record's), makes
/// what is installed a lookup of those and the plan's keys; without them the node-wide
/// maps are read through if the pod is installed. When a map has no room for the pod,
/// every pod that is gone is removed ([`crate::engine::gc::collect_stale`]) and, if any was, the
/// pod is applied once more.
pub fn apply(
    root: &PinRoot,
    object: &EbpfObject,
    plan: &PodPlan,
    netns: &Netns,
    mode: Mode,
    maps: &mut OpenMaps,
    known: Option<&PodKeys>,
) -> Result<Outcome, EngineError> {
    let full = match apply_once(root, object, plan, netns, mode, maps, known) {
        Err(EngineError::MapFull { map }) => map,
        other => return other,
    };
    match crate::engine::gc::collect_stale(root) {
        Ok(removed) if !removed.is_empty() => {
            tracing::info!(
                "{full} was full: removed {} pod(s) that are gone, applying once more",
                removed.len()
            );
            apply_once(root, object, plan, netns, mode, maps, known)
        }
        Ok(_) => Err(EngineError::MapFull { map: full }),
        Err(err) => {
            tracing::warn!("{full} is full, and removing the pods that are gone failed: {err}");
            Err(EngineError::MapFull { map: full })
        }
    }
}

/// [`apply`], once, under the node lock.
fn apply_once(
    root: &PinRoot,
    object: &EbpfObject,
    plan: &PodPlan,
    netns: &Netns,
    mode: Mode,
    maps: &mut OpenMaps,
    known: Option<&PodKeys>,
) -> Result<Outcome, EngineError> {
    let _lock = NodeLock::acquire(root)?;
    let started = Instant::now();
    let cookie = plan.netns_cookie;
    // With every setup, a few pods that are gone go too: no map fills with pods deleted
    // without a cleanup.
    crate::engine::gc::collect_some(root, maps, cookie, object.id());
    let target = root.object(object.id());
    let targets = attach_targets(plan, netns)?;
    // Links a killed run staged are not the pod's: they go before anything is compared.
    let staged = target.pod(cookie);
    staged.clear_staged().map_err(fs_err(
        "removing links staged by an interrupted run in",
        staged.dir(),
    ))?;
    let keys = known.map(|known| known.union(&PodKeys::of(plan)));
    let state = observe::observe(root, cookie, maps, lookup(keys.as_ref()))?;
    tracing::debug!("observed pod {cookie} in {:?}", started.elapsed());
    let pod_diff = diff::diff(plan, &target, targets, &state, mode);
    if pod_diff.is_empty() {
        return Ok(Outcome::Unchanged);
    }
    let load_started = Instant::now();
    let (obj, object_loaded) = ensure_loaded(root, object)?;
    let object_load_time = object_loaded.then(|| load_started.elapsed());
    if let Err(err) = supported(&obj, plan) {
        collect_if_unused(&obj)?;
        return Err(err);
    }
    let ops = pod_diff.target.as_ref().expect("a plan has a target");
    let mut undo = Vec::new();
    let target_maps = maps.get(&obj)?;
    let installed = stage(&obj, target_maps, plan, netns, &ops.writes, &mut undo)
        .and_then(|staged| commit(&obj.pod(cookie), staged));
    if let Err(err) = installed {
        rollback(target_maps, &obj.pod(cookie), cookie, undo);
        collect_if_unused(&obj)?;
        return Err(err);
    }
    tracing::debug!("wrote and swapped in {:?}", started.elapsed());
    let mut failures = remove(&obj, target_maps, cookie, &ops.removals);
    let capture_ports = [plan.config.inbound_port, plan.config.outbound_port];
    let listeners = crate::engine::listeners::register_existing(target_maps, netns, &capture_ports);
    tracing::debug!("registered listeners in {:?}", started.elapsed());
    for retired in &pod_diff.retire {
        failures.extend(retire(retired, cookie, maps));
    }
    tracing::debug!("removed in {:?}", started.elapsed());
    if !failures.is_empty() {
        return Err(EngineError::Removals(failures));
    }
    let report = ApplyReport {
        object_id: obj.id().clone(),
        object_load_time,
        pod_time: started
            .elapsed()
            .saturating_sub(object_load_time.unwrap_or_default()),
        moved_from: pod_diff.retired_objects(),
        listeners,
    };
    Ok(if state.is_empty() {
        Outcome::New(report)
    } else {
        Outcome::Replaced(report)
    })
}

/// Whether the pod has exactly its plan installed under `object` (read-only); `known` as
/// for [`apply`].
pub fn is_installed(
    root: &PinRoot,
    object: &EbpfObject,
    plan: &PodPlan,
    netns: &Netns,
    maps: &mut OpenMaps,
    known: Option<&PodKeys>,
) -> Result<bool, EngineError> {
    let keys = known.map(|known| known.union(&PodKeys::of(plan)));
    let state = observe::observe(root, plan.netns_cookie, maps, lookup(keys.as_ref()))?;
    let targets = attach_targets(plan, netns)?;
    let target = root.object(object.id());
    Ok(!state.is_empty() && diff::diff(plan, &target, targets, &state, Mode::Changes).is_empty())
}

fn attach_targets(plan: &PodPlan, netns: &Netns) -> Result<AttachTargets, EngineError> {
    let cgroup_id = match &plan.cgroup {
        Some(path) => {
            let cgroup = fs::metadata(path).map_err(|source| EngineError::Cgroup {
                path: path.display().to_string(),
                source,
            })?;
            std::os::unix::fs::MetadataExt::ino(&cgroup)
        }
        // No cgroup programs in the plan.
        None => 0,
    };
    Ok(AttachTargets {
        cgroup_id,
        netns_inode: netns.inode(),
    })
}

/// Refuses a plan that needs what the node's programs were loaded without: the interface
/// lists (-c, -k) where sk_lookup is the variant without `ingress_ifindex`. Only lists
/// naming an interface of the pod count: the others change nothing.
fn supported(obj: &ObjectPins, plan: &PodPlan) -> Result<(), EngineError> {
    let without_ifindex = POD_PROGRAMS
        .iter()
        .any(|spec| spec.kind == ProgramKind::SkLookup && obj.uses_variant(spec));
    if !without_ifindex {
        return Ok(());
    }
    let flag = if plan.config.exclude_iface_count > 0 {
        "-c (the interfaces whose inbound traffic is not captured)"
    } else if plan.config.virt_iface_count > 0 {
        "-k (the interfaces whose inbound traffic is treated as outbound)"
    } else {
        return Ok(());
    };
    Err(EngineError::NeedsIngressIfindex { flag })
}

/// One write to take back if a later step fails.
enum Undo {
    Config(Option<PodConfig>),
    Port(redirector_common::PortKey),
    Cidr4(Key<redirector_common::Cidr4Key>, Option<u8>),
    Cidr6(Key<redirector_common::Cidr6Key>, Option<u8>),
    Addr(PodAddrKey, Option<NetnsCookie>),
    Counters,
    StagedLink(PathBuf),
}

/// A new link pinned at its staging path, waiting to be renamed over the current one.
struct Staged {
    hook: &'static str,
    path: PathBuf,
}

fn previous<T>(got: Result<T, MapError>) -> Option<T> {
    got.ok()
}

/// Make the writes; create and pin the new links at staging paths.
fn stage(
    obj: &ObjectPins,
    maps: &mut NodeMaps,
    plan: &PodPlan,
    netns: &Netns,
    writes: &[Write],
    undo: &mut Vec<Undo>,
) -> Result<Vec<Staged>, EngineError> {
    let cookie = plan.netns_cookie;
    let pod = obj.pod(cookie);
    let attaches_cgroup = writes
        .iter()
        .any(|w| matches!(w, Write::Attach(spec) if spec.target == AttachTarget::Cgroup));
    let cgroup = match &plan.cgroup {
        Some(path) if attaches_cgroup => {
            let file = fs::File::open(path).map_err(|source| EngineError::Cgroup {
                path: path.display().to_string(),
                source,
            })?;
            Some((path, file))
        }
        _ => None,
    };
    let mut staged = Vec::new();
    // Opened at the first program that reads the pod's cookie from its cgroup.
    let mut stamps: Option<CookieStamps> = None;
    // Made just before its first link, so that an apply stopped earlier leaves none.
    let mut pod_dir_made = false;
    for write in writes {
        match write {
            Write::Port(key) => {
                if maps.port_sets.get(key, 0).is_err() {
                    maps.port_sets
                        .insert(key, 1, 0)
                        .map_err(write_err("PORT_SETS"))?;
                    undo.push(Undo::Port(*key));
                    fault::step("a PORT_SETS write");
                }
            }
            Write::Cidr4(e) => {
                let key = key_of(e);
                let before = previous(maps.cidrs_v4.get(&key, 0));
                maps.cidrs_v4
                    .insert(&key, e.value, 0)
                    .map_err(write_err("CIDRS_V4"))?;
                undo.push(Undo::Cidr4(key, before));
                fault::step("a CIDRS_V4 write");
            }
            Write::Cidr6(e) => {
                let key = key_of(e);
                let before = previous(maps.cidrs_v6.get(&key, 0));
                maps.cidrs_v6
                    .insert(&key, e.value, 0)
                    .map_err(write_err("CIDRS_V6"))?;
                undo.push(Undo::Cidr6(key, before));
                fault::step("a CIDRS_V6 write");
            }
            Write::Addr(key) => {
                let before = previous(maps.pod_by_addr.get(key, 0));
                maps.pod_by_addr
                    .insert(key, cookie, 0)
                    .map_err(write_err("POD_BY_ADDR"))?;
                undo.push(Undo::Addr(*key, before));
                fault::step("a POD_BY_ADDR write");
            }
            Write::Counters => {
                let cpus = aya::util::nr_cpus()
                    .map_err(|(path, source)| FsError::new("reading", path, source))?;
                let zero =
                    PerCpuValues::try_from(vec![Counters::default(); cpus]).map_err(|source| {
                        FsError::new("sizing per-CPU values of", "COUNTERS", source)
                    })?;
                maps.counters
                    .insert(cookie, zero, 0)
                    .map_err(write_err("COUNTERS"))?;
                undo.push(Undo::Counters);
                fault::step("the COUNTERS entry");
            }
            Write::Config(config) => {
                let before = previous(maps.pod_config.get(&cookie, 0));
                maps.pod_config
                    .insert(cookie, config, 0)
                    .map_err(write_err("POD_CONFIG"))?;
                undo.push(Undo::Config(before));
                fault::step("the POD_CONFIG write");
            }
            Write::Attach(spec) => {
                // Created first (an unpinned link detaches when its fd closes), then pinned.
                let (target, target_name) = match spec.target {
                    AttachTarget::Cgroup => {
                        let (path, file) = cgroup.as_ref().ok_or(EngineError::NoCgroup {
                            program: spec.function,
                        })?;
                        (file.as_fd(), path.display().to_string())
                    }
                    AttachTarget::Netns => (
                        netns.as_fd(),
                        format!("network namespace {}", netns.path().display()),
                    ),
                };
                let prog = open_program(obj, spec.function)?;
                let cgroup_path = match spec.target {
                    AttachTarget::Cgroup => cgroup.as_ref().map(|(path, _)| path.as_path()),
                    AttachTarget::Netns => None,
                };
                let link = bpf_sys::link_create(prog.as_fd(), target.as_fd(), spec.attach_type)
                    .map_err(|source| EngineError::Attach {
                        program: spec.function,
                        target: target_name,
                        blocked: refused_by(&source, cgroup_path, spec.attach_type),
                        source,
                    })?;
                if !pod_dir_made {
                    pod.make_dirs().map_err(fs_err("creating", pod.dir()))?;
                    pod_dir_made = true;
                }
                // No staged pin is left here: `apply` cleared them under the node lock.
                let path = pod.staging_link(spec.hook);
                bpf_sys::obj_pin(link.as_fd(), &path).map_err(fs_err("pinning link", &path))?;
                undo.push(Undo::StagedLink(path.clone()));
                fault::step("a staged link");
                if spec.target == AttachTarget::Cgroup && obj.reads_cookie_from_cgroup(spec) {
                    let (path, file) = cgroup.as_ref().ok_or(EngineError::NoCgroup {
                        program: spec.function,
                    })?;
                    if stamps.is_none() {
                        stamps = Some(CookieStamps::open(obj)?);
                    }
                    if let Some(stamps) = &stamps {
                        stamps
                            .write(file, spec.attach_type, cookie)
                            .map_err(|source| EngineError::Attach {
                                program: spec.function,
                                target: path.display().to_string(),
                                source,
                                blocked: None,
                            })?;
                    }
                }
                staged.push(Staged {
                    hook: spec.hook,
                    path,
                });
            }
        }
    }
    Ok(staged)
}

/// Swap the staged links over the current ones. If a rename fails, the links already
/// swapped are put back (their old links are held open until the swap is complete).
fn commit(pod: &PodPins, staged: Vec<Staged>) -> Result<(), EngineError> {
    let mut swapped: Vec<(&'static str, Option<OwnedFd>)> = Vec::new();
    for link in &staged {
        let target = pod.link(link.hook);
        // Held open until the swap is complete, so that it can be put back.
        let old = match bpf_sys::obj_get(&target) {
            Ok(old) => Ok(Some(old)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(fs_err("opening link", &target)(err)),
        };
        let swap = old.and_then(|old| {
            fs::rename(&link.path, &target)
                .map(|()| old)
                .map_err(fs_err("replacing link", &target))
        });
        let old = match swap {
            Ok(old) => old,
            Err(err) => {
                for (hook, old) in swapped.into_iter().rev() {
                    if let Err(undo_err) = restore_link(pod, hook, old) {
                        tracing::warn!("putting back the link of {hook}: {undo_err}");
                    }
                }
                return Err(err.into());
            }
        };
        swapped.push((link.hook, old));
        fault::step("a link swapped in");
    }
    Ok(())
}

/// Put back a link replaced in a failed swap: the old one if there was one, none if not.
fn restore_link(pod: &PodPins, hook: &str, old: Option<OwnedFd>) -> io::Result<()> {
    let target = pod.link(hook);
    match old {
        Some(old) => {
            let staging = pod.staging_link(hook);
            bpf_sys::obj_pin(old.as_fd(), &staging)?;
            fs::rename(&staging, &target)
        }
        None => fs::remove_file(&target),
    }
}

fn rollback(maps: &mut NodeMaps, pod: &PodPins, cookie: NetnsCookie, undo: Vec<Undo>) {
    for step in undo.into_iter().rev() {
        let undone = match step {
            Undo::Config(Some(before)) => maps
                .pod_config
                .insert(cookie, before, 0)
                .map_err(undo_failed),
            Undo::Config(None) => maps.pod_config.remove(&cookie).map_err(undo_failed),
            Undo::Port(key) => maps.port_sets.remove(&key).map_err(undo_failed),
            Undo::Cidr4(key, Some(v)) => maps.cidrs_v4.insert(&key, v, 0).map_err(undo_failed),
            Undo::Cidr4(key, None) => maps.cidrs_v4.remove(&key).map_err(undo_failed),
            Undo::Cidr6(key, Some(v)) => maps.cidrs_v6.insert(&key, v, 0).map_err(undo_failed),
            Undo::Cidr6(key, None) => maps.cidrs_v6.remove(&key).map_err(undo_failed),
            Undo::Addr(key, Some(owner)) => {
                maps.pod_by_addr.insert(key, owner, 0).map_err(undo_failed)
            }
            Undo::Addr(key, None) => maps.pod_by_addr.remove(&key).map_err(undo_failed),
            Undo::Counters => maps.counters.remove(&cookie).map_err(undo_failed),
            Undo::StagedLink(path) => unpinned(fs::remove_file(&path)),
        };
        if let Err(err) = undone {
            tracing::warn!("rollback step failed: {err}");
        }
    }
    // A pod directory (an earlier release's) goes only if the pod had no links before.
    if let Err(err) = pod.remove_dir_if_empty() {
        tracing::warn!("removing {}: {err}", pod.dir().display());
    }
}

/// Why an undo step failed, for the warning.
fn undo_failed(err: MapError) -> String {
    err.to_string()
}

/// What refused an attachment at `cgroup` with EPERM: a program at an ancestor.
pub(crate) fn refused_by(
    err: &io::Error,
    cgroup: Option<&std::path::Path>,
    attach_type: u32,
) -> Option<crate::engine::neighbours::Blocking> {
    if err.raw_os_error() != Some(libc::EPERM) {
        return None;
    }
    crate::engine::neighbours::blocking_ancestor(cgroup?, attach_type)
}
