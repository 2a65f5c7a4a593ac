//! Polls that block the executor: an enter-to-exit interval on an async runtime's worker thread
//! at least as long as the threshold (`TRACING_PROF_LONG_POLL`, default 10 ms) kept the worker
//! from every other task it had. Each one is counted per span path, with the longest.
//!
//! A thread is a worker if its name is tokio's default for its workers (`tokio-runtime-worker`,
//! which the kernel keeps as `tokio-runtime-w`, or `tokio-rt-worker`): read once, on the
//! thread's first enter (one `prctl`). Renamed worker threads are not recognised. The check on
//! exit is one comparison; a long poll adds to two counters of its path, shared by the threads
//! (a long poll is rare: they cost nothing on the common path).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tracing_prof_alloc::{MAX_TAGS, Tag};

/// The threshold in nanoseconds; 0: off (no profiler built, or turned off).
static THRESHOLD_NS: AtomicU64 = AtomicU64::new(0);

static COUNTS: [AtomicU64; MAX_TAGS] = [const { AtomicU64::new(0) }; MAX_TAGS];
static LONGEST_NS: [AtomicU64; MAX_TAGS] = [const { AtomicU64::new(0) }; MAX_TAGS];

/// Sets the threshold (`None`: off), for the counters and for the CPU sampler's marks (which
/// read the layer's clock, `crate::monotonic`).
pub(crate) fn set_threshold(threshold: Option<Duration>) {
    let ns = threshold.map_or(0, |d| {
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
    });
    THRESHOLD_NS.store(ns, Ordering::Relaxed);
    tracing_prof_cpu::watch_long_polls(ns, crate::monotonic::now_ns);
}

/// Whether long polls are counted.
pub(crate) fn enabled() -> bool {
    THRESHOLD_NS.load(Ordering::Relaxed) != 0
}

/// Counts the interval `busy_ns` of `tag` if it is a long poll.
#[inline]
pub(crate) fn exited(tag: Tag, busy_ns: u64) {
    let t = THRESHOLD_NS.load(Ordering::Relaxed);
    if t != 0 && busy_ns >= t {
        let i = tag.get() as usize;
        if let (Some(c), Some(l)) = (COUNTS.get(i), LONGEST_NS.get(i)) {
            c.fetch_add(1, Ordering::Relaxed);
            l.fetch_max(busy_ns, Ordering::Relaxed);
        }
    }
}

/// Long polls of `tag` so far, and the longest in nanoseconds.
pub(crate) fn of(tag: Tag) -> (u64, u64) {
    let i = tag.get() as usize;
    (
        COUNTS.get(i).map_or(0, |c| c.load(Ordering::Relaxed)),
        LONGEST_NS.get(i).map_or(0, |c| c.load(Ordering::Relaxed)),
    )
}

/// Whether the calling thread is an async runtime's worker (see the module docs).
pub(crate) fn this_thread_is_worker() -> bool {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes (NUL included) into the buffer given.
    let ok = unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) } == 0;
    ok && (name.starts_with(b"tokio-runtime-w") || name.starts_with(b"tokio-rt-worker"))
}
