//! Per-pod, per-reason decision counters.

use redirector_common::{NetnsCookie, Reason, COUNTER_SLOTS};

use crate::maps::COUNTERS;

/// Count one decision for a pod. The entry exists from the moment the pod was configured,
/// so this never allocates on the connection path.
#[inline(always)]
pub fn count(netns_cookie: NetnsCookie, reason: Reason) {
    count_raw(netns_cookie, reason as u8);
}

/// [`count`] by the reason's number, as read back from a map.
#[inline(always)]
pub fn count_raw(netns_cookie: NetnsCookie, reason: u8) {
    let slot = usize::from(reason);
    if slot >= COUNTER_SLOTS {
        return;
    }
    if let Some(counters) = COUNTERS.get_ptr_mut(netns_cookie) {
        // SAFETY: a valid pointer to this CPU's value, which no other CPU writes, so a
        // plain increment is exact; the slot is checked to be in bounds above.
        unsafe { (*counters).by_reason[slot] += 1 };
    }
}
