//! The example workload (20 000 requests, 4 tokio workers) three ways, each in its own process:
//! off (System, a tracing registry without profiling), ours (TaggingAllocator<System>, our layer
//! and file exporter), and tracing-prof 0.3 (its TrackingAllocator, its layer tracking
//! everything, its pprof file backend). Reports wall time, CPU time, peak RSS and the final
//! flush at shutdown.
//!
//! `cargo bench --manifest-path peers/Cargo.toml --bench workload_peers`

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};
use tracing_prof_03::allocator::TrackingAllocator;
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
        // SAFETY: getenv with a NUL-terminated name; it allocates nothing.
        let v = unsafe { libc::getenv(c"TRACING_PROF_PEER_CHILD".as_ptr()) };
        let name = if v.is_null() {
            &b""[..]
        } else {
            // SAFETY: a non-null result points to a NUL-terminated string.
            unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes()
        };
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
    println!("wall_ns={} flush_ns={}", wall.as_nanos(), flush.as_nanos());
}

struct Run {
    wall_s: f64,
    cpu_s: f64,
    maxrss_mib: f64,
    flush_ms: f64,
}

fn spawn(mode: &str) -> Run {
    #[allow(
        clippy::zombie_processes,
        reason = "reaped below by wait4, which also returns its rusage"
    )]
    let mut c = Command::new(std::env::current_exe().unwrap())
        .env(ENV, mode)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the benchmark child");
    let mut out = String::new();
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pid is our child's; status and ru are valid, writable locals.
    let pid = unsafe { libc::wait4(c.id() as libc::pid_t, &mut status, 0, &mut ru) };
    assert!(
        pid > 0 && status == 0,
        "child {mode} failed (status {status}): {out}"
    );
    let field = |k: &str| -> f64 {
        out.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Run {
        wall_s: field("wall_ns=") / 1e9,
        cpu_s: tv(ru.ru_utime) + tv(ru.ru_stime),
        maxrss_mib: ru.ru_maxrss as f64 / 1024.0,
        flush_ms: field("flush_ns=") / 1e6,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    if let Ok(mode) = std::env::var(ENV) {
        return child(&mode);
    }
    let modes = ["off", "ours", "theirs"];
    let mut runs: [Vec<Run>; 3] = Default::default();
    for round in 0..ROUNDS {
        for j in 0..modes.len() {
            let i = (round + j) % modes.len();
            runs[i].push(spawn(modes[i]));
        }
    }
    let [off, ours, theirs] = &runs;
    let med = |r: &[Run], f: &dyn Fn(&Run) -> f64| median(r.iter().map(f).collect());
    let ratio = |r: &[Run], f: &dyn Fn(&Run) -> f64| {
        median(r.iter().zip(off).map(|(a, b)| f(a) / f(b)).collect())
    };
    println!("\n### Example workload, System allocator: off vs ours vs tracing-prof 0.3\n");
    println!(
        "{ROUNDS} rotating rounds, one process per run; ratios are medians of per-round ratios to off.\n"
    );
    println!("| | off | ours | ratio | tracing-prof 0.3 | ratio |");
    println!("|---|---:|---:|---:|---:|---:|");
    let row = |name: &str, unit: &str, f: &dyn Fn(&Run) -> f64| {
        println!(
            "| {name} | {:.3} {unit} | {:.3} {unit} | {:.2} | {:.3} {unit} | {:.2} |",
            med(off, f),
            med(ours, f),
            ratio(ours, f),
            med(theirs, f),
            ratio(theirs, f)
        );
    };
    row("wall time (incl. final flush)", "s", &|r| r.wall_s);
    row("CPU time (user+sys)", "s", &|r| r.cpu_s);
    row("peak RSS", "MiB", &|r| r.maxrss_mib);
    println!(
        "| final flush at shutdown | | {:.2} ms | | {:.2} ms | |",
        med(ours, &|r| r.flush_ms),
        med(theirs, &|r| r.flush_ms)
    );
}
