//! Capturing a [`Snapshot`]: reads the allocator's counters, the span path table and the
//! samplers, symbolizes the sampled stacks, and fills the model.

use crate::runtime::RUNTIME;
use crate::span_path::{PathIndex, path_of};
use crate::symbolize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tracing_prof_alloc::__private::StackTotals;
use tracing_prof_alloc::__private::TagTotals;
use tracing_prof_alloc::{Tag, TagGuard};
use tracing_prof_model::{
    CodeFrame, CpuSource, Lifetimes, MemoryStats, PathKind, PathProfile, Snapshot, SpanFrame,
    StackProfile, TABLE_FULL_FRAME, TimeStats,
};

const _: () = assert!(
    tracing_prof_model::LIFETIME_BUCKETS == tracing_prof_alloc::__private::LIFETIME_BUCKETS
);

/// Reads every counter now. Never blocks application threads. `duration` is how long the
/// counters have been running.
///
/// It also hands back to the kernel the span table's pages that no open span uses any more
/// (see [`Stats::span_table_bytes`](crate::Stats::span_table_bytes)).
///
/// Exact memory and time per span path are always there; sampled heap stacks, lifetimes and
/// per-thread memory when the tagging allocator is installed (and heap sampling is on).
pub fn capture(duration: Duration) -> Snapshot {
    let _profiler = TagGuard::new(Tag::PROFILER);
    let _ = crate::span_index::trim();
    let all = RUNTIME.paths.all_with_reserved();
    let mut totals = vec![TagTotals::default(); all.len()];
    tracing_prof_alloc::__private::read_totals(&mut totals);
    let mut times = vec![TimeStats::default(); all.len()];
    crate::span_times::read(&mut times);
    let mut outlived = vec![(0.0, 0); totals.len()];
    tracing_prof_alloc::__private::read_outlived(&mut outlived);
    let by_tag: PathIndex = all
        .iter()
        .map(|(tag, kind, frames)| (*tag, (*kind, frames.clone())))
        .collect();
    let cpu = RUNTIME.cpu.source();
    let period = RUNTIME.cpu.period_ns();
    // Symbolization reads the binary's debug info: whatever goes wrong there must not take
    // the snapshot (or the aggregator thread) down with it; the stacks are left out instead.
    let (cpu_stacks, sampled_cpu) = if period > 0 {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            RUNTIME.cpu.stacks(&RUNTIME.paths, &by_tag, period)
        }))
        .unwrap_or_default()
    } else {
        Default::default()
    };
    let paths = paths_of(&all, &totals, &times, &outlived, cpu, &sampled_cpu)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    let stacks = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        stacks_of(&tracing_prof_alloc::__private::read_stacks(), &by_tag)
    }))
    .unwrap_or_default();
    let mut snapshot = Snapshot::new(SystemTime::now(), duration);
    snapshot.binary = crate::binary::current();
    if !cpu_stacks.is_empty() || !stacks.is_empty() {
        snapshot.symbols = symbolize::program_symbols();
    }
    snapshot.paths = paths;
    snapshot.overflowed_spans = RUNTIME.paths.overflowed_spans();
    snapshot.cpu = cpu;
    snapshot.cpu_stacks = cpu_stacks;
    snapshot.cpu_sampling_hz = RUNTIME.cpu.sampled_hz();
    snapshot.sample_rate = tracing_prof_alloc::__private::sample_rate();
    snapshot.temporary_threshold = tracing_prof_alloc::__private::temporary_threshold();
    snapshot.stacks = stacks;
    snapshot.threads = RUNTIME.thread_names.threads();
    snapshot
}

/// The span paths' counters only, read now: their time (latency histograms and errors
/// included) and memory, with none of the stacks (no symbolization, no heap or CPU stacks).
/// What a metrics scrape reads: its cost grows with span paths × threads that ever had a
/// table, and the CPU samples taken since the last read (symbolized into the store, as the
/// aggregator would); no heap or CPU stacks are built. `outlived` is not read (0).
pub fn capture_paths(duration: Duration) -> Snapshot {
    let _profiler = TagGuard::new(Tag::PROFILER);
    let all = RUNTIME.paths.all_with_reserved();
    let mut totals = vec![TagTotals::default(); all.len()];
    tracing_prof_alloc::__private::read_totals(&mut totals);
    let mut times = vec![TimeStats::default(); all.len()];
    crate::span_times::read(&mut times);
    let outlived = vec![(0.0, 0); totals.len()];
    let cpu = RUNTIME.cpu.source();
    let sampled_cpu = if matches!(cpu, CpuSource::Sampled { .. }) {
        RUNTIME.cpu.sampled_cpu(&RUNTIME.paths)
    } else {
        HashMap::new()
    };
    let mut snapshot = Snapshot::new(SystemTime::now(), duration);
    snapshot.binary = crate::binary::current();
    #[cfg_attr(not(feature = "opentelemetry"), allow(unused_mut))]
    let mut paths = paths_of(&all, &totals, &times, &outlived, cpu, &sampled_cpu);
    #[cfg(feature = "opentelemetry")]
    for (tag, p) in &mut paths {
        p.exemplars = crate::exemplars::of(*tag)
            .into_iter()
            .map(
                |(bucket, link, duration_ns)| tracing_prof_model::DurationExemplar {
                    bucket,
                    link,
                    duration_ns,
                },
            )
            .collect();
    }
    snapshot.paths = paths.into_iter().map(|(_, p)| p).collect();
    snapshot.overflowed_spans = RUNTIME.paths.overflowed_spans();
    snapshot.cpu = cpu;
    snapshot.cpu_sampling_hz = RUNTIME.cpu.sampled_hz();
    snapshot.sample_rate = tracing_prof_alloc::__private::sample_rate();
    snapshot
}

/// The profile of every path that counted something, with its tag, from the tables read by
/// tag.
pub(crate) fn paths_of(
    all: &[(Tag, PathKind, Vec<SpanFrame>)],
    totals: &[TagTotals],
    times: &[TimeStats],
    outlived: &[(f64, u64)],
    cpu: CpuSource,
    sampled_cpu: &HashMap<Tag, u64>,
) -> Vec<(Tag, PathProfile)> {
    all.iter()
        .filter_map(|(tag, kind, frames)| {
            let t = totals.get(tag.get() as usize)?;
            let (objects, bytes) = outlived.get(tag.get() as usize).copied()?;
            let mut p = PathProfile::new(*kind, frames.clone());
            p.time = times.get(tag.get() as usize).copied().unwrap_or_default();
            p.time.long_polls = RUNTIME.long_polls.of(*tag).0;
            if matches!(cpu, CpuSource::Sampled { .. }) {
                p.time.cpu_ns = sampled_cpu.get(tag).copied().unwrap_or(0);
            }
            p.memory = memory_of(t);
            p.outlived = (objects.round() as u64, bytes);
            let empty = p.time == TimeStats::default() && p.memory == MemoryStats::default();
            (!empty).then_some((*tag, p))
        })
        .collect()
}

/// The code stack of `ips` sampled in the path `frames` of `kind`, or the table-full frame for
/// a bucket without one.
pub(crate) fn code_of(
    ips: &[usize],
    kind: PathKind,
    frames: &[SpanFrame],
    leaf: symbolize::Leaf,
) -> Vec<CodeFrame> {
    if ips.is_empty() {
        vec![CodeFrame::named(TABLE_FULL_FRAME)]
    } else {
        // In a span (one beyond the path cap too): cut where it was entered.
        let spans = if matches!(kind, PathKind::Span | PathKind::Overflow) {
            symbolize::InSpan::of(frames)
        } else {
            symbolize::InSpan::default()
        };
        symbolize::code_stack(ips, spans, leaf)
    }
}

/// Each heap stack bucket's code stack, symbolized at the first capture that reads the bucket
/// and shared by every snapshot after it (the interval's, the peak's, the flight recorder's):
/// before, each capture built every stack's frames again, and up to three snapshots held their
/// own copies at an export. A bucket's tag and addresses never change once it is claimed (the
/// allocator hands buckets out in order and never takes one back); each entry is checked
/// against a hash of them all the same. Equal code stacks are one allocation (`interned`), so
/// that buckets are merged by pointer. Bounded by the allocator's table (`MAX_STACKS`). A
/// bucket whose span path the capture does not know yet is not kept (see `stacks_of`).
static HEAP_CODE: std::sync::Mutex<Option<HeapCode>> = std::sync::Mutex::new(None);

#[derive(Default)]
struct HeapCode {
    /// By bucket: the hash of its tag and addresses, and its code stack.
    by_bucket: HashMap<u32, (u64, Arc<[CodeFrame]>)>,
    interned: std::collections::HashSet<Arc<[CodeFrame]>>,
}

impl HeapCode {
    /// The code stack kept for `bucket`, if its tag and addresses still hash to `hash`.
    fn get(&self, bucket: u32, hash: u64) -> Option<&Arc<[CodeFrame]>> {
        self.by_bucket
            .get(&bucket)
            .and_then(|(known, code)| (*known == hash).then_some(code))
    }

    /// The one allocation of the code stack equal to `built`.
    fn intern(&mut self, built: Arc<[CodeFrame]>) -> Arc<[CodeFrame]> {
        if let Some(same) = self.interned.get(&built) {
            return Arc::clone(same);
        }
        self.interned.insert(Arc::clone(&built));
        built
    }
}

/// [`HEAP_CODE`]'s lock, for `fork` (see `crate::fork`): taken after the runtime's and before
/// the symbolizer's, the order [`stacks_of`] takes them in.
pub(crate) fn lock_for_fork() -> Box<dyn std::any::Any> {
    Box::new(
        HEAP_CODE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

/// What a bucket's code stack depends on.
fn bucket_hash(b: &StackTotals) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut h = foldhash::fast::FixedState::with_seed(0x7072_6f66).build_hasher();
    b.tag.get().hash(&mut h);
    b.ips.hash(&mut h);
    h.finish()
}

/// Symbolizes and merges the allocator's stack buckets: buckets whose trimmed code stacks and
/// span paths are equal become one [`StackProfile`].
pub(crate) fn stacks_of(buckets: &[StackTotals], by_tag: &PathIndex) -> Vec<StackProfile> {
    let mut guard = HEAP_CODE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cache = guard.get_or_insert_with(HeapCode::default);
    let hashes: Vec<u64> = buckets.iter().map(bucket_hash).collect();
    // Every new address in one batch: each compilation unit is read once.
    symbolize::prepare(
        buckets
            .iter()
            .zip(&hashes)
            .filter(|&(b, &h)| cache.get(b.bucket, h).is_none())
            .flat_map(|(b, _)| b.ips.iter().copied()),
    );
    let mut merged: Vec<StackProfile> = Vec::new();
    // By span path and code stack (interned: equal stacks are one pointer).
    let mut index: HashMap<(PathKind, &[SpanFrame], *const CodeFrame), usize> = HashMap::new();
    // Estimates are summed unrounded, then rounded once.
    let mut estimates: Vec<[f64; 2]> = Vec::new();
    for (b, &hash) in buckets.iter().zip(&hashes) {
        let (kind, frames) = path_of(by_tag, b.tag);
        let code = match cache.get(b.bucket, hash) {
            Some(code) => Arc::clone(code),
            None => {
                let code = cache
                    .intern(code_of(&b.ips, kind, frames, symbolize::Leaf::TrimAllocator).into());
                // A path made after `by_tag` was read (its first spans while the capture
                // symbolized the CPU stacks) reads as the overflow path here: its stack is cut
                // at no span. Right for this capture alone, so not kept for later ones.
                if by_tag.contains_key(&b.tag) {
                    cache.by_bucket.insert(b.bucket, (hash, Arc::clone(&code)));
                }
                code
            }
        };
        let i = *index
            .entry((kind, frames, code.as_ptr()))
            .or_insert_with(|| {
                merged.push(StackProfile::new(kind, frames.to_vec(), code));
                estimates.push([0.0; 2]);
                merged.len() - 1
            });
        let m = &mut merged[i];
        m.samples += b.samples;
        m.sampled_bytes += b.sampled_bytes;
        m.memory.alloc_bytes += b.alloc_bytes;
        m.memory.inuse_bytes += b.inuse_bytes();
        estimates[i][0] += b.alloc_objects;
        estimates[i][1] += b.inuse_objects();
        let round = |v: f64| v.round() as u64;
        let mut l = Lifetimes::default();
        l.freed_objects = b.lifetime_objects.map(round);
        l.freed_bytes = b.lifetime_bytes;
        l.temporary_objects = round(b.temporary_objects);
        l.temporary_bytes = b.temporary_bytes;
        m.lifetimes.add(&l);
    }
    for (m, [alloc, inuse]) in merged.iter_mut().zip(estimates) {
        m.memory.alloc_objects = alloc.round() as u64;
        m.memory.inuse_objects = inuse.round() as u64;
    }
    merged
}

fn memory_of(t: &TagTotals) -> MemoryStats {
    let mut m = MemoryStats::default();
    m.alloc_objects = t.alloc_objects;
    m.alloc_bytes = t.alloc_bytes;
    m.inuse_objects = t.inuse_objects();
    m.inuse_bytes = t.inuse_bytes();
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn allocating_site() -> usize {
        std::hint::black_box(allocating_site as fn() -> usize as usize)
    }

    fn kept(bucket: u32) -> bool {
        HEAP_CODE
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|c| c.by_bucket.contains_key(&bucket))
    }

    /// A bucket of a span path that the capture has not read yet is symbolized for that capture
    /// only (cut at no span, as the overflow path); kept once its path is known.
    #[test]
    fn a_bucket_of_a_path_not_read_yet_is_not_kept() {
        let mut b = StackTotals::default();
        b.bucket = u32::MAX - 7;
        b.tag = Tag::new(4000);
        b.ips = vec![allocating_site() + 1];
        b.samples = 1;
        let unknown = stacks_of(std::slice::from_ref(&b), &PathIndex::new());
        assert_eq!(unknown.len(), 1);
        assert_eq!(unknown[0].kind, PathKind::Overflow);
        assert!(!kept(b.bucket));
        let mut known = PathIndex::new();
        known.insert(b.tag, (PathKind::NoSpan, Vec::new()));
        let first = stacks_of(std::slice::from_ref(&b), &known);
        assert!(kept(b.bucket));
        let again = stacks_of(std::slice::from_ref(&b), &known);
        assert_eq!(first[0].kind, PathKind::NoSpan);
        assert!(tracing_prof_model::CodeStack::ptr_eq(
            &first[0].code,
            &again[0].code
        ));
    }
}
