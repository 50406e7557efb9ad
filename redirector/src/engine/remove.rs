//! Removing pods' state: their links, map entries and staged pins, and an object once no
//! pod and no node link uses it. Apply, gc and the node's upgrade all remove through here.

use std::{fs, io};

use aya::maps::{lpm_trie::Key, MapError};
use redirector_common::NetnsCookie;

use crate::{
    store::{NodeMaps, ObjectPins, OpenMaps},
    sys::fault,
    sys::fs_error::{fs_err, gone_ok, FsError},
};

use super::{
    diff::{ObjectOps, Removal},
    plan::CidrEntry,
};

pub(crate) fn key_of<K: aya::Pod>(e: &CidrEntry<K>) -> Key<K> {
    Key::new(e.prefix_len, e.data)
}

/// `Ok(None)` for a missing key.
/// Make the removals under one object; returns what failed. An entry already gone is
/// not a failure.
pub(crate) fn remove(
    obj: &ObjectPins,
    maps: &mut NodeMaps,
    cookie: NetnsCookie,
    removals: &[Removal],
) -> Vec<String> {
    let pod = obj.pod(cookie);
    let mut failures = Vec::new();
    for removal in removals {
        let (what, outcome) = match removal {
            Removal::Detach(hook) => {
                let path = pod.link(hook);
                let outcome = unpinned(crate::store::pins::unpin_link(&path));
                (format!("link {}", path.display()), outcome)
            }
            Removal::Config => ("POD_CONFIG".into(), gone(maps.pod_config.remove(&cookie))),
            Removal::Counters => ("COUNTERS".into(), gone(maps.counters.remove(&cookie))),
            Removal::Port(key) => (
                format!("PORT_SETS {key:?}"),
                gone(maps.port_sets.remove(key)),
            ),
            Removal::Cidr4(entry) => (
                format!("CIDRS_V4 {entry:?}"),
                gone(maps.cidrs_v4.remove(&key_of(entry))),
            ),
            Removal::Cidr6(entry) => (
                format!("CIDRS_V6 {entry:?}"),
                gone(maps.cidrs_v6.remove(&key_of(entry))),
            ),
            Removal::Addr(key) => (
                format!("POD_BY_ADDR {key:?}"),
                gone(maps.pod_by_addr.remove(key)),
            ),
            Removal::Listener(key) => (
                format!("LISTENERS {key:?}"),
                gone(maps.listeners.remove(key)),
            ),
            Removal::Connection(key) => (
                format!("ORIG_DST_BY_CONN {key:?}"),
                gone(maps.orig_dst_by_conn.remove(key)),
            ),
        };
        fault::step("a removal");
        if let Err(err) = outcome {
            failures.push(format!(
                "removing {what} of pod {cookie} under object {}: {err}",
                obj.id()
            ));
        }
    }
    if let Err(err) = pod.clear_staged() {
        failures.push(fs_err("removing staged links in", pod.dir())(err).to_string());
    }
    // A pod directory (an earlier release's) goes once empty: the pod may keep other links.
    if let Err(err) = pod.remove_dir_if_empty() {
        failures.push(fs_err("removing", pod.dir())(err).to_string());
    }
    failures
}

/// A map entry removed, or already gone.
fn gone(result: Result<(), MapError>) -> Result<(), String> {
    match result {
        Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
        Err(MapError::SyscallError(err)) if err.io_error.kind() == io::ErrorKind::NotFound => {
            Ok(())
        }
        Err(err) => Err(err.to_string()),
    }
}

/// A pin removed, or already gone.
pub(crate) fn unpinned(result: io::Result<()>) -> Result<(), String> {
    gone_ok(result).map_err(|err| err.to_string())
}

/// Remove a pod from an object entirely, and the object once no pod uses it.
pub(crate) fn retire(ops: &ObjectOps, cookie: NetnsCookie, maps: &mut OpenMaps) -> Vec<String> {
    let mut failures = match maps.get(&ops.object) {
        Ok(maps) => remove(&ops.object, maps, cookie, &ops.removals),
        Err(err) => vec![err.to_string()],
    };
    if let Err(err) = collect_if_unused(&ops.object) {
        failures.push(err.to_string());
    }
    failures
}

/// Remove an object (programs, maps, empty dirs) once no pod and no node link uses it.
pub(crate) fn collect_if_unused(obj: &ObjectPins) -> Result<(), FsError> {
    // The node's object first (its `node/` directory, with or without links: daemon pods
    // may all have their programs at their own cgroups), and then the pods, which can be
    // thousands, need not be listed. Only `--uninstall` removes that directory.
    if obj.node().dir().exists() {
        return Ok(());
    }
    let pods = obj
        .has_pods()
        .map_err(fs_err("listing", &obj.links_dir()))?;
    if !pods {
        gone_ok(fs::remove_dir_all(obj.dir())).map_err(fs_err("removing", obj.dir()))?;
    }
    Ok(())
}
