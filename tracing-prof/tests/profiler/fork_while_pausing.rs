//! `fork` while another thread pauses and resumes profiling over and over: neither waits for
//! the other for good. A pause stops the CPU sampler, which drains its rings into the CPU
//! store under the store's lock; the fork handler takes that lock too, before the gate of the
//! profiler handles' own locks (`ForkSafe`). When pausing held one of those (and so the gate)
//! while it took the store's lock, a fork that came in between hung the parent: the forking
//! thread held the store and waited for the gate, the pausing one held the gate and waited for
//! the store. Now the pause switch is the runtime's first lock, which the fork takes first.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tracing_subscriber::prelude::*;

const FORKS: u32 = 300;

#[test]
fn forks_and_pauses_never_wait_for_each_other() {
    if crate::isolated(module_path!(), "forks_and_pauses_never_wait_for_each_other") {
        return;
    }
    let (layer, guard) = tracing_prof::Profiler::builder()
        .interval(Duration::from_secs(3600))
        .cpu_sampling(1000)
        .build()
        .unwrap();
    tracing_subscriber::registry().with(layer).init();
    let profiler = guard.profiler().clone();

    // A hung fork cannot be joined or timed out from the hung thread: a watchdog ends the
    // process with a failure instead.
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !done.load(Ordering::Relaxed) {
                if Instant::now() > deadline {
                    eprintln!("a fork or a pause hung: they waited for each other");
                    std::process::exit(3);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let stop = Arc::new(AtomicBool::new(false));
    let switches = Arc::new(AtomicU64::new(0));
    let toggler = {
        let (stop, switches, profiler) =
            (Arc::clone(&stop), Arc::clone(&switches), profiler.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Some CPU time, so that the sampler's rings hold samples to drain.
                tracing::info_span!("toggler").in_scope(|| {
                    let mut x = 0u64;
                    for i in 0..20_000u64 {
                        x = x.wrapping_mul(31).wrapping_add(std::hint::black_box(i));
                    }
                    std::hint::black_box(x);
                });
                assert!(profiler.pause());
                assert!(profiler.resume());
                switches.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let mut forked = 0;
    for _ in 0..FORKS {
        // SAFETY: the child calls nothing but _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: ends the child without running the parent's destructors or atexit.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child, which exits at once.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        forked += 1;
    }
    stop.store(true, Ordering::Relaxed);
    toggler.join().unwrap();
    done.store(true, Ordering::Relaxed);
    watchdog.join().unwrap();
    drop(guard);
    assert_eq!(forked, FORKS);
    assert!(
        switches.load(Ordering::Relaxed) > 0,
        "the profiler was paused and resumed while the forks ran"
    );
}
