//! The example's request workload (CPU-heavy requests) with the default configuration
//! (tagging allocator, layer, heap sampling at 512 KiB, CPU sampling at 100 Hz; pprof files
//! every second here) against everything off (plain jemalloc and a tracing registry with a
//! no-op layer instead of ours: the same instrumented service, unprofiled; a registry with no
//! layer at all never frees a closed span's slot, tokio-rs/tracing#2668). The cheap-request
//! workload (`cheap.rs`) is the shape that shows per-span costs.
//!
//! A third variant, the tagging allocator alone (no layer), separates the allocator's own memory
//! cost from the layer's effect on the workload's timing: with the layer, peak RSS of this
//! workload is *lower*, because slower spans change how much work piles up in flight, not
//! because the profiler saves memory.
//!
//! Each run is a child process, so that its peak RSS can be read; the variants rotate over the
//! rounds. Reports wall time, CPU time, peak RSS, their ratios to off, and the final flush time.
//!
//! `cargo bench -p tracing-prof-as-user --bench workload`

use std::time::{Duration, Instant};
use tracing_prof::{FileExporter, Profiler};
use tracing_prof_examples::bench::{child, switch};
use tracing_prof_examples::{App, Workload, run};
use tracing_subscriber::prelude::*;

const ENV: &str = "TRACING_PROF_BENCH_CHILD";
/// Rounds by default; `TRACING_PROF_BENCH_ROUNDS` asks for more (a tighter median).
const ROUNDS: usize = 7;

fn rounds() -> usize {
    std::env::var("TRACING_PROF_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ROUNDS)
}

#[global_allocator]
static GLOBAL: switch::Switch = switch::Switch;

/// The default workload, or `TRACING_PROF_BENCH_REQUESTS` requests (to see costs that are paid
/// once, such as symbolizing new allocation sites, amortized over a longer run).
fn workload() -> Workload {
    let mut w = Workload::default();
    if let Some(n) = std::env::var("TRACING_PROF_BENCH_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        w.requests = n;
    }
    w
}

/// `on`: the profiler runs (defaults otherwise); `sample_rate`: its heap sampling rate (0: off).
fn child(on: bool, sample_rate: u64) {
    let dir = std::env::temp_dir().join(format!("tracing-prof-bench-{}", std::process::id()));
    let guard = if on {
        let (layer, guard) = Profiler::builder()
            .interval(Duration::from_secs(1))
            .heap_sampling(sample_rate)
            .sink(FileExporter::new(&dir))
            .build()
            .expect("profiler");
        tracing_subscriber::registry().with(layer).init();
        Some(guard)
    } else {
        child::init_unprofiled(false);
        None
    };
    let start = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let app = App::new(2_000);
    let workload = workload();
    let summary = rt.block_on(run(&app, &workload));
    drop(rt);
    let wall = start.elapsed();
    let flush = Instant::now();
    drop(guard);
    let flush = flush.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(summary.handled, workload.requests);
    child::report(wall, flush);
}

fn main() {
    if let Ok(mode) = std::env::var(ENV) {
        let rate = tracing_prof::alloc::DEFAULT_SAMPLE_RATE;
        return child(
            mode == "on" || mode == "exact",
            if mode == "on" { rate } else { 0 },
        );
    }
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with("--") && !"workload".contains(a.as_str()))
    {
        return; // filtered out by `cargo bench -- NAME`
    }
    let rounds = rounds();
    let runs = child::rotate(ENV, &["off", "alloc", "exact", "on"], rounds);
    println!(
        "\n### Example workload ({} requests, 4 workers): everything on vs everything off\n",
        workload().requests
    );
    println!(
        "{rounds} rotating rounds, one process per run; ratios are medians of per-round ratios to off.\n"
    );
    child::table(
        &[
            "off",
            "tagging allocator only",
            "the default less heap sampling",
            "the default (heap sampling at 512 KiB, CPU sampling at 100 Hz)",
        ],
        &runs,
    );
    let (exact, sampled) = (&runs[2], &runs[3]);
    println!(
        "\nHeap sampling at 512 KiB against the same without it (median of per-round ratios): \
         wall time {:.3}, CPU time {:.3}, peak RSS {:.3}.",
        child::ratio(sampled, exact, &|r| r.wall_s),
        child::ratio(sampled, exact, &|r| r.cpu_s),
        child::ratio(sampled, exact, &|r| r.maxrss_mib),
    );
}
