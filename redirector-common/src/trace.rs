//! The decision trace's record: what the eBPF programs log (through aya-log) for each
//! decision of a pod whose config carries `pod_flags::TRACE`, and `redirector trace` reads.
//!
//! It travels as one hex-formatted byte argument: a single field keeps the log's code in
//! the programs small (each aya-log argument is more code for the verifier to walk, on
//! every path that logs), and bytemuck proves both sides read the same layout.

use crate::RawIp;

/// [`TraceRecord::direction`].
pub const OUTBOUND: u8 = 0;
pub const INBOUND: u8 = 1;

/// [`TraceRecord::families`] bits: the address is IPv6 (else IPv4, in `RawIp`'s first word).
pub const SRC_V6: u8 = 1 << 0;
pub const DST_V6: u8 = 1 << 1;

/// One decision.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct TraceRecord {
    pub netns_cookie: u64,
    /// The caller's uid and gid (outbound; 0 inbound, which has no caller).
    pub uid: u32,
    pub gid: u32,
    /// Outbound: the socket's bound address; inbound: the peer. Words as the maps hold
    /// addresses (the programs copy them as they have them, which keeps the log cheap to
    /// verify); [`TraceRecord::families`] says which family.
    pub src: RawIp,
    /// The original destination, as `src`.
    pub dst: RawIp,
    pub dst_port: u16,
    /// Where it was sent or steered to; 0 when it went through untouched (or was refused).
    pub to: u16,
    /// `Reason` discriminant.
    pub reason: u8,
    /// [`OUTBOUND`] or [`INBOUND`].
    pub direction: u8,
    /// IP protocol number (`kernel_abi::IPPROTO_TCP` or `IPPROTO_UDP`).
    pub protocol: u8,
    /// [`SRC_V6`] and [`DST_V6`].
    pub families: u8,
}

// Logged by the eBPF programs (bpfel), decoded by user space: another layout fails to build.
const _: () = {
    use core::mem::offset_of;
    assert!(size_of::<TraceRecord>() == 56 && align_of::<TraceRecord>() == 8);
    assert!(offset_of!(TraceRecord, uid) == 8 && offset_of!(TraceRecord, src) == 16);
    assert!(offset_of!(TraceRecord, dst) == 32 && offset_of!(TraceRecord, dst_port) == 48);
    assert!(offset_of!(TraceRecord, to) == 50 && offset_of!(TraceRecord, reason) == 52);
    assert!(offset_of!(TraceRecord, families) == 55);
};

/// The log line's format: one argument, the record's bytes in lower-case hex.
pub const TRACE_PREFIX: &str = "decision ";
