//! Pods-wide decision counts that only go up, from per-pod counters that go with their pods.
//!
//! A pod's counters live in the maps only while the pod does: summed as they are, the
//! node's totals would drop whenever a pod is removed (by the daemon, the CNI plugin or a
//! gc), and Prometheus reads a drop in a counter as a restart. So what a pod had counted
//! when it was last seen is kept once it is gone (as is what it had before its counters
//! started again from zero). Decisions a pod makes between the last scrape and its removal
//! are not counted: the totals undercount by at most that, and never go down.

use std::collections::HashMap;

use redirector_common::{NetnsCookie, COUNTER_SLOTS};

/// Counts by counter slot.
pub type Counts = [u64; COUNTER_SLOTS];

#[derive(Default)]
pub struct DecisionTotals {
    /// Each pod's counts at the last update.
    last: HashMap<NetnsCookie, Counts>,
    /// What pods no longer counted (gone, or counting from zero again) had counted.
    retired: Counts,
}

impl DecisionTotals {
    /// Every pod's counts now (a pod not listed is gone): the node's totals.
    pub fn update(&mut self, now: impl IntoIterator<Item = (NetnsCookie, Counts)>) -> Counts {
        let now: HashMap<NetnsCookie, Counts> = now.into_iter().collect();
        for (cookie, before) in &self.last {
            let after = now.get(cookie);
            for slot in 0..COUNTER_SLOTS {
                match after {
                    Some(after) if after[slot] >= before[slot] => {}
                    _ => self.retired[slot] += before[slot],
                }
            }
        }
        let mut totals = self.retired;
        for counts in now.values() {
            for (total, count) in totals.iter_mut().zip(counts) {
                *total += count;
            }
        }
        self.last = now;
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(first: u64, second: u64) -> Counts {
        let mut counts = [0; COUNTER_SLOTS];
        counts[0] = first;
        counts[1] = second;
        counts
    }

    #[test]
    fn totals_never_go_down_as_pods_come_and_go() {
        let (a, b, c) = (NetnsCookie(1), NetnsCookie(2), NetnsCookie(3));
        let mut totals = DecisionTotals::default();
        assert_eq!(
            totals.update([(a, counts(5, 1)), (b, counts(2, 0))]),
            counts(7, 1)
        );
        // b is removed; c is new.
        assert_eq!(
            totals.update([(a, counts(6, 1)), (c, counts(1, 1))]),
            counts(9, 2)
        );
        // a's counters start again from zero (set up anew) and count one: what it had
        // stays counted.
        assert_eq!(
            totals.update([(a, counts(1, 0)), (c, counts(1, 1))]),
            counts(10, 2)
        );
        // Every pod gone.
        assert_eq!(totals.update([]), counts(10, 2));
        assert_eq!(totals.update([(b, counts(0, 4))]), counts(10, 6));
    }
}
