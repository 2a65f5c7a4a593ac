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

use crate::span_path::{PathIndex, Paths, path_of};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tracing_prof_alloc::Tag;
use tracing_prof_cpu::TraceLink;
use tracing_prof_model::{
    ALL_TRIMMED_FRAME, CodeFrame, CodeStack, CpuSource, CpuStack, LinkedSamples,
    NOTHING_UNWOUND_FRAME, PathKind, SpanFrame, TABLE_FULL_FRAME,
};

/// How per-span CPU time is measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CpuTime {
    /// From the CPU stack samples (the default): no cost on span enter and exit; an estimate
    /// per span path, whose error shrinks with the time measured (see `docs/cpu.md`).
    #[default]
    Sampled,
    /// A per-thread CPU clock read on every enter and exit ([`CpuClock`](crate::CpuClock)): exact per interval,
    /// about 0.5 µs per read (a system call). For spans entered rarely, or tests.
    Exact,
    /// Not measured.
    Off,
}

/// How often the aggregator drains the samplers' rings: 100 ms (a thread's ring holds about
/// 0.6 s of samples at 100 Hz).
pub const DRAIN_EVERY: Duration = Duration::from_millis(100);
/// Distinct CPU stacks kept (per span path and code stack): 16384.
pub const MAX_CPU_STACKS: usize = 16_384;

/// The store's maps: hashed with foldhash, not SipHash. Their keys are this process's own
/// addresses and frames, hashed at every drain and compaction on the aggregator's thread
/// (SipHash over the frames' names was a sixth of that thread's time under an HTTP service's
/// load).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Default)]
struct Store {
    /// Weighted samples per (tag, trace link, code addresses innermost first) since the last
    /// compaction.
    raw: FastMap<(u32, TraceLink, Box<[u64]>), u64>,
    /// The id of each (tag, symbolized code stack, root first, as indices into `frames`):
    /// what `raw` becomes when it is compacted. Keyed by function and line, not by
    /// instruction, so it stops growing once the program's hot stacks have been seen. Three
    /// one-entry stacks of [`Empty`] ids stand for samples without code frames: those that
    /// found it full, those with nothing unwound, those whose every frame was trimmed. A
    /// snapshot's stacks share the keys' ids (`CodeStack::shared`).
    resolved: FastMap<(u32, Arc<[u32]>), u32>,
    /// Weighted samples per stack id.
    counts: Vec<u64>,
    /// The part of a stack's samples taken in one trace span's work, per (stack id, link).
    /// Bounded: see [`MAX_LINKED`].
    linked: FastMap<(u32, TraceLink), Linked>,
    /// Every distinct frame of the stacks in `resolved`, once: a stack costs 4 bytes a frame
    /// (40 as `CodeFrame`s: the example service's store grew 0.5 MiB a minute that way).
    frames: Vec<CodeFrame>,
    frame_ids: FastMap<CodeFrame, u32>,
    /// `frames` as snapshots share it, made again only when frames were added since: every
    /// CPU stack of a snapshot is its ids in `resolved` and this table. (Each stack's frames
    /// as a list of their own, 40 bytes a frame, kept for the run, were the profiler's largest
    /// memory on an axum service: 3.5 MB for a thousand stacks 80 frames deep; built anew per
    /// capture instead, up to three copies were alive at an export.)
    table: Option<Arc<[CodeFrame]>>,
    /// Samples that arrived while `resolved` was full.
    overflowed: u64,
    /// The last batch's interrupted instructions, resolved: the next batch takes those it
    /// meets again from here (a service's hot instructions come back every batch; resolving
    /// them anew was a quarter of the profiler's own allocations). Only the last batch's, so
    /// it never grows with the run.
    leaves: crate::symbolize::Transient,
    /// When the store was made: `Linked::seen` counts seconds from it.
    born: Option<std::time::Instant>,
}

/// Why a sample has no code frames, kept in the store as a one-entry stack of an id no frame
/// has (frame ids count up from 0), so that each reads for what happened to it. (All three
/// were one key, named for the first: 3 of 14 processes of an axum service said 1 sample
/// "found the stack table full" after about 2 400, with room for 16 384 stacks.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Empty {
    TableFull = 0,
    NothingUnwound = 1,
    AllTrimmed = 2,
}

impl Empty {
    const BASE: u32 = u32::MAX - 2;

    fn key(self) -> Arc<[u32]> {
        Arc::from([Self::BASE + self as u32])
    }

    fn of(code: &[u32]) -> Option<Empty> {
        match code {
            [id] if *id >= Self::BASE => Some(match id - Self::BASE {
                0 => Empty::TableFull,
                1 => Empty::NothingUnwound,
                _ => Empty::AllTrimmed,
            }),
            _ => None,
        }
    }

    fn frame(self) -> &'static str {
        match self {
            Empty::TableFull => TABLE_FULL_FRAME,
            Empty::NothingUnwound => NOTHING_UNWOUND_FRAME,
            Empty::AllTrimmed => ALL_TRIMMED_FRAME,
        }
    }
}

/// Samples of one stack in one trace span's work.
#[derive(Clone, Copy)]
struct Linked {
    samples: u64,
    /// When it was last added to, in seconds of the store's life.
    seen: u64,
}

/// (Stack, trace span) pairs kept: 65 536, about 8 MiB with the map's own room. A busy service makes one per sample
/// it takes in a request (16 busy threads at 100 Hz: 1 600 a second). Past it, the pairs least
/// recently sampled are let go, and so are pairs not sampled for [`LINK_SECONDS`]: their
/// samples stay in their stack's count, and a window taken after that no longer names their
/// span.
pub(crate) const MAX_LINKED: usize = 65_536;
/// Seconds after which a pair no longer sampled is let go: 5 minutes, longer than any export
/// interval takes to come round.
const LINK_SECONDS: u64 = 300;

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

    /// The id of stack `key`, added if new and there is room (always, for an [`Empty`] one:
    /// where a tag's samples go once the table is full).
    fn stack_id(&mut self, key: (u32, Arc<[u32]>)) -> Option<u32> {
        if let Some(&id) = self.resolved.get(&key) {
            return Some(id);
        }
        if self.resolved.len() >= MAX_CPU_STACKS && Empty::of(&key.1).is_none() {
            return None;
        }
        let id = self.counts.len() as u32;
        self.counts.push(0);
        self.resolved.insert(key, id);
        Some(id)
    }

    /// Seconds since the store was made.
    fn now_s(&mut self) -> u64 {
        self.born
            .get_or_insert_with(std::time::Instant::now)
            .elapsed()
            .as_secs()
    }

    /// Lets go of pairs not sampled for [`LINK_SECONDS`], then of the least recently
    /// sampled ones while there are more than [`MAX_LINKED`]; returns how many went.
    fn trim_links(&mut self) -> u64 {
        let now = self.now_s();
        let before = self.linked.len();
        self.linked
            .retain(|_, l| now.saturating_sub(l.seen) < LINK_SECONDS);
        if self.linked.len() > MAX_LINKED {
            // Exactly down to three quarters, least recently sampled first (ties by key).
            let mut by_age: Vec<(u64, (u32, TraceLink))> =
                self.linked.iter().map(|(k, l)| (l.seen, *k)).collect();
            by_age.sort_unstable();
            let cut = self.linked.len() - MAX_LINKED * 3 / 4;
            for (_, key) in &by_age[..cut] {
                self.linked.remove(key);
            }
        }
        (before - self.linked.len()) as u64
    }
}

/// The bit of a store key's tag that marks samples taken in a long poll (tags are below
/// `MAX_TAGS`, far under it).
const LONG_POLL: u32 = 1 << 31;

/// Raw stacks kept before they are symbolized and merged (on the aggregator thread, at the
/// drain that reaches this many, and at every capture).
const MAX_RAW: usize = 4096;

/// The CPU samples' store, and how CPU time is measured: a part of
/// [`crate::runtime::Runtime`]. All zeros when new.
#[repr(align(64))]
pub(crate) struct Cpu {
    /// Boxed: `None` is then all zeros, and so is the whole runtime (see `crate::runtime`).
    store: Mutex<Option<Box<Store>>>,
    /// How the most recently installed layer measures CPU time on enter and exit: 0 off, 1 a
    /// thread clock, 2 a clock that splits user and system time.
    exact: AtomicU8,
    /// The CPU time mode of the profiler built last: 0 none built (a bare layer), 1 sampled,
    /// 2 exact, 3 off.
    mode: AtomicU8,
    /// The sampling rate this process's profiler started the sampler with (0 once stopped).
    started_hz: AtomicU32,
    /// The rate the samples in the store were taken at (kept after the sampler stops).
    ran_hz: AtomicU32,
    /// (Stack, trace span) pairs let go so far (see [`MAX_LINKED`]).
    links_let_go: AtomicU64,
}

impl Cpu {
    pub(crate) const fn new() -> Self {
        Cpu {
            store: Mutex::new(None),
            exact: AtomicU8::new(0),
            mode: AtomicU8::new(0),
            started_hz: AtomicU32::new(0),
            ran_hz: AtomicU32::new(0),
            links_let_go: AtomicU64::new(0),
        }
    }

    /// The store's lock, for `fork` (see `crate::fork`).
    pub(crate) fn lock_for_fork(&'static self) -> Box<dyn std::any::Any> {
        Box::new(self.store())
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Option<Box<Store>>> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Says how the layer installed last measures CPU time on enter and exit.
    pub(crate) fn set_exact_source(&self, source: CpuSource) {
        let mode = match source {
            CpuSource::ThreadClock => 1,
            CpuSource::Rusage => 2,
            _ => 0,
        };
        self.exact.store(mode, Ordering::Relaxed);
    }

    /// How CPU time is measured on enter and exit by the layer installed last.
    fn exact_source(&self) -> CpuSource {
        match self.exact.load(Ordering::Relaxed) {
            1 => CpuSource::ThreadClock,
            2 => CpuSource::Rusage,
            _ => CpuSource::Off,
        }
    }

    /// (Stack, trace span) pairs let go so far, to bound the store.
    pub(crate) fn links_let_go(&self) -> u64 {
        self.links_let_go.load(Ordering::Relaxed)
    }

    /// Starts the sampler as `cpu_time`, `hz` and `unwind` say; `Err` says why it could not run
    /// (the profiler goes on without it).
    pub(crate) fn start(
        &self,
        cpu_time: CpuTime,
        hz: u32,
        unwind: tracing_prof_cpu::Unwind,
    ) -> Result<(), tracing_prof_cpu::StartError> {
        self.mode.store(
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
        tracing_prof_alloc::__private::set_new_thread_hook(Some(tracing_prof_cpu::ensure_armed));
        tracing_prof_cpu::start(hz, unwind)?;
        // The heap sampler walks armed threads' stacks with the same unwinder (it stays usable
        // once sampling stops: its tables and the threads' stack extents are never freed).
        tracing_prof_alloc::__private::set_stack_walker(Some(tracing_prof_cpu::walk_own_stack));
        let before = self.ran_hz.swap(hz, Ordering::Relaxed);
        if before != 0 && before != hz {
            // Counts taken at another rate stand for another period: start afresh.
            *self.store() = None;
        }
        self.started_hz.store(hz, Ordering::Relaxed);
        Ok(())
    }

    /// Stops the sampler if this process's profiler started it, and keeps what it recorded.
    pub(crate) fn stop(&self, paths: &Paths) {
        if self.started_hz.swap(0, Ordering::Relaxed) != 0 {
            tracing_prof_cpu::stop();
            tracing_prof_alloc::__private::set_new_thread_hook(None);
            self.drain(paths);
        }
    }

    /// Moves every recorded sample into the store, and symbolizes them once enough have come.
    pub(crate) fn drain(&self, paths: &Paths) {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        let mut guard = self.store();
        let s = guard.get_or_insert_with(Box::default);
        tracing_prof_cpu::drain(|sample| {
            let tag = sample.tag | if sample.long_poll { LONG_POLL } else { 0 };

            let key = (tag, sample.link, Box::<[u64]>::from(sample.ips));
            *s.raw.entry(key).or_insert(0) += sample.weight;
        });
        if s.raw.len() >= MAX_RAW {
            self.compact(s, paths);
        }
    }

    /// Symbolizes the raw stacks and merges them into `resolved`. The interrupted instructions
    /// are resolved without entering the symbol cache (there are as many as there are hot
    /// instructions); return addresses are cached.
    fn compact(&self, s: &mut Store, paths: &Paths) {
        if s.raw.is_empty() {
            return;
        }
        let now = s.now_s();
        let raw = std::mem::take(&mut s.raw);
        let leaves = crate::symbolize::resolve_transient(
            raw.keys()
                .filter_map(|(_, _, ips)| ips.first().map(|&ip| ip as usize)),
            &s.leaves,
        );
        crate::symbolize::prepare(
            raw.keys()
                .flat_map(|(_, _, ips)| ips.iter().skip(1).map(|&ip| ip as usize)),
        );
        // The innermost span of each path: stacks are cut where it was entered.
        let mut spans: HashMap<u32, (Option<SpanFrame>, Option<SpanFrame>)> = HashMap::new();
        for ((tag, link, ips), n) in raw {
            let code: Arc<[u32]> = match ips.split_first() {
                None => Empty::NothingUnwound.key(),
                Some((&pc, rest)) => {
                    let rest: Vec<usize> = rest.iter().map(|&ip| ip as usize).collect();
                    let path = tag & !LONG_POLL;
                    let (span, parent) = spans
                        .entry(path)
                        .or_insert_with(|| paths.innermost_two(Tag::new(path)));
                    crate::symbolize::code_stack_from(
                        leaves.get(&(pc as usize)).map(|f| &f[..]),
                        &rest,
                        crate::symbolize::InSpan {
                            span: span.as_ref(),
                            parent: parent.as_ref(),
                        },
                        crate::symbolize::Leaf::Keep,
                    )
                    .iter()
                    .map(|f| s.frame_id(f))
                    .collect::<Arc<[u32]>>()
                }
            };
            let code = if code.is_empty() {
                Empty::AllTrimmed.key()
            } else {
                code
            };
            let Some(id) = s.stack_id((tag, code)).or_else(|| {
                s.overflowed += n;
                s.stack_id((tag, Empty::TableFull.key()))
            }) else {
                continue; // not reached: an empty stack always has room
            };
            s.counts[id as usize] += n;
            if link.is_some() {
                let l = s.linked.entry((id, link)).or_insert(Linked {
                    samples: 0,
                    seen: now,
                });
                l.samples += n;
                l.seen = now;
            }
        }
        s.leaves = leaves;
        let let_go = s.trim_links();
        self.links_let_go.fetch_add(let_go, Ordering::Relaxed);
    }

    /// How the snapshot's per-span CPU time was measured.
    pub(crate) fn source(&self) -> CpuSource {
        match self.mode.load(Ordering::Relaxed) {
            1 => match self.ran_hz.load(Ordering::Relaxed) {
                0 => CpuSource::Off,
                hz => CpuSource::Sampled { hz },
            },
            // Exact, or no profiler built: whatever the layer measures.
            0 | 2 => self.exact_source(),
            _ => CpuSource::Off,
        }
    }

    /// The rate the store's counts were sampled at (0: no sampling ran).
    pub(crate) fn sampled_hz(&self) -> u32 {
        self.ran_hz.load(Ordering::Relaxed)
    }

    /// The sampling period the store's counts stand for (0: no sampling ran).
    pub(crate) fn period_ns(&self) -> u64 {
        match self.ran_hz.load(Ordering::Relaxed) {
            0 => 0,
            hz => 1_000_000_000 / u64::from(hz),
        }
    }

    /// The sampled CPU time per tag so far (cumulative): what [`stacks`](Self::stacks) sums,
    /// without building the stacks (new samples are symbolized into the store, as each drain
    /// past its bound does).
    pub(crate) fn sampled_cpu(&self, paths: &Paths) -> HashMap<Tag, u64> {
        self.drain(paths);
        let period_ns = self.period_ns();
        let mut per_tag: HashMap<Tag, u64> = HashMap::new();
        let mut guard = self.store();
        if let Some(s) = guard.as_mut() {
            self.compact(s, paths);
            for ((tag, _), &id) in &s.resolved {
                let n = s.counts.get(id as usize).copied().unwrap_or(0);
                *per_tag.entry(Tag::new(tag & !LONG_POLL)).or_insert(0) += n * period_ns;
            }
        }
        per_tag
    }

    /// The CPU stacks recorded so far (cumulative), symbolized and merged by span path and code
    /// stack, and the sampled CPU time per tag.
    pub(crate) fn stacks(
        &self,
        paths: &Paths,
        by_tag: &PathIndex,
        period_ns: u64,
    ) -> (Vec<CpuStack>, HashMap<Tag, u64>) {
        self.drain(paths);
        /// A stack of the store, symbolized: its tag, frame ids, code, samples and samples per
        /// trace span.
        type Counted = (u32, Arc<[u32]>, CodeStack, u64, Vec<LinkedSamples>);
        let counts: Vec<Counted> = {
            let mut guard = self.store();
            guard.as_mut().map_or_else(Vec::new, |s| {
                self.compact(s, paths);
                let mut links: HashMap<u32, Vec<LinkedSamples>> = HashMap::new();
                for (&(id, link), l) in &s.linked {
                    links.entry(id).or_default().push(LinkedSamples {
                        link: tracing_prof_model::TraceLink {
                            trace_id: link.trace_id,
                            span_id: link.span_id,
                        },
                        samples: l.samples,
                    });
                }
                let Store {
                    resolved,
                    counts,
                    frames,
                    table,
                    ..
                } = &mut **s;
                let table = match table {
                    Some(t) if t.len() == frames.len() => Arc::clone(t),
                    _ => Arc::clone(table.insert(frames.iter().cloned().collect())),
                };
                resolved
                    .iter()
                    .map(|((tag, ids), &id)| {
                        let code = match Empty::of(ids) {
                            Some(empty) => CodeStack::from([CodeFrame::named(empty.frame())]),
                            // Every id is in the table (it is `frames`, which only grows).
                            None => CodeStack::shared(Arc::clone(&table), Arc::clone(ids))
                                .unwrap_or_else(|| {
                                    ids.iter()
                                        .filter_map(|&i| frames.get(i as usize).cloned())
                                        .collect()
                                }),
                        };
                        let links = links.remove(&id).unwrap_or_default();
                        (*tag, Arc::clone(ids), code, counts[id as usize], links)
                    })
                    .collect()
            })
        };
        let mut per_tag: HashMap<Tag, u64> = HashMap::new();
        let mut merged: Vec<CpuStack> = Vec::new();
        // Stacks merged by path and frame ids: equal ids are equal frames (each frame has one
        // id), and ids hash without reading the frames' names. The path's frames are borrowed
        // from `by_tag`: copied once per merged stack, not once per stack of the store.
        type Key<'a> = (PathKind, &'a [SpanFrame], Arc<[u32]>, bool);
        let mut index: HashMap<Key<'_>, usize> = HashMap::new();
        for (key, ids, code, n, links) in counts {
            let long_poll = key & LONG_POLL != 0;
            let tag = Tag::new(key & !LONG_POLL);
            *per_tag.entry(tag).or_insert(0) += n * period_ns;
            let (kind, frames) = path_of(by_tag, tag);
            let key = (kind, frames, ids, long_poll);
            let i = *index
                .entry(key)
                .or_insert_with_key(|(kind, frames, _, long_poll)| {
                    let mut stack = CpuStack::new(*kind, frames.to_vec(), code);
                    stack.long_poll = *long_poll;
                    merged.push(stack);
                    merged.len() - 1
                });
            merged[i].samples += n;
            merged[i].cpu_ns += n * period_ns;
            merged[i].links.extend(links);
        }
        for stack in &mut merged {
            // Two tags of one path may share a span: one entry per span, in span order.
            stack.links.sort_by_key(|l| l.link);
            stack.links.dedup_by(|b, a| {
                let same = a.link == b.link;
                if same {
                    a.samples += b.samples;
                }
                same
            });
        }
        // Largest first, then by stack: a stable order for files and tables.
        merged.sort_by(|a, b| {
            b.samples.cmp(&a.samples).then_with(|| {
                (&a.frames, &a.code, a.long_poll).cmp(&(&b.frames, &b.code, b.long_poll))
            })
        });
        (merged, per_tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past the cap, exactly a quarter goes, the least recently sampled first, even when every
    /// pair was sampled in the same second.
    #[test]
    fn links_past_the_cap_are_let_go_least_recent_first() {
        let mut s = Store {
            born: std::time::Instant::now().checked_sub(std::time::Duration::from_secs(10)),
            ..Store::default()
        };
        let now = s.now_s();
        assert!(now >= 10);
        let link = |span_id| TraceLink {
            trace_id: 1,
            span_id,
        };
        for i in 0..MAX_LINKED as u64 + 100 {
            let seen = if i < 10 { 0 } else { now };
            s.linked
                .insert((0, link(i + 1)), Linked { samples: 1, seen });
        }
        let let_go = s.trim_links();
        assert_eq!(s.linked.len(), MAX_LINKED * 3 / 4);
        assert!((1..=10).all(|i| !s.linked.contains_key(&(0, link(i)))));
        assert_eq!(let_go, (MAX_LINKED / 4 + 100) as u64);
    }

    /// Samples of the one-frame stacks whose frame is `frame`.
    fn samples_named(stacks: &[CpuStack], frame: &str) -> u64 {
        stacks
            .iter()
            .filter(|st| {
                st.code.len() == 1 && st.code.first().is_some_and(|f| &*f.function == frame)
            })
            .map(|st| st.samples)
            .sum()
    }

    /// A sample with no return address is named for that, not for a full table (3 of 14
    /// processes of an axum service said one "found the stack table full" with room for 16 384
    /// stacks); past the cap, samples of new stacks are named for the full table.
    #[test]
    fn samples_without_code_frames_say_why() {
        let cpu = Cpu::new();
        let paths = &crate::runtime::RUNTIME.paths;
        let tag = Tag::NO_SPAN.get();
        {
            let mut guard = cpu.store();
            let s = guard.get_or_insert_with(Box::default);
            s.raw.insert((tag, TraceLink::default(), Box::from([])), 3);
            // The table full of stacks already: a new one goes to the full table's entry.
            let _ = s.frame_id(&CodeFrame::named("f"));
            for i in 0..MAX_CPU_STACKS as u32 {
                s.resolved.insert((Tag::FIRST_PATH + i, Arc::from([0])), i);
                s.counts.push(0);
            }
            let pc = samples_without_code_frames_say_why as *const () as u64;
            s.raw
                .insert((tag, TraceLink::default(), Box::from([pc + 1, pc + 2])), 5);
        }
        let (stacks, _) = cpu.stacks(paths, &paths.index(), 1);
        assert_eq!(samples_named(&stacks, NOTHING_UNWOUND_FRAME), 3);
        assert_eq!(samples_named(&stacks, TABLE_FULL_FRAME), 5);
        assert_eq!(samples_named(&stacks, ALL_TRIMMED_FRAME), 0);
        // A later capture, after a new stack: each stack with code frames shares them with the
        // first capture (the store's ids and frame table), and each stack reads as it should.
        {
            let mut guard = cpu.store();
            let s = guard.as_mut().unwrap();
            s.raw.insert((tag, TraceLink::default(), Box::from([])), 2);
            let other = Tag::FIRST_PATH + MAX_CPU_STACKS as u32;
            s.raw
                .insert((other, TraceLink::default(), Box::from([])), 7);
        }
        let (again, _) = cpu.stacks(paths, &paths.index(), 1);
        assert_eq!(again.len(), stacks.len() + 1);
        let mut shared = 0;
        for a in &stacks {
            let b = again
                .iter()
                .find(|b| b.frames == a.frames && b.code == a.code)
                .unwrap_or_else(|| panic!("{:?} in the second capture", a.code));
            if a.code.first().is_some_and(|f| &*f.function == "f") {
                assert!(CodeStack::ptr_eq(&a.code, &b.code), "{:?}", a.code);
                shared += 1;
            }
        }
        assert!(shared > 0, "no stack with code frames compared");
        assert_eq!(samples_named(&again, NOTHING_UNWOUND_FRAME), 3 + 2 + 7);
        assert_eq!(samples_named(&again, TABLE_FULL_FRAME), 5);
        assert_eq!(samples_named(&again, "f"), 0);
    }
}
