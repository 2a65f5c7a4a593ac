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
//! | kind | sample types (Go's names) | default |
//! |------|---------------------------|---------|
//! | `spans` | `spans/count`, `wall/nanoseconds`, `wall_busy/nanoseconds`, `wall_idle/nanoseconds`, `cpu/nanoseconds`, `cpu_user/nanoseconds`, `cpu_sys/nanoseconds` | `cpu` |
//! | `heap` | `alloc_objects/count`, `alloc_space/bytes`, `inuse_objects/count`, `inuse_space/bytes` | `inuse_space` |
//! | `allocs` | same as `heap` | `alloc_space` |

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
    /// Memory per span path, in-use space shown by default (like Go's `heap`).
    Heap,
    /// Memory per span path, allocated space shown by default (like Go's `allocs`).
    Allocs,
}

impl ProfileKind {
    /// The name used in file names and URLs: `spans`, `heap`, `allocs`.
    pub fn name(self) -> &'static str {
        match self {
            ProfileKind::Spans => "spans",
            ProfileKind::Heap => "heap",
            ProfileKind::Allocs => "allocs",
        }
    }
}
