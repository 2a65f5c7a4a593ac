//! CPU samples, from the sampler's rings to the snapshot: the store that accumulates them
//! (cumulative counts per span path tag and stack), and the glue that starts and stops the
//! sampler with the profiler.
//!
//! The rings are drained by the aggregator thread every [`DRAIN_EVERY`] and by every capture;
//! the store lives off the signal path, under a mutex that only the profiler's own threads and
//! callers of `snapshot()` take. Raw stacks (addresses) are symbolized and merged by function
//! and line every [`MAX_RAW`] new ones and at each capture, so the store is bounded by the
//! program's distinct hot stacks, not by its instructions: at most [`MAX_CPU_STACKS`] of them;
//! samples of further stacks count under their span path with the `(stack table full)` frame.

use crate::capture::{PathIndex, path_of};
use crate::config::CpuTime;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tracing_prof_alloc::Tag;
use tracing_prof_model::{CodeFrame, CpuSource, CpuStack, PathKind, SpanFrame, TABLE_FULL_FRAME};

/// How often the aggregator drains the samplers' rings: 100 ms (a thread's ring holds about
/// 0.6 s of samples at 100 Hz).
pub const DRAIN_EVERY: Duration = Duration::from_millis(100);
/// Distinct CPU stacks kept (per span path and code stack): 16384.
pub const MAX_CPU_STACKS: usize = 16_384;

/// The CPU time mode of the profiler built last: 0 none built (a bare layer), 1 sampled,
/// 2 exact, 3 off.
static MODE: AtomicU8 = AtomicU8::new(0);
/// The sampling rate this process's profiler started the sampler with (0 once stopped).
static STARTED_HZ: AtomicU32 = AtomicU32::new(0);
/// The rate the samples in the store were taken at (kept after the sampler stops).
static RAN_HZ: AtomicU32 = AtomicU32::new(0);

#[derive(Default)]
struct Store {
    /// Weighted samples per (tag, code addresses innermost first) since the last compaction.
    raw: HashMap<(u32, Box<[u64]>), u64>,
    /// Weighted samples per (tag, symbolized code stack, root first, as indices into
    /// `frames`): what `raw` becomes when it is compacted. Keyed by function and line, not by
    /// instruction, so it stops growing once the program's hot stacks have been seen; an empty
    /// stack counts the samples that found it full.
    resolved: HashMap<(u32, Box<[u32]>), u64>,
    /// Every distinct frame of the stacks in `resolved`, once: a stack costs 4 bytes a frame
    /// (40 as `CodeFrame`s: the example service's store grew 0.5 MiB a minute that way).
    frames: Vec<CodeFrame>,
    frame_ids: HashMap<CodeFrame, u32>,
    /// Samples that arrived while `resolved` was full.
    overflowed: u64,
}

impl Store {
    /// The index of `frame` in `frames`, added if new.
    fn frame_id(&mut self, frame: &CodeFrame) -> u32 {
        if let Some(&id) = self.frame_ids.get(frame) {
            return id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(frame.clone());
        self.frame_ids.insert(frame.clone(), id);
        id
    }
}

/// The bit of a store key's tag that marks samples taken in a long poll (tags are below
/// `MAX_TAGS`, far under it).
const LONG_POLL: u32 = 1 << 31;

/// Raw stacks kept before they are symbolized and merged (on the aggregator thread, at the
/// drain that reaches this many, and at every capture).
const MAX_RAW: usize = 4096;

static STORE: Mutex<Option<Store>> = Mutex::new(None);

/// The store's lock, for `fork` (see `crate::fork`).
pub(crate) fn lock_for_fork() -> Box<dyn std::any::Any> {
    Box::new(store())
}

fn store() -> std::sync::MutexGuard<'static, Option<Store>> {
    STORE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts the sampler as `cpu_time`, `hz` and `unwind` say; `Err` says why it could not run
/// (the profiler goes on without it).
pub(crate) fn start(
    cpu_time: CpuTime,
    hz: u32,
    unwind: tracing_prof_cpu::Unwind,
) -> Result<(), tracing_prof_cpu::StartError> {
    MODE.store(
        match cpu_time {
            CpuTime::Sampled => 1,
            CpuTime::Exact => 2,
            CpuTime::Off => 3,
        },
        Ordering::Relaxed,
    );
    if hz == 0 {
        return Ok(());
    }
    // The unwinder's caches and module list are the profiler's own memory.
    let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
    tracing_prof_alloc::set_new_thread_hook(Some(tracing_prof_cpu::ensure_armed));
    tracing_prof_cpu::start(hz, unwind)?;
    // The heap sampler walks armed threads' stacks with the same unwinder (it stays usable
    // once sampling stops: its tables and the threads' stack extents are never freed).
    tracing_prof_alloc::set_stack_walker(Some(tracing_prof_cpu::walk_own_stack));
    let before = RAN_HZ.swap(hz, Ordering::Relaxed);
    if before != 0 && before != hz {
        // Counts taken at another rate stand for another period: start afresh.
        *store() = None;
    }
    STARTED_HZ.store(hz, Ordering::Relaxed);
    Ok(())
}

/// Stops the sampler if this process's profiler started it, and keeps what it recorded.
pub(crate) fn stop() {
    if STARTED_HZ.swap(0, Ordering::Relaxed) != 0 {
        tracing_prof_cpu::stop();
        tracing_prof_alloc::set_new_thread_hook(None);
        drain();
    }
}

/// Moves every recorded sample into the store, and symbolizes them once enough have come.
pub(crate) fn drain() {
    let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
    let mut guard = store();
    let s = guard.get_or_insert_with(Store::default);
    tracing_prof_cpu::drain(|sample| {
        let tag = sample.tag | if sample.long_poll { LONG_POLL } else { 0 };
        let key = (tag, Box::<[u64]>::from(sample.ips));
        *s.raw.entry(key).or_insert(0) += sample.weight;
    });
    if s.raw.len() >= MAX_RAW {
        compact(s);
    }
}

/// Symbolizes the raw stacks and merges them into `resolved`. The interrupted instructions
/// are resolved without entering the symbol cache (there are as many as there are hot
/// instructions); return addresses are cached.
fn compact(s: &mut Store) {
    if s.raw.is_empty() {
        return;
    }
    let raw = std::mem::take(&mut s.raw);
    let leaves = crate::symbolize::resolve_transient(
        raw.keys()
            .filter_map(|(_, ips)| ips.first().map(|&ip| ip as usize)),
    );
    crate::symbolize::prepare(
        raw.keys()
            .flat_map(|(_, ips)| ips.iter().skip(1).map(|&ip| ip as usize)),
    );
    // The innermost span of each path: stacks are cut where it was entered.
    let mut spans: HashMap<u32, Option<SpanFrame>> = HashMap::new();
    for ((tag, ips), n) in raw {
        let code: Box<[u32]> = match ips.split_first() {
            None => Box::from([]),
            Some((&pc, rest)) => {
                let rest: Vec<usize> = rest.iter().map(|&ip| ip as usize).collect();
                let path = tag & !LONG_POLL;
                let span = spans
                    .entry(path)
                    .or_insert_with(|| crate::span_path::innermost(Tag::new(path)));
                crate::symbolize::code_stack_from(
                    leaves.get(&(pc as usize)).map(|f| &f[..]),
                    &rest,
                    span.as_ref(),
                    crate::symbolize::Leaf::Keep,
                )
                .iter()
                .map(|f| s.frame_id(f))
                .collect()
            }
        };
        let key = (tag, code);
        if let Some(c) = s.resolved.get_mut(&key) {
            *c += n;
        } else if s.resolved.len() < MAX_CPU_STACKS {
            s.resolved.insert(key, n);
        } else {
            s.overflowed += n;
            *s.resolved.entry((tag, Box::from([]))).or_insert(0) += n;
        }
    }
}

/// How the snapshot's per-span CPU time was measured.
pub(crate) fn source(exact: CpuSource) -> CpuSource {
    match MODE.load(Ordering::Relaxed) {
        1 => match RAN_HZ.load(Ordering::Relaxed) {
            0 => CpuSource::Off,
            hz => CpuSource::Sampled { hz },
        },
        // Exact, or no profiler built: whatever the layer measures.
        0 | 2 => exact,
        _ => CpuSource::Off,
    }
}

/// The rate the store's counts were sampled at (0: no sampling ran).
pub(crate) fn sampled_hz() -> u32 {
    RAN_HZ.load(Ordering::Relaxed)
}

/// The sampling period the store's counts stand for (0: no sampling ran).
pub(crate) fn period_ns() -> u64 {
    match RAN_HZ.load(Ordering::Relaxed) {
        0 => 0,
        hz => 1_000_000_000 / u64::from(hz),
    }
}

/// The CPU stacks recorded so far (cumulative), symbolized and merged by span path and code
/// stack, and the sampled CPU time per tag.
pub(crate) fn stacks(by_tag: &PathIndex, period_ns: u64) -> (Vec<CpuStack>, HashMap<Tag, u64>) {
    drain();
    let counts: Vec<(u32, Arc<[CodeFrame]>, u64)> = {
        let mut guard = store();
        guard.as_mut().map_or_else(Vec::new, |s| {
            compact(s);
            s.resolved
                .iter()
                .map(|((tag, code), n)| {
                    let frames: Arc<[CodeFrame]> =
                        code.iter().map(|&i| s.frames[i as usize].clone()).collect();
                    (*tag, frames, *n)
                })
                .collect()
        })
    };
    let mut per_tag: HashMap<Tag, u64> = HashMap::new();
    let mut merged: Vec<CpuStack> = Vec::new();
    type Key = (PathKind, Vec<SpanFrame>, Arc<[CodeFrame]>, bool);
    let mut index: HashMap<Key, usize> = HashMap::new();
    for (key, code, n) in counts {
        let long_poll = key & LONG_POLL != 0;
        let tag = Tag::new(key & !LONG_POLL);
        *per_tag.entry(tag).or_insert(0) += n * period_ns;
        let (kind, frames) = path_of(by_tag, tag);
        let key = (kind, frames.to_vec(), code, long_poll);
        let i = *index
            .entry(key)
            .or_insert_with_key(|(kind, frames, code, long_poll)| {
                let code = if code.is_empty() {
                    vec![CodeFrame::named(TABLE_FULL_FRAME)]
                } else {
                    code.to_vec()
                };
                let mut stack = CpuStack::new(*kind, frames.clone(), code);
                stack.long_poll = *long_poll;
                merged.push(stack);
                merged.len() - 1
            });
        merged[i].samples += n;
        merged[i].cpu_ns += n * period_ns;
    }
    // Largest first, then by stack: a stable order for files and tables.
    merged.sort_by(|a, b| {
        b.samples
            .cmp(&a.samples)
            .then_with(|| (&a.frames, &a.code, a.long_poll).cmp(&(&b.frames, &b.code, b.long_poll)))
    });
    (merged, per_tag)
}
