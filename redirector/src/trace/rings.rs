//! Reading the decisions the programs trace: each pinned object's trace ring
//! ([`names::TRACE`]), opened by its pin, so this works beside whoever loaded the object.
//! An object an earlier release pinned has no such ring; its pods are named, not traced.

use std::{fmt, future::Future, io, sync::Arc, time::Duration};

use aya::maps::{MapData, RingBuf};
use redirector_common::{names, NetnsCookie, TraceRecord};
use tokio::io::{unix::AsyncFd, Interest};

use super::{record, Traced, Tracer};
use crate::store::{node_maps, NodeMaps, ObjectId, ObjectPins, OpenMapError, PinRoot};

#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("listing the objects under {path}: {source}")]
    Objects { path: String, source: io::Error },
    /// The map's path names the object.
    #[error("opening the trace ring: {0}")]
    Open(OpenMapError),
    #[error("listing the pods of an earlier release's object: {0}")]
    Pods(OpenMapError),
    #[error("{0}")]
    EarlierRelease(EarlierObject),
    #[error("watching a trace ring: {0}")]
    Watch(io::Error),
    #[error("refreshing the trace switch: {0}")]
    Refresh(#[from] super::TraceError),
}

/// Where decisions go.
#[derive(Clone)]
pub struct DecisionSink(Arc<dyn Fn(TraceRecord) + Send + Sync>);

impl DecisionSink {
    pub fn new(f: impl Fn(TraceRecord) + Send + Sync + 'static) -> Self {
        DecisionSink(Arc::new(f))
    }
}

/// One object's trace ring.
pub struct Ring {
    object: ObjectId,
    ring: RingBuf<MapData>,
}

/// An object pinned by a release before the trace ring: its programs write decisions in
/// aya-log's format to aya-log's ring, which this release does not read, so its pods are
/// not traced (their switch is left off). It goes once its pods are set up by this release.
#[derive(Debug)]
pub struct EarlierObject {
    pub object: ObjectId,
    pub pods: Vec<NetnsCookie>,
}

impl fmt::Display for EarlierObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pods: Vec<String> = self.pods.iter().map(|c| format!("netns:{c}")).collect();
        write!(
            f,
            "object {}, pinned by an earlier release, logs decisions in a format this release does not read: its pod(s) {} are not traced until set up again by this release (a daemon of this release moves the node's object when it starts; an init container's pod moves when the pod restarts)",
            self.object,
            pods.join(", ")
        )
    }
}

/// The trace rings under a pin root, and the objects without one that serve pods.
pub struct Rings {
    pub rings: Vec<Ring>,
    pub earlier: Vec<EarlierObject>,
}

impl Rings {
    /// Refuses to trace a single pod that an [`EarlierObject`] serves.
    pub fn check(&self, traced: Traced) -> Result<(), RingError> {
        let Traced::One(cookie) = traced else {
            return Ok(());
        };
        match self.earlier.iter().find(|e| e.pods.contains(&cookie)) {
            Some(earlier) => Err(RingError::EarlierRelease(EarlierObject {
                object: earlier.object.clone(),
                pods: vec![cookie],
            })),
            None => Ok(()),
        }
    }
}

/// The pods configured in `object`.
fn pods_of(object: &ObjectPins) -> Result<Vec<NetnsCookie>, RingError> {
    let maps = NodeMaps::open(object).map_err(RingError::Pods)?;
    let mut pods: Vec<NetnsCookie> = maps.pod_config.keys().filter_map(Result::ok).collect();
    pods.sort();
    Ok(pods)
}

/// Every object's trace ring under `root`. Opening a ring consumes nothing: a tracer
/// refused because another one runs takes no record from it.
pub fn open_rings(root: &PinRoot) -> Result<Rings, RingError> {
    let objects = root.objects().map_err(|source| RingError::Objects {
        path: root.path().display().to_string(),
        source,
    })?;
    let mut rings = Rings {
        rings: Vec::new(),
        earlier: Vec::new(),
    };
    for object in &objects {
        if !object.has_trace_ring() {
            // One without pods (about to be collected) has nothing to say.
            let pods = pods_of(object)?;
            if !pods.is_empty() {
                rings.earlier.push(EarlierObject {
                    object: object.id().clone(),
                    pods,
                });
            }
            continue;
        }
        let ring = node_maps::open(object, names::TRACE).map_err(RingError::Open)?;
        rings.rings.push(Ring {
            object: object.id().clone(),
            ring,
        });
    }
    Ok(rings)
}

/// Read one ring as it fills, each record handed to `sink`; a record this release cannot
/// read is skipped, the first one said in the log.
async fn read(mut fd: AsyncFd<Ring>, sink: DecisionSink) -> io::Result<()> {
    let mut refused = 0u64;
    loop {
        let mut ready = fd.readable_mut().await?;
        let ring = ready.get_inner_mut();
        while let Some(item) = ring.ring.next() {
            match record::decode(&item) {
                Ok(record) => (sink.0)(record),
                Err(err) => {
                    refused += 1;
                    if refused == 1 {
                        tracing::warn!(
                            "trace ring of object {}: {err}; skipping such records",
                            ring.object
                        );
                    }
                }
            }
        }
        ready.clear_ready();
    }
}

/// Hand decisions to `sink` as they arrive, until `stop` completes; set the tracer's
/// switch again every second (a re-applied pod, new pods).
pub async fn follow(
    tracer: &Tracer,
    rings: Vec<Ring>,
    sink: DecisionSink,
    stop: impl Future<Output = ()>,
) -> Result<(), RingError> {
    let mut readers = tokio::task::JoinSet::new();
    for ring in rings {
        // SAFETY: the ring owns its map's fd and keeps it open, unchanged, for its whole
        // life, which the AsyncFd holding it bounds.
        let fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| RingError::Watch(e.into_parts().1))?;
        readers.spawn(read(fd, sink.clone()));
    }
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return Ok(()),
            Some(ended) = readers.join_next() => {
                ended
                    .map_err(|e| RingError::Watch(io::Error::other(e)))?
                    .map_err(RingError::Watch)?;
            }
            _ = tick.tick() => tracer.refresh()?,
        }
    }
}

impl std::os::fd::AsRawFd for Ring {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.ring.as_raw_fd()
    }
}
