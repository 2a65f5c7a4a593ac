//! The README's Rust, compiled as written: each of its `rust` blocks is here verbatim (the
//! test checks it), in a function that gives it what the README leaves to the reader (the
//! routes, the token, the handler), so that a README that no longer compiles fails here.
#![allow(dead_code, reason = "compiled, not all run")]
#![allow(
    unused_variables,
    clippy::let_and_return,
    reason = "the README's snippets end with the value they make"
)]

#[rustfmt::skip]
mod readme_main {
// --- README: "Use it in your service"
use tracing_prof::TaggingAllocator;
use tracing_subscriber::prelude::*;

// 1. Tag every allocation with the current span path. Wrap the allocator you use:
//    std::alloc::System, tikv_jemallocator::Jemalloc, mimalloc::MiMalloc, ...
#[global_allocator]
static GLOBAL: TaggingAllocator<tikv_jemallocator::Jemalloc> =
    TaggingAllocator::new(tikv_jemallocator::Jemalloc);

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // 2. Settings from the TRACING_PROF_* variables (defaults otherwise): pprof files into
    //    TRACING_PROF_DIR (default ./profiles), Pyroscope when PYROSCOPE_SERVER_ADDRESS is set,
    //    /debug/pprof when TRACING_PROF_HTTP_ADDR is set. A bad value is an error naming it
    //    (`Error: environment variable TRACING_PROF_INTERVAL="ten" is invalid: ...`).
    let (layer, guard) = tracing_prof::init_from_env()?;
    // 3. Add the layer to your subscriber, beside your other layers.
    tracing_subscriber::registry().with(layer).init();

    // ... run the service ...

    // 4. Dropping the guard (a ProfilerGuard; the HTTP server, if any, is attached to it)
    //    writes and pushes a final profile, then stops (at most 5 s).
    drop(guard);
    Ok(())
}
}

#[rustfmt::skip]
fn readme_builder() -> Result<(), Box<dyn std::error::Error>> {
// --- README: "Use it in your service", the builder
use tracing_prof::{FileExporter, Profiler, PyroscopeConfig, PyroscopeExporter};
let (layer, guard) = Profiler::builder()
    .interval(std::time::Duration::from_secs(15))
    .sink(FileExporter::new("/var/lib/myservice/profiles").deltas(true).flamegraphs(true))
    .sink(PyroscopeExporter::start(PyroscopeConfig::new("http://pyroscope:4040", "myservice").tag("env", "prod"))?)
    .build()?;
drop((layer, guard));
Ok(())
}

#[rustfmt::skip]
fn readme_axum(my_routes: axum::Router, guard: tracing_prof::ProfilerGuard, token: String) -> axum::Router {
// --- README: "The /debug/pprof endpoint", axum
use tracing_prof::export::http::{PprofHandler, axum_router};
let app = my_routes.merge(axum_router(PprofHandler::new(guard.profiler().clone()).bearer_token(token)));
app
}

#[rustfmt::skip]
fn readme_otel(exporter: opentelemetry_sdk::trace::InMemorySpanExporter) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
// --- README: "OpenTelemetry"
use opentelemetry::trace::TracerProvider as _;
use tracing_subscriber::prelude::*;
// `exporter`: where your spans go (opentelemetry-otlp's, for Tempo or a Collector).
let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().with_batch_exporter(exporter).build();
let (layer, guard) = tracing_prof::init_from_env()?;
tracing_subscriber::registry()
    .with(layer)
    .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("my-service")))
    .init();
drop(guard);
Ok(())
}

fn handle(request: u32) -> Vec<u8> {
    vec![0; request as usize]
}

#[rustfmt::skip]
fn readme_budget() -> Vec<u8> {
let request = 16;
// --- README: "Allocation budgets in tests"
use tracing_prof::Budget;
// (with TaggingAllocator as #[global_allocator] and a ProfileLayer in the subscriber)
let response = Budget::new().max_allocations(10).max_bytes(64 * 1024).assert(|| handle(request));
response
}

async fn serve() {}

#[rustfmt::skip]
mod readme_sigterm {
use super::serve;
// --- README: "Running it in production"
async fn main_loop(guard: tracing_prof::ProfilerGuard) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        () = serve() => {}
        _ = term.recv() => {}                 // systemd, Kubernetes, docker stop
        _ = tokio::signal::ctrl_c() => {}     // Ctrl-C
    }
    drop(guard);                              // the final export, before the grace period ends
}
}

#[rustfmt::skip]
fn docs_metrics_registry(guard: tracing_prof::ProfilerGuard) -> prometheus_client::registry::Registry {
// --- docs/metrics.md: span metrics in the service's own registry
use tracing_prof::export::metrics::SpanMetrics;
let mut registry = prometheus_client::registry::Registry::default();
// ... the service's own metrics, then ours, read from the profiler at each scrape:
SpanMetrics::new().register(&mut registry, guard.profiler().clone());
registry
}

#[test]
fn every_rust_block_of_the_readme_is_here_verbatim() {
    let readme = tracing_prof_test_support::documentation();
    let here = include_str!("readme_rust.rs");
    let mut blocks = 0;
    for block in readme.split("```rust\n").skip(1) {
        let code = &block[..block.find("```").unwrap()];
        assert!(
            here.contains(code),
            "not here as the README has it:\n{code}"
        );
        blocks += 1;
    }
    assert_eq!(blocks, 8);
}

/// The `[dependencies]` lines of the documentation's `toml` blocks: `(crate, rest of the line)`.
fn dependency_lines(docs: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for block in docs.split("```toml\n").skip(1) {
        let block = &block[..block.find("```").unwrap()];
        let mut in_dependencies = false;
        for line in block.lines() {
            let line = line.split('#').next().unwrap().trim();
            if line.starts_with('[') {
                in_dependencies = line == "[dependencies]";
            } else if in_dependencies && let Some((name, rest)) = line.split_once('=') {
                out.push((name.trim().to_owned(), rest.trim().to_owned()));
            }
        }
    }
    out
}

/// None of our crates is published (the crate named tracing-prof on crates.io is another
/// project's), so no dependency line of the documentation may give one of them a version; and
/// the OpenTelemetry crates it names are of the versions the workspace builds with.
#[test]
fn the_documentations_dependency_lines_are_ones_that_work() {
    let docs = tracing_prof_test_support::documentation();
    let workspace = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml"),
    )
    .unwrap();
    let lines = dependency_lines(&docs);
    assert!(
        lines.iter().filter(|(n, _)| n == "tracing-prof").count() >= 2,
        "{lines:?}"
    );
    let mut otel = 0;
    for (name, rest) in &lines {
        if name.starts_with("tracing-prof") {
            assert!(
                rest.contains("path = ") && !rest.contains("version"),
                "{name} = {rest}: our crates are not on crates.io"
            );
        }
        if [
            "opentelemetry",
            "opentelemetry_sdk",
            "tracing-opentelemetry",
        ]
        .contains(&name.as_str())
        {
            let version = rest.trim_matches('"');
            let ours = workspace
                .lines()
                .find(|l| l.starts_with(&format!("{name} = ")))
                .unwrap_or_else(|| panic!("{name} in the workspace's dependencies"));
            assert!(
                ours.contains(&format!("version = \"{version}\"")),
                "{name} = {rest} in the docs, {ours} in the workspace"
            );
            otel += 1;
        }
    }
    assert_eq!(otel, 3, "{lines:?}");
    // And in prose: `tracing-prof = { version = "0.1", ... }` in a sentence misled as much.
    for (at, _) in docs.match_indices("tracing-prof") {
        let rest = &docs[at..];
        let name_end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .unwrap_or(rest.len());
        let Some(value) = rest[name_end..].strip_prefix(" = ") else {
            continue;
        };
        let value = &value[..value.find(['\n', '`']).unwrap_or(value.len())];
        assert!(
            !value.contains("version") && !value.starts_with('"'),
            "{}: our crates are not on crates.io",
            &rest[..name_end + 3 + value.len()]
        );
    }
}
