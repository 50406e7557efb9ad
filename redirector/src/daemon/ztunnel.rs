//! The daemon as ztunnel's node agent (`--ztunnel-socket`): the ZDS agent, told of the
//! node's pods from the records, so that a daemon restarted or upgraded sends ztunnel the
//! same pods again and ztunnel keeps proxying them.

use std::{path::Path, sync::Arc, time::Duration};

use crate::{
    pods::records::Records,
    zds::agent::{Agent, Bound, Enrolled, Workload},
};

/// How long ztunnel has to answer a request (and, once more, to connect): an enrollment
/// not acked by then fails, and the pod's start is retried.
pub const ACK_WITHIN: Duration = Duration::from_secs(5);

/// The pods of the records whose mesh has a ztunnel.
struct RecordedPods(Records);

impl Enrolled for RecordedPods {
    fn snapshot(&self) -> Result<Vec<Workload>, String> {
        let records = self.0.all().map_err(|e| e.to_string())?;
        Ok(records
            .iter()
            .filter_map(|record| crate::mesh::ztunnel_workload(&record.flags(), &record.netns))
            .collect())
    }
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
pub fn serve(bound: Bound, records: Records) -> Agent {
    bound.serve(Arc::new(RecordedPods(records)), ACK_WITHIN)
}
