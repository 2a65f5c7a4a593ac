//! Telling the samples taken in a long poll: a thread of an async runtime that has entered or
//! left no span for at least the threshold is blocking its executor (it is inside one poll,
//! running code of its own), so a sample taken then shows the code that blocks it.
//!
//! The span layer records when each worker's current stretch began
//! (`tracing_prof_alloc::__private::set_stretch_start`); the handler compares that with the same clock,
//! read through the function [`watch_long_polls`] was given, and marks the sample. The samples
//! of a long poll's first `threshold` are not marked: until then it was not long.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// The threshold in nanoseconds (0: nothing is marked).
static THRESHOLD_NS: AtomicU64 = AtomicU64::new(0);
/// The clock of the stretch starts, a `fn() -> u64` (null: none).
static CLOCK: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// From now on, marks the samples taken on a thread whose stretch began at least
/// `threshold_ns` ago by `clock` (0: marks none). `clock` must be the clock of the stretch
/// starts and async-signal-safe: the signal handler calls it.
pub fn watch_long_polls(threshold_ns: u64, clock: fn() -> u64) {
    CLOCK.store(clock as *mut (), Ordering::Relaxed);
    THRESHOLD_NS.store(threshold_ns, Ordering::Release);
}

/// Whether the calling thread is in a long poll now. Async-signal-safe: two atomic loads, one
/// thread-local read and, on a watched thread, the clock.
#[inline]
#[cfg_attr(
    not(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    )),
    allow(dead_code)
)]
pub(crate) fn now() -> bool {
    let threshold = THRESHOLD_NS.load(Ordering::Acquire);
    if threshold == 0 {
        return false;
    }
    let since = tracing_prof_alloc::__private::stretch_start();
    let clock = CLOCK.load(Ordering::Relaxed);
    if since == 0 || clock.is_null() {
        return false;
    }
    // SAFETY: CLOCK holds null or a `fn() -> u64` cast by `watch_long_polls`; function and data
    // pointers have one size on every target this crate samples on.
    let clock = unsafe { std::mem::transmute::<*mut (), fn() -> u64>(clock) };
    clock().saturating_sub(since) >= threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    static NOW: AtomicU64 = AtomicU64::new(0);

    fn test_clock() -> u64 {
        NOW.load(Ordering::Relaxed)
    }

    #[test]
    fn a_stretch_is_long_from_the_threshold_on() {
        assert!(!now(), "nothing is watched yet");
        watch_long_polls(10, test_clock);
        NOW.store(100, Ordering::Relaxed);
        assert!(!now(), "no stretch recorded on this thread");
        tracing_prof_alloc::__private::set_stretch_start(95);
        assert!(!now(), "5 ns in");
        tracing_prof_alloc::__private::set_stretch_start(90);
        assert!(now(), "10 ns in");
        watch_long_polls(0, test_clock);
        assert!(!now(), "turned off");
        tracing_prof_alloc::__private::set_stretch_start(0);
    }
}
