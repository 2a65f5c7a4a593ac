//! Polls that block the executor: an enter-to-exit interval on an async runtime's worker thread
//! at least as long as the threshold (`TRACING_PROF_LONG_POLL`, default 10 ms) kept the worker
//! from every other task it had. Each one is counted per span path, with the longest.
//!
//! A thread is a worker if its name is tokio's default for its workers (`tokio-runtime-worker`,
//! which the kernel keeps as `tokio-runtime-w`, or `tokio-rt-worker`): read once, on the
//! thread's first enter, into its thread record (one `prctl`). Renamed worker threads are not recognised. The check on
//! exit is one comparison; a long poll adds to two counters of its path, shared by the threads
//! (a long poll is rare: they cost nothing on the common path).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tracing_prof_alloc::{MAX_TAGS, Tag};

/// The threshold, and each span path's long polls so far: a part of
/// [`crate::runtime::Runtime`].
#[repr(align(64))]
pub(crate) struct LongPollCounts {
    /// The threshold in nanoseconds; 0: off (no profiler built, or turned off). Read on every
    /// exit, written when a profiler is built: on a cache line of its own, apart from the
    /// counts that long polls write.
    threshold_ns: AtomicU64,
    counts: Counts,
}

#[repr(align(64))]
struct Counts {
    polls: [AtomicU64; MAX_TAGS],
    longest_ns: [AtomicU64; MAX_TAGS],
}

impl LongPollCounts {
    pub(crate) const fn new() -> Self {
        LongPollCounts {
            threshold_ns: AtomicU64::new(0),
            counts: Counts {
                polls: [const { AtomicU64::new(0) }; MAX_TAGS],
                longest_ns: [const { AtomicU64::new(0) }; MAX_TAGS],
            },
        }
    }

    /// Sets the threshold (`None`: off), for the counters and for the CPU sampler's marks
    /// (which read the layer's clock, `crate::monotonic`).
    pub(crate) fn set_threshold(&self, threshold: Option<Duration>) {
        let ns = threshold.map_or(0, |d| {
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
        });
        self.threshold_ns.store(ns, Ordering::Relaxed);
        tracing_prof_cpu::watch_long_polls(ns, crate::monotonic::now_ns);
    }

    /// Whether long polls are counted.
    pub(crate) fn enabled(&self) -> bool {
        self.threshold_ns.load(Ordering::Relaxed) != 0
    }

    /// Counts the interval `busy_ns` of `tag` if it is a long poll.
    #[inline]
    pub(crate) fn exited(&self, tag: Tag, busy_ns: u64) {
        let t = self.threshold_ns.load(Ordering::Relaxed);
        if t != 0 && busy_ns >= t {
            let i = tag.get() as usize;
            let c = &self.counts;
            if let (Some(n), Some(l)) = (c.polls.get(i), c.longest_ns.get(i)) {
                n.fetch_add(1, Ordering::Relaxed);
                l.fetch_max(busy_ns, Ordering::Relaxed);
            }
        }
    }

    /// Long polls of `tag` so far, and the longest in nanoseconds.
    pub(crate) fn of(&self, tag: Tag) -> (u64, u64) {
        let i = tag.get() as usize;
        let c = &self.counts;
        (
            c.polls.get(i).map_or(0, |n| n.load(Ordering::Relaxed)),
            c.longest_ns.get(i).map_or(0, |l| l.load(Ordering::Relaxed)),
        )
    }
}

/// Whether the thread of `record` is an async runtime's worker, by its name (see the module
/// docs).
pub(crate) fn is_worker(record: &tracing_prof_thread::ThreadRecord) -> bool {
    let name = record.name_bytes();
    name.starts_with(b"tokio-runtime-w") || name.starts_with(b"tokio-rt-worker")
}
