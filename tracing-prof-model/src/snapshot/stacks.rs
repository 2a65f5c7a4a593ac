//! What a snapshot knows of sampled code stacks: heap stacks with their lifetimes, CPU stacks
//! with how their time was measured.

use super::LIFETIME_BUCKETS;
// What the docs below name.
#[cfg(doc)]
use super::LIFETIME_BUCKET_NAMES;
use super::code_stack::CodeStack;
use super::frames::{CodeFrame, SpanFrame, display_path};
use super::paths::{MemoryStats, PathKind};

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
    pub code: CodeStack,
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
    pub fn new(kind: PathKind, frames: Vec<SpanFrame>, code: impl Into<CodeStack>) -> Self {
        StackProfile {
            kind,
            frames,
            code: code.into(),
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
    /// The code stack under it, root first, ending at the function that was running; its
    /// frames shared with the snapshot's other CPU stacks and with the profiler's store, which
    /// keeps it from one snapshot to the next.
    pub code: CodeStack,
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
    pub fn new(kind: PathKind, frames: Vec<SpanFrame>, code: impl Into<CodeStack>) -> Self {
        CpuStack {
            kind,
            frames,
            code: code.into(),
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
