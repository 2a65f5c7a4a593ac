//! A monotonic clock in nanoseconds, as cheap as the CPU allows: the layer reads it on every
//! span enter, exit, creation and close.
//!
//! Where the kernel itself keeps time with the x86 time-stamp counter (clocksource `tsc`, which
//! it only picks when the counter is invariant and synchronized across CPUs), we read the
//! counter directly (`rdtsc`, about 10 ns here) and convert it with a rate calibrated against
//! `CLOCK_MONOTONIC` once, over 5 ms, when the first layer is made; otherwise, and until then,
//! `clock_gettime(CLOCK_MONOTONIC)` through the vDSO (about 24 ns here). The two agree to
//! within the calibration's error, about 10 parts per million; the counter-based time starts
//! where `CLOCK_MONOTONIC` was at the end of calibration, so switching costs no jump beyond a
//! few tens of nanoseconds.
//!
//! The aggregator checks the clocksource again every interval; if the kernel gave up on the
//! counter (it does, when its watchdog finds it unstable), so do we.

use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

/// Nanoseconds per counter tick, as a 32.32 fixed-point number; 0: the counter is not used.
static MULT: AtomicU64 = AtomicU64::new(0);
/// Counter value and `CLOCK_MONOTONIC` time at the end of calibration.
static BASE_TICKS: AtomicU64 = AtomicU64::new(0);
static BASE_NS: AtomicU64 = AtomicU64::new(0);

/// `CLOCK_MONOTONIC` in nanoseconds, through the vDSO.
#[inline]
pub(crate) fn vdso_ns() -> u64 {
    tracing_prof_cpu::clock_ns(libc::CLOCK_MONOTONIC)
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn ticks() -> u64 {
    // SAFETY: `rdtsc` has no preconditions on x86_64; it reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Monotonic time in nanoseconds since an arbitrary origin.
#[inline]
pub(crate) fn now_ns() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        let mult = MULT.load(Ordering::Relaxed);
        if mult != 0 {
            let elapsed = ticks().wrapping_sub(BASE_TICKS.load(Ordering::Relaxed));
            let ns = (u128::from(elapsed) * u128::from(mult)) >> 32;
            return BASE_NS.load(Ordering::Relaxed).wrapping_add(ns as u64);
        }
    }
    vdso_ns()
}

/// Whether the kernel keeps time with the time-stamp counter now.
fn kernel_uses_tsc() -> bool {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .is_ok_and(|s| s.trim() == "tsc")
}

/// Calibrates the counter against `CLOCK_MONOTONIC` once per process (5 ms), if the kernel uses
/// it. Called when a layer is made, off the hot path.
pub(crate) fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        #[cfg(target_arch = "x86_64")]
        if kernel_uses_tsc() {
            calibrate();
        }
    });
}

/// Stops using the counter if the kernel stopped using it.
pub(crate) fn recheck() {
    if MULT.load(Ordering::Relaxed) != 0 && !kernel_uses_tsc() {
        MULT.store(0, Ordering::Relaxed);
    }
}

#[cfg(target_arch = "x86_64")]
fn calibrate() {
    // A counter reading and a clock reading taken as close together as possible: the tightest
    // of a few tries, the counter read on both sides of the clock.
    let pair = || {
        (0..8)
            .map(|_| {
                let t1 = ticks();
                let ns = vdso_ns();
                let t2 = ticks();
                (t2.wrapping_sub(t1), t1 / 2 + t2 / 2, ns)
            })
            .min_by_key(|&(width, _, _)| width)
            .map(|(_, t, ns)| (t, ns))
            .unwrap_or((0, 0))
    };
    let (t0, n0) = pair();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let (t1, n1) = pair();
    let (dt, dn) = (t1.wrapping_sub(t0), n1.wrapping_sub(n0));
    if dt == 0 || dn < 4_000_000 || dt > dn.saturating_mul(100) {
        return; // implausible (a counter under 10 MHz or above 100 GHz): keep the vDSO
    }
    let mult = ((u128::from(dn) << 32) / u128::from(dt)) as u64;
    BASE_TICKS.store(t1, Ordering::Relaxed);
    BASE_NS.store(n1, Ordering::Relaxed);
    MULT.store(mult, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_the_kernel_clock() {
        init();
        for _ in 0..5 {
            let (a, b, c) = (vdso_ns(), now_ns(), vdso_ns());
            // Within the reads' own spread and 50 µs of calibration drift.
            assert!(b + 50_000 >= a && b <= c + 50_000, "{a} {b} {c}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let (s0, m0) = (now_ns(), vdso_ns());
        std::thread::sleep(std::time::Duration::from_millis(200));
        let (s1, m1) = (now_ns(), vdso_ns());
        let (ds, dm) = ((s1 - s0) as f64, (m1 - m0) as f64);
        assert!((ds - dm).abs() < dm * 1e-3, "{ds} ns against {dm} ns");
    }
}
