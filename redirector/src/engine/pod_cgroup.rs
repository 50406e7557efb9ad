//! Node mode's programs attached at one pod's own cgroup instead of the node cgroup, so
//! that a pod the node does not capture runs none of them. Attached with BPF_PROG_ATTACH
//! and `BPF_F_ALLOW_MULTI`, with no link and no pin: the attachment lives and dies with the
//! cgroup, costs about a tenth of a pinned link's kernel memory (0.6–0.7 KiB for six
//! programs against 6.7–9.9 KiB as links, docs/design.md), and is found again by asking the
//! cgroup (BPF_PROG_QUERY) for the object's program ids.

use std::{
    fs,
    os::fd::{AsFd, OwnedFd},
    path::Path,
};

use redirector_common::NetnsCookie;

use crate::sys::bpf_sys;
use crate::{
    engine::error::EngineError,
    store::{
        cgroup_cookie::CookieStamps,
        open_program,
        programs::{is_dns, ProgramSpec, NODE_PROGRAMS},
        ObjectPins,
    },
};

/// The cgroup's directory, open, for the bpf(2) commands.
fn open_cgroup(cgroup: &Path) -> Result<fs::File, EngineError> {
    fs::File::open(cgroup).map_err(|source| EngineError::Cgroup {
        path: cgroup.display().to_string(),
        source,
    })
}

/// The cgroup's directory, open, or `None` when it is gone (and its attachments with it).
fn open_cgroup_if_there(cgroup: &Path) -> Result<Option<fs::File>, EngineError> {
    match open_cgroup(cgroup) {
        Err(EngineError::Cgroup { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        opened => opened.map(Some),
    }
}

/// A program of the object: its pinned program, open, and its id.
struct Program {
    spec: &'static ProgramSpec,
    fd: OwnedFd,
    id: u32,
    /// Loaded as the variant that reads the pod's cookie from its cgroup.
    reads_cookie: bool,
}

/// An object's node programs, open: opened once for many pods (the daemon keeps them; an
/// upgrade opens each object's once for all its pods).
pub struct NodePrograms {
    programs: Vec<Program>,
    /// The object's `POD_COOKIE`, when a program reads it.
    stamps: Option<CookieStamps>,
}

impl NodePrograms {
    pub fn open(object: &ObjectPins) -> Result<Self, EngineError> {
        let programs: Vec<Program> = NODE_PROGRAMS
            .iter()
            .map(|spec| {
                let fd = open_program(object, spec.function)?;
                let (id, _) = bpf_sys::program_id_and_name(fd.as_fd()).map_err(|e| {
                    crate::sys::fs_error::FsError::new(
                        "reading the program",
                        object.program(spec.function).display(),
                        e,
                    )
                })?;
                let reads_cookie = object.reads_cookie_from_cgroup(spec);
                Ok(Program {
                    spec,
                    fd,
                    id,
                    reads_cookie,
                })
            })
            .collect::<Result<_, EngineError>>()?;
        let stamps = if programs.iter().any(|p| p.reads_cookie) {
            Some(CookieStamps::open(object)?)
        } else {
            None
        };
        Ok(NodePrograms { programs, stamps })
    }

    /// Stamp `cookie` for `program`, just attached at `cgroup`, if it reads it.
    fn stamp(
        &self,
        program: &Program,
        file: &fs::File,
        cgroup: &Path,
        cookie: NetnsCookie,
    ) -> Result<(), EngineError> {
        match &self.stamps {
            Some(stamps) if program.reads_cookie => stamps
                .write(file, program.spec.attach_type, cookie)
                .map_err(|source| attach_err(program, cgroup, source)),
            _ => Ok(()),
        }
    }
}

/// Whether `program` is attached directly at the cgroup `file` (at `path`).
fn attached_at(file: &fs::File, path: &Path, program: &Program) -> Result<bool, EngineError> {
    let (_, ids) = bpf_sys::cgroup_programs(file.as_fd(), program.spec.attach_type)
        .map_err(|source| attach_err(program, path, source))?;
    Ok(ids.contains(&program.id))
}

fn attach_err(program: &Program, cgroup: &Path, source: std::io::Error) -> EngineError {
    EngineError::Attach {
        program: program.spec.function,
        target: cgroup.display().to_string(),
        source,
        blocked: None,
    }
}

/// The hooks of `object`'s node programs attached at `cgroup`.
pub fn attached_hooks(
    programs: &NodePrograms,
    cgroup: &Path,
) -> Result<Vec<&'static str>, EngineError> {
    let file = open_cgroup(cgroup)?;
    let mut hooks = Vec::new();
    for program in &programs.programs {
        if attached_at(&file, cgroup, program)? {
            hooks.push(program.spec.hook);
        }
    }
    Ok(hooks)
}

/// Whether a pod gets `spec` at its cgroup: the UDP DNS programs only when its DNS is
/// captured (`dns`), as an init container's pod gets them.
pub fn wanted(spec: &ProgramSpec, dns: bool) -> bool {
    dns || !is_dns(spec)
}

/// Attach the node programs at the pod's `cgroup` — the UDP DNS ones only when the pod's
/// DNS is captured (`dns`), as an init container's pod gets them — each where it is not
/// attached already; the hooks attached now. On failure those are detached again, so a
/// pod is never left with part of the programs (half its connections captured). `cookie`
/// is the pod's, stamped for the programs that read it from the cgroup.
pub fn attach(
    programs: &NodePrograms,
    cgroup: &Path,
    dns: bool,
    cookie: NetnsCookie,
) -> Result<Vec<&'static str>, EngineError> {
    let file = open_cgroup(cgroup)?;
    let mut done: Vec<&Program> = Vec::new();
    let result = (|| {
        for program in &programs.programs {
            let wanted = wanted(program.spec, dns);
            let attached = attached_at(&file, cgroup, program)?;
            if !wanted && attached {
                // DNS capture switched off since: that program goes.
                bpf_sys::prog_detach(program.fd.as_fd(), file.as_fd(), program.spec.attach_type)
                    .map_err(|source| attach_err(program, cgroup, source))?;
            }
            if !wanted || attached {
                continue;
            }
            bpf_sys::prog_attach(
                program.fd.as_fd(),
                file.as_fd(),
                program.spec.attach_type,
                None,
            )
            .map_err(|source| EngineError::Attach {
                program: program.spec.function,
                target: cgroup.display().to_string(),
                blocked: crate::engine::apply::refused_by(
                    &source,
                    Some(cgroup),
                    program.spec.attach_type,
                ),
                source,
            })?;
            done.push(program);
            programs.stamp(program, &file, cgroup, cookie)?;
        }
        Ok(())
    })();
    if let Err(err) = result {
        for program in done {
            if let Err(undo) =
                bpf_sys::prog_detach(program.fd.as_fd(), file.as_fd(), program.spec.attach_type)
            {
                tracing::warn!(
                    "detaching {} from {} again: {undo}",
                    program.spec.function,
                    cgroup.display()
                );
            }
        }
        return Err(err);
    }
    Ok(done.iter().map(|p| p.spec.hook).collect())
}

/// Detach `object`'s node programs from the pod's `cgroup`; how many were attached. A
/// cgroup that is gone took its attachments with it: nothing to do.
pub fn detach(programs: &NodePrograms, cgroup: &Path) -> Result<usize, EngineError> {
    let Some(file) = open_cgroup_if_there(cgroup)? else {
        return Ok(0);
    };
    let mut detached = 0;
    for program in &programs.programs {
        if !attached_at(&file, cgroup, program)? {
            continue;
        }
        bpf_sys::prog_detach(program.fd.as_fd(), file.as_fd(), program.spec.attach_type)
            .map_err(|source| attach_err(program, cgroup, source))?;
        detached += 1;
    }
    Ok(detached)
}

/// Detach redirector's node programs from the pod's `cgroup`, whichever object they are
/// of, known by their names on their hooks: with no pins to name them (an uninstall done
/// half-way, an upgrade interrupted between two objects) they still go. How many.
pub fn detach_ours(cgroup: &Path) -> Result<usize, EngineError> {
    let Some(file) = open_cgroup_if_there(cgroup)? else {
        return Ok(0);
    };
    let failed = |spec: &ProgramSpec, source| EngineError::Attach {
        program: spec.function,
        target: cgroup.display().to_string(),
        source,
        blocked: None,
    };
    let mut detached = 0;
    for spec in &NODE_PROGRAMS {
        let (_, ids) = bpf_sys::cgroup_programs(file.as_fd(), spec.attach_type)
            .map_err(|source| failed(spec, source))?;
        for id in ids {
            let Ok(prog) = bpf_sys::program_by_id(id) else {
                continue; // gone meanwhile
            };
            let (_, name) = bpf_sys::program_id_and_name(prog.as_fd()).unwrap_or_default();
            // The kernel keeps 15 bytes of a name.
            if name.is_empty() || !spec.functions().any(|f| f.starts_with(&name)) {
                continue;
            }
            bpf_sys::prog_detach(prog.as_fd(), file.as_fd(), spec.attach_type)
                .map_err(|source| failed(spec, source))?;
            detached += 1;
        }
    }
    Ok(detached)
}

/// Put `new`'s programs in the place of `old`'s at the pod's `cgroup`, each in one step
/// (`BPF_F_REPLACE`: the hook never runs without one of them); how many were switched. On
/// failure the ones switched are switched back.
pub fn switch(
    old_set: &NodePrograms,
    new_set: &NodePrograms,
    cgroup: &Path,
) -> Result<usize, EngineError> {
    let file = open_cgroup(cgroup)?;
    let mut done: Vec<(&Program, &Program)> = Vec::new();
    let result = (|| {
        for (old, new) in old_set.programs.iter().zip(&new_set.programs) {
            if !attached_at(&file, cgroup, old)? {
                continue;
            }
            // The pod's cookie goes over to a program that reads it, read before the old
            // program's entry goes with it.
            let cookie = match &old_set.stamps {
                _ if !new.reads_cookie => None,
                Some(stamps) if old.reads_cookie => Some(
                    stamps
                        .read(&file, old.spec.attach_type)
                        .map_err(|source| attach_err(old, cgroup, source))?,
                ),
                _ => {
                    return Err(attach_err(
                        new,
                        cgroup,
                        std::io::Error::other(
                            "the program reads the pod's netns cookie from its cgroup, and the program it replaces did not keep it there",
                        ),
                    ))
                }
            };
            bpf_sys::prog_attach(
                new.fd.as_fd(),
                file.as_fd(),
                new.spec.attach_type,
                Some(old.fd.as_fd()),
            )
            .map_err(|source| attach_err(new, cgroup, source))?;
            done.push((old, new));
            if let Some(cookie) = cookie {
                new_set.stamp(new, &file, cgroup, cookie)?;
            }
        }
        Ok(())
    })();
    if let Err(err) = result {
        for (old, new) in done {
            let back = bpf_sys::prog_attach(
                old.fd.as_fd(),
                file.as_fd(),
                old.spec.attach_type,
                Some(new.fd.as_fd()),
            );
            if let Err(undo) = back {
                tracing::warn!(
                    "switching {} back at {}: {undo}",
                    old.spec.function,
                    cgroup.display()
                );
            }
        }
        return Err(err);
    }
    Ok(done.len())
}
