//! Deterministic interruption, for the suite that kills an apply or a cleanup at every
//! step and checks that the next run finishes the job with nothing half-done or leaked.
//!
//! `REDIRECTOR_KILL_AT_STEP=N` makes the process SIGKILL itself when it reaches the Nth
//! step (a map write, a link pinned or swapped in, a removal). Debug builds only: a
//! release binary never reads the variable.

/// The env var naming the step to die at.
pub const KILL_AT_STEP_ENV: &str = "REDIRECTOR_KILL_AT_STEP";

#[cfg(debug_assertions)]
pub fn step(what: &str) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static REACHED: AtomicU32 = AtomicU32::new(0);
    let Some(at) = std::env::var(KILL_AT_STEP_ENV)
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    else {
        return;
    };
    let n = REACHED.fetch_add(1, Ordering::SeqCst) + 1;
    if n == at {
        eprintln!("{KILL_AT_STEP_ENV}: killed at step {n}, after {what}");
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn step(_what: &str) {}
