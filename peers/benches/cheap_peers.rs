//! The cheap-request workload (`tracing_prof_examples::run_cheap`: about ten span enters and a
//! dozen allocations of 16 B to 64 KiB per request, 256 in flight, a tokio worker per CPU) under
//! our default configuration and under what a user would pick instead, in the same rotating
//! rounds, one process per run:
//! - `off`: plain jemalloc, a registry with a no-op layer (the baseline of every ratio);
//! - `ours`: our defaults (tagging allocator over jemalloc, layer, heap sampling at 512 KiB, CPU
//!   sampling at 100 Hz, pprof files);
//! - `off+jemalloc-prof`: jemalloc's own heap profiler (`prof:true`, its default 512 KiB
//!   sampling), span-blind; checked in the child through `opt.prof`;
//! - `off+pprof-rs`: pprof-rs's CPU profiler at 100 Hz (what pyroscope-rs runs), span-blind,
//!   its report built at the end;
//! - `off+tracing-timing`: tracing-timing's layer (it times the gaps between events inside
//!   spans; this workload has no events, so this is its per-span bookkeeping alone);
//! - `off+fmt-span-close`: tracing-subscriber's fmt layer printing each span's busy and idle time
//!   at close (`FmtSpan::CLOSE`) into `io::sink`.
//!
//! Every binary is built with jemalloc's profiling compiled in (the `profiling` feature), so the
//! baseline pays what `off+jemalloc-prof` pays when its profiler is not active.
//!
//! `cargo bench --manifest-path peers/Cargo.toml --bench cheap_peers`
//! (`TRACING_PROF_BENCH_ROUNDS`, `TRACING_PROF_BENCH_REQUESTS` to change the run).

use std::time::Instant;
use tracing_prof::{FileExporter, Profiler};
use tracing_prof_examples::bench::{child, switch};
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: switch::Switch = switch::Switch;

const ENV: &str = "TRACING_PROF_BENCH_CHILD";
const MODES: [&str; 6] = [
    "off",
    "ours",
    "off+jemalloc-prof",
    "off+pprof-rs",
    "off+tracing-timing",
    "off+fmt-span-close",
];

fn child(mode: &str) {
    let dir = std::env::temp_dir().join(format!("tracing-prof-peers-{}", std::process::id()));
    let prof_active: bool = tikv_jemalloc_ctl::profiling::prof::read().unwrap_or(false);
    assert_eq!(
        prof_active,
        mode == "off+jemalloc-prof",
        "jemalloc's profiler must be on exactly in its own mode ({mode})"
    );
    let mut guard = None;
    let mut pprof = None;
    match mode {
        "ours" => {
            let (layer, g) = Profiler::builder()
                .sink(FileExporter::new(&dir))
                .build()
                .expect("profiler");
            tracing_subscriber::registry().with(layer).init();
            guard = Some(g);
        }
        "off+tracing-timing" => {
            let layer = tracing_timing::Builder::default()
                .layer(|| tracing_timing::Histogram::new_with_max(1_000_000_000, 2).unwrap());
            tracing_subscriber::registry().with(layer).init();
        }
        "off+fmt-span-close" => {
            tracing_subscriber::registry()
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
                        .with_writer(std::io::sink),
                )
                .init();
        }
        _ => {
            tracing_subscriber::registry()
                .with(tracing_subscriber::layer::Identity::new())
                .init();
            if mode == "off+pprof-rs" {
                pprof = Some(
                    pprof::ProfilerGuardBuilder::default()
                        .frequency(100)
                        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
                        .build()
                        .expect("pprof-rs"),
                );
            }
        }
    }
    let wall = child::run_cheap();
    let flush = Instant::now();
    drop(guard);
    if let Some(p) = pprof {
        let report = p.report().build().expect("pprof-rs report");
        std::hint::black_box(report.data.len());
    }
    let flush = flush.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    child::report(wall, flush);
}

fn main() {
    if let Ok(mode) = std::env::var(ENV) {
        return child(&mode);
    }
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with("--") && !"cheap_peers".contains(a.as_str()))
    {
        return; // filtered out by `cargo bench -- NAME`
    }
    let rounds = child::setting("TRACING_PROF_BENCH_ROUNDS", 9) as usize;
    // jemalloc reads its options from this variable when its symbols are prefixed (as
    // tikv-jemallocator's are); only the child of that mode gets it.
    let runs = child::rotate_with(ENV, &MODES, rounds, &|mode| {
        (mode == "off+jemalloc-prof").then_some(("_RJEM_MALLOC_CONF", "prof:true"))
    });
    println!(
        "\n### Cheap requests ({} requests, 256 in flight, a worker per CPU): ours and the peers vs off\n",
        child::setting("TRACING_PROF_BENCH_REQUESTS", 400_000)
    );
    println!(
        "{rounds} rotating rounds, one process per run; ratios are medians of per-round ratios to off.\n"
    );
    child::table(&MODES, &runs);
}
