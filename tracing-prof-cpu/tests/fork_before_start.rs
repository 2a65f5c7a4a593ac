//! A process that forks before sampling ever started (so before the sampler registered its
//! fork handler), then starts it in the child: the forking thread's record was claimed in the
//! parent, with the parent's thread id, and arming must not trust it (with the parent's id,
//! `timer_create` fails with EINVAL and the thread is never sampled).

use tracing_prof_cpu::{RawSample, Unwind};
use tracing_prof_test_support::burn_cpu as burn;

/// What the child checks; its exit status (0: all held).
fn child() -> i32 {
    if tracing_prof_cpu::start(1000, Unwind::Dwarf).is_err() {
        return 3;
    }
    burn(300);
    let mut samples = 0u64;
    while !tracing_prof_cpu::drain(|_: RawSample<'_>| samples += 1) {}
    let stats = tracing_prof_cpu::stats();
    if stats.arm_failures != 0 {
        return 10 + stats.last_arm_error.clamp(0, 99);
    }
    if samples < 30 {
        return 4; // 300 ms of CPU at 1000 Hz: about 300
    }
    0
}

#[test]
fn a_child_samples_its_thread_when_sampling_starts_after_the_fork() {
    // The record, with this thread's id, claimed before the fork (as the tagging allocator
    // does on a thread's first allocation).
    let parent_tid = tracing_prof_thread::current().expect("a record").tid();
    assert!(!tracing_prof_cpu::is_running());
    // SAFETY: the child makes system calls, starts the sampler (no lock of it is held: it was
    // never started here) and leaves with `_exit`.
    let status = unsafe { tracing_prof_test_support::fork_and_wait(child) };
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    // 3: start refused; 10 + errno: arming failed; 4: too few samples.
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the child's check that failed"
    );
    assert_eq!(tracing_prof_thread::current().unwrap().tid(), parent_tid);
}
