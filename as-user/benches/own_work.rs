//! The profiler's own work in the steady state of a small service: how many allocations, and
//! how many bytes, its aggregator thread makes per export interval once warm (the first export
//! symbolizes everything seen so far; later ones only what is new, and the CPU samples' leaf
//! addresses, which are resolved again at every batch on purpose), and what it holds.
//!
//! The service: the cheap-request workload (`run_cheap`) in batches of 1000 requests every
//! 100 ms on two tokio workers, a light steady load. The profiler: the defaults (heap sampling
//! at 512 KiB, CPU sampling at 100 Hz, pprof files), but exports every second, so that ten
//! intervals take ten seconds (an interval's work does not depend on its length, only on what
//! was new in it). Its own allocations are read from its exact counters (the `(tracing-prof)`
//! path), less what reading them costs. Three warm-up exports, then `TRACING_PROF_BENCH_ROUNDS`
//! rounds of ten exports each; prints each round and the median.
//!
//! `cargo bench -p tracing-prof-as-user --bench own_work`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tracing_prof::model::{MemoryStats, PathKind};
use tracing_prof::{FileExporter, Profiler, TaggingAllocator};
use tracing_prof_examples::bench::child;
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: TaggingAllocator<tikv_jemallocator::Jemalloc> =
    TaggingAllocator::new(tikv_jemallocator::Jemalloc);

/// The profiler's own exact counters now.
fn own(profiler: &tracing_prof::Profiler) -> MemoryStats {
    profiler
        .snapshot()
        .paths
        .iter()
        .find(|p| p.kind == PathKind::Profiler)
        .map(|p| p.memory)
        .unwrap_or_default()
}

fn main() {
    let rounds = child::setting("TRACING_PROF_BENCH_ROUNDS", 3) as usize;
    let dir = std::env::temp_dir().join(format!("tracing-prof-own-work-{}", std::process::id()));
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(1))
        .sink(FileExporter::new(&dir))
        .build()
        .expect("a profiler");
    tracing_subscriber::registry().with(layer).init();
    let profiler = guard.profiler().clone();
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async {
                while !stop.load(Ordering::Relaxed) {
                    tokio::spawn(tracing_prof_examples::run_cheap(1000, 16))
                        .await
                        .expect("a batch");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        })
    };
    let exports = || profiler.stats().exports;
    let wait_for = |n: u64| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while exports() < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for(3);
    // What one reading of the counters allocates as the profiler's (a snapshot).
    let (a, b) = (own(&profiler), own(&profiler));
    let reading = (
        b.alloc_objects - a.alloc_objects,
        b.alloc_bytes - a.alloc_bytes,
    );
    println!(
        "one reading of the counters: {} allocations, {} bytes (taken off below)",
        reading.0, reading.1
    );
    println!(
        "round  exports  allocations/export  bytes/export  in use (KiB)  cpu stacks  heap stacks  threads"
    );
    let mut per_export = Vec::new();
    let mut bytes_per_export = Vec::new();
    for round in 0..rounds {
        let (e0, m0) = (exports(), own(&profiler));
        wait_for(e0 + 10);
        let (e1, m1) = (exports(), own(&profiler));
        let n = (e1 - e0).max(1);
        let allocs = (m1.alloc_objects - m0.alloc_objects).saturating_sub(reading.0) / n;
        let bytes = (m1.alloc_bytes - m0.alloc_bytes).saturating_sub(reading.1) / n;
        let snapshot = profiler.snapshot();
        println!(
            "{round:>5}  {n:>7}  {allocs:>18}  {bytes:>12}  {:>12}  {:>10}  {:>11}  {:>7}",
            m1.inuse_bytes / 1024,
            snapshot.cpu_stacks.len(),
            snapshot.stacks.len(),
            snapshot.threads.len(),
        );
        per_export.push(allocs as f64);
        bytes_per_export.push(bytes as f64);
    }
    println!(
        "median: {:.0} allocations and {:.0} bytes per export interval",
        child::median(per_export),
        child::median(bytes_per_export)
    );
    stop.store(true, Ordering::Relaxed);
    let _ = load.join();
    drop(guard);
    let _ = std::fs::remove_dir_all(&dir);
}
