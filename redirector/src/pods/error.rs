//! Why a pod was not set up, checked or removed.

use std::path::PathBuf;

use redirector_common::NetnsCookie;

use crate::{engine::error::EngineError, mesh::MeshError, sys::fs_error::FsError};

#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// The pod's flags in their mesh's dialect: the message names the flag and the value.
    #[error(transparent)]
    Flags(#[from] MeshError),
    /// The node holds a newer format than this release writes: a newer release will set
    /// the pod up (CNI answers "try again later").
    #[error("{0}")]
    NewerFormat(String),
    /// The pod's namespace: opening it, reading its addresses, its loopback route.
    #[error("{0}")]
    Namespace(String),
    #[error("setting up pod netns {cookie}: {source}")]
    Apply {
        cookie: NetnsCookie,
        source: Box<EngineError>,
    },
    #[error(transparent)]
    Engine(Box<EngineError>),
    #[error(transparent)]
    Records(#[from] FsError),
    #[error("{path} is another network namespace now (cookie {now}, the pod's was {was})")]
    NamespaceReused {
        path: PathBuf,
        now: NetnsCookie,
        was: u64,
    },
    #[error(
        "the pod runs in cgroup {cgroup}, outside the node cgroup {node}: none of the node's programs runs on its sockets"
    )]
    OutsideNodeCgroup { cgroup: PathBuf, node: String },
    #[error("the installed state differs from the pod's plan")]
    Differs,
    /// The pod's own cgroup is not known and there is no node cgroup to attach at.
    #[error("{0}")]
    NoCgroup(String),
    #[error("{attached} of the node's programs are attached at the pod's cgroup {cgroup}")]
    NotAttached { cgroup: PathBuf, attached: usize },
    #[error("the pod relies on the programs at the node cgroup, and none is attached there")]
    NoNodeLinks,
}

// Boxed: the engine's error is large, and every result of this module carries it.
impl From<EngineError> for PodError {
    fn from(err: EngineError) -> Self {
        PodError::Engine(Box::new(err))
    }
}
