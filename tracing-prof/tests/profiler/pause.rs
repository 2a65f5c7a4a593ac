//! Profiling paused and resumed at run time: while paused no heap sample, no CPU sample and no
//! file; the exact counters keep counting, so in-use memory is right after resuming; the toggle
//! signal works when asked for and is left alone otherwise.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};
use tracing::info_span;
use tracing_prof::core::ToggleSignal;
use tracing_prof::{FileExporter, Profiler};
use tracing_subscriber::prelude::*;

/// The newest modification time among the directory's captures, and how many there are.
fn files(dir: &Path) -> (usize, Option<SystemTime>) {
    let entries: Vec<_> = std::fs::read_dir(dir.join("captures"))
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    let newest = entries
        .iter()
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .max();
    (entries.len(), newest)
}

fn heap_samples(profiler: &tracing_prof::core::Profiler) -> u64 {
    profiler.snapshot().stacks.iter().map(|s| s.samples).sum()
}

fn inuse(profiler: &tracing_prof::core::Profiler, span: &str) -> u64 {
    profiler
        .snapshot()
        .paths
        .iter()
        .filter(|p| p.is(&[span]))
        .map(|p| p.memory.inuse_bytes)
        .sum()
}

fn burn(d: Duration) -> u64 {
    let end = Instant::now() + d;
    let mut x = 1u64;
    while Instant::now() < end {
        for _ in 0..10_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
    }
    x
}

fn signal_action(sig: libc::c_int) -> libc::sighandler_t {
    // SAFETY: reading the current action into a zeroed struct of our own.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old);
        old.sa_sigaction
    }
}

#[test]
fn paused_means_no_samples_no_files_and_exact_counts() {
    if crate::isolated(
        module_path!(),
        "paused_means_no_samples_no_files_and_exact_counts",
    ) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tracing-prof-pause-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    tracing_subscriber::registry()
        .with(tracing_prof::core::ProfileLayer::new())
        .init();

    // Off unless asked: a profiler without a toggle signal leaves SIGUSR2 alone.
    let (_layer, guard) = Profiler::builder().build().unwrap();
    assert_eq!(signal_action(libc::SIGUSR2), libc::SIG_DFL);
    drop(guard);

    let (_layer, guard) = Profiler::builder()
        .interval(Duration::from_millis(100))
        .heap_sampling(1)
        .cpu_sampling(1000)
        .toggle_signal(Some(ToggleSignal::Usr2))
        .sink(FileExporter::new(&dir))
        .build()
        .unwrap();
    let profiler = guard.profiler().clone();
    let before = info_span!("before").in_scope(|| vec![1u8; 1 << 20]);
    info_span!("work").in_scope(|| burn(Duration::from_millis(300)));
    std::thread::sleep(Duration::from_millis(300));
    assert!(files(&dir).0 > 0, "exports run before the pause");
    assert!(profiler.stats().cpu.samples > 0);

    assert!(profiler.pause());
    assert!(!profiler.pause(), "already paused");
    assert!(profiler.stats().paused);
    std::thread::sleep(Duration::from_millis(150)); // an export under way finishes
    let (cpu, heap, written) = (
        profiler.stats().cpu.samples,
        heap_samples(&profiler),
        files(&dir),
    );
    drop(before); // freed while paused
    let during = info_span!("during").in_scope(|| {
        burn(Duration::from_millis(300));
        vec![2u8; 2 << 20]
    });
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        profiler.stats().cpu.samples,
        cpu,
        "no CPU sample while paused"
    );
    assert_eq!(heap_samples(&profiler), heap, "no heap sample while paused");
    assert_eq!(files(&dir), written, "no file while paused");
    // The exact counters kept counting.
    assert_eq!(inuse(&profiler, "before"), 0);
    assert_eq!(inuse(&profiler, "during"), 2 << 20);

    assert!(profiler.resume());
    assert!(!profiler.stats().paused);
    let kept = info_span!("after").in_scope(|| {
        burn(Duration::from_millis(200));
        vec![3u8; 4096]
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(profiler.stats().cpu.samples > cpu, "CPU sampling again");
    assert!(heap_samples(&profiler) > heap, "heap sampling again");
    assert!(files(&dir).1 > written.1, "exports again");
    assert_eq!(inuse(&profiler, "during"), 2 << 20);
    assert_eq!(inuse(&profiler, "after"), 4096);

    // The toggle signal: asked for, so handled; each one flips the state.
    assert_ne!(signal_action(libc::SIGUSR2), libc::SIG_DFL);
    let wait_for = |paused: bool| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while profiler.is_paused() != paused {
            assert!(
                Instant::now() < deadline,
                "the signal did not toggle to {paused}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // SAFETY: raising a signal this process handles.
    unsafe { libc::raise(libc::SIGUSR2) };
    wait_for(true);
    // SAFETY: as above.
    unsafe { libc::raise(libc::SIGUSR2) };
    wait_for(false);
    drop((during, kept));
    drop(guard);
    let _ = std::fs::remove_dir_all(&dir);
}
