//! The decision trace: the switch that turns a pod's logging on (`switch`), the records as
//! printed (`decision`), and the reading of the objects' log rings (`rings`). Used by
//! `redirector trace` and by the daemon's `trace` request.

mod decision;
mod rings;
mod switch;

pub use decision::{parse, Decision};
pub use rings::{follow, open_rings, DecisionSink, Ring, RingError};
pub use switch::{clear_stale_locked, TraceError, Traced, Tracer};
