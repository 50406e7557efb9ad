//! The decision trace: one aya-log record per decision of a pod whose config carries
//! [`pod_flags::TRACE`] (set by `redirector trace`). Other pods pay one bit test on a
//! config already read.
//!
//! Every record goes through the single non-inlined [`emit`], with one argument (the
//! record's bytes): the log's code exists once per program and stays small, because the
//! verifier walks it again for each path that logs.

use core::net::IpAddr;

use aya_ebpf::{bindings::bpf_sk_lookup, macros::map, maps::PerCpuArray};
use aya_log_ebpf::info;
use redirector_common::{
    kernel_abi::V4_MAPPED_WORD, pod_flags, trace::INBOUND, NetnsCookie, PodConfig, Reason,
    TraceRecord, AF_INET6,
};

const RECORD_SIZE: usize = size_of::<TraceRecord>();

/// This CPU's record being logged. It lives here, not on the stack: a program's stack
/// (512 bytes, its own and the log's together) has little room left in connect6.
#[map]
static RECORD: PerCpuArray<TraceRecord> = PerCpuArray::with_max_entries(1, 0);

/// `ip` as IPv6 octets, IPv4 mapped (`::ffff:a.b.c.d`).
#[inline(always)]
pub fn octets(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

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
    let words = |w: [u32; 4]| {
        let mut o = [0u8; 16];
        for (i, word) in w.iter().enumerate() {
            o[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
        }
        o
    };
    let (src, dst) = if family == u32::from(AF_INET6) {
        (words(remote6), words(local6))
    } else {
        (
            words([0, 0, V4_MAPPED_WORD, remote4]),
            words([0, 0, V4_MAPPED_WORD, local4]),
        )
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
        protocol: 6,
        _pad: 0,
    });
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

/// The aya-log record: `decision <hex bytes>`, parsed back by `redirector trace`.
#[inline(never)]
fn emit(record: &TraceRecord) {
    // SAFETY: `TraceRecord` is `repr(C)` plain data without padding (bytemuck proves it on
    // the user side), so its bytes are all initialised.
    let bytes = unsafe { &*(record as *const TraceRecord).cast::<[u8; RECORD_SIZE]>() };
    info!(record, "decision {:x}", bytes);
}
