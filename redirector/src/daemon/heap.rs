//! Free heap pages handed back to the kernel now and then.
//!
//! The daemon's live heap is small and flat (about 100 KiB with 50 pods, after 8,000 pods
//! of churn: heaptrack), but glibc keeps the pages of what it freed in each thread's arena,
//! up to the most that arena ever held at once: a `/metrics` rendering or a collection
//! that ran on a blocking thread leaves its peak resident, and the resident size creeps up
//! as the peaks meet other threads' arenas. `malloc_trim` returns the free pages of every
//! arena, so the resident size follows what the daemon holds, not its history.
//!
//! Trimming alone leaves two slower creeps, both glibc's defaults: every thread that first
//! allocates while the others' arenas are busy gets an arena of its own (up to eight per
//! CPU), and the tokio blocking pool's threads come and go, so the arenas — each with its
//! own fragments — multiply over days; and the threshold above which a block is mapped on
//! its own rises with every such block freed, so a large rendering later lands in an
//! arena and fragments it. [`settle`] fixes both before the first thread starts: one arena
//! (the daemon allocates little, its threads seldom contend) and a fixed mapping threshold.

use std::time::Duration;

/// Blocks of at least this size are mapped on their own and unmapped when freed: a
/// `/metrics` rendering, a collection's listing. Fixed, so that it does not rise.
const MMAP_THRESHOLD: i32 = 128 * 1024;

/// One arena for every thread, and a fixed mapping threshold (glibc); nothing elsewhere.
/// Called at the start, before any other thread runs.
pub fn settle() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets the allocator's parameters; called before other threads
    // exist. A refused parameter (0) leaves glibc's default, which is only slower to settle.
    unsafe {
        if libc::mallopt(libc::M_ARENA_MAX, 1) == 0 {
            tracing::debug!("the allocator kept its arena limit");
        }
        if libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 0 {
            tracing::debug!("the allocator kept its mapping threshold");
        }
    }
}

/// How often free pages are returned: the walk over the arenas takes well under a
/// millisecond on a heap this size.
pub const INTERVAL: Duration = Duration::from_secs(30);

/// Returns the free pages of every arena to the kernel (glibc); nothing elsewhere.
pub fn return_free_pages() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases memory the allocator holds free; 0 keeps no pad.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// [`return_free_pages`] every [`INTERVAL`], for as long as the daemon runs.
pub async fn trim_now_and_then() {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + INTERVAL, INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Err(err) = tokio::task::spawn_blocking(return_free_pages).await {
            tracing::debug!("returning free heap pages: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn returning_free_pages_leaves_the_heap_usable() {
        let freed: Vec<Vec<u8>> = (0..64).map(|_| vec![1u8; 64 * 1024]).collect();
        drop(freed);
        super::return_free_pages();
        let again = vec![2u8; 1 << 20];
        assert_eq!(again.iter().map(|&b| u64::from(b)).sum::<u64>(), 2 << 20);
    }
}
