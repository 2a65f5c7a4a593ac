//! A clock read in nanoseconds: one wrapper of `clock_gettime` for the signal handler, the
//! span layer's exact CPU clock and the monotonic clock's calibration.

/// `clock` (a `libc::CLOCK_*` id) in nanoseconds, or 0 when the clock cannot be read (an id
/// the kernel does not know). `clock_gettime` is async-signal-safe (POSIX.1-2008,
/// signal-safety(7)). `CLOCK_MONOTONIC` is served by the vDSO without a system call where the
/// kernel's clocksource allows (tsc, on x86 hosts and most VMs); `CLOCK_THREAD_CPUTIME_ID` is a
/// system call.
#[inline]
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec that this function owns; on failure it stays
    // zero.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}
