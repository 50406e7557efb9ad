//! The decision trace: one record in the object's trace ring per decision of a pod whose
//! config carries [`pod_flags::TRACE`] (set by `redirector trace`). Other pods pay one bit
//! test on a config already read.
//!
//! Every record goes through the single non-inlined [`emit`]: the ring's code exists once
//! per program, and the verifier walks one call for each path that traces.

use aya_ebpf::{
    bindings::bpf_sk_lookup,
    macros::map,
    maps::{PerCpuArray, RingBuf},
};
use redirector_common::{
    kernel_abi::IPPROTO_TCP,
    pod_flags,
    trace::{self, DST_V6, INBOUND, SRC_V6},
    NetnsCookie, PodConfig, RawIp, Reason, TraceRecord, AF_INET6,
};

/// The decisions of traced pods, read by `redirector trace`
/// (`redirector_common::names::TRACE`).
#[map]
static TRACE: RingBuf = RingBuf::with_byte_size(trace::RING_BYTES, 0);

/// This CPU's record being traced. It lives here, not on the stack: a program's stack
/// (512 bytes) has little room left in connect6.
#[map]
static RECORD: PerCpuArray<TraceRecord> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub fn on(cfg: &PodConfig) -> bool {
    cfg.flags & pod_flags::TRACE != 0
}

/// Trace an inbound decision. The addresses are read again from the context here rather
/// than handed over: `sk_lookup`'s own `IpAddr`s, kept live until its end, make the
/// compiler spill registers the verifier sees as uninitialised.
#[inline(never)]
pub fn inbound(lk: &bpf_sk_lookup, netns_cookie: NetnsCookie, reason: Reason, to: u16) {
    // Every field read on its own, at a constant offset: the verifier refuses a context
    // read through a computed offset, which is what a choice between fields compiles to.
    // SAFETY: `lk` is the program's context; each field is readable in sk_lookup.
    let (family, remote4, local4, remote6, local6, local_port) = unsafe {
        use core::ptr::read_volatile;
        (
            read_volatile(&lk.family),
            read_volatile(&lk.remote_ip4),
            read_volatile(&lk.local_ip4),
            read_volatile(&lk.remote_ip6),
            read_volatile(&lk.local_ip6),
            read_volatile(&lk.local_port),
        )
    };
    let (src, dst, families) = if family == u32::from(AF_INET6) {
        (RawIp(remote6), RawIp(local6), SRC_V6 | DST_V6)
    } else {
        (RawIp::from_v4_be(remote4), RawIp::from_v4_be(local4), 0)
    };
    write(TraceRecord {
        format: trace::FORMAT,
        reason: reason as u8,
        direction: INBOUND,
        protocol: IPPROTO_TCP,
        dst_port: local_port as u16,
        to,
        netns_cookie: netns_cookie.get(),
        uid: 0,
        gid: 0,
        src,
        dst,
        families,
        _reserved: [0; 7],
    });
}

/// A decision as the code after it sees it: its reason and port, written into this CPU's
/// record and read back. Each rule of a decision ends in its own constant reason and port,
/// and the verifier would walk everything after the decision (the redirect, the count, the
/// trace) once per rule; a value read from a map is unknown to it, so here those paths
/// meet and what follows is walked a few times (connect4's walk: 16,065 → 12,432
/// instructions). `None` only if this CPU had no slot, which an array of one entry always
/// has.
#[inline(always)]
pub fn settle(reason: Reason, port: u16) -> Option<(u8, u16)> {
    use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};
    let slot = RECORD.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot, which nothing else uses while the program runs; volatile,
    // so the values are read back from the map, not forwarded by the compiler.
    unsafe {
        write_volatile(addr_of_mut!((*slot).reason), reason as u8);
        write_volatile(addr_of_mut!((*slot).to), port);
        Some((
            read_volatile(addr_of!((*slot).reason)),
            read_volatile(addr_of!((*slot).to)),
        ))
    }
}

/// Trace `record`: into this CPU's slot, and from there into the ring.
#[inline(always)]
pub fn write(record: TraceRecord) {
    if let Some(slot) = RECORD.get_ptr_mut(0) {
        // SAFETY: this CPU's slot, which nothing else uses while the program runs.
        let slot = unsafe { &mut *slot };
        *slot = record;
        emit(slot);
    }
}

/// `record`'s bytes into the trace ring, as they are. A full ring (a reader too slow)
/// drops the record: the decision itself never waits on its trace.
#[inline(never)]
fn emit(record: &TraceRecord) {
    let _ = TRACE.output::<TraceRecord>(record, 0);
}
