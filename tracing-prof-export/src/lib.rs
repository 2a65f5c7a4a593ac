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

mod env;
pub mod files;
pub mod http;
pub mod pyroscope;

pub use files::{FileError, FileExporter};
pub use http::{HttpServer, PprofHandler};
pub use pyroscope::{PyroscopeApi, PyroscopeConfig, PyroscopeExporter};
pub use tracing_prof_model::ProfileKind;

#[cfg(test)]
mod tests {
    /// Every variable the exporters read is a known setting (`config::ENV_VARS`), so the
    /// warning about unknown variables never names one of them.
    #[test]
    fn every_variable_read_is_listed() {
        let mut read: Vec<&str> = [include_str!("env.rs")]
            .into_iter()
            .flat_map(|source| {
                source.match_indices("\"TRACING_PROF_").map(move |(i, _)| {
                    let rest = &source[i + 1..];
                    &rest[..rest.find('"').unwrap()]
                })
            })
            .collect();
        read.retain(|n| *n != "TRACING_PROF_"); // this test's own pattern
        read.sort_unstable();
        read.dedup();
        assert!(!read.is_empty());
        for name in &read {
            assert!(
                tracing_prof_core::config::ENV_VARS.contains(name),
                "{name} is not in tracing_prof_core::config::ENV_VARS"
            );
        }
    }
}
