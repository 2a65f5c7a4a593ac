//! tracing-prof: an always-on profiler for services instrumented with [`tracing`](https://docs.rs/tracing).
//!
//! Per span *path* (root -> ... -> span) it records span counts, wall/busy/idle time and CPU
//! time, and, with the tagging allocator installed, exact allocated and in-use objects and
//! bytes. A CPU sampler takes the code stacks under the span frames (correct across `.await`
//! and worker threads); a heap sampler does the same for memory, with allocation lifetimes,
//! temporary allocations, memory that outlives its span, and memory per thread. A background
//! thread writes pprof files that `go tool pprof` opens.
//!
//! # Setup
//! Add it with the subscriber crate it plugs into:
//! ```toml
//! [dependencies]
//! tracing-prof = "0.1"
//! tracing-subscriber = "0.3"
//! ```
//! then, in your binary:
//! ```no_run
//! use tracing_prof::TaggingAllocator;
//! use tracing_subscriber::prelude::*;
//!
//! // 1. Tag every allocation with the current span path (wrap System, Jemalloc, mimalloc...).
//! #[global_allocator]
//! static GLOBAL: TaggingAllocator<std::alloc::System> = TaggingAllocator::new(std::alloc::System);
//!
//! fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//!     // 2. Settings from TRACING_PROF_* (defaults otherwise), files into ./profiles, and
//!     //    Pyroscope / `/debug/pprof` when PYROSCOPE_SERVER_ADDRESS / TRACING_PROF_HTTP_ADDR say so.
//!     let (layer, guard) = tracing_prof::init_from_env()?;
//!     // 3. Add the layer to your subscriber.
//!     tracing_subscriber::registry().with(layer).init();
//!
//!     tracing::info_span!("request").in_scope(|| vec![0u8; 1024]);
//!
//!     // 4. Dropping the guard (one type, [`ProfilerGuard`]) writes a final profile and stops.
//!     drop(guard);
//!     Ok(())
//! }
//! ```
//! Then `go tool pprof -top profiles/cpu.latest.pb.gz` (which code uses CPU, under which
//! span), `go tool pprof -top -sample_index=inuse_space profiles/span_memory.latest.pb.gz`
//! (memory per span path) or `tracing-prof top profiles/heap.latest.pb.gz` with the
//! `tracing-prof` command (crate `tracing-prof-cli`), no Go needed.
//!
//! # Crates
//! - `tracing_prof::alloc` (crate `tracing-prof-alloc`): the `GlobalAlloc` wrapper; all
//!   allocator `unsafe`.
//! - `tracing_prof::model` (crate `tracing-prof-model`): snapshots and profiles as data, pprof
//!   encode and decode, windows, diffs, folded stacks, flame graphs, text tables.
//! - `tracing_prof::core` (crate `tracing-prof-core`): the layer, span paths, capture, the CPU
//!   sampler's store, the aggregator.
//! - `tracing_prof::export` (crate `tracing-prof-export`): files, `/debug/pprof`, Pyroscope,
//!   OTLP profiles (feature `otlp`).
//!
//! The guide, one page per topic, is in the repository's `docs/`: the profile kinds
//! ([profiles](https://github.com/tracing-prof/tracing-prof/blob/main/docs/profiles.md)), the
//! environment variables
//! ([configuration](https://github.com/tracing-prof/tracing-prof/blob/main/docs/configuration.md)),
//! [running it in production](https://github.com/tracing-prof/tracing-prof/blob/main/docs/production.md),
//! the [overhead](https://github.com/tracing-prof/tracing-prof/blob/main/docs/overhead.md) and
//! the [limitations](https://github.com/tracing-prof/tracing-prof/blob/main/docs/limitations.md);
//! [its index](https://github.com/tracing-prof/tracing-prof/blob/main/docs/README.md) lists
//! every page.

#[doc(inline)]
pub use tracing_prof_alloc as alloc;
#[doc(inline)]
pub use tracing_prof_core as core;
#[doc(inline)]
pub use tracing_prof_export as export;
#[doc(inline)]
pub use tracing_prof_model as model;

pub use tracing_prof_alloc::{ReallocMode, TaggingAllocator};
pub use tracing_prof_core::{
    AllocatorStats, Budget, Config, ConfigError, GlibcMalloc, ProfileLayer, Profiler,
    ProfilerBuilder, ProfilerGuard, Sink, TraceLinks,
};
pub use tracing_prof_export::{
    FileExporter, HttpServer, PprofHandler, PyroscopeConfig, PyroscopeExporter,
};
pub use tracing_prof_model::{Profile, ProfileKind, Snapshot};

/// Why the profiler could not be set up from the environment.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `TRACING_PROF_*` variable is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A pushing exporter (Pyroscope, OTLP) could not start: its settings are invalid, or
    /// its thread could not be spawned.
    #[error(transparent)]
    Push(#[from] tracing_prof_export::PushError),
    /// The profiler could not start.
    #[error(transparent)]
    Build(#[from] tracing_prof_core::BuildError),
    /// The `/debug/pprof` server could not start.
    #[error(transparent)]
    Http(#[from] tracing_prof_export::http::HttpError),
}

// `fn main() -> Result<(), Box<dyn Error>>` prints an error it returns with `Debug`: the
// message, not the variant's structure, is what the user must read.
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// A [`ProfilerBuilder`] set up from the environment: the `TRACING_PROF_*` settings, a
/// [`FileExporter`] writing to `TRACING_PROF_DIR` (default `./profiles`), and a
/// [`PyroscopeExporter`] when `PYROSCOPE_SERVER_ADDRESS` is set, and with the `otlp` feature an
/// OTLP profiles exporter when `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set (`export::otlp`).
///
/// A variable set to an invalid value is an error naming it. A `TRACING_PROF_*` variable that
/// is no setting (a misspelling) is said on stderr, with the setting it most resembles, and
/// otherwise ignored (see `core::config::ENV_VARS`).
pub fn from_env() -> Result<ProfilerBuilder, Error> {
    let mut builder = Profiler::builder()
        .from_env()?
        .sink(FileExporter::from_env()?);
    if let Some(config) = PyroscopeConfig::from_env()? {
        builder = builder.sink(PyroscopeExporter::start(config)?);
    }
    #[cfg(feature = "otlp")]
    if let Some(config) = tracing_prof_export::otlp::OtlpConfig::from_env()? {
        builder = builder.sink(tracing_prof_export::otlp::OtlpExporter::start(config)?);
    }
    Ok(builder)
}

/// Everything the environment asks for, started: [`from_env`]'s profiler, a `/debug/pprof`
/// server when `TRACING_PROF_HTTP_ADDR` is set, attached to the guard (its address:
/// `guard.attached::<HttpServer>().and_then(HttpServer::local_addr)`), and a `/metrics`-only
/// listener when `TRACING_PROF_METRICS_ADDR` is (`guard.attached::<MetricsServer>()`). Keep the guard
/// alive; dropping it stops the server, then writes and pushes the final profiles.
pub fn init_from_env() -> Result<(ProfileLayer, ProfilerGuard), Error> {
    let (layer, mut guard) = from_env()?.build()?;
    if let Some(http) = HttpServer::from_env(guard.profiler())? {
        guard.attach(http);
    }
    if let Some(metrics) = tracing_prof_export::http::MetricsServer::from_env(guard.profiler())? {
        guard.attach(metrics);
    }
    Ok((layer, guard))
}
