//! The daemon as ztunnel's node agent (`--ztunnel-socket`): the ZDS agent, told of the
//! node's pods from the records, so that a daemon restarted or upgraded sends ztunnel the
//! same pods again and ztunnel keeps proxying them.

use std::{path::Path, sync::Arc, time::Duration};

use tracing::info;

use crate::{
    pods::records::Records,
    store::PinRoot,
    zds::{
        agent::{Agent, Bound, Enrolled, Workload},
        seqpacket::Peer,
    },
};

/// How long ztunnel has to answer a request (and, once more, to connect): an enrollment
/// not acked by then fails, and the pod's start is retried.
pub const ACK_WITHIN: Duration = Duration::from_secs(5);

/// The pods of the records whose mesh has a ztunnel, and the node's pins, where ztunnel's
/// programs are.
struct RecordedPods {
    records: Records,
    root: PinRoot,
}

impl Enrolled for RecordedPods {
    fn snapshot(&self) -> Result<Vec<Workload>, String> {
        let records = self.records.all().map_err(|e| e.to_string())?;
        Ok(records
            .iter()
            .filter_map(|record| crate::mesh::ztunnel_workload(&record.flags(), &record.netns))
            .collect())
    }

    /// ztunnel's programs attached at its cgroup, before it opens its sockets in the pods'
    /// namespaces.
    fn connected(&self, peer: Peer) -> Result<(), String> {
        attach_at(&self.root, peer)
    }
}

/// Attach ztunnel's programs at the cgroup of process `peer`.
pub fn attach_at(root: &PinRoot, peer: Peer) -> Result<(), String> {
    let cgroup = crate::sys::cgroup::cgroup_of_pid(peer.pid).map_err(|e| e.to_string())?;
    let attached = crate::engine::ztunnel_cgroup::attach(root, &cgroup).map_err(|e| {
        format!(
            "attaching its programs at its cgroup {}: {e}",
            cgroup.display()
        )
    })?;
    if !attached.is_empty() {
        info!(
            "ZDS: ztunnel's programs attached at {} ({})",
            cgroup.display(),
            attached.join(", ")
        );
    }
    Ok(())
}

/// Listens for ztunnel at `socket`, before the start-up: a path that cannot be a socket
/// fails the start having changed nothing.
pub fn bind(socket: &Path) -> anyhow::Result<Bound> {
    use anyhow::Context as _;
    let context = || {
        format!(
            "listening for ztunnel at --ztunnel-socket {}",
            socket.display()
        )
    };
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).with_context(context)?;
    }
    Bound::bind(socket).with_context(context)
}

/// Serves ztunnel the node's pods, as the records have them.
pub fn serve(bound: Bound, records: Records, root: PinRoot) -> Agent {
    bound.serve(Arc::new(RecordedPods { records, root }), ACK_WITHIN)
}
