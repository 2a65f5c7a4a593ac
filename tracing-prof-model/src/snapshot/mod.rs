//! [`Snapshot`]: everything the profiler knows at one instant, as owned data.
//!
//! A snapshot is what the capture code in `tracing-prof-core` fills and what every exporter
//! ships. It knows nothing of any file format: [`Snapshot::profile`] turns one of its kinds into
//! a [`Profile`](crate::Profile), which knows pprof.

mod code_stack;
mod durations;
mod frames;
mod memory;
mod paths;
mod stacks;

pub use code_stack::{CodeStack, Frames as CodeFrames};
pub use durations::{
    DURATION_BOUNDS_NS, DURATION_BUCKETS, DurationExemplar, duration_bucket, duration_quantile,
    nearest_duration_bound, slow_bound, spans_slower_than,
};
pub(crate) use frames::fields_of;
use frames::names_are;
pub use frames::{
    ALL_TRIMMED_FRAME, CodeFrame, NO_SPAN_FRAME, NOTHING_UNWOUND_FRAME, OVERFLOW_FRAME,
    PATH_SEPARATOR, PROFILER_FRAME, SpanFrame, TABLE_FULL_FRAME, display_path,
};
pub use memory::{AllocatorMemory, CgroupMemory, Peak, ProcessMemory};
pub use paths::{MemoryStats, PathKind, PathProfile, TimeStats};
pub use stacks::{CpuSource, CpuStack, Lifetimes, StackProfile};
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// Buckets of the lifetime histogram (see [`LIFETIME_BUCKET_NAMES`]).
pub const LIFETIME_BUCKETS: usize = 9;
/// Names of the lifetime buckets, shortest first.
pub const LIFETIME_BUCKET_NAMES: [&str; LIFETIME_BUCKETS] = [
    "<1us", "<10us", "<100us", "<1ms", "<10ms", "<100ms", "<1s", "<10s", ">=10s",
];

/// Memory of one thread (exactly counted, not sampled).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ThreadProfile {
    /// The thread's counter table index; 0 for work done without one.
    pub index: u32,
    /// OS thread id (0: unknown).
    pub tid: u64,
    /// Thread name as the OS knows it, `(no thread table)` for index 0.
    pub name: String,
    /// Whether the thread is alive.
    pub alive: bool,
    /// Allocated by the thread; in use: allocated by it and not freed yet, by any thread.
    pub memory: MemoryStats,
}

impl ThreadProfile {
    /// A thread with no numbers yet.
    pub fn new(index: u32, tid: u64, name: String, alive: bool) -> Self {
        ThreadProfile {
            index,
            tid,
            name,
            alive,
            memory: MemoryStats::default(),
        }
    }
}

/// A span path, or a sampled stack under one, whose in-use memory looks like a leak by
/// [`is_suspected_leak`](crate::series::is_suspected_leak): over the last captures it never
/// fell, grew in at least half of them, and by enough.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SuspectedLeak {
    /// What kind of path it is (a span path, or `(no span)`).
    pub kind: PathKind,
    /// The path, root first.
    pub frames: Vec<SpanFrame>,
    /// The sampled code stack under the path, root first; empty when the whole span path is
    /// suspected.
    pub code: Vec<CodeFrame>,
    /// Its span names joined by ` -> `, then ` @ ` and the innermost code frame for a stack.
    /// With span labels, paths that differ by their values only have the same `path`
    /// ([`SuspectedLeak::labeled_path`] tells them apart).
    pub path: String,
    /// In-use bytes now.
    pub inuse_bytes: u64,
    /// Growth since its in-use memory last fell (or was first seen).
    pub growth_bytes: u64,
    /// Captures that rose since then.
    pub snapshots: usize,
}

impl SuspectedLeak {
    /// [`path`](Self::path) with the label values of its spans in braces after the span names
    /// (`request -> store {route=/users}`, then ` @ ` and the code frame for a stack); the same
    /// as `path` without span labels.
    pub fn labeled_path(&self) -> String {
        let shown = format!("{}{}", display_path(&self.frames), fields_of(&self.frames));
        at_leaf(shown, self.code.iter())
    }

    /// A suspected leak of the span path `frames` (and the stack `code` under it, if any).
    pub fn new(
        kind: PathKind,
        frames: Vec<SpanFrame>,
        code: Vec<CodeFrame>,
        inuse_bytes: u64,
        growth_bytes: u64,
        snapshots: usize,
    ) -> Self {
        let path = at_leaf(display_path(&frames), code.iter());
        SuspectedLeak {
            kind,
            frames,
            code,
            path,
            inuse_bytes,
            growth_bytes,
            snapshots,
        }
    }
}

/// `shown` (a span path), then ` @ ` and the innermost frame of `code` for a stack.
fn at_leaf<'a>(shown: String, code: impl DoubleEndedIterator<Item = &'a CodeFrame>) -> String {
    match code.last() {
        Some(leaf) => format!("{shown} @ {}", leaf.short_name()),
        None => shown,
    }
}

/// The program a snapshot was taken in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Binary {
    /// Path of the executable.
    pub path: String,
    /// Its GNU build id in hex, when it has one.
    pub build_id: Option<String>,
}

/// What a program says about its own code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Symbols {
    /// Not looked at.
    #[default]
    Unknown,
    /// DWARF debug information: names, inlined functions, files and lines.
    DebugInfo,
    /// A symbol table but no debug information (`cargo build --release` without `debug`):
    /// function names, no inlined functions, no files or lines.
    SymbolTable,
    /// Neither (a stripped binary): code frames are addresses.
    Stripped,
}

impl Binary {
    /// A binary at `path` with an optional build id.
    pub fn new(path: impl Into<String>, build_id: Option<String>) -> Self {
        Binary {
            path: path.into(),
            build_id,
        }
    }

    /// The file name of the executable, e.g. `my-service`.
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
}

/// Everything the profiler knows at one instant.
///
/// A *cumulative* snapshot holds counters since the process started (the allocator counts from
/// its first allocation, the layer from its installation, CPU samples from the profiler's
/// start). One from [`Snapshot::window_since`] is a *window*: counters grown over the period
/// between two snapshots, and in-use memory as it stands at the end of it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Snapshot {
    /// When it was taken: the end of the period its counters cover.
    pub time: SystemTime,
    /// Length of the period its counters cover: since the profiler started, or the window.
    pub duration: Duration,
    /// Whether the counters cover only the window ending at `time`.
    pub window: bool,
    /// The program, when known.
    pub binary: Option<Binary>,
    /// What the program says about its own code: how its code frames could be named (known
    /// once code stacks were symbolized).
    pub symbols: Symbols,
    /// Every path with something to report, in a stable order.
    pub paths: Vec<PathProfile>,
    /// Spans that were counted under [`OVERFLOW_FRAME`] because the path cap was reached.
    pub overflowed_spans: u64,
    /// Paths whose in-use memory keeps growing, as the leak detection last saw them.
    pub suspected_leaks: Vec<SuspectedLeak>,
    /// How [`TimeStats::cpu_ns`] was measured.
    pub cpu: CpuSource,
    /// Sampled CPU stacks under their span paths (empty while CPU sampling is off).
    pub cpu_stacks: Vec<CpuStack>,
    /// The rate `cpu_stacks` were sampled at, per second of CPU time per thread (0: CPU
    /// sampling off, or the rate of [`CpuSource::Sampled`]). It runs whichever way
    /// [`Snapshot::cpu`] says per-span CPU time was measured; read it with
    /// [`Snapshot::cpu_sample_rate`].
    pub cpu_sampling_hz: u32,
    /// Mean bytes between heap samples (0: sampling off, `stacks` empty).
    pub sample_rate: u64,
    /// Frees sooner than this after allocation count as temporary in [`Lifetimes`].
    pub temporary_threshold: Duration,
    /// Sampled heap stacks under their span paths, with estimated memory.
    pub stacks: Vec<StackProfile>,
    /// Memory per thread (exact).
    pub threads: Vec<ThreadProfile>,
    /// Set when this snapshot is the heap at its high-water mark: its span paths' memory and
    /// its heap stacks are as they were then (time, CPU and threads are not kept).
    pub peak: Option<Peak>,
    /// The heap at its high-water mark since the profiler started (or since
    /// `Profiler::reset_peak`), carried by the aggregator's exports: what files write as
    /// `heap_peak` and `span_memory_peak`.
    pub heap_peak: Option<std::sync::Arc<Snapshot>>,
    /// What the process's resident memory is made of, read at the capture.
    pub process_memory: Option<ProcessMemory>,
}

impl Snapshot {
    /// An empty snapshot taken at `time`, covering `duration`.
    pub fn new(time: SystemTime, duration: Duration) -> Self {
        Snapshot {
            time,
            duration,
            window: false,
            binary: None,
            symbols: Symbols::Unknown,
            paths: Vec::new(),
            overflowed_spans: 0,
            suspected_leaks: Vec::new(),
            cpu: CpuSource::Off,
            cpu_stacks: Vec::new(),
            cpu_sampling_hz: 0,
            sample_rate: 0,
            temporary_threshold: Duration::from_millis(1),
            stacks: Vec::new(),
            threads: Vec::new(),
            peak: None,
            heap_peak: None,
            process_memory: None,
        }
    }

    /// The rate `cpu_stacks` were sampled at: [`Snapshot::cpu_sampling_hz`], or, for a
    /// snapshot that only says its per-span CPU time is sampled, that rate (0: off).
    pub fn cpu_sample_rate(&self) -> u32 {
        match (self.cpu_sampling_hz, self.cpu) {
            (0, CpuSource::Sampled { hz }) => hz,
            (hz, _) => hz,
        }
    }

    /// The CPU sampling period in nanoseconds (0 while CPU sampling is off).
    pub fn cpu_period_ns(&self) -> u64 {
        match self.cpu_sample_rate() {
            0 => 0,
            hz => 1_000_000_000 / u64::from(hz),
        }
    }

    /// What happened between `base` (an earlier cumulative snapshot) and `self`: counters (span
    /// counts, time, allocated objects and bytes, samples) are the growth over the window;
    /// in-use objects and bytes are those at its end, since in-use is a level, not a count.
    /// Paths, stacks and threads with nothing in the window are left out.
    pub fn window_since(&self, base: &Snapshot) -> Snapshot {
        let before: HashMap<(PathKind, &[SpanFrame]), &PathProfile> =
            base.paths.iter().map(|p| (p.key(), p)).collect();
        let paths = self
            .paths
            .iter()
            .filter_map(|p| {
                let b = before.get(&p.key());
                let time = b.map_or(p.time, |b| p.time.since(&b.time));
                let memory = b.map_or(p.memory, |b| p.memory.since(&b.memory));
                let (o0, b0) = b.map_or((0, 0), |b| b.outlived);
                let outlived = (
                    p.outlived.0.saturating_sub(o0),
                    p.outlived.1.saturating_sub(b0),
                );
                let active = time != TimeStats::default()
                    || memory.alloc_objects > 0
                    || memory.alloc_bytes > 0
                    || memory.inuse_bytes > 0
                    || outlived.0 > 0;
                active.then(|| PathProfile {
                    kind: p.kind,
                    frames: p.frames.clone(),
                    time,
                    memory,
                    outlived,
                    // Recent by nature: the window keeps them.
                    exemplars: p.exemplars.clone(),
                })
            })
            .collect();
        Snapshot {
            time: self.time,
            duration: self.duration.saturating_sub(base.duration),
            window: true,
            binary: self.binary.clone(),
            symbols: self.symbols,
            paths,
            overflowed_spans: self.overflowed_spans.saturating_sub(base.overflowed_spans),
            suspected_leaks: self.suspected_leaks.clone(),
            cpu: self.cpu,
            cpu_stacks: self.cpu_stacks_since(base),
            cpu_sampling_hz: self.cpu_sampling_hz,
            sample_rate: self.sample_rate,
            temporary_threshold: self.temporary_threshold,
            stacks: self.stacks_since(base),
            threads: self.threads_since(base),
            // Levels, as in-use is: as of the window's end.
            peak: self.peak,
            heap_peak: self.heap_peak.clone(),
            process_memory: self.process_memory.clone(),
        }
    }

    fn stacks_since(&self, base: &Snapshot) -> Vec<StackProfile> {
        type Key<'a> = (PathKind, &'a [SpanFrame], &'a CodeStack);
        let before: HashMap<Key<'_>, &StackProfile> = base
            .stacks
            .iter()
            .map(|s| ((s.kind, s.frames.as_slice(), &s.code), s))
            .collect();
        self.stacks
            .iter()
            .filter_map(|s| {
                let mut out = s.clone();
                if let Some(b) = before.get(&(s.kind, s.frames.as_slice(), &s.code)) {
                    out.samples = s.samples.saturating_sub(b.samples);
                    out.sampled_bytes = s.sampled_bytes.saturating_sub(b.sampled_bytes);
                    out.memory = s.memory.since(&b.memory);
                    out.lifetimes = s.lifetimes.since(&b.lifetimes);
                }
                (out.samples > 0 || out.memory.inuse_bytes > 0 || out.lifetimes.freed() > 0)
                    .then_some(out)
            })
            .collect()
    }

    fn cpu_stacks_since(&self, base: &Snapshot) -> Vec<CpuStack> {
        type Key<'a> = (PathKind, &'a [SpanFrame], &'a CodeStack, bool);
        fn key(s: &CpuStack) -> Key<'_> {
            (s.kind, s.frames.as_slice(), &s.code, s.long_poll)
        }
        let before: HashMap<Key<'_>, &CpuStack> =
            base.cpu_stacks.iter().map(|s| (key(s), s)).collect();
        self.cpu_stacks
            .iter()
            .filter_map(|s| {
                let mut out = s.clone();
                if let Some(b) = before.get(&key(s)) {
                    out.samples = s.samples.saturating_sub(b.samples);
                    out.cpu_ns = s.cpu_ns.saturating_sub(b.cpu_ns);
                    // A span missing from `base` is new in the window (or was let go by the
                    // profiler meanwhile: then its samples before `base` are counted again
                    // here, and no more than the stack's own growth).
                    out.links = s
                        .links
                        .iter()
                        .filter_map(|l| {
                            let was = b
                                .links
                                .binary_search_by(|x| x.link.cmp(&l.link))
                                .map_or(0, |i| b.links[i].samples);
                            let samples = l.samples.saturating_sub(was);
                            (samples > 0).then_some(crate::LinkedSamples {
                                link: l.link,
                                samples,
                            })
                        })
                        .collect();
                    let mut room = out.samples;
                    for l in &mut out.links {
                        l.samples = l.samples.min(room);
                        room -= l.samples;
                    }
                    out.links.retain(|l| l.samples > 0);
                }
                (out.samples > 0).then_some(out)
            })
            .collect()
    }

    fn threads_since(&self, base: &Snapshot) -> Vec<ThreadProfile> {
        self.threads
            .iter()
            .map(|t| {
                let mut out = t.clone();
                if let Some(b) = base.threads.iter().find(|b| b.index == t.index) {
                    out.memory = t.memory.since(&b.memory);
                }
                out
            })
            .collect()
    }

    /// The estimated memory of the span path whose span names are `names`, summed over its
    /// sampled stacks (not over the paths below it). With span labels, over every path of
    /// those names whatever their label values (compare it with the sum of their
    /// [`PathProfile::memory`]).
    pub fn sampled_memory(&self, names: &[&str]) -> MemoryStats {
        let mut m = MemoryStats::default();
        for s in self.stacks.iter().filter(|s| names_are(&s.frames, names)) {
            m.add(&s.memory);
        }
        m
    }

    /// The sampled CPU time of the span path whose span names are `names`, summed over its
    /// CPU stacks (self time: not over the paths below it). With span labels, over every path
    /// of those names whatever their label values.
    pub fn sampled_cpu_ns(&self, names: &[&str]) -> u64 {
        self.cpu_stacks
            .iter()
            .filter(|s| names_are(&s.frames, names))
            .map(|s| s.cpu_ns)
            .sum()
    }

    /// The lifetimes of the sampled allocations of `path`'s own spans.
    pub fn lifetimes(&self, path: &PathProfile) -> Lifetimes {
        let mut l = Lifetimes::default();
        for s in self
            .stacks
            .iter()
            .filter(|s| s.kind == path.kind && s.frames == path.frames)
        {
            l.add(&s.lifetimes);
        }
        l
    }

    /// The span path whose span names, root first, are `names`.
    pub fn path(&self, names: &[&str]) -> Option<&PathProfile> {
        self.paths.iter().find(|p| p.is(names))
    }

    /// Whether `path` is among [`Snapshot::suspected_leaks`].
    pub fn is_suspected_leak(&self, path: &PathProfile) -> bool {
        self.is_suspected_path(path.kind, &path.frames)
    }

    /// Whether the span path `frames` of `kind`, as a whole, is among the suspected leaks.
    pub fn is_suspected_path(&self, kind: PathKind, frames: &[SpanFrame]) -> bool {
        self.suspected_leaks
            .iter()
            .any(|l| l.kind == kind && l.frames == frames && l.code.is_empty())
    }

    /// Whether `stack` is among the suspected leaks as a stack of its own.
    pub fn is_suspected_stack_leak(&self, stack: &StackProfile) -> bool {
        self.suspected_leaks
            .iter()
            .any(|l| l.kind == stack.kind && l.frames == stack.frames && stack.code == l.code[..])
    }

    /// Memory summed over every path except the profiler's own.
    pub fn total_memory(&self) -> MemoryStats {
        let mut total = MemoryStats::default();
        for p in self.paths.iter().filter(|p| p.kind != PathKind::Profiler) {
            total.add(&p.memory);
        }
        total
    }

    /// `path`'s numbers plus those of every path below it (pprof's `cum`): for busy and CPU
    /// time, the time spent in the span including its children.
    pub fn cumulative(&self, path: &PathProfile) -> (TimeStats, MemoryStats) {
        let (mut t, mut m) = (TimeStats::default(), MemoryStats::default());
        for p in self
            .paths
            .iter()
            .filter(|p| p.kind == path.kind && p.frames.starts_with(&path.frames))
        {
            t.add(&p.time);
            m.add(&p.memory);
        }
        (t, m)
    }

    /// Paths sorted by `key`, largest first (ties in path order), with a non-zero key.
    pub fn top_by(&self, key: impl Fn(&PathProfile) -> u64) -> Vec<&PathProfile> {
        let mut v: Vec<&PathProfile> = self.paths.iter().filter(|p| key(p) > 0).collect();
        v.sort_by_key(|p| std::cmp::Reverse(key(p)));
        v
    }
}
