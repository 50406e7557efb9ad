//! The decision trace: the switch that turns a pod's tracing on (`switch`), the objects'
//! trace rings (`rings`), their records read back (`record`), and the decisions as printed
//! (`decision`). Used by `redirector trace` and by the daemon's `trace` request.

mod decision;
mod record;
mod rings;
mod switch;

pub use decision::Decision;
pub use record::{decode, RecordError};
pub use rings::{follow, open_rings, DecisionSink, EarlierObject, Ring, RingError, Rings};
pub use switch::{clear_stale_locked, TraceError, Traced, Tracer};
