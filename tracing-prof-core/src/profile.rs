//! The profile model: per span path, its frames and its numbers. Knows nothing of pprof.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};
use tracing_core::Metadata;
use tracing_prof_alloc::{Tag, TagGuard, TagTotals};

/// Frame name of allocations made while no span was entered.
pub const NO_SPAN_FRAME: &str = "(no span)";
/// Frame name of the profiler's own allocations.
pub const PROFILER_FRAME: &str = "(tracing-prof)";
/// Frame name standing for span paths beyond the cap.
pub const OVERFLOW_FRAME: &str = "(other span paths)";

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
        let all = special
            .into_iter()
            .chain(spans.into_iter().map(|(t, f)| (t, PathKind::Span, f)));
        let paths = all
            .filter_map(|(tag, kind, frames)| {
                let t = totals.get(tag.get() as usize)?;
                let p = PathProfile {
                    kind,
                    frames,
                    time: time_of(t),
                    memory: memory_of(t),
                };
                let empty = p.time == TimeStats::default() && p.memory == MemoryStats::default();
                (!empty).then_some(p)
            })
            .collect();
        Profile {
            time: SystemTime::now(),
            duration,
            window: false,
            paths,
            overflowed_spans: crate::span_path::overflowed_spans(),
            suspected_leaks: Vec::new(),
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
                (active || memory.inuse_bytes > 0).then(|| PathProfile {
                    kind: p.kind,
                    frames: p.frames.clone(),
                    time,
                    memory,
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
        }
    }

    /// The span path whose span names, root first, are `names`.
    pub fn path(&self, names: &[&str]) -> Option<&PathProfile> {
        self.paths.iter().find(|p| p.is(names))
    }

    /// Whether `path` is among [`Profile::suspected_leaks`].
    pub fn is_suspected_leak(&self, path: &PathProfile) -> bool {
        self.suspected_leaks
            .iter()
            .any(|l| l.kind == path.kind && l.frames == path.frames)
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
