//! What is running now: the span path each thread is in, and every open span (see
//! [`InFlight`]).
//!
//! Each thread that enters a span takes a slot of [`ThreadSlots`] on its first enter (its OS thread
//! id is read then, once: one `gettid` call), and on every enter and exit stores the path it is
//! in and since when: two relaxed stores to a cache line only it writes. The slot is given back
//! when the thread exits. Past [`MAX_THREADS`] threads at once, the others are not listed.
//! Open spans come from the span table (see `span_index`), read without a lock.

use crate::span_path::PathIndex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use tracing_prof_alloc::Tag;
use tracing_prof_model::{InFlight, LISTED_PER_PATH, OpenPath, OpenSpan, ThreadNow};

/// Threads listed at once.
pub(crate) const MAX_THREADS: usize = 1024;

/// One thread's place: its id, and the path it is in since when.
#[repr(align(64))]
pub(crate) struct ThreadSlot {
    owned: AtomicBool,
    tid: AtomicU64,
    tag: AtomicU32,
    /// Monotonic time of the last change of `tag` (0: unknown).
    since_ns: AtomicU64,
}

impl ThreadSlot {
    const fn new() -> Self {
        ThreadSlot {
            owned: AtomicBool::new(false),
            tid: AtomicU64::new(0),
            tag: AtomicU32::new(0),
            since_ns: AtomicU64::new(0),
        }
    }

    /// The owner is in `tag` since `since_ns`.
    #[inline]
    pub(crate) fn publish(&self, tag: Tag, since_ns: u64) {
        self.tag.store(tag.get(), Ordering::Relaxed);
        self.since_ns.store(since_ns, Ordering::Relaxed);
    }

    /// The owner exits: the slot is free for another thread.
    pub(crate) fn release(&self) {
        self.tag.store(Tag::NO_SPAN.get(), Ordering::Relaxed);
        self.owned.store(false, Ordering::Release);
    }
}

/// A slot per thread that enters spans: a part of [`crate::runtime::Runtime`].
pub(crate) struct ThreadSlots([ThreadSlot; MAX_THREADS]);

impl ThreadSlots {
    pub(crate) const fn new() -> Self {
        ThreadSlots([const { ThreadSlot::new() }; MAX_THREADS])
    }

    /// A free slot for the calling thread, or `None` when every one is taken.
    pub(crate) fn claim(&'static self) -> Option<&'static ThreadSlot> {
        let slot = self.0.iter().find(|s| {
            !s.owned.load(Ordering::Relaxed)
                && s.owned
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
        })?;
        slot.tid.store(gettid(), Ordering::Relaxed);
        slot.publish(Tag::NO_SPAN, 0);
        Some(slot)
    }

    /// In a child of `fork`: only the calling thread exists; the slots of the parent's other
    /// threads are given back, and the caller's (if it has one) takes its new thread id.
    pub(crate) fn after_fork_in_child(&self, own: Option<&'static ThreadSlot>) {
        for s in &self.0 {
            if !own.is_some_and(|o| std::ptr::eq(o, s)) {
                s.release();
            }
        }
        if let Some(o) = own {
            o.tid.store(gettid(), Ordering::Relaxed);
        }
    }

    /// Reads what is running now; `paths` resolves tags to span paths, `now_ns` is the
    /// monotonic clock now.
    pub(crate) fn read(&self, paths: &PathIndex, now_ns: u64) -> InFlight {
        let frames = |tag: Tag| {
            paths
                .get(&tag)
                .filter(|(kind, _)| *kind == tracing_prof_model::PathKind::Span)
                .map(|(_, f)| f.clone())
                .unwrap_or_default()
        };
        let age = |t: u64| Duration::from_nanos(now_ns.saturating_sub(t));
        let threads = self
            .0
            .iter()
            .filter(|s| s.owned.load(Ordering::Acquire))
            .map(|s| {
                let tid = s.tid.load(Ordering::Relaxed);
                let since = s.since_ns.load(Ordering::Relaxed);
                ThreadNow::new(
                    tid,
                    thread_name(tid),
                    frames(Tag::new(s.tag.load(Ordering::Relaxed))),
                    (since != 0).then(|| age(since)),
                )
            })
            .collect();
        // Per path: the count, and the oldest LISTED_PER_PATH creation times.
        let mut open: HashMap<Tag, (u64, Vec<(u64, u64)>)> = HashMap::new();
        crate::span_index::for_each_open(|tag, created_ns, busy_ns| {
            let (count, oldest) = open.entry(tag).or_default();
            *count += 1;
            oldest.push((created_ns, busy_ns));
            if oldest.len() >= 2 * LISTED_PER_PATH {
                oldest.sort_unstable();
                oldest.truncate(LISTED_PER_PATH);
            }
        });
        let mut paths: Vec<OpenPath> = open
            .into_iter()
            .map(|(tag, (count, mut oldest))| {
                oldest.sort_unstable();
                oldest.truncate(LISTED_PER_PATH);
                let spans = oldest
                    .into_iter()
                    .map(|(created, busy)| OpenSpan::new(age(created), Duration::from_nanos(busy)))
                    .collect();
                OpenPath::new(frames(tag), count, spans)
            })
            .collect();
        paths.sort_by(|a, b| {
            let oldest = |p: &OpenPath| p.oldest.first().map(|s| s.age).unwrap_or_default();
            oldest(b).cmp(&oldest(a)).then(b.open.cmp(&a.open))
        });
        let mut out = InFlight::default();
        out.time = Some(SystemTime::now());
        out.binary = crate::binary::current();
        out.threads = threads;
        out.paths = paths;
        out.unlisted = crate::span_index::spans_outside();
        out
    }
}

fn gettid() -> u64 {
    // SAFETY: gettid has no preconditions and cannot fail.
    u64::try_from(unsafe { libc::gettid() }).unwrap_or(0)
}

/// `/proc/self/task/TID/comm` (empty when the thread is gone or there is no `/proc`).
fn thread_name(tid: u64) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .map(|s| s.trim_end().to_owned())
        .unwrap_or_default()
}
