//! The sampler in a child of `fork`: sampling stops at the fork (the child has no timers), and
//! started again in the child it samples the forking thread, whose timer must name the child's
//! thread id (with the parent's, `timer_create` fails with EINVAL and the thread is never
//! sampled); the parent's other threads are not counted as live there.

use std::sync::{Arc, Barrier};
use tracing_prof_cpu::{RawSample, Unwind};
use tracing_prof_test_support::burn_cpu as burn;

/// What the child checks; its exit status (0: all held).
fn child() -> i32 {
    if tracing_prof_cpu::is_running() {
        return 2; // the fork handler stops sampling in the child
    }
    if tracing_prof_cpu::start(1000, Unwind::Dwarf).is_err() {
        return 3;
    }
    burn(300);
    let mut samples = 0u64;
    while !tracing_prof_cpu::drain(|_: RawSample<'_>| samples += 1) {}
    let stats = tracing_prof_cpu::stats();
    if stats.arm_failures != 0 {
        return 10 + stats.last_arm_error.clamp(0, 99) as i32;
    }
    if samples < 30 {
        return 4; // 300 ms of CPU at 1000 Hz: about 300
    }
    if stats.threads_live != 1 {
        return 5;
    }
    0
}

#[test]
fn a_child_of_fork_samples_its_own_thread() {
    tracing_prof_cpu::start(1000, Unwind::Dwarf).expect("start");
    // A second armed thread, alive at the fork: gone in the child.
    let (armed, done) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let t = {
        let (armed, done) = (Arc::clone(&armed), Arc::clone(&done));
        std::thread::spawn(move || {
            tracing_prof_cpu::ensure_armed();
            armed.wait();
            done.wait();
        })
    };
    armed.wait();
    burn(20);
    // SAFETY: the child makes system calls, runs the sampler (no locks held by other threads
    // at the fork are taken: `start`'s lock is free, the fork handler reset the drain flag) and
    // leaves with `_exit`.
    let status = unsafe { tracing_prof_test_support::fork_and_wait(child) };
    done.wait();
    t.join().unwrap();
    tracing_prof_cpu::stop();
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    // 2: still running; 3: start refused; 10 + errno: arming failed; 4: too few samples;
    // 5: the parent's other thread counted live.
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the child's check that failed"
    );
}
