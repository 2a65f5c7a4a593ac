//! The sampler on its own: samples arrive, weighted by CPU time, with stacks that reach the
//! burning function and its callers, with both unwinders.

use std::hint::black_box;
use tracing_prof_cpu::{RawSample, Unwind};

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[inline(never)]
fn burn_here(ms: u64) -> u64 {
    let start = thread_cpu_ns();
    let mut x = 1u64;
    // Reading the thread's CPU clock is a system call, and CPU timers fire as it returns: few
    // reads, so that few samples land in libc's `clock_gettime`, which has no frame pointer
    // (a frame-pointer walk from there misses `burn_here`).
    while thread_cpu_ns() - start < ms * 1_000_000 {
        for _ in 0..200_000 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

#[inline(never)]
fn outer_caller(ms: u64) -> u64 {
    black_box(burn_here(ms)) + 1
}

fn names(ips: &[u64]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, &ip) in ips.iter().enumerate() {
        // The first address is the interrupted instruction, the others return addresses.
        let pc = if i == 0 { ip } else { ip - 1 };
        backtrace::resolve(pc as *mut std::ffi::c_void, |s| {
            if let Some(n) = s.name() {
                out.push(format!("{n:#}"));
            }
        });
    }
    out
}

fn collect() -> Vec<(u64, Vec<u64>)> {
    let mut v = Vec::new();
    while !tracing_prof_cpu::drain(|s: RawSample<'_>| v.push((s.weight, s.ips.to_vec()))) {}
    v
}

/// Samples 300 ms of CPU at 1 kHz; checks the weights against the thread's CPU clock, and, when
/// `callers`, that the stacks reach the callers of the burning function.
fn run(unwind: Unwind, callers: bool) {
    tracing_prof_cpu::start(1000, unwind).expect("start");
    let _ = collect();
    let cpu0 = thread_cpu_ns();
    black_box(outer_caller(300));
    let used = thread_cpu_ns() - cpu0;
    let samples = collect();
    tracing_prof_cpu::stop();
    let weight: u64 = samples.iter().map(|s| s.0).sum();
    // 1 ms per sample: the weights add up to the CPU time used, within 10%.
    let sampled = weight * 1_000_000;
    assert!(
        sampled as f64 > used as f64 * 0.9 && (sampled as f64) < used as f64 * 1.1,
        "{unwind:?}: sampled {sampled} ns, used {used} ns"
    );
    if !callers {
        return;
    }
    let with_both = samples
        .iter()
        .filter(|(_, ips)| {
            let n = names(ips);
            let burn = n.iter().position(|f| f.contains("burn_here"));
            let outer = n.iter().position(|f| f.contains("outer_caller"));
            let test = n.iter().position(|f| f.contains("run"));
            matches!((burn, outer, test), (Some(b), Some(o), Some(t)) if b < o && o < t)
        })
        .count();
    assert!(
        with_both * 10 >= samples.len() * 9,
        "{unwind:?}: {with_both} of {} samples show burn_here <- outer_caller <- run; e.g. {:?}",
        samples.len(),
        samples.first().map(|s| names(&s.1))
    );
}

/// The calling thread's return addresses from the platform unwinder (`_Unwind_Backtrace`,
/// through the backtrace crate) and from `walk_own_stack`, taken at the same place.
#[inline(never)]
fn both_walks() -> (Vec<u64>, Option<Vec<u64>>) {
    let mut platform = Vec::new();
    // SAFETY: no other backtrace runs on this thread meanwhile.
    unsafe {
        backtrace::trace_unsynchronized(|f| {
            let ip = f.ip() as u64;
            if ip != 0 {
                platform.push(ip);
            }
            true
        })
    };
    let mut ips = [0usize; 128];
    let ours = tracing_prof_cpu::walk_own_stack(&mut ips)
        .map(|n| ips[..n].iter().map(|&ip| ip as u64).collect());
    black_box(&platform);
    (platform, ours)
}

#[inline(never)]
fn walk_three_down() -> (Vec<u64>, Option<Vec<u64>>) {
    black_box(walk_two_down())
}

#[inline(never)]
fn walk_two_down() -> (Vec<u64>, Option<Vec<u64>>) {
    black_box(both_walks())
}

/// `walk_own_stack` (the heap sampler's walker) finds the return addresses the platform
/// unwinder finds: from `both_walks`'s caller to the thread's start, address for address.
fn own_stack_matches_the_platform_unwinder(unwind: Unwind) {
    tracing_prof_cpu::start(1, unwind).expect("start");
    let (platform, ours) = walk_three_down();
    tracing_prof_cpu::stop();
    let ours = ours.unwrap_or_else(|| panic!("{unwind:?}: this armed thread's walk declined"));
    // Each starts with its own call's return address in `both_walks`; from its caller on,
    // they walk the same frames.
    let first = platform
        .iter()
        .position(|&ip| ip == ours[1])
        .unwrap_or_else(|| panic!("{unwind:?}: {:x?} not in {:x?}", ours, platform));
    let (ours, theirs) = (&ours[1..], &platform[first..]);
    let names = names(&[&[0][..], ours].concat());
    assert!(
        names.iter().any(|n| n.contains("walk_two_down"))
            && names.iter().any(|n| n.contains("walk_three_down"))
            && names.iter().any(|n| n.contains("own_stack_matches")),
        "{unwind:?}: {names:?}"
    );
    // At the thread's start, one may stop a frame sooner (with frame pointers, `clone3` has
    // none).
    let common = ours.len().min(theirs.len());
    assert!(
        common + 1 >= ours.len().max(theirs.len()),
        "{ours:x?} {theirs:x?}"
    );
    assert_eq!(ours[..common], theirs[..common], "{unwind:?}");
    // A thread the sampler never armed: its stack's extent is unknown, the walk declines.
    std::thread::spawn(|| assert!(both_walks().1.is_none()))
        .join()
        .unwrap();
}

#[test]
fn samples_weigh_cpu_time_and_reach_the_callers() {
    run(Unwind::Dwarf, true);
    let s = tracing_prof_cpu::stats();
    assert!(s.samples > 250 && s.foreign_signals == 0, "{s:?}");
    // The handler's own accounts: one run per signal (each weighing one or more samples), at
    // least the three frames checked above in each, and a time for each.
    assert!(
        s.handler_runs > 0 && s.handler_runs <= s.samples + s.dropped,
        "{s:?}"
    );
    assert!(s.frames >= 3 * s.handler_runs, "{s:?}");
    assert!(s.handler_ns >= s.handler_runs, "{s:?}");
    assert_eq!(
        s.handler_ns_histogram.iter().sum::<u64>(),
        s.handler_runs,
        "{s:?}"
    );
    assert!(s.handler_ns_quantile(0.5).is_some_and(|m| m > 0), "{s:?}");
    // Frame pointers reach the callers only where every function keeps them: in the CI build
    // with `-C force-frame-pointers=yes`, which sets this variable.
    let fp_build = std::env::var_os("TRACING_PROF_EXPECT_FRAME_POINTERS").is_some();
    run(Unwind::FramePointers, fp_build);
    // (Here, not in a test of its own: tests run at once, and this restarts the sampler.)
    own_stack_matches_the_platform_unwinder(Unwind::Dwarf);
    if fp_build {
        own_stack_matches_the_platform_unwinder(Unwind::FramePointers);
    }
}
