//! Exporters for tracing-prof profiles.
//!
//! Every exporter ships the model of `tracing-prof-model`: a
//! [`Snapshot`](tracing_prof_model::Snapshot) becomes one pprof
//! [`Profile`](tracing_prof_model::Profile) per [`ProfileKind`](tracing_prof_model::ProfileKind), which knows how to encode
//! itself and draw its flame graphs.
//!
//! - [`FileExporter`]: a [`Sink`](tracing_prof_core::Sink) writing pprof files to a directory,
//!   with optional delta files and flame graph SVGs.
//! - [`http`]: a Go-compatible `/debug/pprof` handler and a small standalone server, with
//!   `/metrics`.
//! - [`metrics`]: latency, errors, CPU and memory per span path for Prometheus.
//! - [`pyroscope`]: pushes to Pyroscope / Grafana Cloud, never blocking the application.
//! - `otlp` (feature `otlp`): sends OpenTelemetry profiles (OTLP/HTTP) to a Collector or
//!   Pyroscope, in the same way.

mod env;
pub mod files;
pub mod http;
pub mod metrics;
#[cfg(feature = "otlp")]
pub mod otlp;
mod pushed;
pub mod pyroscope;
mod sending;

pub use files::{FileError, FileExporter};
pub use http::{HttpServer, PprofHandler};
pub use pyroscope::{PyroscopeApi, PyroscopeConfig, PyroscopeExporter};
pub use sending::{PushError, PushStats};

/// What this crate's own tests and the conformance tests of `tracing-prof-examples` need beyond
/// the API: the Pyroscope push API's messages. Public because those tests live in other crates;
/// no promise is made about it.
#[doc(hidden)]
pub mod __private {
    pub use crate::pyroscope::wire::push;
}
#[cfg(test)]
mod tests {
    /// Every variable the exporters read is a known setting (`config::ENV_VARS`), so the
    /// warning about unknown variables never names one of them.
    #[test]
    fn every_variable_read_is_listed() {
        // The names: env.rs reads them, each exporter's module names them.
        let mut read: Vec<&str> = [
            include_str!("env.rs"),
            include_str!("files/mod.rs"),
            include_str!("http/mod.rs"),
            include_str!("pyroscope/config.rs"),
            include_str!("otlp/config.rs"),
        ]
        .into_iter()
        .flat_map(|source| {
            source.match_indices("\"TRACING_PROF_").map(move |(i, _)| {
                let rest = &source[i + 1..];
                &rest[..rest.find('"').unwrap()]
            })
        })
        .collect();
        read.retain(|n| *n != "TRACING_PROF_"); // this test's own pattern
        // ... and env.rs is the only module that reads the environment.
        let others = [
            ("files/mod.rs", include_str!("files/mod.rs")),
            ("files/safe.rs", include_str!("files/safe.rs")),
            ("files/names.rs", include_str!("files/names.rs")),
            ("http/mod.rs", include_str!("http/mod.rs")),
            ("http/handler.rs", include_str!("http/handler.rs")),
            ("http/pages.rs", include_str!("http/pages.rs")),
            ("http/server.rs", include_str!("http/server.rs")),
            ("http/axum.rs", include_str!("http/axum.rs")),
            ("pyroscope/mod.rs", include_str!("pyroscope/mod.rs")),
            ("pyroscope/config.rs", include_str!("pyroscope/config.rs")),
            ("pyroscope/series.rs", include_str!("pyroscope/series.rs")),
            (
                "pyroscope/exporter.rs",
                include_str!("pyroscope/exporter.rs"),
            ),
            ("pyroscope/sender.rs", include_str!("pyroscope/sender.rs")),
            ("pyroscope/wire.rs", include_str!("pyroscope/wire.rs")),
            ("pushed.rs", include_str!("pushed.rs")),
            ("sending/mod.rs", include_str!("sending/mod.rs")),
            ("sending/report.rs", include_str!("sending/report.rs")),
            ("otlp/mod.rs", include_str!("otlp/mod.rs")),
            ("otlp/config.rs", include_str!("otlp/config.rs")),
            ("otlp/convert.rs", include_str!("otlp/convert.rs")),
            ("otlp/exporter.rs", include_str!("otlp/exporter.rs")),
        ];
        for (file, source) in others {
            for reader in ["env_var(", "env::var", "var_os("] {
                assert!(
                    !source.contains(reader),
                    "{file} reads the environment ({reader})"
                );
            }
        }
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
