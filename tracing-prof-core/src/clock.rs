//! Where time comes from: a monotonic wall clock and the thread's CPU usage.
//!
//! Both sit behind [`Clock`] so that tests can drive time exactly.

/// A source of wall time and per-thread CPU time for the span layer.
///
/// [`SystemClock`] is the real one. A test can implement this trait to make every duration
/// exact. Implementations must not allocate, lock or panic: they run on span enter and exit.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time in nanoseconds since an arbitrary fixed origin.
    fn now_ns(&self) -> u64;

    /// CPU time consumed so far by the calling thread, as `(user_ns, system_ns)`.
    fn thread_cpu_ns(&self) -> (u64, u64);
}

/// `CLOCK_MONOTONIC` (vDSO, no syscall) and `getrusage(RUSAGE_THREAD)` (a syscall, whose
/// resolution is one microsecond).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported on
        // Linux, and on failure `ts` stays zero, which is harmless.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
    }

    #[inline]
    fn thread_cpu_ns(&self) -> (u64, u64) {
        thread_rusage_ns()
    }
}

#[cfg(target_os = "linux")]
fn thread_rusage_ns() -> (u64, u64) {
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is valid and writable; RUSAGE_THREAD is supported since Linux 2.6.26. On
    // failure `ru` stays zero and the interval reads as no CPU.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let ns = |tv: libc::timeval| (tv.tv_sec as u64) * 1_000_000_000 + (tv.tv_usec as u64) * 1_000;
    (ns(ru.ru_utime), ns(ru.ru_stime))
}

#[cfg(not(target_os = "linux"))]
fn thread_rusage_ns() -> (u64, u64) {
    // Per-thread rusage is Linux-only; elsewhere CPU time reads as zero (documented).
    (0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_move_forward() {
        let c = SystemClock;
        let a = c.now_ns();
        let (u0, s0) = c.thread_cpu_ns();
        let mut x = 0u64;
        while c.now_ns() - a < 20_000_000 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let (u1, s1) = c.thread_cpu_ns();
        assert!(u1 + s1 > u0 + s0, "20 ms of spinning used no CPU time");
    }
}
