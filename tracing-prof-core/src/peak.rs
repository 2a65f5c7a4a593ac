//! The heap's high-water mark, found by reading the allocator's per-thread tables from the
//! aggregator thread every [`DEFAULT_PEAK_EVERY`]: nothing is added to the allocation path.
//!
//! Each reading sums the in-use bytes of every tag but the profiler's own over every thread's
//! table (the same read a capture makes: tags × threads × 32 bytes). A reading above the highest so far keeps that
//! reading's totals per tag (exact, as read) and, when the total has grown by 1/32 since the
//! sampled heap stacks were last kept or a second has passed, the heap sampler's stack buckets
//! as raw addresses (symbolized only when the peak is exported or asked for). A spike that
//! rises and falls between two readings is not seen.

use crate::capture::{paths_of, stacks_of};
use crate::runtime::RUNTIME;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tracing_prof_alloc::__private::{StackTotals, TagTotals};
use tracing_prof_alloc::Tag;
use tracing_prof_model::{CpuSource, Peak, Snapshot, TimeStats};

/// How often the heap is read for its peak, by default: 100 ms.
pub const DEFAULT_PEAK_EVERY: Duration = Duration::from_millis(100);

/// The heap stacks are read again at a new peak when the total has grown by this share since
/// they were last read...
const STACKS_GROWTH: u64 = 32;
/// ...or when this long has passed.
const STACKS_AGE: Duration = Duration::from_secs(1);

/// The highest reading so far; replaced whole (shared as an `Arc`, never changed in place).
#[derive(Debug)]
pub(crate) struct PeakState {
    at: SystemTime,
    inuse: u64,
    /// In use per tag at `at`, by tag.
    totals: Vec<TagTotals>,
    /// The heap sampler's buckets, raw, at `stacks_at` (shared with the next peaks of the
    /// same rise until read again).
    stacks: Arc<Vec<StackTotals>>,
    stacks_at: SystemTime,
    stacks_read: Instant,
    stacks_inuse: u64,
    /// Counts the peaks kept: a new one, a new number.
    pub(crate) seq: u64,
}

/// The peak as shared: replaced under its lock, read by cloning the `Arc`.
pub(crate) type SharedPeak = crate::fork::ForkSafe<Option<Arc<PeakState>>>;

/// Reads the heap for its peak (the aggregator's).
#[derive(Debug, Default)]
pub(crate) struct PeakWatch {
    scratch: Vec<TagTotals>,
    seq: u64,
}

impl PeakWatch {
    /// One reading: a new peak replaces `shared`'s. The tables are read, and the stacks when
    /// due, with no lock of ours held (the span path table's lock is taken first, alone, as a
    /// fork takes it); `shared`'s lock only to look and to swap. The profiler's own memory is
    /// not counted: the peak is the application's.
    pub(crate) fn read(&mut self, shared: &SharedPeak) {
        let n = RUNTIME.paths.tags();
        self.scratch.clear();
        self.scratch.resize(n, TagTotals::default());
        tracing_prof_alloc::__private::read_totals(&mut self.scratch);
        let profiler = Tag::PROFILER.get() as usize;
        let inuse: u64 = self
            .scratch
            .iter()
            .enumerate()
            .filter(|(tag, _)| *tag != profiler)
            .map(|(_, t)| t.inuse_bytes())
            .sum();
        let last = shared.lock().clone();
        if inuse == 0 || last.as_ref().is_some_and(|s| inuse <= s.inuse) {
            return;
        }
        let now = (SystemTime::now(), Instant::now());
        let kept = last.filter(|s| {
            let grown = inuse - s.stacks_inuse.min(inuse) >= s.stacks_inuse / STACKS_GROWTH;
            !grown && now.1.duration_since(s.stacks_read) < STACKS_AGE
        });
        let (stacks, stacks_at, stacks_read, stacks_inuse) = match kept {
            Some(s) => (
                Arc::clone(&s.stacks),
                s.stacks_at,
                s.stacks_read,
                s.stacks_inuse,
            ),
            None => (
                Arc::new(tracing_prof_alloc::__private::read_stacks()),
                now.0,
                now.1,
                inuse,
            ),
        };
        self.seq += 1;
        let next = Arc::new(PeakState {
            at: now.0,
            inuse,
            totals: self.scratch.clone(),
            stacks,
            stacks_at,
            stacks_read,
            stacks_inuse,
            seq: self.seq,
        });
        let mut slot = shared.lock();
        // A reset while reading: start from this reading all the same.
        if slot.as_ref().is_none_or(|s| s.inuse < inuse) {
            *slot = Some(next);
        }
    }
}

/// The snapshot of a peak: its span paths' memory (exact, as read then) and its heap stacks
/// (symbolized now), `duration` since the profiler started. Time, CPU and threads are not kept.
pub(crate) fn snapshot(state: &PeakState, every: Duration, duration: Duration) -> Snapshot {
    let all = RUNTIME.paths.all_with_reserved();
    let n = state.totals.len();
    // The application's heap: the profiler's own is left out, as from the peak's total.
    let mut totals = state.totals.clone();
    if let Some(own) = totals.get_mut(Tag::PROFILER.get() as usize) {
        *own = TagTotals::default();
    }
    let times = vec![TimeStats::default(); n];
    let outlived = vec![(0.0, 0); n];
    let by_tag = all
        .iter()
        .map(|(tag, kind, frames)| (*tag, (*kind, frames.clone())))
        .collect();
    let mut snapshot = Snapshot::new(state.at, duration);
    snapshot.binary = crate::binary::current();
    snapshot.paths = paths_of(
        &all,
        &totals,
        &times,
        &outlived,
        CpuSource::Off,
        &HashMap::new(),
    )
    .into_iter()
    .map(|(_, p)| p)
    .collect();
    snapshot.stacks = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        stacks_of(&state.stacks, &by_tag)
    }))
    .unwrap_or_default();
    if !snapshot.stacks.is_empty() {
        snapshot.symbols = crate::symbolize::program_symbols();
    }
    snapshot.sample_rate = tracing_prof_alloc::__private::sample_rate();
    snapshot.temporary_threshold = tracing_prof_alloc::__private::temporary_threshold();
    let mut peak = Peak::new(state.at, state.inuse, every);
    peak.stacks_at = state.stacks_at;
    peak.stacks_inuse_bytes = state.stacks_inuse;
    snapshot.peak = Some(peak);
    snapshot
}
