//! The engine's error: what a set-up, a removal or an upgrade of pods can fail with.

use std::io;

use aya::maps::MapError;

use crate::{
    store::{ObjectError, OpenMapError},
    sys::fs_error::FsError,
};

use super::observe::ObserveError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error(transparent)]
    OpenMap(#[from] OpenMapError),
    #[error(transparent)]
    Observe(#[from] ObserveError),
    #[error(transparent)]
    Loopback(#[from] super::loopback::LoopbackError),
    #[error(transparent)]
    Copy(#[from] crate::store::growing::CopyError),
    #[error("writing {map}: {}", describe(source))]
    MapWrite { map: &'static str, source: MapError },
    #[error(
        "{map} is full: this pod's entries do not fit beside the other pods' on this node; \
         nothing was applied (a node of more pods needs `redirector daemon --max-pods`; \
         the other sizes are the `capacity` constants in redirector-common/src/maps.rs)"
    )]
    MapFull { map: &'static str },
    #[error("opening cgroup {path}: {source}")]
    Cgroup { path: String, source: io::Error },
    #[error("attaching {program} to {target}: {source}{}", blocked.as_ref().map(|b| format!(": {b}")).unwrap_or_default())]
    Attach {
        program: &'static str,
        target: String,
        source: io::Error,
        /// What refused it: a program attached at an ancestor cgroup.
        blocked: Option<crate::engine::neighbours::Blocking>,
    },
    #[error("{program} attaches to the pod's cgroup, but the plan has none")]
    NoCgroup { program: &'static str },
    #[error(
        "the node's programs read each pod's netns cookie from the cgroup they are attached at \
         (this kernel's sock_ops and getsockopt programs cannot call bpf_get_netns_cookie, \
         Linux 5.15), so they cannot be attached at {cgroup}, a cgroup of many pods: each pod \
         needs its own (give the pod's UID or cgroup)"
    )]
    SharedCgroup { cgroup: String },
    #[error("ambient pods need ztunnel's programs, which find a pod by its socket's network namespace: {why}")]
    AmbientUnsupported { why: String },
    #[error(
        "the node has no object loaded by a daemon (its `node/` directory under the pin root)"
    )]
    NoNodeObject,
    #[error(
        "{flag} needs ingress_ifindex in sk_lookup programs (Linux 5.17), which the node's \
         programs were loaded without (the kernel lacks it): nothing was applied"
    )]
    NeedsIngressIfindex { flag: &'static str },
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("{} removal(s) failed: {}", .0.len(), .0.join("; "))]
    Removals(Vec<String>),
}

pub(crate) fn write_err(map: &'static str) -> impl FnOnce(MapError) -> EngineError {
    move |source| match &source {
        // The kernel says E2BIG when a hash map or LPM trie has no room for a new key.
        MapError::SyscallError(err)
            if matches!(
                err.io_error.raw_os_error(),
                Some(libc::E2BIG | libc::ENOSPC)
            ) =>
        {
            EngineError::MapFull { map }
        }
        _ => EngineError::MapWrite { map, source },
    }
}

/// A map error with the kernel's reason (aya's message names only the call).
fn describe(err: &MapError) -> String {
    match err {
        MapError::SyscallError(e) => format!("{}: {}", e.call, e.io_error),
        other => other.to_string(),
    }
}
