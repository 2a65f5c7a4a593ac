//! `fork` under a busy profiler: 4 threads allocate and create spans on new paths as fast as
//! they can (every one of them takes the span path table's lock), the aggregator exports every
//! 100 ms (symbolizing), and the main thread forks 120 times. Every child enters a span on a
//! path of its own, allocates, captures a snapshot and exits, within a timeout: before the
//! `atfork` handlers, children hung on a lock another thread held at the fork. In the child
//! only the forking thread is listed as running or alive, with the child's own thread id.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tracing_subscriber::prelude::*;

/// What a child does; returns its exit status. (The workers fill the span path cap quickly,
/// so the child's new path may land under `(other span paths)`: interning it takes the path
/// table's lock all the same.)
fn child(profiler: &tracing_prof::core::Profiler) -> i32 {
    let before = profiler.snapshot().total_memory().alloc_bytes;
    let kept = tracing::info_span!("fork_child_only", n = 1).in_scope(|| vec![5u8; 4096]);
    let after = profiler.snapshot().total_memory().alloc_bytes;
    drop(kept);
    // The handle's own state (each behind a lock the aggregator takes at every export).
    let _ = (profiler.giant_allocations(), profiler.cpu_error());
    // Only this thread exists here: the parent's 4 workers are not listed as running, and the
    // one listed (if this thread entered a span before the fork) has this thread's id, which
    // is the child's pid (the forking thread is the child's first).
    // SAFETY: getpid has no preconditions.
    let pid = u64::try_from(unsafe { libc::getpid() }).unwrap_or(0);
    let in_flight = profiler.in_flight();
    if in_flight.threads.len() > 1 || in_flight.threads.iter().any(|t| t.tid != pid) {
        return 4;
    }
    // Nor are they alive in the allocator's per-thread view: their tables were handed back.
    let threads = profiler.snapshot().threads;
    let alive: Vec<u64> = threads.iter().filter(|t| t.alive).map(|t| t.tid).collect();
    if alive != [pid] {
        return 5;
    }
    if after >= before + 4096 { 0 } else { 3 }
}

/// Forks: each child takes about 0.1 s on CI's two cores beside the four busy threads (before
/// the `atfork` handlers, children hung from the first few).
const FORKS: usize = 120;

#[test]
fn children_of_a_busy_profiler_never_hang() {
    if crate::isolated(module_path!(), "children_of_a_busy_profiler_never_hang") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tracing-prof-fork-{}", std::process::id()));
    let (layer, guard) = tracing_prof::Profiler::builder()
        .interval(Duration::from_millis(100))
        .span_field_labels(["n"])
        .max_label_values(1024)
        .giant_allocations(1 << 20, false)
        .leak_detection(2, 1)
        .sink(tracing_prof::FileExporter::new(&dir))
        .build()
        .unwrap();
    tracing_subscriber::registry().with(layer).init();
    let profiler = guard.profiler().clone();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    // A new label value: a new span path (then, past the caps, the overflow
                    // path, whose interning takes the table's lock every time).
                    tracing::info_span!("fork_busy", n = w * 1_000_000 + n).in_scope(|| {
                        std::hint::black_box(vec![0u8; 64 + (n % 512) as usize]);
                    });
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let (mut ok, mut hung, mut failed) = (0, 0, 0);
    for _ in 0..FORKS {
        if hung >= 3 {
            break; // a failing run need not wait 20 s for every child
        }
        // SAFETY: the child only runs the profiler's own code (which the atfork handlers made
        // safe to run after fork), allocates through glibc (fork-safe), and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = child(&profiler);
            // SAFETY: ends the child without running the parent's destructors or atexit.
            unsafe { libc::_exit(code) };
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut status = 0;
            // SAFETY: waits for our own child, without blocking.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
                    ok += 1;
                } else {
                    failed += 1;
                }
                break;
            }
            if Instant::now() > deadline {
                hung += 1;
                // SAFETY: our own child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    drop(guard);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        (ok, hung, failed),
        (FORKS, 0, 0),
        "children that finished, hung, failed"
    );
}
