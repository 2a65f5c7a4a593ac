//! Exporters for tracing-prof profiles.
//!
//! Every exporter ships the model of `tracing-prof-model`: a
//! [`Snapshot`](tracing_prof_model::Snapshot) becomes one pprof
//! [`Profile`](tracing_prof_model::Profile) per [`ProfileKind`], which knows how to encode
//! itself and draw its flame graphs.
//!
//! - [`FileExporter`]: a [`Sink`](tracing_prof_core::Sink) writing pprof files to a directory,
//!   with optional delta files and flame graph SVGs.
//! - [`http`]: a Go-compatible `/debug/pprof` handler and a small standalone server.
//! - [`pyroscope`]: pushes to Pyroscope / Grafana Cloud, never blocking the application.

pub mod files;
pub mod http;
pub mod pyroscope;

pub use files::{FileError, FileExporter};
pub use http::{HttpServer, PprofHandler};
pub use pyroscope::{PyroscopeApi, PyroscopeConfig, PyroscopeExporter};
pub use tracing_prof_model::ProfileKind;
