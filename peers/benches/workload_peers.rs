//! The example workload (20 000 requests, 4 tokio workers) three ways, each in its own process:
//! off (System, a tracing registry without profiling), ours (TaggingAllocator<System>, our layer
//! and file exporter), and tracing-prof 0.3 (its TrackingAllocator, its layer tracking
//! everything, its pprof file backend). Reports wall time, CPU time, peak RSS and the final
//! flush at shutdown.
//!
//! `cargo bench --manifest-path peers/Cargo.toml --bench workload_peers`

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};
use tracing_prof_03::allocator::TrackingAllocator;
use tracing_prof_examples::bench::child;
use tracing_prof_examples::{App, Workload, run};
use tracing_subscriber::prelude::*;

const ENV: &str = "TRACING_PROF_PEER_CHILD";
const ROUNDS: usize = 5;

static MODE: AtomicU8 = AtomicU8::new(0);
static OURS: tracing_prof::TaggingAllocator<System> = tracing_prof::TaggingAllocator::new(System);
static THEIRS: TrackingAllocator = TrackingAllocator::system();

/// 1 off, 2 ours, 3 theirs; fixed by the first allocation.
fn mode() -> u8 {
    let mut m = MODE.load(Ordering::Relaxed);
    if m == 0 {
        let name = child::env_bytes(c"TRACING_PROF_PEER_CHILD");
        m = match name {
            b"ours" => 2,
            b"theirs" => 3,
            _ => 1,
        };
        MODE.store(m, Ordering::Relaxed);
    }
    m
}

struct Switch;

// SAFETY: each process uses one allocator throughout (the mode is fixed by the first call), so
// every block is freed by the allocator that made it.
unsafe impl GlobalAlloc for Switch {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe {
            match mode() {
                2 => OURS.alloc(l),
                3 => THEIRS.alloc(l),
                _ => System.alloc(l),
            }
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded contract; the same allocator as the allocation.
        unsafe {
            match mode() {
                2 => OURS.dealloc(p, l),
                3 => THEIRS.dealloc(p, l),
                _ => System.dealloc(p, l),
            }
        }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // SAFETY: forwarded contract; the same allocator as the allocation.
        unsafe {
            match mode() {
                2 => OURS.realloc(p, l, n),
                3 => THEIRS.realloc(p, l, n),
                _ => System.realloc(p, l, n),
            }
        }
    }
}

#[global_allocator]
static GLOBAL: Switch = Switch;

fn workload() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let app = App::new(2_000);
    let s = rt.block_on(run(&app, &Workload::default()));
    assert_eq!(s.handled, Workload::default().requests);
}

fn child(mode: &str) {
    let dir = std::env::temp_dir().join(format!("tracing-prof-peer-{}", std::process::id()));
    let start = Instant::now();
    let flush = match mode {
        "ours" => {
            let (layer, guard) = tracing_prof::Profiler::builder()
                .interval(Duration::from_secs(1))
                .sink(tracing_prof::FileExporter::new(&dir))
                .build()
                .unwrap();
            tracing_subscriber::registry().with(layer).init();
            workload();
            let t = Instant::now();
            drop(guard);
            t.elapsed()
        }
        "theirs" => {
            use tracing_prof_03::reporter::pprof::backend::file::{FileBackend, FileBackendConfig};
            use tracing_prof_03::reporter::pprof::{PProfReporter, PProfReporterConfig};
            let layer = tracing_prof_03::ProfileLayer::new(
                tracing_prof_03::ProfileConfig::default().track_all(),
                PProfReporter::new(
                    PProfReporterConfig::default().aggregate_samples(true),
                    FileBackend::new(FileBackendConfig::new(&dir)),
                ),
            );
            let handle = layer.shutdown_handle();
            tracing_subscriber::registry().with(layer).init();
            workload();
            let t = Instant::now();
            drop(handle);
            t.elapsed()
        }
        _ => {
            tracing_subscriber::registry().init();
            workload();
            Duration::ZERO
        }
    };
    let wall = start.elapsed();
    if std::env::var_os("TRACING_PROF_PEER_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    child::report(wall, flush);
}

fn main() {
    if let Ok(mode) = std::env::var(ENV) {
        return child(&mode);
    }
    let runs = child::rotate(ENV, &["off", "ours", "theirs"], ROUNDS);
    println!("\n### Example workload, System allocator: off vs ours vs tracing-prof 0.3\n");
    println!(
        "{ROUNDS} rotating rounds, one process per run; ratios are medians of per-round ratios to off.\n"
    );
    child::table(&["off", "ours", "tracing-prof 0.3"], &runs);
}
