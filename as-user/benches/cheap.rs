//! The cheap-request workload (`tracing_prof_examples::run_cheap`: a few microseconds of work,
//! about ten span enters and a dozen allocations per request, 256 in flight, spawned from a
//! task on a tokio runtime with one worker per CPU), which shows per-span costs that
//! CPU-heavy requests hide.
//!
//! Variants, each a child process (for its peak RSS), rotating over the rounds:
//! - `off`: plain jemalloc, a tracing registry with a no-op layer instead of ours (the same
//!   instrumented service, unprofiled; a registry with no layer at all never frees a closed
//!   span's slot, tokio-rs/tracing#2668, and grew to 450 MB here);
//! - `default`: what `init_from_env()` gives: tagging allocator, layer, heap sampling at
//!   512 KiB, CPU sampling at 100 Hz with per-span CPU time from the samples, pprof files every
//!   10 s (and at exit);
//! - `no-cpu-sampling`: the default less CPU sampling (`TRACING_PROF_CPU_HZ=0`), to see what
//!   sampling itself costs;
//! - `no-heap-sampling`: the default less heap sampling (`TRACING_PROF_SAMPLE_RATE=0`), to see
//!   what heap sampling costs;
//! - `exact-cpu`: the previous default: no CPU sampling, a CPU clock read on every enter and
//!   exit;
//! - `alloc-only`: the tagging allocator with no layer and no profiler;
//! - `off-layer-only`: the layer with no tagging allocator and no profiler;
//! - `off-layer-no-clock`: the same with a clock that reads nothing (one load of a word nobody
//!   writes): against `off-layer-only`, what the layer's clock reads cost in place;
//! - `off-floor-layer`: not ours, the least a span-timing layer does (`test-support`'s
//!   `bench::floor`: per enter and exit a read of our clock, a thread-local frame, the
//!   allocation tag switched; no span lookup, nothing on creation and close), with plain
//!   jemalloc as `off-layer-only` has: what any layer that times spans with our clock costs at
//!   least, to compare `off-layer-only` with;
//! - `floor-layer`: the same floor with the tagging allocator (as `alloc-only`), the least a
//!   profiler that times spans and charges memory to them costs.
//!
//! `cargo bench -p tracing-prof-as-user --bench cheap`
//! (`TRACING_PROF_BENCH_ROUNDS`, `TRACING_PROF_BENCH_REQUESTS` to change the run).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tracing_prof::alloc::__private::set_current_tag;
use tracing_prof::alloc::Tag;
use tracing_prof::core::{Clock, CpuSample, CpuTime, SystemClock};
use tracing_prof::{FileExporter, Profiler};
use tracing_prof_examples::bench::{child, switch};
use tracing_prof_test_support::bench::floor::Floor;
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: switch::Switch = switch::Switch;

const ENV: &str = "TRACING_PROF_BENCH_CHILD";
const MODES: [&str; 10] = [
    "off",
    "default",
    "no-cpu-sampling",
    "no-heap-sampling",
    "exact-cpu",
    "alloc-only",
    "off-layer-only",
    "off-layer-no-clock",
    "off-floor-layer",
    "floor-layer",
];

/// A clock that reads nothing (see `off-layer-no-clock` above).
struct Frozen;

static FROZEN: AtomicU64 = AtomicU64::new(0);

impl Clock for Frozen {
    fn now_ns(&self) -> u64 {
        FROZEN.load(Ordering::Relaxed)
    }
    fn thread_cpu(&self) -> CpuSample {
        CpuSample::default()
    }
}

fn child(mode: &str) {
    let dir = std::env::temp_dir().join(format!("tracing-prof-cheap-{}", std::process::id()));
    let guard = if mode == "off" || mode == "alloc-only" || mode == "off-layer-only" {
        child::init_unprofiled(mode == "off-layer-only");
        None
    } else if mode == "off-layer-no-clock" {
        tracing_subscriber::registry()
            .with(tracing_prof::ProfileLayer::new().with_clock(Frozen))
            .init();
        None
    } else if mode == "off-floor-layer" || mode == "floor-layer" {
        // Calibrates the clock as ours does (a layer of ours made once), for the same reads.
        let _ = tracing_prof::ProfileLayer::new();
        tracing_subscriber::registry()
            .with(Floor::new(
                || SystemClock::default().now_ns(),
                |tag| set_current_tag(Tag::new(tag)).get(),
            ))
            .init();
        None
    } else {
        let mut b = Profiler::builder().sink(FileExporter::new(&dir));
        b = match mode {
            "default" => b,
            "no-cpu-sampling" => b.cpu_sampling(0),
            "no-heap-sampling" => b.heap_sampling(0),
            "exact-cpu" => b.cpu_sampling(0).cpu_time(CpuTime::Exact),
            "no-sampling" => b.cpu_sampling(0).heap_sampling(0),
            other => panic!("unknown mode {other}"),
        };
        let (layer, guard) = b.build().expect("profiler");
        tracing_subscriber::registry().with(layer).init();
        Some(guard)
    };
    let wall = child::run_cheap();
    let flush = Instant::now();
    drop(guard);
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
        .any(|a| !a.starts_with("--") && !"cheap".contains(a.as_str()))
    {
        return; // filtered out by `cargo bench -- NAME`
    }
    let rounds = child::setting("TRACING_PROF_BENCH_ROUNDS", 9) as usize;
    let runs = child::rotate(ENV, &MODES, rounds);
    println!(
        "\n### Cheap requests ({} requests, 256 in flight, a worker per CPU): the default configuration vs off\n",
        child::setting("TRACING_PROF_BENCH_REQUESTS", 400_000)
    );
    println!(
        "{rounds} rotating rounds, one process per run; ratios are medians of per-round ratios to off.\n"
    );
    child::table(&MODES, &runs);
    println!(
        "\nThe layer's clock reads in place, `off-layer-only` against `off-layer-no-clock` \
         (median of per-round ratios): wall time {:.3}, CPU time {:.3}.",
        child::ratio(&runs[6], &runs[7], &|r| r.wall_s),
        child::ratio(&runs[6], &runs[7], &|r| r.cpu_s),
    );
    println!(
        "\nOur layer against the floor of any span-timing layer, `off-layer-only` against \
         `off-floor-layer` (median of per-round ratios): wall time {:.3}, CPU time {:.3}.",
        child::ratio(&runs[6], &runs[8], &|r| r.wall_s),
        child::ratio(&runs[6], &runs[8], &|r| r.cpu_s),
    );
    println!(
        "\nThe defaults against that floor with the tagging allocator, `default` against \
         `floor-layer` (median of per-round ratios): wall time {:.3}, CPU time {:.3}.",
        child::ratio(&runs[1], &runs[9], &|r| r.wall_s),
        child::ratio(&runs[1], &runs[9], &|r| r.cpu_s),
    );
    let default = &runs[1];
    for (what, without) in [
        ("CPU sampling at 100 Hz", &runs[2]),
        ("Heap sampling at 512 KiB", &runs[3]),
    ] {
        // The final flush symbolizes every address the run saw (once per process: a service's
        // later exports find them cached), on the profiler's thread, inside the child's CPU
        // time: without it, what the sampling costs while the requests run.
        println!(
            "\n{what} against the same configuration without it (median of per-round ratios): \
             wall time {:.3}, CPU time {:.3} ({:.3} less the final flush), peak RSS {:.3}.",
            child::ratio(default, without, &|r| r.wall_s),
            child::ratio(default, without, &|r| r.cpu_s),
            child::ratio(default, without, &|r| r.cpu_s - r.flush_ms / 1000.0),
            child::ratio(default, without, &|r| r.maxrss_mib),
        );
    }
}
