//! Each setup of a pod also removes a few pods that are gone, so that a node whose pods
//! are deleted without `--cleanup-only` (as Kubernetes deletes them: namespace and cgroup
//! freed) never fills its maps, with no `redirector gc` to run.
//!
//! The work is bounded: a setup checks at most [`PODS_CHECKED_PER_SETUP`] pods of each
//! object, taken in POD_CONFIG's own key order from where the last setup stopped, so every
//! pod is checked once per round and the time a setup takes does not grow with the
//! node's history. A node that sets up one pod for each one deleted keeps, on average,
//! about one gone pod for every `PODS_CHECKED_PER_SETUP - 1` live ones. A checked pod
//! costs one link lookup when it is alive, and a lookup per hook and two bpf calls per link
//! when it is not; the node-wide maps are read (once,
//! for all the gone pods found) only when one was found.

use std::{collections::BTreeSet, fs, io, os::fd::AsFd as _};

use redirector_common::NetnsCookie;

use super::remove_found;
use crate::sys::bpf_sys::{self, pinned_link_target};
use crate::{
    engine::error::EngineError,
    engine::observe::{observe_links, ObservedLink, Pods},
    engine::remove::collect_if_unused,
    store::{
        pins::names_in, programs::POD_PROGRAMS, NodeMaps, ObjectId, ObjectPins, OpenMaps, PinRoot,
    },
    sys::fs_error::{fs_err, gone_ok},
};

/// How many pods of each object a setup checks.
pub const PODS_CHECKED_PER_SETUP: usize = 4;

/// Removes the pods that are gone among the next few of each object under `root`, never
/// `setting_up`, and any object other than `target` that is left without pods. The
/// caller holds the node lock. Housekeeping never fails a setup: what goes wrong is
/// logged. Returns the removed pods.
pub(crate) fn collect_some(
    root: &PinRoot,
    maps: &mut OpenMaps,
    setting_up: NetnsCookie,
    target: &ObjectId,
) -> Vec<NetnsCookie> {
    let objects = match root.objects() {
        Ok(objects) => objects,
        Err(err) => {
            tracing::warn!("{}", fs_err("listing", &root.objects_dir())(err));
            return Vec::new();
        }
    };
    let mut removed = Vec::new();
    for object in objects {
        match collect_in(&object, maps, setting_up) {
            Ok(pods) => removed.extend(pods),
            Err(err) => tracing::warn!(
                "removing pods that are gone under object {}: {err}",
                object.id()
            ),
        }
        if object.id() != target {
            if let Err(err) = collect_if_unused(&object) {
                tracing::warn!("{err}");
            }
        }
    }
    if !removed.is_empty() {
        let cookies: Vec<u64> = removed.iter().map(|c| c.get()).collect();
        tracing::info!(
            "removed {} pod(s) that are gone (netns cookies {cookies:?})",
            removed.len()
        );
    }
    removed
}

fn collect_in(
    object: &ObjectPins,
    maps: &mut OpenMaps,
    setting_up: NetnsCookie,
) -> Result<Vec<NetnsCookie>, EngineError> {
    let maps = maps.get(object)?;
    let due = next_pods(object, maps, PODS_CHECKED_PER_SETUP)
        .map_err(fs_err("walking the pods of", object.dir()))?;
    let mut gone: Vec<(NetnsCookie, Vec<ObservedLink>)> = Vec::new();
    for cookie in due.into_iter().filter(|c| *c != setting_up) {
        if has_an_attached_link(object, cookie) {
            continue;
        }
        let links = observe_links(object, cookie)?;
        if !links.iter().any(ObservedLink::attached) {
            gone.push((cookie, links));
        }
    }
    if gone.is_empty() {
        return Ok(Vec::new());
    }
    let these: BTreeSet<NetnsCookie> = gone.iter().map(|(cookie, _)| *cookie).collect();
    let (removed, failures) = remove_found(object, maps, &Pods::These(&these), gone, false)?;
    if !failures.is_empty() {
        return Err(EngineError::Removals(failures));
    }
    Ok(removed)
}

/// Whether one of the pod's pinned links is still attached, looked up hook by hook until
/// one is: most pods checked are alive, and one lookup proves it (where reading every hook's
/// pin and link first cost a setup about 30 syscalls a pod). A link that cannot be read
/// counts as attached, as it does for [`ObservedLink::attached`].
fn has_an_attached_link(object: &ObjectPins, cookie: NetnsCookie) -> bool {
    let pod = object.pod(cookie);
    POD_PROGRAMS.iter().any(
        |program| match pinned_link_target(&pod.link(program.hook)) {
            Ok(target) => target.attached(),
            Err(err) => err.kind() != io::ErrorKind::NotFound,
        },
    )
}

/// The next `count` pods configured under `object`, from where the last call stopped; the
/// cursor moves past them (back to the first pod after the last).
fn next_pods(object: &ObjectPins, maps: &NodeMaps, count: usize) -> io::Result<Vec<NetnsCookie>> {
    let cursor = Cursor(object.gc_cursor_dir());
    let map = maps.pod_config.map().fd().as_fd();
    // A cursor whose pod was removed meanwhile starts the round again.
    let mut next = match cursor.read()? {
        Some(at) if maps.pod_config.get(&at, 0).is_ok() => Some(at),
        _ => bpf_sys::next_key::<NetnsCookie>(map, None)?,
    };
    let mut due = Vec::with_capacity(count);
    while let Some(cookie) = next {
        if due.len() == count {
            break;
        }
        due.push(cookie);
        next = bpf_sys::next_key(map, Some(&cookie))?;
    }
    cursor.write(next)?;
    Ok(due)
}

/// Where the next collection starts: an empty directory named by the pod's netns cookie;
/// none, from the first pod.
struct Cursor(std::path::PathBuf);

impl Cursor {
    fn read(&self) -> io::Result<Option<NetnsCookie>> {
        Ok(names_in(&self.0)?.iter().find_map(|name| name.parse().ok()))
    }

    fn write(&self, at: Option<NetnsCookie>) -> io::Result<()> {
        let name = at.map(|cookie| cookie.to_string());
        let names = names_in(&self.0)?;
        for old in names.iter().filter(|old| Some(*old) != name.as_ref()) {
            gone_ok(fs::remove_dir(self.0.join(old)))?;
        }
        if let Some(name) = name.filter(|name| !names.contains(name)) {
            fs::create_dir_all(self.0.join(name))?;
        }
        Ok(())
    }
}
