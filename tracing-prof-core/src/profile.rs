//! The profile model: per span path, its frames and its numbers. Knows nothing of pprof.

use crate::symbolize::CodeFrame;
use std::collections::HashMap;
use std::time::{Duration, SystemTime};
use tracing_core::Metadata;
use tracing_prof_alloc::{LIFETIME_BUCKETS, StackTotals, Tag, TagGuard, TagTotals};

/// Frame name of allocations made while no span was entered.
pub const NO_SPAN_FRAME: &str = "(no span)";
/// Frame name of the profiler's own allocations.
pub const PROFILER_FRAME: &str = "(tracing-prof)";
/// Frame name standing for span paths beyond the cap.
pub const OVERFLOW_FRAME: &str = "(other span paths)";
/// Code frame of samples whose stack found no room in the allocator's stack table.
pub const TABLE_FULL_FRAME: &str = "(stack table full)";

/// One span callsite in a path.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// The span's target, usually its module path; empty for synthetic frames.
    pub target: &'static str,
    /// The span's name.
    pub name: &'static str,
    /// Source file of the callsite, when known.
    pub file: Option<&'static str>,
    /// Source line of the callsite, when known.
    pub line: Option<u32>,
}

impl Frame {
    /// The frame of a span callsite.
    pub fn from_metadata(m: &'static Metadata<'static>) -> Self {
        Frame {
            target: m.target(),
            name: m.name(),
            file: m.file(),
            line: m.line(),
        }
    }

    /// A frame that stands for no callsite, such as [`NO_SPAN_FRAME`].
    pub const fn synthetic(name: &'static str) -> Self {
        Frame {
            target: "",
            name,
            file: None,
            line: None,
        }
    }

    /// `target::name`, or just `name` for synthetic frames: the function name exporters show.
    pub fn qualified_name(&self) -> String {
        if self.target.is_empty() {
            self.name.to_owned()
        } else {
            format!("{}::{}", self.target, self.name)
        }
    }
}

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
    /// CPU time of the entering threads over the entered intervals, self time like `busy_ns`.
    pub cpu_ns: u64,
    /// The user part of `cpu_ns`, with [`CpuClock::Rusage`](crate::CpuClock) (else 0).
    pub cpu_user_ns: u64,
    /// The system part of `cpu_ns`, with [`CpuClock::Rusage`](crate::CpuClock) (else 0).
    pub cpu_sys_ns: u64,
}

impl TimeStats {
    fn add(&mut self, o: &TimeStats) {
        self.spans += o.spans;
        self.wall_ns += o.wall_ns;
        self.busy_ns += o.busy_ns;
        self.idle_ns += o.idle_ns;
        self.cpu_ns += o.cpu_ns;
        self.cpu_user_ns += o.cpu_user_ns;
        self.cpu_sys_ns += o.cpu_sys_ns;
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
    fn add(&mut self, o: &MemoryStats) {
        self.alloc_objects += o.alloc_objects;
        self.alloc_bytes += o.alloc_bytes;
        self.inuse_objects += o.inuse_objects;
        self.inuse_bytes += o.inuse_bytes;
    }
}

/// What kind of path a [`PathProfile`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PathKind {
    /// A real span path.
    Span,
    /// Work done outside any span.
    NoSpan,
    /// The profiler's own allocations.
    Profiler,
    /// Span paths beyond the cap, lumped together.
    Overflow,
}

/// The numbers of one span path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathProfile {
    /// What this path stands for.
    pub kind: PathKind,
    /// Root first; one frame for the synthetic kinds.
    pub frames: Vec<Frame>,
    /// Time spent.
    pub time: TimeStats,
    /// Memory allocated and held.
    pub memory: MemoryStats,
    /// Sampled allocations still live when the span that made them closed (estimates from the
    /// heap sampler, exact at rate 1): `(allocations, bytes)`, summed over closed spans.
    pub outlived: (u64, u64),
}

impl PathProfile {
    /// The span names from the root, joined by ` -> `.
    pub fn display_path(&self) -> String {
        let names: Vec<&str> = self.frames.iter().map(|f| f.name).collect();
        names.join(" -> ")
    }

    /// Whether the path's span names, root first, are `names`.
    pub fn is(&self, names: &[&str]) -> bool {
        self.frames.len() == names.len() && self.frames.iter().zip(names).all(|(f, n)| f.name == *n)
    }
}

/// Everything the profiler knows at one instant.
///
/// A profile from [`Profile::capture`] is *cumulative*: counters since the process started (the
/// allocator counts from its first allocation, the layer from its installation). One from
/// [`Profile::window_since`] is a *window*: counters grown over the period between two captures,
/// and in-use memory as it stands at the end of it.
#[derive(Clone, Debug)]
pub struct Profile {
    /// When it was captured: the end of the period its counters cover.
    pub time: SystemTime,
    /// Length of the period its counters cover: since the profiler started, or the window.
    pub duration: Duration,
    /// Whether the counters cover only the window ending at `time` (see [`Profile::window_since`]).
    pub window: bool,
    /// Every path with something to report, in a stable order (by tag).
    pub paths: Vec<PathProfile>,
    /// Spans that were counted under [`OVERFLOW_FRAME`] because the path cap was reached.
    pub overflowed_spans: u64,
    /// Paths whose in-use memory keeps growing, as the aggregator's leak detection last saw
    /// them (empty when it is off); see [`crate::leak`].
    pub suspected_leaks: Vec<crate::leak::SuspectedLeak>,
    /// Mean bytes between heap samples when captured (0: sampling off, `stacks` empty).
    pub sample_rate: u64,
    /// Frees sooner than this after allocation count as temporary in [`Lifetimes`].
    pub temporary_threshold: Duration,
    /// Sampled code stacks under their span paths, with estimated memory; see
    /// [`StackProfile`].
    pub stacks: Vec<StackProfile>,
    /// Memory per thread (exact).
    pub threads: Vec<ThreadProfile>,
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

/// Names of the lifetime buckets, matching `tracing_prof_alloc::LIFETIME_BOUNDS_NS`.
pub const LIFETIME_BUCKET_NAMES: [&str; LIFETIME_BUCKETS] = [
    "<1us", "<10us", "<100us", "<1ms", "<10ms", "<100ms", "<1s", "<10s", ">=10s",
];

impl Lifetimes {
    fn add(&mut self, o: &Lifetimes) {
        for k in 0..LIFETIME_BUCKETS {
            self.freed_objects[k] += o.freed_objects[k];
            self.freed_bytes[k] += o.freed_bytes[k];
        }
        self.temporary_objects += o.temporary_objects;
        self.temporary_bytes += o.temporary_bytes;
    }

    fn since(&self, o: &Lifetimes) -> Lifetimes {
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
/// `memory` and `lifetimes` are *estimates*: each sample of `size` bytes stands for
/// `1 / (1 - e^(-size/rate))` allocations, as Go scales its heap profiles (unbiased; at rate 1
/// they are exact counts). `samples` and `sampled_bytes` are the raw samples behind them.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StackProfile {
    /// What the span path stands for.
    pub kind: PathKind,
    /// The span path, root first.
    pub frames: Vec<Frame>,
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
    /// Mean size of the sampled allocations (Go's `bytes` label).
    pub fn mean_size(&self) -> u64 {
        self.sampled_bytes.checked_div(self.samples).unwrap_or(0)
    }
}

/// Memory of one thread (exactly counted, not sampled).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ThreadProfile {
    /// The thread's counter table index (see `tracing_prof_alloc::ThreadTotals`); 0 for work
    /// done without one.
    pub index: u32,
    /// OS thread id (0: unknown).
    pub tid: u64,
    /// Thread name as the OS knows it, `(exited) name` when the thread has exited,
    /// `(no thread table)` for index 0.
    pub name: String,
    /// Whether the thread is alive.
    pub alive: bool,
    /// Allocated by the thread; in use: allocated by it and not freed yet, by any thread.
    pub memory: MemoryStats,
}

impl Profile {
    /// Reads every counter now. Never blocks application threads.
    pub fn capture(duration: Duration) -> Profile {
        let _profiler = TagGuard::new(Tag::PROFILER);
        let spans = crate::span_path::all_paths();
        let mut totals = vec![TagTotals::default(); Tag::FIRST_PATH as usize + spans.len()];
        tracing_prof_alloc::read_totals(&mut totals);
        let special = [
            (Tag::NO_SPAN, PathKind::NoSpan, NO_SPAN_FRAME),
            (Tag::PROFILER, PathKind::Profiler, PROFILER_FRAME),
            (Tag::OVERFLOW, PathKind::Overflow, OVERFLOW_FRAME),
        ]
        .map(|(tag, kind, name)| (tag, kind, vec![Frame::synthetic(name)]));
        let all: Vec<(Tag, PathKind, Vec<Frame>)> = special
            .into_iter()
            .chain(spans.into_iter().map(|(t, f)| (t, PathKind::Span, f)))
            .collect();
        let mut outlived = vec![(0.0, 0); totals.len()];
        tracing_prof_alloc::read_outlived(&mut outlived);
        let paths = all
            .iter()
            .filter_map(|(tag, kind, frames)| {
                let t = totals.get(tag.get() as usize)?;
                let (objects, bytes) = outlived[tag.get() as usize];
                let p = PathProfile {
                    kind: *kind,
                    frames: frames.clone(),
                    time: time_of(t),
                    memory: memory_of(t),
                    outlived: (objects.round() as u64, bytes),
                };
                let empty = p.time == TimeStats::default() && p.memory == MemoryStats::default();
                (!empty).then_some(p)
            })
            .collect();
        let by_tag: HashMap<Tag, (PathKind, &[Frame])> = all
            .iter()
            .map(|(tag, kind, frames)| (*tag, (*kind, frames.as_slice())))
            .collect();
        // Symbolization reads the binary's debug info: whatever goes wrong there must not take
        // the profile (or the aggregator thread) down with it; the stacks are left out instead.
        let stacks = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            stacks_of(tracing_prof_alloc::read_stacks(), &by_tag)
        }))
        .unwrap_or_default();
        Profile {
            time: SystemTime::now(),
            duration,
            window: false,
            paths,
            overflowed_spans: crate::span_path::overflowed_spans(),
            suspected_leaks: Vec::new(),
            sample_rate: tracing_prof_alloc::sample_rate(),
            temporary_threshold: tracing_prof_alloc::temporary_threshold(),
            stacks,
            threads: crate::threads::threads(),
        }
    }

    /// What happened between `base` (an earlier capture) and `self`: counters (span counts, time,
    /// allocated objects and bytes) are the growth over the window; in-use objects and bytes are
    /// those at the end of it, since in-use is a level, not a count. Paths with nothing in the
    /// window are left out.
    ///
    /// This is what each interval's dashboards and diffs want: what changed *now*.
    pub fn window_since(&self, base: &Profile) -> Profile {
        let before: HashMap<(PathKind, &[Frame]), &PathProfile> = base
            .paths
            .iter()
            .map(|p| ((p.kind, p.frames.as_slice()), p))
            .collect();
        let paths = self
            .paths
            .iter()
            .filter_map(|p| {
                let (t0, m0) = before
                    .get(&(p.kind, p.frames.as_slice()))
                    .map_or((TimeStats::default(), MemoryStats::default()), |b| {
                        (b.time, b.memory)
                    });
                let d = |now: u64, then: u64| now.saturating_sub(then);
                let time = TimeStats {
                    spans: d(p.time.spans, t0.spans),
                    wall_ns: d(p.time.wall_ns, t0.wall_ns),
                    busy_ns: d(p.time.busy_ns, t0.busy_ns),
                    idle_ns: d(p.time.idle_ns, t0.idle_ns),
                    cpu_ns: d(p.time.cpu_ns, t0.cpu_ns),
                    cpu_user_ns: d(p.time.cpu_user_ns, t0.cpu_user_ns),
                    cpu_sys_ns: d(p.time.cpu_sys_ns, t0.cpu_sys_ns),
                };
                let memory = MemoryStats {
                    alloc_objects: d(p.memory.alloc_objects, m0.alloc_objects),
                    alloc_bytes: d(p.memory.alloc_bytes, m0.alloc_bytes),
                    ..p.memory
                };
                let active = time != TimeStats::default()
                    || memory.alloc_objects > 0
                    || memory.alloc_bytes > 0;
                let (o0, b0) = before
                    .get(&(p.kind, p.frames.as_slice()))
                    .map_or((0, 0), |b| b.outlived);
                let outlived = (d(p.outlived.0, o0), d(p.outlived.1, b0));
                (active || memory.inuse_bytes > 0 || outlived.0 > 0).then(|| PathProfile {
                    kind: p.kind,
                    frames: p.frames.clone(),
                    time,
                    memory,
                    outlived,
                })
            })
            .collect();
        Profile {
            time: self.time,
            duration: self.duration.saturating_sub(base.duration),
            window: true,
            paths,
            overflowed_spans: self.overflowed_spans.saturating_sub(base.overflowed_spans),
            suspected_leaks: self.suspected_leaks.clone(),
            sample_rate: self.sample_rate,
            temporary_threshold: self.temporary_threshold,
            stacks: self.stacks_since(base),
            threads: self.threads_since(base),
        }
    }

    fn stacks_since(&self, base: &Profile) -> Vec<StackProfile> {
        let before: HashMap<(PathKind, &[Frame], &[CodeFrame]), &StackProfile> = base
            .stacks
            .iter()
            .map(|s| ((s.kind, s.frames.as_slice(), s.code.as_slice()), s))
            .collect();
        self.stacks
            .iter()
            .filter_map(|s| {
                let b = before.get(&(s.kind, s.frames.as_slice(), s.code.as_slice()));
                let mut out = s.clone();
                if let Some(b) = b {
                    out.samples = s.samples.saturating_sub(b.samples);
                    out.sampled_bytes = s.sampled_bytes.saturating_sub(b.sampled_bytes);
                    out.memory.alloc_objects = s
                        .memory
                        .alloc_objects
                        .saturating_sub(b.memory.alloc_objects);
                    out.memory.alloc_bytes =
                        s.memory.alloc_bytes.saturating_sub(b.memory.alloc_bytes);
                    out.lifetimes = s.lifetimes.since(&b.lifetimes);
                }
                (out.samples > 0 || out.memory.inuse_bytes > 0 || out.lifetimes.freed() > 0)
                    .then_some(out)
            })
            .collect()
    }

    fn threads_since(&self, base: &Profile) -> Vec<ThreadProfile> {
        self.threads
            .iter()
            .map(|t| {
                let mut out = t.clone();
                if let Some(b) = base.threads.iter().find(|b| b.index == t.index) {
                    out.memory.alloc_objects = t
                        .memory
                        .alloc_objects
                        .saturating_sub(b.memory.alloc_objects);
                    out.memory.alloc_bytes =
                        t.memory.alloc_bytes.saturating_sub(b.memory.alloc_bytes);
                }
                out
            })
            .collect()
    }

    /// The estimated memory of the span path whose span names are `names`, summed over its
    /// sampled stacks (not over the paths below it).
    pub fn sampled_memory(&self, names: &[&str]) -> MemoryStats {
        let mut m = MemoryStats::default();
        for s in self.stacks.iter().filter(|s| {
            s.frames.len() == names.len() && s.frames.iter().zip(names).all(|(f, n)| f.name == *n)
        }) {
            m.add(&s.memory);
        }
        m
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

    /// Whether `path` is among [`Profile::suspected_leaks`].
    pub fn is_suspected_leak(&self, path: &PathProfile) -> bool {
        self.is_suspected_path(path.kind, &path.frames)
    }

    /// Whether the span path `frames` of `kind`, as a whole, is among
    /// [`Profile::suspected_leaks`].
    pub fn is_suspected_path(&self, kind: PathKind, frames: &[Frame]) -> bool {
        self.suspected_leaks
            .iter()
            .any(|l| l.kind == kind && l.frames == frames && l.code.is_empty())
    }

    /// Whether `stack` is among [`Profile::suspected_leaks`] as a stack of its own.
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

/// Symbolizes and merges the allocator's stack buckets: buckets whose trimmed code stacks and
/// span paths are equal become one [`StackProfile`].
fn stacks_of(
    buckets: Vec<StackTotals>,
    by_tag: &HashMap<Tag, (PathKind, &[Frame])>,
) -> Vec<StackProfile> {
    let mut merged: Vec<StackProfile> = Vec::new();
    let mut index: HashMap<(PathKind, Vec<Frame>, Vec<CodeFrame>), usize> = HashMap::new();
    // Estimates are summed unrounded, then rounded once.
    let mut estimates: Vec<[f64; 2]> = Vec::new();
    for b in buckets {
        let (kind, frames) = by_tag
            .get(&b.tag)
            .map_or((PathKind::Overflow, &[][..]), |&(k, f)| (k, f));
        let code = if b.ips.is_empty() {
            vec![CodeFrame {
                function: std::sync::Arc::from(TABLE_FULL_FRAME),
                file: None,
                line: None,
            }]
        } else {
            crate::symbolize::code_stack(&b.ips, kind == PathKind::Span)
        };
        let key = (kind, frames.to_vec(), code);
        let i = *index.entry(key).or_insert_with_key(|(kind, frames, code)| {
            merged.push(StackProfile {
                kind: *kind,
                frames: frames.clone(),
                code: code.clone(),
                samples: 0,
                sampled_bytes: 0,
                memory: MemoryStats::default(),
                lifetimes: Lifetimes::default(),
            });
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
        m.lifetimes.add(&Lifetimes {
            freed_objects: b.lifetime_objects.map(round),
            freed_bytes: b.lifetime_bytes,
            temporary_objects: round(b.temporary_objects),
            temporary_bytes: b.temporary_bytes,
        });
    }
    crate::symbolize::release_debug_info();
    for (m, [alloc, inuse]) in merged.iter_mut().zip(estimates) {
        m.memory.alloc_objects = alloc.round() as u64;
        m.memory.inuse_objects = inuse.round() as u64;
    }
    merged
}

fn time_of(t: &TagTotals) -> TimeStats {
    TimeStats {
        spans: t.spans,
        wall_ns: t.wall_ns,
        busy_ns: t.busy_ns,
        idle_ns: t.idle_ns,
        cpu_ns: t.cpu_ns,
        cpu_user_ns: t.cpu_user_ns,
        cpu_sys_ns: t.cpu_sys_ns,
    }
}

fn memory_of(t: &TagTotals) -> MemoryStats {
    MemoryStats {
        alloc_objects: t.alloc_objects,
        alloc_bytes: t.alloc_bytes,
        inuse_objects: t.inuse_objects(),
        inuse_bytes: t.inuse_bytes(),
    }
}
