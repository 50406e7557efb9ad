//! Daemon mode's node-level attachment: every cgroup program attached once at the node
//! cgroup (the cgroup2 root, or kubepods in Kubernetes), pinned, so that a pod needs only
//! its map entries and its network namespace's link.

use std::{
    fs, io,
    os::{fd::AsFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use redirector_common::names;

use crate::sys::bpf_sys::{self, LinkTarget};
use crate::{
    engine::error::EngineError,
    engine::observe::{observe_links, observe_pods, Pods},
    engine::pod_cgroup,
    engine::remove::collect_if_unused,
    store::{
        ensure_loaded, ensure_loaded_sharing, growing, open_program,
        programs::{ProgramSpec, NODE_PROGRAMS, POD_PROGRAMS},
        EbpfObject, NodeLock, NodeMaps, ObjectId, ObjectPins, PinRoot, PodPins,
    },
    sys::fs_error::{fs_err, gone_ok},
    sys::netns::Netns,
};

/// What [`attach_node`] found and did.
#[derive(Debug)]
pub struct NodeAttachment {
    pub object: ObjectId,
    pub cgroup: PathBuf,
    /// Hooks attached now (the others were already attached there).
    pub attached: Vec<&'static str>,
}

/// The node's object: the one a daemon set up (its `node/` directory), whether its
/// programs are attached at the node cgroup or only at pods' own cgroups.
pub fn node_object(root: &PinRoot) -> Result<Option<ObjectPins>, EngineError> {
    if !root.path().exists() {
        return Ok(None);
    }
    Ok(root
        .objects()
        .map_err(fs_err("listing", &root.objects_dir()))?
        .into_iter()
        .find(|object| object.node().dir().exists()))
}

/// Make `object` the node's (its `node/` directory), loading it if the node lacks it, with
/// no program attached at the node cgroup.
pub fn claim_node(root: &PinRoot, object: &EbpfObject) -> Result<ObjectPins, EngineError> {
    let _lock = NodeLock::acquire(root)?;
    let (obj, _) = ensure_loaded(root, object)?;
    let node = obj.node();
    fs::create_dir_all(node.dir()).map_err(fs_err("creating", node.dir()))?;
    Ok(obj)
}

/// The pods of `object` that no record in `recorded` names (init containers' pods) and
/// that have no cgroup link of their own: they set up only their entries, relying on the
/// programs at the node cgroup.
pub fn pods_covered_without_links(
    object: &ObjectPins,
    recorded: &std::collections::HashSet<u64>,
) -> Result<usize, EngineError> {
    let mut covered = 0;
    for cookie in object
        .pods()
        .map_err(fs_err("listing", &object.links_dir()))?
    {
        if recorded.contains(&cookie.get()) {
            continue;
        }
        let pod = object.pod(cookie);
        let hooks = pod.hooks().map_err(fs_err("listing", pod.dir()))?;
        if !hooks
            .iter()
            .any(|h| NODE_PROGRAMS.iter().any(|p| p.hook == h))
        {
            covered += 1;
        }
    }
    Ok(covered)
}

/// Remove the node-level links and keep the node's object, when no pod relies on them
/// (every pod has the programs at its own cgroup); the hooks unpinned.
pub fn detach_node_links(root: &PinRoot) -> Result<usize, EngineError> {
    let _lock = NodeLock::acquire(root)?;
    let Some(object) = node_object(root)? else {
        return Ok(0);
    };
    let node = object.node();
    let hooks = node.hooks().map_err(fs_err("listing", node.dir()))?;
    for hook in &hooks {
        let pin = node.link(hook);
        crate::store::pins::unpin_link(&pin).map_err(fs_err("unpinning link", &pin))?;
    }
    Ok(hooks.len())
}

/// The cgroup (its inode) the node's programs are attached at, read from a node link.
pub fn node_cgroup_id(object: &ObjectPins) -> Option<u64> {
    linked_cgroup(&object.node())
}

/// The cgroup (inode) the cgroup links pinned in `pins` are attached at, if any.
pub fn linked_cgroup(pins: &PodPins) -> Option<u64> {
    pins.hooks().ok()?.iter().find_map(|hook| {
        match bpf_sys::pinned_link_target(&pins.link(hook)).ok()? {
            LinkTarget::Cgroup(id) if id != 0 => Some(id),
            _ => None,
        }
    })
}

/// Attach `object`'s cgroup programs at `cgroup`, loading the object if the node lacks it.
/// A hook already attached there is kept as it is; one attached elsewhere is moved by an
/// atomic swap of its pin. On failure, the links made by this call are removed again.
pub fn attach_node(
    root: &PinRoot,
    object: &EbpfObject,
    cgroup: &Path,
) -> Result<NodeAttachment, EngineError> {
    let _lock = NodeLock::acquire(root)?;
    let (obj, _) = ensure_loaded(root, object)?;
    if obj.reads_cgroup_cookie() {
        return Err(EngineError::SharedCgroup {
            cgroup: cgroup.display().to_string(),
        });
    }
    let attached = pin_cgroup_links(&obj, &obj.node(), &NODE_PROGRAMS, cgroup)?;
    Ok(NodeAttachment {
        object: obj.id().clone(),
        cgroup: cgroup.to_path_buf(),
        attached,
    })
}

/// Attach `specs` of `obj` at `cgroup`, each link pinned in `pins` (the caller holds the
/// node lock): a hook already attached there is kept, one attached elsewhere is moved by
/// an atomic swap of its pin. On failure the links made here are removed again. Returns
/// the hooks attached now.
pub(crate) fn pin_cgroup_links(
    obj: &ObjectPins,
    pins: &PodPins,
    specs: &[ProgramSpec],
    cgroup: &Path,
) -> Result<Vec<&'static str>, EngineError> {
    let cgroup_err = |source| EngineError::Cgroup {
        path: cgroup.display().to_string(),
        source,
    };
    let cgroup_file = fs::File::open(cgroup).map_err(cgroup_err)?;
    let cgroup_id = cgroup_file.metadata().map_err(cgroup_err)?.ino();
    fs::create_dir_all(pins.dir()).map_err(fs_err("creating", pins.dir()))?;
    let mut attached = Vec::new();
    let result = (|| {
        for spec in specs {
            let pin = pins.link(spec.hook);
            if bpf_sys::pinned_link_target(&pin).ok() == Some(LinkTarget::Cgroup(cgroup_id)) {
                continue;
            }
            let prog = open_program(obj, spec.function)?;
            let link = bpf_sys::link_create(prog.as_fd(), cgroup_file.as_fd(), spec.attach_type)
                .map_err(|source| EngineError::Attach {
                    program: spec.function,
                    target: cgroup.display().to_string(),
                    blocked: crate::engine::apply::refused_by(
                        &source,
                        Some(cgroup),
                        spec.attach_type,
                    ),
                    source,
                })?;
            let staging = pins.staging_link(spec.hook);
            gone_ok(fs::remove_file(&staging)).map_err(fs_err("removing", &staging))?;
            bpf_sys::obj_pin(link.as_fd(), &staging).map_err(fs_err("pinning link", &staging))?;
            fs::rename(&staging, &pin).map_err(fs_err("replacing link", &pin))?;
            attached.push(spec.hook);
        }
        Ok(())
    })();
    if let Err(err) = result {
        for hook in &attached {
            let pin = pins.link(hook);
            if let Err(undo) = fs::remove_file(&pin) {
                tracing::warn!("removing {}: {undo}", pin.display());
            }
        }
        return Err(err);
    }
    Ok(attached)
}

/// Remove the node-level links (the programs stop running for every pod that relied on
/// them), and the objects nothing uses any more. Returns the objects they were under.
pub fn detach_node(root: &PinRoot) -> Result<Vec<ObjectId>, EngineError> {
    if !root.path().exists() {
        return Ok(Vec::new());
    }
    let _lock = NodeLock::acquire(root)?;
    let mut detached = Vec::new();
    for object in root
        .objects()
        .map_err(fs_err("listing", &root.objects_dir()))?
    {
        let mut hooks = Vec::new();
        // ztunnel's links first: they live only while the node's directory does.
        for links in [object.ztunnel(), object.node()] {
            let pinned = links.hooks().map_err(fs_err("listing", links.dir()))?;
            for hook in &pinned {
                let pin = links.link(hook);
                crate::store::pins::unpin_link(&pin).map_err(fs_err("unpinning link", &pin))?;
            }
            if links.dir().exists() {
                fs::remove_dir(links.dir()).map_err(fs_err("removing", links.dir()))?;
            }
            hooks.extend(pinned);
        }
        if !hooks.is_empty() {
            detached.push(object.id().clone());
        }
        collect_if_unused(&object)?;
    }
    Ok(detached)
}

/// The object whose node-level links cover `cgroup` (they attach at it or at one of its
/// ancestors), if any: a pod there needs no cgroup links of its own, and must have its
/// entries in that object's maps.
pub fn covering(root: &PinRoot, cgroup: &Path) -> Result<Option<ObjectPins>, EngineError> {
    let Some(object) = node_object(root)? else {
        return Ok(None);
    };
    let node = object.node();
    let hooks = node.hooks().map_err(fs_err("listing", node.dir()))?;
    let targets: Vec<u64> = hooks
        .iter()
        .filter_map(|hook| match bpf_sys::pinned_link_target(&node.link(hook)) {
            Ok(LinkTarget::Cgroup(id)) if id != 0 => Some(id),
            _ => None,
        })
        .collect();
    // Every node program must be there to cover a pod: a partial set would capture half.
    let covers = |dir: &Path| {
        fs::metadata(dir).is_ok_and(|m| {
            targets.len() == NODE_PROGRAMS.len() && targets.iter().all(|t| *t == m.ino())
        })
    };
    Ok(cgroup.ancestors().any(covers).then_some(object))
}

/// What [`upgrade`] moved.
#[derive(Debug)]
pub struct Upgrade {
    pub from: ObjectId,
    pub to: ObjectId,
    /// Whether the new programs use the old maps.
    pub shared_maps: bool,
    pub pods: usize,
    pub links: usize,
}

/// A link to move: its pin under the old object, where it goes under the new one, and
/// the program it runs there.
struct Move {
    from: PathBuf,
    to: PathBuf,
    function: &'static str,
}

/// Move the node from the object its links use to `object`, never leaving a hook without a
/// program. When the maps keep their definitions, the new programs are loaded on the old
/// maps (nothing to copy, no connection in flight lost); otherwise every pod's entries and
/// the connections in flight are copied into the new maps first. Then every link — the node's and each pod's own — is switched to the new
/// program in place with `BPF_LINK_UPDATE` and its pin moved, and only then is the old
/// object removed. A failure before the switch leaves everything on the old object.
pub fn upgrade(
    root: &PinRoot,
    object: &EbpfObject,
    pod_cgroups: &[PathBuf],
) -> Result<Option<Upgrade>, EngineError> {
    let _lock = NodeLock::acquire(root)?;
    let Some(old) = node_object(root)? else {
        return Ok(None);
    };
    if old.id() == object.id() {
        return Ok(None);
    }
    let (new, shared) = ensure_loaded_sharing(root, object, &old)?;
    let entries = if shared {
        // The new programs use the same maps: nothing to copy, nothing in flight lost.
        old.pods()
            .map_err(|e| fs_err("listing", &old.links_dir())(e).into())
    } else {
        copy_entries(&old, &new)
    };
    let moved = entries.and_then(|pods| {
        let moves = link_moves(&old, &new, &pods)?;
        let switched = switch_cgroups(&old, &new, pod_cgroups)?;
        if let Err(err) = switch_links(&new, &moves) {
            switch_cgroups(&new, &old, &switched)?;
            return Err(err);
        }
        Ok((pods, moves.len() + switched.len()))
    });
    let (pods, links) = match moved {
        Ok(moved) => moved,
        Err(err) => {
            collect_if_unused(&new)?;
            return Err(err);
        }
    };
    if !shared {
        // Connections that started on the old programs during the switch.
        copy_connections(&old, &new)?;
    }
    remove_object(&old)?;
    Ok(Some(Upgrade {
        from: old.id().clone(),
        to: new.id().clone(),
        shared_maps: shared,
        pods: pods.len(),
        links,
    }))
}

/// The configuration maps an upgrade copies when the objects do not share them, the
/// pods' configuration last so that no pod's programs see it before its lists.
const CONFIGURATION: [&str; 6] = [
    names::PORT_SETS,
    names::CIDRS_V4,
    names::CIDRS_V6,
    names::POD_BY_ADDR,
    names::COUNTERS,
    names::POD_CONFIG,
];

/// Every entry of the maps `new` does not share with `old`, written into `new`'s with its
/// value in `new`'s layout ([`crate::store::growing`]); proxy listeners registered again
/// from the pods' namespaces. Every map is checked for a copy before any is written.
/// Returns the pods.
fn copy_entries(
    old: &ObjectPins,
    new: &ObjectPins,
) -> Result<Vec<redirector_common::NetnsCookie>, EngineError> {
    let unshared = |maps: &[&'static str]| -> Vec<&'static str> {
        maps.iter()
            .copied()
            .filter(|m| !shares(old, new, m))
            .collect()
    };
    for map in unshared(&CONFIGURATION)
        .into_iter()
        .chain(unshared(&names::IN_FLIGHT))
    {
        growing::check_copy(map, &old.map(map), &new.map(map))?;
    }
    let from = NodeMaps::open(old)?;
    let none = std::collections::BTreeSet::new();
    let pods = observe_pods(old, &from, &Pods::AllBut(&none), false)?;
    for map in unshared(&CONFIGURATION) {
        let copied = growing::copy_map(map, &old.map(map), &new.map(map), false)?;
        tracing::debug!("{map}: {copied} entries copied");
    }
    if !shares(old, new, names::LISTENERS) {
        let mut to = NodeMaps::open(new)?;
        for (cookie, pod) in &pods {
            let Some(config) = pod.config else { continue };
            // The proxy's listeners are found again in its namespace (a sockhash gives
            // user space no socket back).
            let sk_lookup = observe_links(old, *cookie)?
                .into_iter()
                .find_map(|l| match l.target {
                    Some(LinkTarget::Netns(ino)) if ino != 0 => Some(ino),
                    _ => None,
                });
            match sk_lookup.and_then(|ino| Netns::find(u64::from(ino))) {
                Some(netns) => {
                    let ports = [config.inbound_port, config.outbound_port];
                    crate::engine::listeners::register_existing(&mut to, &netns, &ports);
                }
                None => tracing::warn!(
                    "pod {cookie}: its namespace is not found; its proxy's listeners are registered again when it listens again"
                ),
            }
        }
    }
    copy_connections(old, new)?;
    Ok(pods.into_keys().collect())
}

/// The connections in flight, in the maps the objects do not share (their entries
/// changed shape): copied before the switch and again after it, for connections that
/// started on the old programs meanwhile.
fn copy_connections(old: &ObjectPins, new: &ObjectPins) -> Result<(), EngineError> {
    for map in names::IN_FLIGHT {
        if !shares(old, new, map) {
            growing::copy_map(map, &old.map(map), &new.map(map), true)?;
        }
    }
    Ok(())
}

/// Whether the two objects' `map` pins are the one map.
fn shares(a: &ObjectPins, b: &ObjectPins, map: &str) -> bool {
    let id = |o: &ObjectPins| {
        aya::maps::MapData::from_pin(o.map(map))
            .and_then(|m| m.info())
            .map(|i| i.id())
    };
    matches!((id(a), id(b)), (Ok(x), Ok(y)) if x == y)
}

/// Every link pinned under `old` (node and pods), with where it goes under `new`.
fn link_moves(
    old: &ObjectPins,
    new: &ObjectPins,
    pods: &[redirector_common::NetnsCookie],
) -> Result<Vec<Move>, EngineError> {
    let mut dirs = vec![(old.node(), new.node())];
    let mut cookies: Vec<_> = pods.to_vec();
    cookies.extend(old.pods().map_err(fs_err("listing", &old.links_dir()))?);
    cookies.sort();
    cookies.dedup();
    dirs.extend(cookies.iter().map(|c| (old.pod(*c), new.pod(*c))));
    let mut moves = Vec::new();
    for (from, to) in dirs {
        for hook in from.hooks().map_err(fs_err("listing", from.dir()))? {
            let spec = POD_PROGRAMS
                .iter()
                .find(|p| p.hook == hook)
                .ok_or_else(|| {
                    EngineError::Fs(crate::sys::fs_error::FsError::new(
                        "moving",
                        from.link(&hook).display(),
                        io::Error::other("a link of no known program"),
                    ))
                })?;
            moves.push(Move {
                from: from.link(&hook),
                to: to.link(&hook),
                function: spec.function,
            });
        }
    }
    Ok(moves)
}

/// Put `new`'s programs in the place of `old`'s at each pod's own cgroup (a cgroup that is
/// gone took them with it); the cgroups switched. Undone if one fails.
fn switch_cgroups(
    old: &ObjectPins,
    new: &ObjectPins,
    cgroups: &[PathBuf],
) -> Result<Vec<PathBuf>, EngineError> {
    if cgroups.is_empty() {
        return Ok(Vec::new());
    }
    let (old, new) = (
        pod_cgroup::NodePrograms::open(old)?,
        pod_cgroup::NodePrograms::open(new)?,
    );
    let (old, new) = (&old, &new);
    let mut done = Vec::new();
    for cgroup in cgroups.iter().filter(|c| c.exists()) {
        match pod_cgroup::switch(old, new, cgroup) {
            Ok(0) => {}
            Ok(_) => done.push(cgroup.clone()),
            Err(err) => {
                for back in &done {
                    if let Err(undo) = pod_cgroup::switch(new, old, back) {
                        tracing::warn!("switching {} back: {undo}", back.display());
                    }
                }
                return Err(err);
            }
        }
    }
    Ok(done)
}

/// Switch every link to the new object's program and move its pin; undone link by link if
/// one fails.
fn switch_links(new: &ObjectPins, moves: &[Move]) -> Result<(), EngineError> {
    let mut done: Vec<(&Move, std::os::fd::OwnedFd)> = Vec::new();
    let result = (|| {
        for m in moves {
            let link = bpf_sys::obj_get(&m.from).map_err(fs_err("opening link", &m.from))?;
            let old_prog = bpf_sys::link_program_fd(link.as_fd())
                .map_err(fs_err("reading the program of", &m.from))?;
            let prog = open_program(new, m.function)?;
            bpf_sys::link_update(link.as_fd(), prog.as_fd())
                .map_err(fs_err("updating link", &m.from))?;
            done.push((m, old_prog));
            if let Some(dir) = m.to.parent() {
                fs::create_dir_all(dir).map_err(fs_err("creating", dir))?;
            }
            fs::rename(&m.from, &m.to).map_err(fs_err("moving link", &m.to))?;
        }
        Ok(())
    })();
    if let Err(err) = result {
        for (m, old_prog) in done.into_iter().rev() {
            let pin = if m.to.exists() { &m.to } else { &m.from };
            let back = bpf_sys::obj_get(pin)
                .and_then(|link| bpf_sys::link_update(link.as_fd(), old_prog.as_fd()))
                .and_then(|()| {
                    if pin == &m.to {
                        fs::rename(&m.to, &m.from)
                    } else {
                        Ok(())
                    }
                });
            if let Err(undo) = back {
                tracing::warn!("putting back {}: {undo}", m.from.display());
            }
        }
        return Err(err);
    }
    Ok(())
}

/// Remove an object whose links have all moved away: its empty link directories, then
/// its programs and maps.
fn remove_object(old: &ObjectPins) -> Result<(), EngineError> {
    for cookie in old.pods().map_err(fs_err("listing", &old.links_dir()))? {
        let pod = old.pod(cookie);
        pod.remove_dir_if_empty()
            .map_err(fs_err("removing", pod.dir()))?;
    }
    let node = old.node();
    if node.dir().exists() {
        fs::remove_dir(node.dir()).map_err(fs_err("removing", node.dir()))?;
    }
    collect_if_unused(old)?;
    Ok(())
}
