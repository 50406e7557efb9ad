//! Other eBPF programs on a pod's cgroup path: a socket load-balancer (Cilium's, Calico's)
//! attached at an ancestor of the pods' cgroups. Attached there without
//! `BPF_F_ALLOW_MULTI` (Cilium before 1.14 did so at the cgroup root), it makes the kernel
//! refuse every attachment below it for that hook with a bare "Operation not permitted";
//! this names the attachment instead.

use std::{
    collections::{HashMap, HashSet},
    fmt, fs,
    os::{fd::AsFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use crate::sys::bpf_sys;
use crate::{
    store::{
        programs::{AttachTarget, POD_PROGRAMS},
        ObjectPins,
    },
    sys::bpf_sys::{BPF_F_ALLOW_MULTI, BPF_F_ALLOW_OVERRIDE},
    sys::fs_kind::is_cgroup2_dir,
};

/// A program attached at an ancestor that keeps the kernel from attaching below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocking {
    pub cgroup: String,
    pub program_id: u32,
    pub program_name: String,
}

impl fmt::Display for Blocking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cgroup {} has program {} (id {}) attached for this hook without BPF_F_ALLOW_MULTI, so the kernel refuses every attachment in the cgroups below it; attach that program with BPF_F_ALLOW_MULTI (as a BPF link), or detach it (Cilium's socket load-balancer attaches so from 1.14 on)",
            self.cgroup, self.program_name, self.program_id
        )
    }
}

/// The attachment at an ancestor of `cgroup` that makes the kernel refuse an attachment
/// for `attach_type` at `cgroup`: as the kernel decides it, the nearest ancestor with a
/// program for that hook, when it was attached with neither `BPF_F_ALLOW_MULTI` nor
/// `BPF_F_ALLOW_OVERRIDE`. Read only after an attachment failed.
pub fn blocking_ancestor(cgroup: &Path, attach_type: u32) -> Option<Blocking> {
    for dir in cgroup.ancestors().skip(1) {
        if !is_cgroup2_dir(dir) {
            return None;
        }
        let file = fs::File::open(dir).ok()?;
        let (flags, ids) = bpf_sys::cgroup_programs(file.as_fd(), attach_type).ok()?;
        let Some(&program_id) = ids.first() else {
            continue;
        };
        if flags & (BPF_F_ALLOW_MULTI | BPF_F_ALLOW_OVERRIDE) != 0 {
            return None;
        }
        return Some(Blocking {
            cgroup: dir.display().to_string(),
            program_id,
            program_name: program_name(program_id),
        });
    }
    None
}

/// The name a program was loaded with, or "?" when it cannot be read.
fn program_name(id: u32) -> String {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == id)
        .and_then(|p| p.name_as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// A program on a pod's cgroup path that is not one of the given object's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Foreign {
    pub cgroup: String,
    pub hook: &'static str,
    pub program_id: u32,
    pub program_name: String,
    /// Attached with `BPF_F_ALLOW_MULTI` (else it blocks attachments below it).
    pub multi: bool,
}

impl fmt::Display for Foreign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} {} (id {}, {})",
            self.cgroup,
            self.hook,
            self.program_name,
            self.program_id,
            if self.multi {
                "multi"
            } else {
                "exclusive: blocks attachments below"
            }
        )
    }
}

/// The programs attached at `cgroup` and its ancestors for redirector's cgroup hooks whose
/// ids are not in `ours`, nearest cgroup first.
pub fn foreign_on_path(cgroup: &Path, ours: &HashSet<u32>) -> Vec<Foreign> {
    let mut found = Vec::new();
    for dir in cgroup.ancestors().take_while(|d| is_cgroup2_dir(d)) {
        let Ok(file) = fs::File::open(dir) else {
            continue;
        };
        let hooks = POD_PROGRAMS
            .iter()
            .filter(|spec| spec.target == AttachTarget::Cgroup);
        for spec in hooks {
            let Ok((flags, ids)) = bpf_sys::cgroup_programs(file.as_fd(), spec.attach_type) else {
                continue;
            };
            for id in ids.into_iter().filter(|id| !ours.contains(id)) {
                found.push(Foreign {
                    cgroup: dir.display().to_string(),
                    hook: spec.hook,
                    program_id: id,
                    program_name: program_name(id),
                    multi: flags & BPF_F_ALLOW_MULTI != 0,
                });
            }
        }
    }
    found
}

/// The ids of `object`'s programs: redirector's own, on any hook.
pub fn object_program_ids(object: &ObjectPins) -> HashSet<u32> {
    POD_PROGRAMS
        .iter()
        .filter_map(|spec| aya::programs::ProgramInfo::from_pin(object.program(spec.function)).ok())
        .map(|info| info.id())
        .collect()
}

/// The paths of the cgroups with the `wanted` inodes, from one walk of the cgroup2 tree.
pub fn cgroup_paths(wanted: &HashSet<u64>) -> HashMap<u64, PathBuf> {
    let mut found = HashMap::new();
    let Ok(mount) = crate::sys::cgroup::cgroup2_mount() else {
        return found;
    };
    crate::sys::cgroup::walk_cgroups(&mount, |dir| {
        if let Ok(meta) = fs::metadata(dir) {
            if wanted.contains(&meta.ino()) {
                found.insert(meta.ino(), dir.to_path_buf());
            }
        }
        found.len() < wanted.len()
    });
    found
}
