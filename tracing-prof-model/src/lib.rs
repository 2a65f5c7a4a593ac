//! The profile model of tracing-prof: data only, owned, and independent of how it was
//! captured.
//!
//! - [`Snapshot`]: everything the profiler knows at one instant, per span path (time, exact
//!   memory), per sampled code stack (CPU, heap, lifetimes) and per thread. The capture code of
//!   `tracing-prof-core` fills it; [`Snapshot::window_since`] turns two cumulative snapshots
//!   into what happened between them.
//! - [`Profile`]: one [`ProfileKind`] of a snapshot as a pprof-shaped profile (sample types,
//!   samples with root-first stacks of span and code frames, labels), or any pprof file
//!   decoded. [`Profile::encode`] and [`Profile::decode`] speak `profile.proto`; [`Profile::diff`]
//!   compares two; [`Profile::top`] and [`Profile::samples_text`] print tables;
//!   [`Profile::folded`] and [`Profile::flamegraph_svg`] draw.
//!
//! Nothing here knows `tracing` or the allocator, so the exporters ship it and the
//! `tracing-prof` command-line tool reads it without running a profiler.
//!
//! # Examples
//! ```
//! use std::time::{Duration, SystemTime};
//! use tracing_prof_model::{PathKind, PathProfile, ProfileKind, Snapshot, SpanFrame};
//!
//! let mut snapshot = Snapshot::new(SystemTime::now(), Duration::from_secs(10));
//! let mut path = PathProfile::new(PathKind::Span, vec![SpanFrame::synthetic("request")]);
//! path.memory.alloc_bytes = 4096;
//! path.memory.alloc_objects = 2;
//! snapshot.paths.push(path);
//!
//! let profile = snapshot.profile(ProfileKind::SpanMemory);
//! let bytes = profile.encode(); // a gzip'd profile.proto, for go tool pprof
//! let back = tracing_prof_model::Profile::decode(&bytes).unwrap();
//! assert_eq!(back, profile);
//! let top = back.top(Some("alloc_space"), Default::default(), false, 10).unwrap();
//! assert_eq!(top.rows[0].flat, 4096);
//! ```

/// `PartialEq`, `Eq`, `Hash`, `PartialOrd` and `Ord` for a type from its `identity()` tuple:
/// the fields that say which thing it is (a frame's path name, carried for display, is not one).
macro_rules! compared_by_identity {
    ($t:ty) => {
        impl PartialEq for $t {
            fn eq(&self, other: &Self) -> bool {
                self.identity() == other.identity()
            }
        }

        impl Eq for $t {}

        impl std::hash::Hash for $t {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.identity().hash(state);
            }
        }

        impl PartialOrd for $t {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl Ord for $t {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                self.identity().cmp(&other.identity())
            }
        }
    };
}

mod build;
mod estimate;
mod folded;
mod in_flight;
mod kind;
mod live;
mod names;
pub mod pprof;
mod profile;
pub mod series;
mod snapshot;
mod table;
mod trace_link;
pub mod units;

pub use build::{
    CPU_SAMPLE_TYPES, LIFETIME_SAMPLE_TYPES, MEMORY_SAMPLE_TYPES, PROFILE_LABELS, span_sample_types,
};
pub use estimate::Estimate;
pub use in_flight::{
    InFlight, LISTED_PER_PATH, OpenPath, OpenSpan, ThreadNow, display_path_with_fields,
};
pub use kind::ProfileKind;
pub use live::{LiveFrame, RECORDING_MAGIC, Recording, record_frame};
pub use names::short_function_name;
pub use pprof::DecodeError;
pub use profile::{Frame, FrameKind, Label, LabelValue, Profile, SPAN_MARK, Sample, SampleType};
pub use snapshot::{
    ALL_TRIMMED_FRAME, AllocatorMemory, Binary, CgroupMemory, CodeFrame, CodeFrames, CodeStack,
    CpuSource, CpuStack, DURATION_BOUNDS_NS, DURATION_BUCKETS, DurationExemplar,
    LIFETIME_BUCKET_NAMES, LIFETIME_BUCKETS, Lifetimes, MemoryStats, NO_SPAN_FRAME,
    NOTHING_UNWOUND_FRAME, OVERFLOW_FRAME, PATH_SEPARATOR, PROFILER_FRAME, PathKind, PathProfile,
    Peak, ProcessMemory, Snapshot, SpanFrame, StackProfile, SuspectedLeak, Symbols,
    TABLE_FULL_FRAME, ThreadProfile, TimeStats, display_path, duration_bucket, duration_quantile,
    nearest_duration_bound, slow_bound, spans_slower_than,
};
pub use table::{Grouping, TagTable, Top, TopRow};
pub use trace_link::{LinkedSamples, TraceLink};

/// Why a profile could not be read, compared or drawn as asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The profile has no sample type of that name.
    #[error("no sample type {asked:?} in this profile (it has: {known})")]
    UnknownSampleType {
        /// What was asked for.
        asked: String,
        /// What the profile has.
        known: String,
    },
    /// Two profiles cannot be compared.
    #[error("{0}")]
    Incompatible(String),
    /// Every sample has 0 for the sample type: nothing to draw.
    #[error("nothing to draw: every sample has 0 {0}")]
    Empty(String),
    /// inferno refused the input.
    #[error("inferno could not draw the flame graph: {0}")]
    Flamegraph(String),
    /// The profile is not an open-spans listing (its sample types are given).
    #[error("not an open-spans profile (/debug/pprof/goroutine): its sample types are {0:?}")]
    NotInFlight(String),
}
