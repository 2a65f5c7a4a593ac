//! Exporters for tracing-prof profiles.
//!
//! - [`encode`] turns a [`Profile`](tracing_prof_core::Profile) into a gzip'd pprof
//!   `profile.proto` that `go tool pprof`, Pyroscope, Grafana and every pprof viewer open.
//! - [`FileExporter`]: a [`Sink`](tracing_prof_core::Sink) writing them to a directory, with
//!   optional delta files and flame graph SVGs.
//! - [`flamegraph`]: folded stacks and SVG flame graphs (inferno) of any kind and sample type.
//! - [`http`]: a Go-compatible `/debug/pprof` handler and a small standalone server.
//! - [`pyroscope`]: pushes to Pyroscope / Grafana Cloud, never blocking the application.
//!
//! The kinds, their samples and sample types are listed in [`pprof`].

pub mod files;
pub mod flamegraph;
pub mod http;
pub mod pprof;
pub mod pyroscope;

pub use files::{FileError, FileExporter};
pub use flamegraph::{FlamegraphError, flamegraph_svg, folded};
pub use http::{HttpServer, PprofHandler};
pub use pprof::{EncodeError, encode, to_proto};
pub use pyroscope::{PyroscopeApi, PyroscopeConfig, PyroscopeExporter};

/// Which profile to encode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProfileKind {
    /// Time per span path: count, wall, busy, idle, CPU.
    Spans,
    /// Go's heap profile: sampled code stacks under their span paths, in-use space shown by
    /// default (exact span paths when sampling is off).
    Heap,
    /// As [`ProfileKind::Heap`], allocated space shown by default (like Go's `allocs`).
    Allocs,
    /// Exact memory per span path (no code stacks), in-use space shown by default.
    SpanMemory,
    /// Frees of sampled allocations by lifetime, and temporary allocations, per code stack.
    Lifetimes,
    /// Exact memory per thread.
    Threads,
}

impl ProfileKind {
    /// Every kind.
    pub const ALL: [ProfileKind; 6] = [
        ProfileKind::Spans,
        ProfileKind::Heap,
        ProfileKind::Allocs,
        ProfileKind::SpanMemory,
        ProfileKind::Lifetimes,
        ProfileKind::Threads,
    ];

    /// The name used in file names and URLs: `spans`, `heap`, `allocs`, `span_memory`,
    /// `lifetimes`, `threads`.
    pub fn name(self) -> &'static str {
        match self {
            ProfileKind::Spans => "spans",
            ProfileKind::Heap => "heap",
            ProfileKind::Allocs => "allocs",
            ProfileKind::SpanMemory => "span_memory",
            ProfileKind::Lifetimes => "lifetimes",
            ProfileKind::Threads => "threads",
        }
    }

    /// The kind named `name` (see [`ProfileKind::name`]).
    pub fn from_name(name: &str) -> Option<ProfileKind> {
        ProfileKind::ALL.into_iter().find(|k| k.name() == name)
    }
}
