//! What a snapshot knows of one span path: its time, its memory, its kind.

use super::LIFETIME_BUCKETS;
use super::durations::{DURATION_BUCKETS, duration_quantile};
// What the docs below name.
use super::frames::{SpanFrame, display_path, names_are};
#[cfg(doc)]
use super::{CpuSource, LIFETIME_BUCKET_NAMES, Snapshot};

/// Time spent by the spans of one path. Durations in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// Closed spans by their wall time (creation to close), in the buckets of
    /// [`DURATION_BOUNDS_NS`]: the latency distribution of the path.
    ///
    /// [`DURATION_BOUNDS_NS`]: crate::DURATION_BOUNDS_NS
    pub durations: [u64; DURATION_BUCKETS],
    /// Closed spans in which an ERROR-level event was recorded (what `#[instrument(err)]`
    /// emits when the function returns `Err`), each counted once.
    pub errors: u64,
}

impl Default for TimeStats {
    fn default() -> Self {
        TimeStats {
            spans: 0,
            wall_ns: 0,
            busy_ns: 0,
            idle_ns: 0,
            cpu_ns: 0,
            cpu_user_ns: 0,
            cpu_sys_ns: 0,
            long_polls: 0,
            intervals: [0; LIFETIME_BUCKETS],
            durations: [0; DURATION_BUCKETS],
            errors: 0,
        }
    }
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
        for (a, b) in self.durations.iter_mut().zip(&o.durations) {
            *a += b;
        }
        self.errors += o.errors;
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
            durations: std::array::from_fn(|i| d(self.durations[i], earlier.durations[i])),
            errors: d(self.errors, earlier.errors),
        }
    }

    /// The `q` quantile (0 to 1) of the closed spans' wall time, in nanoseconds, from
    /// [`durations`](Self::durations) (see [`duration_quantile`]); `None` when none closed.
    pub fn duration_quantile(&self, q: f64) -> Option<u64> {
        duration_quantile(&self.durations, q)
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
    /// Recent spans of the path with their traces, one per latency bucket at most (the
    /// `opentelemetry` feature; read by `Profiler::paths_snapshot`, empty elsewhere).
    pub exemplars: Vec<super::DurationExemplar>,
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
            exemplars: Vec::new(),
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

    pub(super) fn key(&self) -> (PathKind, &[SpanFrame]) {
        (self.kind, &self.frames)
    }
}
