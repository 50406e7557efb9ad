//! Executing a pod plan against the kernel, and removing a pod again.
//!
//! Apply is transactional: map entries are written with an undo log and the new links
//! are created and pinned at staging paths first; only when everything succeeded are they
//! renamed over the pod's current links (an atomic swap on bpffs) and stale entries
//! removed. A failure before that point leaves the pod exactly as it was.

use std::{
    fs, io,
    os::fd::{AsFd, OwnedFd},
    path::Path,
};

use aya::maps::{lpm_trie::Key, MapError};
use redirector_common::{Counters, PodConfig};

use crate::{
    bpf_sys,
    fs_error::{fs_err, FsError},
    node_maps::{NodeMaps, OpenMapError},
    object::{ensure_loaded, open_program, NodeLock, ObjectError},
    pins::{ObjectPins, PinRoot, PodPins, STAGING_PREFIX},
    plan::PodPlan,
    programs::AttachTarget,
};

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error(transparent)]
    OpenMap(#[from] OpenMapError),
    #[error("writing {map}: {source}")]
    MapWrite { map: &'static str, source: MapError },
    #[error("opening cgroup {path}: {source}")]
    Cgroup { path: String, source: io::Error },
    #[error("attaching {program} to {target}: {source}")]
    Attach {
        program: &'static str,
        target: String,
        source: io::Error,
    },
    #[error(transparent)]
    Fs(#[from] FsError),
}

fn write_err(map: &'static str) -> impl FnOnce(MapError) -> ApplyError {
    move |source| ApplyError::MapWrite { map, source }
}

/// What an apply did, for the log.
#[derive(Debug)]
pub struct ApplyReport {
    pub object_id: String,
    /// How long loading the object took, when this run loaded it.
    pub object_load_time: Option<std::time::Duration>,
    /// How long the pod's own entries and links took.
    pub pod_time: std::time::Duration,
    /// Objects this pod was moved away from.
    pub moved_from: Vec<String>,
    /// Capture listeners that existed before and were registered now.
    pub listeners: Vec<String>,
}

/// One step to take back if a later one fails.
enum Undo {
    PodConfig {
        cookie: u64,
        previous: Option<PodConfig>,
    },
    Port(redirector_common::PortKey),
    Cidr4 {
        key: Key<redirector_common::Cidr4Key>,
        previous: Option<u8>,
    },
    Cidr6 {
        key: Key<redirector_common::Cidr6Key>,
        previous: Option<u8>,
    },
    PodAddr {
        key: redirector_common::PodAddrKey,
        previous: Option<u64>,
    },
    Counters(u64),
    StagedLink(std::path::PathBuf),
}

/// Install (or replace) a pod's capture as described by `plan`.
pub fn apply(root: &PinRoot, object: &[u8], plan: &PodPlan) -> Result<ApplyReport, ApplyError> {
    let _lock = NodeLock::acquire(root)?;
    let started = std::time::Instant::now();
    let (obj, object_loaded) = ensure_loaded(root, object)?;
    let object_load_time = object_loaded.then(|| started.elapsed());
    let started = std::time::Instant::now();
    let mut maps = NodeMaps::open(&obj)?;
    let pod = obj.pod(plan.netns_cookie);
    let mut undo = Vec::new();
    let staged = match stage(&obj, &pod, &mut maps, plan, &mut undo) {
        Ok(staged) => staged,
        Err(err) => {
            rollback(&mut maps, &pod, undo);
            drop(maps);
            collect_if_unused(&obj);
            return Err(err);
        }
    };
    // Commit: swap the staged links over the current ones.
    for (hook, staging) in staged {
        let target = pod.link(hook);
        fs::rename(&staging, &target).map_err(fs_err("replacing link", &target))?;
    }
    remove_stale_links(&pod, plan)?;
    remove_stale_entries(&mut maps, plan);
    let capture_ports = [plan.config.inbound_port, plan.config.outbound_port];
    let listeners =
        crate::listeners::register_existing(&mut maps, plan.netns_cookie, &capture_ports);
    let mut moved_from = Vec::new();
    for other in installed_objects(root)? {
        if other.id() != obj.id() && other.pod(plan.netns_cookie).dir().exists() {
            remove_pod_from(&other, plan.netns_cookie)?;
            moved_from.push(other.id());
        }
    }
    Ok(ApplyReport {
        object_id: obj.id(),
        object_load_time,
        pod_time: started.elapsed(),
        moved_from,
        listeners,
    })
}

/// Write map entries and create + pin the new links at staging paths.
fn stage(
    obj: &ObjectPins,
    pod: &PodPins,
    maps: &mut NodeMaps,
    plan: &PodPlan,
    undo: &mut Vec<Undo>,
) -> Result<Vec<(&'static str, std::path::PathBuf)>, ApplyError> {
    let cookie = plan.netns_cookie;
    // Sets first, the config last: a pod with a config entry is live, and it must never
    // be live with half its sets.
    for key in &plan.ports {
        if maps.port_sets.get(key, 0).is_err() {
            maps.port_sets
                .insert(key, 1, 0)
                .map_err(write_err("PORT_SETS"))?;
            undo.push(Undo::Port(*key));
        }
    }
    for e in &plan.cidrs_v4 {
        let key = Key::new(e.prefix_len, e.data);
        let previous = maps.cidrs_v4.get(&key, 0).ok();
        if previous != Some(e.value) {
            maps.cidrs_v4
                .insert(&key, e.value, 0)
                .map_err(write_err("CIDRS_V4"))?;
            undo.push(Undo::Cidr4 { key, previous });
        }
    }
    for e in &plan.cidrs_v6 {
        let key = Key::new(e.prefix_len, e.data);
        let previous = maps.cidrs_v6.get(&key, 0).ok();
        if previous != Some(e.value) {
            maps.cidrs_v6
                .insert(&key, e.value, 0)
                .map_err(write_err("CIDRS_V6"))?;
            undo.push(Undo::Cidr6 { key, previous });
        }
    }
    for key in &plan.addrs {
        let previous = maps.pod_by_addr.get(key, 0).ok();
        if previous != Some(cookie) {
            maps.pod_by_addr
                .insert(key, cookie, 0)
                .map_err(write_err("POD_BY_ADDR"))?;
            undo.push(Undo::PodAddr {
                key: *key,
                previous,
            });
        }
    }
    if maps.counters.get(&cookie, 0).is_err() {
        let cpus =
            aya::util::nr_cpus().map_err(|(path, source)| FsError::new("reading", path, source))?;
        let zero = aya::maps::PerCpuValues::try_from(vec![Counters::default(); cpus])
            .map_err(|source| FsError::new("sizing per-CPU values of", "COUNTERS", source))?;
        maps.counters
            .insert(cookie, zero, 0)
            .map_err(write_err("COUNTERS"))?;
        undo.push(Undo::Counters(cookie));
    }
    let previous = maps.pod_config.get(&cookie, 0).ok();
    maps.pod_config
        .insert(cookie, plan.config, 0)
        .map_err(write_err("POD_CONFIG"))?;
    undo.push(Undo::PodConfig { cookie, previous });

    // Links: created first (an unpinned link detaches when its fd closes), then pinned.
    let cgroup = fs::File::open(&plan.cgroup).map_err(|source| ApplyError::Cgroup {
        path: plan.cgroup.display().to_string(),
        source,
    })?;
    // This thread runs in the pod's network namespace.
    let netns_path = Path::new("/proc/thread-self/ns/net");
    let netns = fs::File::open(netns_path).map_err(fs_err("opening", netns_path))?;
    let mut links: Vec<(&'static str, OwnedFd)> = Vec::new();
    for spec in plan.programs {
        let prog = open_program(obj, spec.function)?;
        let (target, target_name) = match spec.target {
            AttachTarget::Cgroup => (cgroup.as_fd(), plan.cgroup.display().to_string()),
            AttachTarget::Netns => (netns.as_fd(), "the pod's network namespace".to_owned()),
        };
        let link =
            bpf_sys::link_create(prog.as_fd(), target, spec.attach_type).map_err(|source| {
                ApplyError::Attach {
                    program: spec.function,
                    target: target_name,
                    source,
                }
            })?;
        links.push((spec.hook, link));
    }
    fs::create_dir_all(pod.dir()).map_err(fs_err("creating", pod.dir()))?;
    let mut staged = Vec::new();
    for (hook, link) in &links {
        let staging = pod.staging_link(hook);
        let _ = fs::remove_file(&staging);
        bpf_sys::obj_pin(link.as_fd(), &staging).map_err(fs_err("pinning link", &staging))?;
        undo.push(Undo::StagedLink(staging.clone()));
        staged.push((*hook, staging));
    }
    Ok(staged)
}

fn rollback(maps: &mut NodeMaps, pod: &PodPins, undo: Vec<Undo>) {
    for step in undo.into_iter().rev() {
        let undone = match step {
            Undo::PodConfig {
                cookie,
                previous: Some(previous),
            } => maps
                .pod_config
                .insert(cookie, previous, 0)
                .map_err(|e| e.to_string()),
            Undo::PodConfig {
                cookie,
                previous: None,
            } => maps.pod_config.remove(&cookie).map_err(|e| e.to_string()),
            Undo::Port(key) => maps.port_sets.remove(&key).map_err(|e| e.to_string()),
            Undo::Cidr4 {
                key,
                previous: Some(v),
            } => maps.cidrs_v4.insert(&key, v, 0).map_err(|e| e.to_string()),
            Undo::Cidr4 {
                key,
                previous: None,
            } => maps.cidrs_v4.remove(&key).map_err(|e| e.to_string()),
            Undo::Cidr6 {
                key,
                previous: Some(v),
            } => maps.cidrs_v6.insert(&key, v, 0).map_err(|e| e.to_string()),
            Undo::Cidr6 {
                key,
                previous: None,
            } => maps.cidrs_v6.remove(&key).map_err(|e| e.to_string()),
            Undo::PodAddr {
                key,
                previous: Some(previous),
            } => maps
                .pod_by_addr
                .insert(key, previous, 0)
                .map_err(|e| e.to_string()),
            Undo::PodAddr {
                key,
                previous: None,
            } => maps.pod_by_addr.remove(&key).map_err(|e| e.to_string()),
            Undo::Counters(cookie) => maps.counters.remove(&cookie).map_err(|e| e.to_string()),
            Undo::StagedLink(path) => fs::remove_file(&path).map_err(|e| e.to_string()),
        };
        if let Err(err) = undone {
            tracing::warn!("rollback step failed: {err}");
        }
    }
    // Removes the pod dir only if it is empty, i.e. the pod had no links before.
    let _ = fs::remove_dir(pod.dir());
}

/// Unpin (detach) the pod's links to programs the plan no longer has, e.g. the DNS
/// programs once DNS capture is switched off.
fn remove_stale_links(pod: &PodPins, plan: &PodPlan) -> Result<(), ApplyError> {
    let entries = fs::read_dir(pod.dir()).map_err(fs_err("listing", pod.dir()))?;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !plan.programs.iter().any(|p| p.hook == name) {
            let path = entry.path();
            fs::remove_file(&path).map_err(fs_err("unpinning link", &path))?;
        }
    }
    Ok(())
}

/// Remove this pod's entries that the plan no longer has (after a re-apply).
fn remove_stale_entries(maps: &mut NodeMaps, plan: &PodPlan) {
    let cookie = plan.netns_cookie;
    let stale_ports: Vec<_> = maps
        .port_sets
        .keys()
        .filter_map(Result::ok)
        .filter(|k| k.netns_cookie == cookie && !plan.ports.contains(k))
        .collect();
    for key in stale_ports {
        let _ = maps.port_sets.remove(&key);
    }
    let stale_v4: Vec<_> = maps
        .cidrs_v4
        .keys()
        .filter_map(Result::ok)
        .filter(|k| {
            k.data().netns_cookie == cookie
                && !plan
                    .cidrs_v4
                    .iter()
                    .any(|e| e.prefix_len == k.prefix_len() && e.data == k.data())
        })
        .collect();
    for key in stale_v4 {
        let _ = maps.cidrs_v4.remove(&key);
    }
    let stale_v6: Vec<_> = maps
        .cidrs_v6
        .keys()
        .filter_map(Result::ok)
        .filter(|k| {
            k.data().netns_cookie == cookie
                && !plan
                    .cidrs_v6
                    .iter()
                    .any(|e| e.prefix_len == k.prefix_len() && e.data == k.data())
        })
        .collect();
    for key in stale_v6 {
        let _ = maps.cidrs_v6.remove(&key);
    }
    // Only this pod's addresses: another pod may have been given one of them since.
    let stale_addrs: Vec<_> = maps
        .pod_by_addr
        .iter()
        .filter_map(Result::ok)
        .filter(|(k, owner)| *owner == cookie && !plan.addrs.contains(k))
        .map(|(k, _)| k)
        .collect();
    for key in stale_addrs {
        let _ = maps.pod_by_addr.remove(&key);
    }
}

/// Every fully loaded object under the root (staging leftovers excluded).
pub fn installed_objects(root: &PinRoot) -> Result<Vec<ObjectPins>, ApplyError> {
    let dir = root.objects_dir();
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(fs_err("listing", &dir)(err).into()),
    };
    let mut objects: Vec<_> = entries
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with(STAGING_PREFIX))
        .map(|e| root.object(&e.file_name().to_string_lossy()))
        .collect();
    objects.sort_by_key(ObjectPins::id);
    Ok(objects)
}

/// Detach a pod from one object and delete every entry it has in its maps; remove the
/// object if no pod uses it any more.
fn remove_pod_from(obj: &ObjectPins, cookie: u64) -> Result<(), ApplyError> {
    let pod = obj.pod(cookie);
    if let Ok(entries) = fs::read_dir(pod.dir()) {
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            fs::remove_file(&path).map_err(fs_err("unpinning link", &path))?;
        }
        fs::remove_dir(pod.dir()).map_err(fs_err("removing", pod.dir()))?;
    }
    if let Ok(mut maps) = NodeMaps::open(obj) {
        let _ = maps.pod_config.remove(&cookie);
        let _ = maps.counters.remove(&cookie);
        remove_stale_entries(&mut maps, &PodPlan::empty(cookie));
        let conns: Vec<_> = maps
            .orig_dst_by_conn
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.netns_cookie == cookie)
            .collect();
        for key in conns {
            let _ = maps.orig_dst_by_conn.remove(&key);
        }
        let listeners: Vec<_> = maps
            .listeners
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.netns_cookie == cookie)
            .collect();
        for key in listeners {
            let _ = maps.listeners.remove(&key);
        }
    }
    collect_if_unused(obj);
    Ok(())
}

/// Remove an object (programs, maps, empty dirs) once no pod is attached through it.
fn collect_if_unused(obj: &ObjectPins) {
    let has_pods = fs::read_dir(obj.pods_dir()).is_ok_and(|mut d| d.next().is_some());
    if !has_pods {
        let _ = fs::remove_dir_all(obj.dir());
    }
}

/// `--cleanup-only`: remove everything installed for the pod, under every object, and
/// the pin root itself when nothing else is left in it.
pub fn teardown(root: &PinRoot, cookie: u64) -> Result<Vec<String>, ApplyError> {
    if !root.path().exists() {
        return Ok(Vec::new());
    }
    let mut removed_from = Vec::new();
    {
        let _lock = NodeLock::acquire(root)?;
        for obj in installed_objects(root)? {
            if obj.pod(cookie).dir().exists() {
                removed_from.push(obj.id());
            }
            remove_pod_from(&obj, cookie)?;
        }
    }
    // Only empty directories go; another pod's pins keep the root in place.
    let _ = fs::remove_dir(root.objects_dir());
    let _ = fs::remove_dir(root.path());
    Ok(removed_from)
}

/// Remove every pod whose links are all detached — its cgroup and network namespace are
/// gone, e.g. the pod was deleted without `--cleanup-only` — with its map entries, and any
/// object left without pods. Returns the removed pods' netns cookies.
pub fn collect_stale(root: &PinRoot) -> Result<Vec<u64>, ApplyError> {
    if !root.path().exists() {
        return Ok(Vec::new());
    }
    let mut removed = Vec::new();
    {
        let _lock = NodeLock::acquire(root)?;
        for obj in installed_objects(root)? {
            let pods = fs::read_dir(obj.pods_dir()).map_err(fs_err("listing", &obj.pods_dir()))?;
            for pod in pods.filter_map(Result::ok) {
                let Ok(cookie) = pod.file_name().to_string_lossy().parse::<u64>() else {
                    continue;
                };
                let links = fs::read_dir(pod.path()).map_err(fs_err("listing", &pod.path()))?;
                let attached = links.filter_map(Result::ok).any(|link| {
                    bpf_sys::pinned_link_target(&link.path()).map_or(true, |t| t.attached())
                });
                if !attached {
                    remove_pod_from(&obj, cookie)?;
                    removed.push(cookie);
                }
            }
            collect_if_unused(&obj);
        }
    }
    let _ = fs::remove_dir(root.objects_dir());
    let _ = fs::remove_dir(root.path());
    Ok(removed)
}

/// What a pod already has, compared with a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Installed {
    Nothing,
    /// Exactly the plan: same object, entries, and links attached to the same targets.
    Same,
    Different,
}

/// Compare the pod's installed state with `plan` (read from bpffs and the kernel).
pub fn installed_state(
    root: &PinRoot,
    object: &[u8],
    plan: &PodPlan,
) -> Result<Installed, ApplyError> {
    let cookie = plan.netns_cookie;
    let objects = installed_objects(root)?;
    let Some(obj) = objects.iter().find(|o| o.pod(cookie).dir().exists()) else {
        return Ok(Installed::Nothing);
    };
    if obj.id() != crate::object::object_id(object)
        || objects
            .iter()
            .filter(|o| o.pod(cookie).dir().exists())
            .count()
            > 1
    {
        return Ok(Installed::Different);
    }
    let maps = NodeMaps::open(obj)?;
    let mine = |c: u64| c == cookie;
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let ports = sorted(
        maps.port_sets
            .keys()
            .filter_map(Result::ok)
            .filter(|k| mine(k.netns_cookie))
            .map(|k| format!("{k:?}"))
            .collect(),
    );
    let v4 = sorted(
        maps.cidrs_v4
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, _)| mine(k.data().netns_cookie))
            .map(|(k, v)| format!("{}/{:?}={v}", k.prefix_len(), k.data()))
            .collect(),
    );
    let v6 = sorted(
        maps.cidrs_v6
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, _)| mine(k.data().netns_cookie))
            .map(|(k, v)| format!("{}/{:?}={v}", k.prefix_len(), k.data()))
            .collect(),
    );
    let addrs = sorted(
        maps.pod_by_addr
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, c)| mine(*c))
            .map(|(k, _)| format!("{k:?}"))
            .collect(),
    );
    let same_entries = maps.pod_config.get(&cookie, 0).ok() == Some(plan.config)
        && ports == sorted(plan.ports.iter().map(|k| format!("{k:?}")).collect())
        && v4
            == sorted(
                plan.cidrs_v4
                    .iter()
                    .map(|e| format!("{}/{:?}={}", e.prefix_len, e.data, e.value))
                    .collect(),
            )
        && v6
            == sorted(
                plan.cidrs_v6
                    .iter()
                    .map(|e| format!("{}/{:?}={}", e.prefix_len, e.data, e.value))
                    .collect(),
            )
        && addrs == sorted(plan.addrs.iter().map(|k| format!("{k:?}")).collect());
    if !same_entries {
        return Ok(Installed::Different);
    }
    let inode = |path: &Path| {
        fs::metadata(path)
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .ok()
    };
    let cgroup_id = inode(&plan.cgroup);
    let netns_ino = inode(Path::new("/proc/thread-self/ns/net"));
    let pod = obj.pod(cookie);
    let links = sorted(
        fs::read_dir(pod.dir())
            .map_err(fs_err("listing", pod.dir()))?
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
    );
    if links != sorted(plan.programs.iter().map(|p| p.hook.to_owned()).collect()) {
        return Ok(Installed::Different);
    }
    for spec in plan.programs {
        let target = bpf_sys::pinned_link_target(&pod.link(spec.hook)).ok();
        let expected = match spec.target {
            AttachTarget::Cgroup => cgroup_id.map(bpf_sys::LinkTarget::Cgroup),
            AttachTarget::Netns => netns_ino.map(|i| bpf_sys::LinkTarget::Netns(i as u32)),
        };
        if target.is_none() || target != expected {
            return Ok(Installed::Different);
        }
    }
    Ok(Installed::Same)
}
