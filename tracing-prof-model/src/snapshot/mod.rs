//! [`Snapshot`]: everything the profiler knows at one instant, as owned data.
//!
//! A snapshot is what the capture code in `tracing-prof-core` fills and what every exporter
//! ships. It knows nothing of any file format: [`Snapshot::profile`] turns one of its kinds into
//! a [`Profile`](crate::Profile), which knows pprof.

mod frames;

use frames::names_are;
pub use frames::{
    CodeFrame, NO_SPAN_FRAME, OVERFLOW_FRAME, PATH_SEPARATOR, PROFILER_FRAME, SpanFrame,
    TABLE_FULL_FRAME, display_path,
};
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// Buckets of the lifetime histogram (see [`LIFETIME_BUCKET_NAMES`]).
pub const LIFETIME_BUCKETS: usize = 9;
/// Names of the lifetime buckets, shortest first.
pub const LIFETIME_BUCKET_NAMES: [&str; LIFETIME_BUCKETS] = [
    "<1us", "<10us", "<100us", "<1ms", "<10ms", "<100ms", "<1s", "<10s", ">=10s",
];

/// Time spent by the spans of one path. Durations in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TimeStats {
    /// Spans closed.
    pub spans: u64,
    /// Creation to close, summed over closed spans.
    pub wall_ns: u64,
    /// Entered (enter to exit), summed over every interval on every thread, *self* time: less
    /// the intervals of child spans nested in it on the same thread (pprof's flat value).
    pub busy_ns: u64,
    /// Alive but not entered, summed over closed spans (`wall - busy`, at least 0, per span).
    pub idle_ns: u64,
    /// CPU time while the path was the innermost entered span, *self* time like `busy_ns`:
    /// sampled or measured, as [`Snapshot::cpu`] says.
    pub cpu_ns: u64,
    /// The user part of `cpu_ns`, with [`CpuSource::Rusage`] (else 0).
    pub cpu_user_ns: u64,
    /// The system part of `cpu_ns`, with [`CpuSource::Rusage`] (else 0).
    pub cpu_sys_ns: u64,
    /// Enter-to-exit intervals on an async runtime's worker thread at least as long as the
    /// long-poll threshold: polls that kept the worker from its other tasks.
    pub long_polls: u64,
    /// Every enter-to-exit interval by its own length (less nested child spans, as
    /// `busy_ns`), in the buckets of [`LIFETIME_BUCKET_NAMES`] (`<1us` to `>=10s`): how long
    /// each poll of an async span took.
    pub intervals: [u64; LIFETIME_BUCKETS],
}

impl TimeStats {
    /// Field by field sum.
    pub fn add(&mut self, o: &TimeStats) {
        self.spans += o.spans;
        self.wall_ns += o.wall_ns;
        self.busy_ns += o.busy_ns;
        self.idle_ns += o.idle_ns;
        self.cpu_ns += o.cpu_ns;
        self.cpu_user_ns += o.cpu_user_ns;
        self.cpu_sys_ns += o.cpu_sys_ns;
        self.long_polls += o.long_polls;
        for (a, b) in self.intervals.iter_mut().zip(&o.intervals) {
            *a += b;
        }
    }

    /// `self - earlier`, field by field, never below 0.
    pub fn since(&self, earlier: &TimeStats) -> TimeStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        TimeStats {
            spans: d(self.spans, earlier.spans),
            wall_ns: d(self.wall_ns, earlier.wall_ns),
            busy_ns: d(self.busy_ns, earlier.busy_ns),
            idle_ns: d(self.idle_ns, earlier.idle_ns),
            cpu_ns: d(self.cpu_ns, earlier.cpu_ns),
            cpu_user_ns: d(self.cpu_user_ns, earlier.cpu_user_ns),
            cpu_sys_ns: d(self.cpu_sys_ns, earlier.cpu_sys_ns),
            long_polls: d(self.long_polls, earlier.long_polls),
            intervals: std::array::from_fn(|i| d(self.intervals[i], earlier.intervals[i])),
        }
    }

    /// Time entered but not on a CPU: `busy - cpu`, at least 0. Blocking calls, lock waits and
    /// the thread being descheduled while the span was entered.
    pub fn off_cpu_ns(&self) -> u64 {
        self.busy_ns.saturating_sub(self.cpu_ns)
    }
}

/// Memory allocated by the spans of one path, in requested bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Blocks allocated.
    pub alloc_objects: u64,
    /// Bytes allocated (realloc growth included, see the allocator's `ReallocMode`).
    pub alloc_bytes: u64,
    /// Blocks allocated and not freed yet.
    pub inuse_objects: u64,
    /// Bytes allocated and not freed yet.
    pub inuse_bytes: u64,
}

impl MemoryStats {
    /// Field by field sum.
    pub fn add(&mut self, o: &MemoryStats) {
        self.alloc_objects += o.alloc_objects;
        self.alloc_bytes += o.alloc_bytes;
        self.inuse_objects += o.inuse_objects;
        self.inuse_bytes += o.inuse_bytes;
    }

    /// Allocations grown since `earlier`; in-use as it is now (a level, not a count).
    pub fn since(&self, earlier: &MemoryStats) -> MemoryStats {
        MemoryStats {
            alloc_objects: self.alloc_objects.saturating_sub(earlier.alloc_objects),
            alloc_bytes: self.alloc_bytes.saturating_sub(earlier.alloc_bytes),
            ..*self
        }
    }
}

/// What kind of path a [`PathProfile`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PathKind {
    /// A real span path.
    Span,
    /// Work done outside any span.
    NoSpan,
    /// The profiler's own work.
    Profiler,
    /// Span paths beyond the cap, lumped together.
    Overflow,
}

/// The numbers of one span path.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathProfile {
    /// What this path stands for.
    pub kind: PathKind,
    /// Root first; one synthetic frame for the synthetic kinds.
    pub frames: Vec<SpanFrame>,
    /// Time spent.
    pub time: TimeStats,
    /// Memory allocated and held (exact).
    pub memory: MemoryStats,
    /// Sampled allocations still live when the span that made them closed (estimates from the
    /// heap sampler, exact at rate 1): `(allocations, bytes)`, summed over closed spans.
    pub outlived: (u64, u64),
}

impl PathProfile {
    /// A path with no numbers yet.
    pub fn new(kind: PathKind, frames: Vec<SpanFrame>) -> Self {
        PathProfile {
            kind,
            frames,
            time: TimeStats::default(),
            memory: MemoryStats::default(),
            outlived: (0, 0),
        }
    }

    /// The span path names from the root, joined by ` -> ` (see [`SpanFrame::path_name`]).
    pub fn display_path(&self) -> String {
        display_path(&self.frames)
    }

    /// Whether the path's span names (or path names), root first, are `names`.
    pub fn is(&self, names: &[&str]) -> bool {
        names_are(&self.frames, names)
    }

    fn key(&self) -> (PathKind, &[SpanFrame]) {
        (self.kind, &self.frames)
    }
}

/// Frees of sampled allocations by lifetime, estimated like [`StackProfile::memory`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lifetimes {
    /// Blocks freed, by lifetime bucket (see [`LIFETIME_BUCKET_NAMES`]).
    pub freed_objects: [u64; LIFETIME_BUCKETS],
    /// Bytes freed, by lifetime bucket.
    pub freed_bytes: [u64; LIFETIME_BUCKETS],
    /// Blocks freed sooner than the temporary threshold.
    pub temporary_objects: u64,
    /// Bytes of those.
    pub temporary_bytes: u64,
}

impl Lifetimes {
    /// Bucket by bucket sum.
    pub fn add(&mut self, o: &Lifetimes) {
        for k in 0..LIFETIME_BUCKETS {
            self.freed_objects[k] += o.freed_objects[k];
            self.freed_bytes[k] += o.freed_bytes[k];
        }
        self.temporary_objects += o.temporary_objects;
        self.temporary_bytes += o.temporary_bytes;
    }

    /// `self - earlier`, bucket by bucket, never below 0.
    pub fn since(&self, o: &Lifetimes) -> Lifetimes {
        Lifetimes {
            freed_objects: std::array::from_fn(|k| {
                self.freed_objects[k].saturating_sub(o.freed_objects[k])
            }),
            freed_bytes: std::array::from_fn(|k| {
                self.freed_bytes[k].saturating_sub(o.freed_bytes[k])
            }),
            temporary_objects: self.temporary_objects.saturating_sub(o.temporary_objects),
            temporary_bytes: self.temporary_bytes.saturating_sub(o.temporary_bytes),
        }
    }

    /// Blocks freed, all lifetimes.
    pub fn freed(&self) -> u64 {
        self.freed_objects.iter().sum()
    }
}

/// The sampled allocations of one code stack under one span path.
///
/// `memory` and `lifetimes` are *estimates*: each sample stands for the bytes between the
/// sample points it covered (unbiased; exact at sampling rate 1). `samples` and `sampled_bytes`
/// are the raw samples behind them.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StackProfile {
    /// What the span path stands for.
    pub kind: PathKind,
    /// The span path, root first.
    pub frames: Vec<SpanFrame>,
    /// The code stack under it, root first, ending at the function that allocated.
    pub code: Vec<CodeFrame>,
    /// Allocations sampled.
    pub samples: u64,
    /// Their bytes.
    pub sampled_bytes: u64,
    /// Estimated memory.
    pub memory: MemoryStats,
    /// Estimated frees by lifetime.
    pub lifetimes: Lifetimes,
}

impl StackProfile {
    /// A stack with no samples yet.
    pub fn new(kind: PathKind, frames: Vec<SpanFrame>, code: Vec<CodeFrame>) -> Self {
        StackProfile {
            kind,
            frames,
            code,
            samples: 0,
            sampled_bytes: 0,
            memory: MemoryStats::default(),
            lifetimes: Lifetimes::default(),
        }
    }

    /// Mean size of the sampled allocations (Go's `bytes` label).
    pub fn mean_size(&self) -> u64 {
        self.sampled_bytes.checked_div(self.samples).unwrap_or(0)
    }

    /// `span -> path @ innermost function`.
    pub fn display(&self) -> String {
        let leaf = self.code.last().map_or("?".into(), CodeFrame::short_name);
        format!("{} @ {leaf}", display_path(&self.frames))
    }
}

/// The CPU samples of one code stack under one span path.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CpuStack {
    /// What the span path stands for.
    pub kind: PathKind,
    /// The span path that was the innermost entered span when the samples were taken.
    pub frames: Vec<SpanFrame>,
    /// The code stack under it, root first, ending at the function that was running.
    pub code: Vec<CodeFrame>,
    /// Samples (a timer expiry that the thread could not take in time counts again).
    pub samples: u64,
    /// CPU time they stand for: `samples` times the sampling period.
    pub cpu_ns: u64,
    /// Whether these samples were taken in long polls: on an async runtime's worker that had
    /// entered or left no span for at least the long-poll threshold. The same stack outside
    /// long polls is another `CpuStack`.
    pub long_poll: bool,
    /// The part of `samples` taken while a trace span's work ran, per span, in span order
    /// (see `TraceLink`); the rest of `samples` belongs to no known trace span. Empty unless
    /// the profiler links samples to OpenTelemetry spans.
    pub links: Vec<crate::LinkedSamples>,
}

impl CpuStack {
    /// A stack with no samples yet, not in a long poll.
    pub fn new(kind: PathKind, frames: Vec<SpanFrame>, code: Vec<CodeFrame>) -> Self {
        CpuStack {
            kind,
            frames,
            code,
            samples: 0,
            cpu_ns: 0,
            long_poll: false,
            links: Vec::new(),
        }
    }

    /// Samples of this stack that belong to no trace span.
    pub fn unlinked_samples(&self) -> u64 {
        let linked: u64 = self.links.iter().map(|l| l.samples).sum();
        self.samples.saturating_sub(linked)
    }
}

/// How per-span CPU time was measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CpuSource {
    /// Not measured: `cpu_ns` is 0.
    #[default]
    Off,
    /// From CPU stack samples, `hz` per second of CPU time per thread (the default).
    Sampled {
        /// Samples per CPU second.
        hz: u32,
    },
    /// The thread CPU clock read on every enter and exit (exact, no user/system split).
    ThreadClock,
    /// `getrusage(RUSAGE_THREAD)` on every enter and exit (user and system apart, inexact).
    Rusage,
}

impl CpuSource {
    /// Whether CPU time was measured at all.
    pub fn is_measured(self) -> bool {
        self != CpuSource::Off
    }
}

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
    pub path: String,
    /// In-use bytes now.
    pub inuse_bytes: u64,
    /// Growth since its in-use memory last fell (or was first seen).
    pub growth_bytes: u64,
    /// Captures that rose since then.
    pub snapshots: usize,
}

impl SuspectedLeak {
    /// A suspected leak of the span path `frames` (and the stack `code` under it, if any).
    pub fn new(
        kind: PathKind,
        frames: Vec<SpanFrame>,
        code: Vec<CodeFrame>,
        inuse_bytes: u64,
        growth_bytes: u64,
        snapshots: usize,
    ) -> Self {
        let path = if code.is_empty() {
            display_path(&frames)
        } else {
            let leaf = code.last().map_or("?".into(), CodeFrame::short_name);
            format!("{} @ {leaf}", display_path(&frames))
        };
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
        }
    }

    fn stacks_since(&self, base: &Snapshot) -> Vec<StackProfile> {
        type Key<'a> = (PathKind, &'a [SpanFrame], &'a [CodeFrame]);
        let before: HashMap<Key<'_>, &StackProfile> = base
            .stacks
            .iter()
            .map(|s| ((s.kind, s.frames.as_slice(), s.code.as_slice()), s))
            .collect();
        self.stacks
            .iter()
            .filter_map(|s| {
                let mut out = s.clone();
                if let Some(b) = before.get(&(s.kind, s.frames.as_slice(), s.code.as_slice())) {
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
        type Key<'a> = (PathKind, &'a [SpanFrame], &'a [CodeFrame], bool);
        fn key(s: &CpuStack) -> Key<'_> {
            (s.kind, s.frames.as_slice(), s.code.as_slice(), s.long_poll)
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
    /// sampled stacks (not over the paths below it).
    pub fn sampled_memory(&self, names: &[&str]) -> MemoryStats {
        let mut m = MemoryStats::default();
        for s in self.stacks.iter().filter(|s| names_are(&s.frames, names)) {
            m.add(&s.memory);
        }
        m
    }

    /// The sampled CPU time of the span path whose span names are `names`, summed over its
    /// CPU stacks (self time: not over the paths below it).
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
            .any(|l| l.kind == stack.kind && l.frames == stack.frames && l.code == stack.code)
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
