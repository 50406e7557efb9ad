//! The decision trace: one aya-log record per decision of a pod whose config carries
//! [`pod_flags::TRACE`] (set by `redirector trace`). Other pods pay one bit test on a
//! config already read.
//!
//! Every record goes through the single non-inlined [`emit`], with one argument (the
//! record's bytes): the log's code exists once per program and stays small, because the
//! verifier walks it again for each path that logs.

use aya_ebpf::{bindings::bpf_sk_lookup, macros::map, maps::PerCpuArray};
use aya_log_ebpf::info;
use redirector_common::{
    kernel_abi::IPPROTO_TCP,
    pod_flags,
    trace::{DST_V6, INBOUND, SRC_V6},
    NetnsCookie, PodConfig, RawIp, Reason, TraceRecord, AF_INET6,
};

const RECORD_SIZE: usize = size_of::<TraceRecord>();

/// This CPU's record being logged. It lives here, not on the stack: a program's stack
/// (512 bytes, its own and the log's together) has little room left in connect6.
#[map]
static RECORD: PerCpuArray<TraceRecord> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub fn on(cfg: &PodConfig) -> bool {
    cfg.flags & pod_flags::TRACE != 0
}

/// Log an inbound decision. The addresses are read again from the context here rather than
/// handed over: `sk_lookup`'s own `IpAddr`s, kept live until its end, make the compiler
/// spill registers the verifier sees as uninitialised.
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
    log(TraceRecord {
        netns_cookie: netns_cookie.get(),
        uid: 0,
        gid: 0,
        src,
        dst,
        dst_port: local_port as u16,
        to,
        reason: reason as u8,
        direction: INBOUND,
        protocol: IPPROTO_TCP,
        families,
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

/// Log `record`.
#[inline(always)]
pub fn log(record: TraceRecord) {
    if let Some(slot) = RECORD.get_ptr_mut(0) {
        // SAFETY: this CPU's slot, which nothing else uses while the program runs.
        let slot = unsafe { &mut *slot };
        *slot = record;
        emit(slot);
    }
}

/// The aya-log record: `decision <hex bytes>`, parsed back by `redirector trace`. The macro
/// takes only a literal: its prefix is `redirector_common::trace::TRACE_PREFIX`.
#[inline(never)]
fn emit(record: &TraceRecord) {
    // SAFETY: `TraceRecord` is `repr(C)` plain data without padding (bytemuck proves it on
    // the user side), so its bytes are all initialised.
    let bytes = unsafe { &*(record as *const TraceRecord).cast::<[u8; RECORD_SIZE]>() };
    info!(record, "decision {:x}", bytes);
}
