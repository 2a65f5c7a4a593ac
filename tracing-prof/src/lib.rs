//! tracing-prof: an always-on profiler for services instrumented with [`tracing`](https://docs.rs/tracing).
//!
//! Per span *path* (root -> ... -> span) it records span counts, wall/busy/idle time, CPU time,
//! and, with the tagging allocator installed, exact allocated and in-use objects and bytes. A
//! background thread writes pprof files that `go tool pprof` opens.
//!
//! # Setup
//! ```no_run
//! use tracing_prof::TaggingAllocator;
//! use tracing_subscriber::prelude::*;
//!
//! // 1. Tag every allocation with the current span path (wrap System, Jemalloc, mimalloc...).
//! #[global_allocator]
//! static GLOBAL: TaggingAllocator<std::alloc::System> = TaggingAllocator::new(std::alloc::System);
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // 2. Settings from TRACING_PROF_* (defaults otherwise), files into ./profiles.
//!     let (layer, guard) = tracing_prof::from_env()?.build()?;
//!     // 3. Add the layer to your subscriber.
//!     tracing_subscriber::registry().with(layer).init();
//!
//!     tracing::info_span!("request").in_scope(|| vec![0u8; 1024]);
//!
//!     // 4. Dropping the guard writes a final profile and stops the thread.
//!     drop(guard);
//!     Ok(())
//! }
//! ```
//! Then `go tool pprof -top profiles/heap.*.pb.gz`.
//!
//! # Crates
//! - [`alloc`] (`tracing-prof-alloc`): the `GlobalAlloc` wrapper; all allocator `unsafe`.
//! - [`core`] (`tracing-prof-core`): the layer, the profile model, the aggregator.
//! - [`export`] (`tracing-prof-export`): pprof encoding and files.
//!
//! See the README for the profile kinds, the environment variables, the overhead and the
//! limitations.

pub use tracing_prof_alloc as alloc;
pub use tracing_prof_core as core;
pub use tracing_prof_export as export;

pub use tracing_prof_alloc::{ReallocMode, TaggingAllocator};
pub use tracing_prof_core::{
    Config, ConfigError, Profile, ProfileLayer, Profiler, ProfilerBuilder, ProfilerGuard, Sink,
};
pub use tracing_prof_export::{FileExporter, ProfileKind};

/// A [`ProfilerBuilder`] with settings from the `TRACING_PROF_*` environment variables and a
/// [`FileExporter`] writing to `TRACING_PROF_DIR` (default `./profiles`).
///
/// A variable set to an invalid value is an error naming it.
pub fn from_env() -> Result<ProfilerBuilder, ConfigError> {
    Ok(Profiler::builder().from_env()?.sink(FileExporter::from_env()?))
}
