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
pub use maps::*;
pub use reason::Reason;
pub use trace::TraceRecord;
