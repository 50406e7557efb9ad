//! Types and decision logic shared by the redirector eBPF programs and user space.
//!
//! Everything that crosses the kernel/user boundary is defined here once: map keys and
//! values are `#[repr(C)]` with explicit padding, and the outbound decision that the
//! kernel executes is the same function that `redirector` uses to plan and explain.
#![no_std]

pub mod decision;
pub mod identity;
pub mod kernel_abi;
pub mod maps;
pub mod reason;
pub mod trace;

pub use decision::{
    decide_inbound, decide_outbound, InboundAttempt, OutboundAttempt, PodLookups, Protocol,
    Verdict, DNS_CAPTURE_PORT,
};
pub use identity::NetnsCookie;

/// The layout of what user space writes for the programs to read — map keys and values —
/// and of the daemon's pod records. A release that changes either raises it. A pinned
/// object and each record carry the format they were written in, so that a plugin or
/// daemon of an older release never writes a layout the pinned programs do not read.
pub const FORMAT: u32 = 1;
pub use maps::*;
pub use reason::Reason;
pub use trace::TraceRecord;
