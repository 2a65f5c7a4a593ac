//! A small tokio service profiled by tracing-prof.
//!
//! Runs [`tracing_prof_examples::Workload`] (20 000 requests, 64 in flight, nested spans, a
//! cache, buffers freed on another task, a deliberate slow leak), writes pprof profiles into
//! `./profiles` every 2 s and at exit, then prints the top span paths by CPU and by in-use
//! memory and the `go tool pprof` commands to look further.
//!
//! ```text
//! cargo run --release --example service
//! ```
//! Settings: the `TRACING_PROF_*` variables (see the README; `TRACING_PROF_HTTP_ADDR=default`
//! serves `/debug/pprof` on 127.0.0.1:6060; `PYROSCOPE_SERVER_ADDRESS` pushes to Pyroscope;
//! `OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318` sends OTLP profiles to a Collector),
//! `SERVICE_REQUESTS`, and `SERVICE_DURATION_SECS` to keep serving requests for that long instead
//! (SIGTERM or Ctrl-C then ends the run early, with the summary, as a service's graceful
//! shutdown does).
//! `SERVICE_OTEL=1` adds `tracing-opentelemetry` (spans go to an exporter that counts them), so
//! that CPU samples carry the span ids of their requests (`span_id` labels; see the README's
//! OpenTelemetry section); `SERVICE_OTEL_TRACE_IDS=FILE` writes the trace ids it exported there
//! at the end, one per line. OTLP and OpenTelemetry need the example's `otel` feature
//! (`cargo run --release --example service --features otel`): without it the first command
//! builds only what the rest needs.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tikv_jemallocator::Jemalloc;
use tracing_prof::export::HttpServer;
use tracing_prof::model::{PathKind, PathProfile, Snapshot};
use tracing_prof::{FileExporter, Profiler, PyroscopeConfig, PyroscopeExporter, TaggingAllocator};
use tracing_prof_examples::{App, Workload, run};
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: TaggingAllocator<Jemalloc> = TaggingAllocator::new(Jemalloc);

fn main() -> Result<(), Box<dyn Error>> {
    let mut workload = Workload::default();
    if let Ok(n) = std::env::var("SERVICE_REQUESTS") {
        workload.requests = n
            .parse()
            .map_err(|_| Message(format!("SERVICE_REQUESTS={n:?} is not a number")))?;
    }
    let duration = match std::env::var("SERVICE_DURATION_SECS") {
        Ok(s) => Some(Duration::from_secs(s.parse().map_err(|_| {
            Message(format!("SERVICE_DURATION_SECS={s:?} is not a number"))
        })?)),
        Err(_) => None,
    };
    let exporter = FileExporter::from_env()?;
    let dir = exporter.dir().to_owned();
    // The example exports every 2 s unless TRACING_PROF_INTERVAL says otherwise; it pushes to
    // Pyroscope when PYROSCOPE_SERVER_ADDRESS is set, and sends OTLP profiles when
    // OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is.
    let mut builder = Profiler::builder()
        .interval(Duration::from_secs(2))
        .from_env()?
        .sink(exporter);
    if let Some(config) = PyroscopeConfig::from_env()? {
        builder = builder.sink(PyroscopeExporter::start(config)?);
    }
    let otel = otel::Otel::from_env()?;
    builder = otel.sink(builder)?;
    let (layer, guard) = builder.build()?;
    tracing_subscriber::registry()
        .with(layer)
        .with(otel.layer())
        .init();
    let profiler = guard.profiler().clone();
    let http = HttpServer::from_env(&profiler)?;
    if let Some(addr) = http.as_ref().and_then(HttpServer::local_addr) {
        println!("serving http://{addr}/debug/pprof/");
    }

    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    let app = App::new(workload.cache_capacity);
    let summary = match duration {
        None => {
            println!(
                "handling {} requests, {} at a time...",
                workload.requests, workload.concurrency
            );
            runtime.block_on(run(&app, &workload))
        }
        Some(d) => {
            println!(
                "handling requests for {} s, {} at a time...",
                d.as_secs(),
                workload.concurrency
            );
            let batch = Workload {
                requests: 2_000,
                ..workload.clone()
            };
            let mut total = tracing_prof_examples::Summary::default();
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            runtime.spawn(stop_on_signal(stop.clone()));
            while started.elapsed() < d {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    println!("stopped by SIGTERM or Ctrl-C: the run ends early");
                    break;
                }
                let s = runtime.block_on(run(&app, &batch));
                total.handled += s.handled;
                total.cache_hits += s.cache_hits;
                total.audited += s.audited;
                total.leaked_bytes = s.leaked_bytes;
            }
            total
        }
    };
    drop(runtime);
    let elapsed = started.elapsed();
    drop(http);

    let flush = Instant::now();
    drop(guard); // writes the final profiles
    let flush = flush.elapsed();

    let profile = profiler.snapshot();
    println!(
        "handled {} requests in {:.2} s ({} cache hits, {} audit buffers freed on another task, \
         {} KiB leaked on purpose); final export took {:.1} ms\n",
        summary.handled,
        elapsed.as_secs_f64(),
        summary.cache_hits,
        summary.audited,
        summary.leaked_bytes / 1024,
        flush.as_secs_f64() * 1e3,
    );
    print_top(
        "Top span paths by CPU time (self: not in child spans)",
        &profile,
        |p| p.time.cpu_ns,
    );
    print_top(
        "Top span paths by in-use memory (held now)",
        &profile,
        |p| p.memory.inuse_bytes,
    );
    let total = profile.total_memory();
    println!(
        "All paths: {} allocated in {} blocks; {} in use in {} blocks.\n",
        bytes(total.alloc_bytes),
        total.alloc_objects,
        bytes(total.inuse_bytes),
        total.inuse_objects
    );

    if let Some(m) = &profile.process_memory {
        println!("Process memory: {}.\n", m.describe());
    }
    let incidents = profiler.stats().incidents;
    if incidents > 0 {
        println!(
            "Incidents written: {incidents}, in the profile directory's incidents/ (each \
             folder's incident.txt says why; docs/incidents.md).\n"
        );
    }
    print_cpu(&profile, &profiler.stats().cpu);
    otel.finish(&profile);
    print_stacks(&profile);
    print_threads(&profile);

    let leaks = profiler.suspected_leaks();
    if leaks.is_empty() {
        println!(
            "No suspected leaks (a path is suspected when its in-use memory keeps growing over the last captures without falling;"
        );
        println!("run longer, e.g. SERVICE_DURATION_SECS=20, to see the deliberate one found).\n");
    } else {
        println!("Suspected leaks (in-use memory grew in the last captures without falling):");
        for l in &leaks {
            println!(
                "  {}: +{} since it last fell (rising in {} captures), {} in use now",
                l.labeled_path(),
                bytes(l.growth_bytes),
                l.snapshots,
                bytes(l.inuse_bytes)
            );
        }
        println!();
    }

    let (spans, heap) = (latest(&dir, "spans"), latest(&dir, "heap"));
    if let (Some(spans), Some(heap)) = (spans, heap) {
        let memory = latest(&dir, "span_memory").unwrap_or_default();
        let lifetimes = latest(&dir, "lifetimes").unwrap_or_default();
        let threads = latest(&dir, "threads").unwrap_or_default();
        let cpu = latest(&dir, "cpu").unwrap_or_default();
        println!("Profiles are in {}/. To look further:", dir.display());
        println!("  go tool pprof -top {}", cpu.display());
        println!(
            "  go tool pprof -traces -tagfocus='span_path=request -> render' {}",
            cpu.display()
        );
        println!("  go tool pprof -top {}", spans.display());
        println!(
            "  go tool pprof -top -sample_index=wall_busy {}",
            spans.display()
        );
        println!(
            "  go tool pprof -top -sample_index=inuse_space {}",
            memory.display()
        );
        println!(
            "  go tool pprof -traces -sample_index=inuse_space {}",
            heap.display()
        );
        println!(
            "  go tool pprof -top -cum -sample_index=alloc_space {}",
            heap.display()
        );
        println!(
            "  go tool pprof -top -sample_index=temporary_space {}",
            lifetimes.display()
        );
        println!("  go tool pprof -top {}", threads.display());
        println!("  go tool pprof -http=:8080 {}", heap.display());
    } else {
        println!(
            "No profile files were written to {} (see the error above).",
            dir.display()
        );
    }
    Ok(())
}

fn print_top(title: &str, profile: &Snapshot, key: impl Fn(&PathProfile) -> u64) {
    println!("{title}:");
    println!(
        "  {:>10} {:>10} {:>10} {:>8} {:>10} {:>10}  span path",
        "self cpu", "total cpu", "self busy", "spans", "alloc", "in use"
    );
    // `(tracing-prof)`, the profiler's own work, is listed like any path: its cost is part of
    // the truth a reader needs.
    for p in profile.top_by(&key).into_iter().take(8) {
        let (total, _) = profile.cumulative(p);
        println!(
            "  {:>10} {:>10} {:>10} {:>8} {:>10} {:>10}  {}",
            ms(p.time.cpu_ns),
            ms(total.cpu_ns),
            ms(p.time.busy_ns),
            p.time.spans,
            bytes(p.memory.alloc_bytes),
            bytes(p.memory.inuse_bytes),
            tracing_prof::model::display_path_with_fields(&p.frames)
        );
    }
    println!();
}

/// The functions that used the most CPU, from the CPU samples under span frames, and what
/// sampling cost.
fn print_cpu(profile: &Snapshot, stats: &tracing_prof::core::CpuSamplerStats) {
    let hz = profile.cpu_sample_rate();
    if hz == 0 || stats.handler_runs == 0 {
        return;
    }
    let top = profile.profile(tracing_prof::ProfileKind::Cpu).top(
        None,
        tracing_prof::model::Grouping::Function,
        false,
        8,
    );
    if let Ok(top) = top {
        println!(
            "Top functions by sampled CPU time (code and span frames; flat: in the function itself):"
        );
        for line in top.render(true).lines() {
            println!("  {line}");
        }
    }
    println!(
        "  ({} samples at {} Hz, {} dropped; per sample the signal handler took {:.1} µs (median) and found {:.0} frames (mean); unwind rule cache {} hits, {} misses)\n",
        stats.samples,
        hz,
        stats.dropped,
        stats.handler_ns_quantile(0.5).unwrap_or(0) as f64 / 1e3,
        stats.frames as f64 / stats.handler_runs as f64,
        stats.unwind_cache_hits,
        stats.unwind_cache_misses,
    );
}

/// The sampled code stacks holding the most memory, and the sites of the most temporary bytes.
fn print_stacks(profile: &Snapshot) {
    if profile.sample_rate == 0 || profile.stacks.is_empty() {
        return;
    }
    let site = |s: &tracing_prof::model::StackProfile| {
        let leaf = s
            .code
            .last()
            .map_or_else(|| "?".to_owned(), |f| f.location());
        format!(
            "{} @ {leaf}",
            tracing_prof::model::display_path_with_fields(&s.frames)
        )
    };
    let mut stacks: Vec<_> = profile
        .stacks
        .iter()
        .filter(|s| s.kind != PathKind::Profiler)
        .collect();
    println!(
        "Top code stacks by in-use memory (sampled, one sample per {} on average; estimates):",
        bytes(profile.sample_rate)
    );
    println!(
        "  {:>10} {:>10} {:>8}  span path @ function that allocated",
        "in use", "alloc", "samples"
    );
    // Those holding nothing now by what they allocated, so that the order is the same each run.
    stacks.sort_by_key(|s| std::cmp::Reverse((s.memory.inuse_bytes, s.memory.alloc_bytes)));
    for s in stacks.iter().take(5) {
        println!(
            "  {:>10} {:>10} {:>8}  {}",
            bytes(s.memory.inuse_bytes),
            bytes(s.memory.alloc_bytes),
            s.samples,
            site(s)
        );
    }
    // How close the estimates are: the span path allocating most, against its exact counters.
    // With span labels, the paths of one callsite chain with different values share their
    // names: the estimate by names covers all of them, and so does the exact sum here.
    if let Some(top) = profile
        .top_by(|p| p.memory.alloc_bytes)
        .into_iter()
        .find(|p| p.kind == PathKind::Span)
    {
        let names: Vec<&str> = top.frames.iter().map(|f| &*f.name).collect();
        let est = profile.sampled_memory(&names);
        let mut exact = tracing_prof::model::MemoryStats::default();
        for p in profile
            .paths
            .iter()
            .filter(|p| p.kind == PathKind::Span && p.is(&names))
        {
            exact.add(&p.memory);
        }
        println!(
            "  (estimates against the exact counters, over every sampled stack of {}: allocated {} vs {}, in use {} vs {})",
            top.display_path(),
            bytes(est.alloc_bytes),
            bytes(exact.alloc_bytes),
            bytes(est.inuse_bytes),
            bytes(exact.inuse_bytes)
        );
    }
    println!();
    stacks.sort_by_key(|s| std::cmp::Reverse(s.lifetimes.temporary_bytes));
    println!(
        "Top temporary allocations (freed within {:?}; estimates):",
        profile.temporary_threshold
    );
    for s in stacks
        .iter()
        .take(3)
        .filter(|s| s.lifetimes.temporary_bytes > 0)
    {
        println!("  {:>10}  {}", bytes(s.lifetimes.temporary_bytes), site(s));
    }
    println!();
}

/// Memory per thread, most allocated first.
fn print_threads(profile: &Snapshot) {
    let mut threads: Vec<_> = profile.threads.iter().collect();
    threads.sort_by_key(|t| std::cmp::Reverse(t.memory.alloc_bytes));
    println!("Memory per thread (exact):");
    println!("  {:>10} {:>10}  thread", "alloc", "in use");
    for t in threads.iter().take(6) {
        println!(
            "  {:>10} {:>10}  {}{}",
            bytes(t.memory.alloc_bytes),
            bytes(t.memory.inuse_bytes),
            t.name,
            if t.alive { "" } else { " (exited)" }
        );
    }
    println!();
}

fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

fn bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// The stable name of the newest profile of `kind` (`KIND.latest.pb.gz`), if one was written.
fn latest(dir: &Path, kind: &str) -> Option<PathBuf> {
    let path = dir.join(format!("{kind}.latest.pb.gz"));
    path.exists().then_some(path)
}

/// An error of the example's own settings, shown as the sentence it is: `main` returning a
/// `Box<dyn Error>` prints its `Debug`, which for a `String` would be quoted and escaped.
struct Message(String);

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::fmt::Display for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for Message {}

/// Sets `stop` at the first SIGTERM (systemd, Kubernetes, `docker stop`) or Ctrl-C: the run
/// ends after its current batch and the summary is printed.
async fn stop_on_signal(stop: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// OTLP profiles (`OTEL_EXPORTER_OTLP_ENDPOINT`) and, with `SERVICE_OTEL=1`, OpenTelemetry
/// spans and what the CPU samples say of them.
#[cfg(feature = "otel")]
mod otel {
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    use tracing_prof::export::otlp::{OtlpConfig, OtlpExporter};
    use tracing_prof::model::Snapshot;

    /// The spans' exporter and provider, when `SERVICE_OTEL=1`.
    pub(crate) struct Otel(Option<(SpanCounter, SdkTracerProvider, Option<std::path::PathBuf>)>);

    impl Otel {
        pub(crate) fn from_env() -> Result<Otel, super::Message> {
            let on = std::env::var("SERVICE_OTEL").is_ok_and(|v| v == "1");
            let ids = std::env::var_os("SERVICE_OTEL_TRACE_IDS").map(std::path::PathBuf::from);
            Ok(Otel(on.then(|| {
                let spans = SpanCounter::default();
                if ids.is_some() {
                    spans.0.lock().unwrap_or_else(|e| e.into_inner()).traces = Some(HashSet::new());
                }
                (spans.clone(), provider(spans), ids)
            })))
        }

        /// Adds the OTLP exporter when the environment asks for one.
        pub(crate) fn sink(
            &self,
            builder: tracing_prof::ProfilerBuilder,
        ) -> Result<tracing_prof::ProfilerBuilder, Box<dyn std::error::Error>> {
            Ok(match OtlpConfig::from_env()? {
                Some(config) => builder.sink(OtlpExporter::start(config)?),
                None => builder,
            })
        }

        pub(crate) fn layer<S>(&self) -> Option<impl tracing_subscriber::Layer<S> + use<S>>
        where
            S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
        {
            use opentelemetry::trace::TracerProvider as _;
            self.0
                .as_ref()
                .map(|(_, p, _)| tracing_opentelemetry::layer().with_tracer(p.tracer("service")))
        }

        pub(crate) fn finish(self, profile: &Snapshot) {
            if let Some((spans, provider, ids)) = self.0 {
                let _ = provider.shutdown();
                print_links(profile, &spans);
                if let Some(path) = ids {
                    let seen = spans.0.lock().unwrap_or_else(|e| e.into_inner());
                    let text: String = seen
                        .traces
                        .iter()
                        .flatten()
                        .map(|id| format!("{id:032x}\n"))
                        .collect();
                    if let Err(e) = std::fs::write(&path, text) {
                        eprintln!("cannot write {}: {e}", path.display());
                    }
                }
            }
        }
    }

    /// Counts the spans exported, and keeps the ids of the local roots that carry
    /// `pyroscope.profile.id` (what a tracing backend would store and Grafana link), and the
    /// trace ids exported when `SERVICE_OTEL_TRACE_IDS` asks for them.
    #[derive(Clone, Debug, Default)]
    pub(crate) struct SpanCounter(Arc<Mutex<Seen>>);

    #[derive(Debug, Default)]
    pub(crate) struct Seen {
        spans: u64,
        roots: HashSet<u64>,
        /// `Some` when `SERVICE_OTEL_TRACE_IDS` names a file.
        traces: Option<HashSet<u128>>,
    }

    impl SpanExporter for SpanCounter {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
            seen.spans += batch.len() as u64;
            for s in batch {
                if let Some(traces) = &mut seen.traces {
                    traces.insert(u128::from_be_bytes(s.span_context.trace_id().to_bytes()));
                }
                let profiled = s
                    .attributes
                    .iter()
                    .any(|kv| kv.key.as_str() == "pyroscope.profile.id");
                if profiled {
                    seen.roots
                        .insert(u64::from_be_bytes(s.span_context.span_id().to_bytes()));
                }
            }
            Ok(())
        }
    }

    pub(crate) fn provider(spans: SpanCounter) -> SdkTracerProvider {
        SdkTracerProvider::builder()
            .with_simple_exporter(spans)
            .build()
    }

    /// How many CPU samples carry a span id, of how many spans, and whether every one is a
    /// span that was exported with `pyroscope.profile.id`.
    pub(crate) fn print_links(profile: &Snapshot, spans: &SpanCounter) {
        let (exported, roots) = {
            let seen = spans.0.lock().unwrap_or_else(|e| e.into_inner());
            (seen.spans, seen.roots.clone())
        };
        let samples: u64 = profile.cpu_stacks.iter().map(|s| s.samples).sum();
        let links = profile.cpu_stacks.iter().flat_map(|s| &s.links);
        let linked: u64 = links.clone().map(|l| l.samples).sum();
        let ids: HashSet<u64> = links.map(|l| l.link.span_id).collect();
        let unknown = ids.iter().filter(|id| !roots.contains(id)).count();
        println!(
            "OpenTelemetry: {exported} spans exported, {} of them local roots with \
             pyroscope.profile.id; {linked} of {samples} CPU samples linked to {} of those spans \
             ({unknown} linked to a span not exported).\n",
            roots.len(),
            ids.len()
        );
    }
}

/// Built without the `otel` feature: asking for OTLP or OpenTelemetry says how to get them.
#[cfg(not(feature = "otel"))]
mod otel {
    use tracing_prof::model::Snapshot;

    pub(crate) struct Otel;

    impl Otel {
        pub(crate) fn from_env() -> Result<Otel, super::Message> {
            let asked = [
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
            ]
            .into_iter()
            .find(|v| std::env::var_os(v).is_some())
            .or(std::env::var("SERVICE_OTEL")
                .is_ok_and(|v| v == "1")
                .then_some("SERVICE_OTEL"));
            match asked {
                Some(var) => Err(super::Message(format!(
                    "{var} is set, but this example was built without OTLP and OpenTelemetry: \
                     cargo run --release --example service --features otel"
                ))),
                None => Ok(Otel),
            }
        }

        pub(crate) fn sink(
            &self,
            builder: tracing_prof::ProfilerBuilder,
        ) -> Result<tracing_prof::ProfilerBuilder, Box<dyn std::error::Error>> {
            Ok(builder)
        }

        pub(crate) fn layer(&self) -> Option<tracing_subscriber::layer::Identity> {
            None
        }

        pub(crate) fn finish(self, _: &Snapshot) {}
    }
}
