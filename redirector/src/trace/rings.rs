//! Reading the decisions the programs log: each pinned object's aya-log ring buffer,
//! opened through one of its programs by id, so this works beside whoever loaded it.

use std::{future::Future, io, sync::Arc, time::Duration};

use aya::programs::ProgramInfo;
use aya_log::EbpfLogger;
use redirector_common::TraceRecord;
use tokio::io::{unix::AsyncFd, Interest};

use super::{parse, Tracer};
use crate::store::PinRoot;

/// A program that logs; every program of an object writes to the same ring.
const LOGGING_PROGRAM: &str = "capture_connect4";

#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("listing the objects under {path}: {source}")]
    Objects { path: String, source: io::Error },
    #[error("opening the program {path}: {source}")]
    Program {
        path: String,
        source: aya::programs::ProgramError,
    },
    #[error("opening the log ring of object {object}: {source}")]
    Open {
        object: String,
        source: aya_log::Error,
    },
    #[error("watching a log ring: {0}")]
    Watch(io::Error),
    #[error("refreshing the trace switch: {0}")]
    Refresh(#[from] super::TraceError),
}

/// Where decisions go: each record aya-log reads that is a decision.
#[derive(Clone)]
pub struct DecisionSink(Arc<dyn Fn(TraceRecord) + Send + Sync>);

impl DecisionSink {
    pub fn new(f: impl Fn(TraceRecord) + Send + Sync + 'static) -> Self {
        DecisionSink(Arc::new(f))
    }
}

impl log::Log for DecisionSink {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        if let Some(decision) = parse(&record.args().to_string()) {
            (self.0)(decision);
        }
    }

    fn flush(&self) {}
}

/// One object's log ring.
pub type Ring = EbpfLogger<DecisionSink>;

/// Every object's log ring under `root`, each record that is a decision handed to `sink`.
pub fn open_rings(root: &PinRoot, sink: &DecisionSink) -> Result<Vec<Ring>, RingError> {
    let objects = root.objects().map_err(|source| RingError::Objects {
        path: root.path().display().to_string(),
        source,
    })?;
    let mut rings = Vec::new();
    for object in &objects {
        let path = object.program(LOGGING_PROGRAM);
        let id = ProgramInfo::from_pin(&path)
            .map_err(|source| RingError::Program {
                path: path.display().to_string(),
                source,
            })?
            .id();
        rings.push(
            EbpfLogger::init_from_id_with_logger(id, sink.clone()).map_err(|source| {
                RingError::Open {
                    object: object.id().to_string(),
                    source,
                }
            })?,
        );
    }
    Ok(rings)
}

/// Hand decisions to the rings' sink as they arrive, until `stop` completes; set the
/// tracer's switch again every second (a re-applied pod, new pods).
pub async fn follow(
    tracer: &Tracer,
    rings: Vec<Ring>,
    stop: impl Future<Output = ()>,
) -> Result<(), RingError> {
    let mut readers = tokio::task::JoinSet::new();
    for ring in rings {
        // SAFETY: the logger owns its ring buffer's fd and keeps it open, unchanged, for
        // its whole life, which the AsyncFd holding it bounds.
        let mut fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| RingError::Watch(e.into_parts().1))?;
        readers.spawn(async move {
            loop {
                let mut ready = fd.readable_mut().await?;
                ready.get_inner_mut().flush();
                ready.clear_ready();
            }
            #[allow(unreachable_code)]
            Ok::<(), io::Error>(())
        });
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
