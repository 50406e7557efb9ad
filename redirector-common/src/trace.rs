//! The decision trace's record: what the eBPF programs write to their object's trace ring
//! ([`crate::names::TRACE`]) for each decision of a pod whose config carries
//! `pod_flags::TRACE`, and `redirector trace` reads.
//!
//! The ring carries these bytes as they are. Each record opens with its format
//! ([`FORMAT`]): an object stays pinned, and its programs keep writing, after the binary
//! that loaded it is replaced, so a reader must know which layout each record has. A
//! release that changes the layout, appended fields included, raises the format: a reader
//! refuses a record of a format it does not know rather than misread it.

use crate::RawIp;

/// The layout of [`TraceRecord`] this release writes and reads: its first byte.
pub const FORMAT: u8 = 1;

/// Bytes in a trace ring (a power of two times the page size, as the kernel requires):
/// 1,820 records waiting for the reader, each with the ring's 8-byte header.
pub const RING_BYTES: u32 = 1 << 17;

/// [`TraceRecord::direction`].
pub const OUTBOUND: u8 = 0;
pub const INBOUND: u8 = 1;

/// [`TraceRecord::families`] bits: the address is IPv6 (else IPv4, in `RawIp`'s first word).
pub const SRC_V6: u8 = 1 << 0;
pub const DST_V6: u8 = 1 << 1;

/// One decision, in format [`FORMAT`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct TraceRecord {
    /// [`FORMAT`]; at offset 0 in every format.
    pub format: u8,
    /// `Reason` discriminant.
    pub reason: u8,
    /// [`OUTBOUND`] or [`INBOUND`].
    pub direction: u8,
    /// IP protocol number (`kernel_abi::IPPROTO_TCP` or `IPPROTO_UDP`).
    pub protocol: u8,
    pub dst_port: u16,
    /// Where it was sent or steered to; 0 when it went through untouched (or was refused).
    pub to: u16,
    pub netns_cookie: u64,
    /// The caller's uid and gid (outbound; 0 inbound, which has no caller).
    pub uid: u32,
    pub gid: u32,
    /// Outbound: the socket's bound address; inbound: the peer. Words as the maps hold
    /// addresses (the programs copy them as they have them, which keeps the trace cheap to
    /// verify); [`TraceRecord::families`] says which family.
    pub src: RawIp,
    /// The original destination, as `src`.
    pub dst: RawIp,
    /// [`SRC_V6`] and [`DST_V6`].
    pub families: u8,
    /// Zero.
    pub _reserved: [u8; 7],
}

// Written by the eBPF programs (bpfel), read by user space: another layout fails to build.
const _: () = {
    use core::mem::offset_of;
    assert!(size_of::<TraceRecord>() == 64 && align_of::<TraceRecord>() == 8);
    assert!(offset_of!(TraceRecord, format) == 0 && offset_of!(TraceRecord, reason) == 1);
    assert!(offset_of!(TraceRecord, dst_port) == 4 && offset_of!(TraceRecord, to) == 6);
    assert!(offset_of!(TraceRecord, netns_cookie) == 8 && offset_of!(TraceRecord, uid) == 16);
    assert!(offset_of!(TraceRecord, src) == 24 && offset_of!(TraceRecord, dst) == 40);
    assert!(offset_of!(TraceRecord, families) == 56);
};
