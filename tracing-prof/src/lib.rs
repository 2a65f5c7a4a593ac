//! tracing-prof: an always-on profiler for services instrumented with [`tracing`](https://docs.rs/tracing).
//!
//! Per span *path* (root -> ... -> span) it records span counts, wall/busy/idle time, CPU time,
//! and, with the tagging allocator installed, exact allocated and in-use objects and bytes; a heap
//! sampler adds the code stacks under the span frames, allocation lifetimes, temporary
//! allocations, memory that outlives its span, and memory per thread. A background thread
//! writes pprof files that `go tool pprof` opens.
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
//!     // 2. Settings from TRACING_PROF_* (defaults otherwise), files into ./profiles, and
//!     //    Pyroscope / `/debug/pprof` when PYROSCOPE_SERVER_ADDRESS / TRACING_PROF_HTTP_ADDR say so.
//!     let (layer, guard) = tracing_prof::init_from_env()?;
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
//! Then `go tool pprof -top profiles/span_memory.*.pb.gz` (memory per span path) or
//! `go tool pprof -traces profiles/heap.*.pb.gz` (the code that allocated, under its spans).
//!
//! # Crates
//! - [`alloc`] (`tracing-prof-alloc`): the `GlobalAlloc` wrapper; all allocator `unsafe`.
//! - [`model`] (`tracing-prof-model`): snapshots and profiles as data, pprof encode and
//!   decode, windows, diffs, folded stacks, flame graphs, text tables.
//! - [`core`] (`tracing-prof-core`): the layer, span paths, capture, the aggregator.
//! - [`export`] (`tracing-prof-export`): files, `/debug/pprof`, Pyroscope.
//!
//! See the README for the profile kinds, the environment variables, the overhead and the
//! limitations.

pub use tracing_prof_alloc as alloc;
pub use tracing_prof_core as core;
pub use tracing_prof_export as export;
pub use tracing_prof_model as model;

pub use tracing_prof_alloc::{ReallocMode, TaggingAllocator};
pub use tracing_prof_core::{
    Budget, Config, ConfigError, ProfileLayer, Profiler, ProfilerBuilder, ProfilerGuard, Sink,
};
pub use tracing_prof_export::{
    FileExporter, HttpServer, PprofHandler, PyroscopeConfig, PyroscopeExporter,
};
pub use tracing_prof_model::{Profile, ProfileKind, Snapshot};

/// Why the profiler could not be set up from the environment.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `TRACING_PROF_*` variable is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The Pyroscope settings are invalid.
    #[error(transparent)]
    Pyroscope(#[from] tracing_prof_export::pyroscope::PyroscopeError),
    /// The profiler could not start.
    #[error(transparent)]
    Build(#[from] tracing_prof_core::BuildError),
    /// The `/debug/pprof` server could not start.
    #[error(transparent)]
    Http(#[from] tracing_prof_export::http::HttpError),
}

/// A [`ProfilerBuilder`] set up from the environment: the `TRACING_PROF_*` settings, a
/// [`FileExporter`] writing to `TRACING_PROF_DIR` (default `./profiles`), and a
/// [`PyroscopeExporter`] when `PYROSCOPE_SERVER_ADDRESS` is set.
///
/// A variable set to an invalid value is an error naming it.
pub fn from_env() -> Result<ProfilerBuilder, Error> {
    let mut builder = Profiler::builder()
        .from_env()?
        .sink(FileExporter::from_env()?);
    if let Some(config) = PyroscopeConfig::from_env()? {
        builder = builder.sink(PyroscopeExporter::start(config)?);
    }
    Ok(builder)
}

/// Everything the environment asks for, started: [`from_env`]'s profiler, and a
/// `/debug/pprof` server when `TRACING_PROF_HTTP_ADDR` is set. Keep the guard alive.
pub fn init_from_env() -> Result<(ProfileLayer, Guard), Error> {
    let (layer, profiler) = from_env()?.build()?;
    let http = HttpServer::from_env(profiler.profiler())?;
    Ok((layer, Guard { http, profiler }))
}

/// Keeps what [`init_from_env`] started; dropping it stops the HTTP server, then writes and
/// pushes the final profiles.
#[derive(Debug)]
#[must_use = "dropping the guard stops the profiler"]
pub struct Guard {
    http: Option<HttpServer>,
    profiler: ProfilerGuard,
}

impl Guard {
    /// A handle for snapshots and stats.
    pub fn profiler(&self) -> &Profiler {
        self.profiler.profiler()
    }

    /// Where `/debug/pprof` is served, if it is.
    pub fn http_addr(&self) -> Option<std::net::SocketAddr> {
        self.http.as_ref().map(HttpServer::local_addr)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        drop(self.http.take());
    }
}
