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

/// Symbolizes and merges the allocator's stack buckets: buckets whose trimmed code stacks and
/// span paths are equal become one [`StackProfile`].
pub(crate) fn stacks_of(buckets: &[StackTotals], by_tag: &PathIndex) -> Vec<StackProfile> {
    // Every new address in one batch: each compilation unit is read once.
    symbolize::prepare(buckets.iter().flat_map(|b| b.ips.iter().copied()));
    let mut merged: Vec<StackProfile> = Vec::new();
    type Key = (PathKind, Vec<SpanFrame>, Arc<[CodeFrame]>);
    let mut index: HashMap<Key, usize> = HashMap::new();
    // Estimates are summed unrounded, then rounded once.
    let mut estimates: Vec<[f64; 2]> = Vec::new();
    for b in buckets {
        let (kind, frames) = path_of(by_tag, b.tag);
        let code = code_of(&b.ips, kind, frames, symbolize::Leaf::TrimAllocator).into();
        let key = (kind, frames.to_vec(), code);
        let i = *index.entry(key).or_insert_with_key(|(kind, frames, code)| {
            merged.push(StackProfile::new(*kind, frames.clone(), Arc::clone(code)));
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
