//! Daemon mode's node-level attachment: every cgroup program attached once at the node
//! cgroup (the cgroup2 root, or kubepods in Kubernetes), pinned, so that a pod needs only
//! its map entries and its network namespace's link.

use std::{
    fs, io,
    os::{fd::AsFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use crate::{
    apply::{collect_if_unused, ApplyError},
    fs_error::fs_err,
    store::{
        bpf_sys::{self, LinkTarget},
        ensure_loaded, open_program,
        programs::NODE_PROGRAMS,
        EbpfObject, NodeLock, ObjectId, ObjectPins, PinRoot,
    },
};

/// What [`attach_node`] found and did.
#[derive(Debug)]
pub struct NodeAttachment {
    pub object: ObjectId,
    pub cgroup: PathBuf,
    /// Hooks attached now (the others were already attached there).
    pub attached: Vec<&'static str>,
}

/// The object whose programs are attached at node level, if any.
pub fn node_object(root: &PinRoot) -> Result<Option<ObjectPins>, ApplyError> {
    if !root.path().exists() {
        return Ok(None);
    }
    for object in root
        .objects()
        .map_err(fs_err("listing", &root.objects_dir()))?
    {
        let node = object.node();
        if !node
            .hooks()
            .map_err(fs_err("listing", node.dir()))?
            .is_empty()
        {
            return Ok(Some(object));
        }
    }
    Ok(None)
}

/// Attach `object`'s cgroup programs at `cgroup`, loading the object if the node lacks it.
/// A hook already attached there is kept as it is; one attached elsewhere is moved by an
/// atomic swap of its pin. On failure, the links made by this call are removed again.
pub fn attach_node(
    root: &PinRoot,
    object: &EbpfObject,
    cgroup: &Path,
) -> Result<NodeAttachment, ApplyError> {
    let _lock = NodeLock::acquire(root)?;
    let cgroup_err = |source| ApplyError::Cgroup {
        path: cgroup.display().to_string(),
        source,
    };
    let cgroup_file = fs::File::open(cgroup).map_err(cgroup_err)?;
    let cgroup_id = cgroup_file.metadata().map_err(cgroup_err)?.ino();
    let (obj, _) = ensure_loaded(root, object)?;
    let node = obj.node();
    fs::create_dir_all(node.dir()).map_err(fs_err("creating", node.dir()))?;
    let mut attached = Vec::new();
    let result = (|| {
        for spec in &NODE_PROGRAMS {
            let pin = node.link(spec.hook);
            if bpf_sys::pinned_link_target(&pin).ok() == Some(LinkTarget::Cgroup(cgroup_id)) {
                continue;
            }
            let prog = open_program(&obj, spec.function)?;
            let link = bpf_sys::link_create(prog.as_fd(), cgroup_file.as_fd(), spec.attach_type)
                .map_err(|source| ApplyError::Attach {
                    program: spec.function,
                    target: cgroup.display().to_string(),
                    source,
                })?;
            let staging = node.staging_link(spec.hook);
            match fs::remove_file(&staging) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => {
                    return Err(fs_err("removing", &staging)(err).into())
                }
                _ => {}
            }
            bpf_sys::obj_pin(link.as_fd(), &staging).map_err(fs_err("pinning link", &staging))?;
            fs::rename(&staging, &pin).map_err(fs_err("replacing link", &pin))?;
            attached.push(spec.hook);
        }
        Ok(())
    })();
    if let Err(err) = result {
        for hook in &attached {
            let pin = node.link(hook);
            if let Err(undo) = fs::remove_file(&pin) {
                tracing::warn!("removing {}: {undo}", pin.display());
            }
        }
        return Err(err);
    }
    Ok(NodeAttachment {
        object: obj.id().clone(),
        cgroup: cgroup.to_path_buf(),
        attached,
    })
}

/// Remove the node-level links (the programs stop running for every pod that relied on
/// them), and the objects nothing uses any more. Returns the objects they were under.
pub fn detach_node(root: &PinRoot) -> Result<Vec<ObjectId>, ApplyError> {
    if !root.path().exists() {
        return Ok(Vec::new());
    }
    let _lock = NodeLock::acquire(root)?;
    let mut detached = Vec::new();
    for object in root
        .objects()
        .map_err(fs_err("listing", &root.objects_dir()))?
    {
        let node = object.node();
        let hooks = node.hooks().map_err(fs_err("listing", node.dir()))?;
        for hook in &hooks {
            let pin = node.link(hook);
            fs::remove_file(&pin).map_err(fs_err("unpinning link", &pin))?;
        }
        if node.dir().exists() {
            fs::remove_dir(node.dir()).map_err(fs_err("removing", node.dir()))?;
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
pub fn covering(root: &PinRoot, cgroup: &Path) -> Result<Option<ObjectPins>, ApplyError> {
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
