//! Removing pods: one pod on request (`--cleanup-only`), every pod whose cgroup and
//! network namespace are gone (`redirector gc`, and any setup a map has no room for: see
//! [`crate::engine::apply::apply`]), and a few of those with every setup ([`round_robin`]).

mod round_robin;

use std::collections::BTreeSet;

use redirector_common::NetnsCookie;

pub(crate) use round_robin::collect_some;

use crate::{
    engine::diff,
    engine::error::EngineError,
    engine::observe::{self, observe_links, observe_pods, ObserveError, ObservedLink, Pods},
    engine::pod_keys::PodKeys,
    engine::remove::{collect_if_unused, remove, retire},
    store::{NodeLock, NodeMaps, ObjectId, ObjectPins, OpenMaps, PinRoot},
    sys::fs_error::fs_err,
};

/// Remove everything installed for the pod, under every object, and the pin root itself
/// when nothing else is left in it: with `known`, the keys the pod's applies may have
/// written (its record's), only those are looked up; without, the node-wide maps are
/// read through if the pod is installed. What a killed run wrote beyond its record,
/// [`collect_stale`] finds once the pod is gone. Returns the objects it was removed from.
pub fn teardown(
    root: &PinRoot,
    cookie: NetnsCookie,
    maps: &mut OpenMaps,
    known: Option<&PodKeys>,
) -> Result<Vec<ObjectId>, EngineError> {
    if !root.path().exists() {
        return Ok(Vec::new());
    }
    let lock = NodeLock::acquire(root)?;
    let state = observe::observe(root, cookie, maps, observe::lookup(known))?;
    let removal = diff::remove_all(&state);
    let failures: Vec<String> = removal
        .retire
        .iter()
        .flat_map(|ops| retire(ops, cookie, maps))
        .collect();
    if !failures.is_empty() {
        return Err(EngineError::Removals(failures));
    }
    if removal.retire.is_empty() {
        // Nothing left of the pod: a cleanup killed after its last removal may have left
        // the object it emptied.
        for object in root
            .objects()
            .map_err(fs_err("listing", &root.objects_dir()))?
        {
            collect_if_unused(&object)?;
        }
    }
    let removed_from = removal.retired_objects();
    lock.remove_root_if_empty(root);
    Ok(removed_from)
}

/// Remove every pod whose links are all detached — its cgroup and network namespace are
/// gone, e.g. the pod was deleted without `--cleanup-only` — with its map entries, the
/// entries of pods that have no links at all (left by an interrupted run), and any object
/// left without pods, and the trace switches of a tracer that is gone. Each map is read
/// once per object. Returns the removed pods.
pub fn collect_stale(root: &PinRoot) -> Result<Vec<NetnsCookie>, EngineError> {
    if !root.path().exists() {
        return Ok(Vec::new());
    }
    let mut removed = BTreeSet::new();
    let lock = NodeLock::acquire(root)?;
    {
        // A `redirector trace` that was killed left its pods' trace switches on.
        if let Err(err) = crate::trace::clear_stale_locked(root) {
            tracing::warn!("clearing a stopped tracer's switches: {err}");
        }
        for object in root
            .objects()
            .map_err(fs_err("listing", &root.objects_dir()))?
        {
            let mut live = BTreeSet::new();
            let mut stale = Vec::new();
            for cookie in object
                .pods()
                .map_err(fs_err("listing", &object.links_dir()))?
            {
                let links = observe_links(&object, cookie)?;
                if links.iter().any(ObservedLink::attached) {
                    live.insert(cookie);
                } else {
                    stale.push((cookie, links));
                }
            }
            let mut maps = NodeMaps::open(&object)?;
            let (found, mut failures) =
                remove_found(&object, &mut maps, &Pods::AllBut(&live), stale, true)?;
            removed.extend(found);
            drop(maps);
            if let Err(err) = collect_if_unused(&object) {
                failures.push(err.to_string());
            }
            if !failures.is_empty() {
                return Err(EngineError::Removals(failures));
            }
        }
    }
    lock.remove_root_if_empty(root);
    Ok(removed.into_iter().collect())
}

/// Removes from `object` every pod `pods` selects that has entries, and the pods in
/// `linked` with the links found for each, reading each map once for all of them (with
/// `runtime`, also the entries the kernel side made). Returns the pods and what failed.
fn remove_found(
    object: &ObjectPins,
    maps: &mut NodeMaps,
    pods: &Pods,
    linked: Vec<(NetnsCookie, Vec<ObservedLink>)>,
    runtime: bool,
) -> Result<(Vec<NetnsCookie>, Vec<String>), ObserveError> {
    let mut found = observe_pods(object, maps, pods, runtime)?;
    for (cookie, links) in linked {
        found
            .entry(cookie)
            .or_insert_with(|| observe::Installation::empty(object.clone()))
            .links = links;
    }
    let mut failures = Vec::new();
    for (cookie, install) in &found {
        failures.extend(remove(
            object,
            maps,
            *cookie,
            &diff::removal(install).removals,
        ));
    }
    Ok((found.into_keys().collect(), failures))
}
