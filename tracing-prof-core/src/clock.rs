//! Where time comes from: a monotonic wall clock and the thread's CPU usage.
//!
//! Both sit behind [`Clock`] so that tests can drive time exactly.
//!
//! # Which CPU clock
//! [`CpuClock::Thread`] (the default) reads `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`, which
//! brings the thread's run time up to date before reading it: the CPU of an enter..exit interval
//! is exact, whatever the thread does before and after. About 520 ns a read here. It does not
//! split user from system time (`cpu_user` and `cpu_sys` stay 0).
//!
//! [`CpuClock::Rusage`] reads `getrusage(RUSAGE_THREAD)`: user and system time apart, about
//! 300 ns a read here, but over short intervals it is not a measurement of the interval. Linux
//! derives it from run time that is brought up to date only at some scheduler events, so CPU
//! used *between* spans can be credited to a span, and a span's CPU to the gap after it. On this
//! project's machine, summed over many spans, it read 200% of the work inside the spans when
//! threads burned CPU between spans, and 65% on a tokio workload, where workers park between
//! polls (`tests/process/cpu_clock.rs`). Use it when the user/system split matters more than
//! per-span accuracy.

/// Which per-thread CPU clock [`SystemClock`] reads; see the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CpuClock {
    /// `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`: exact per interval, no user/system split.
    #[default]
    Thread,
    /// `getrusage(RUSAGE_THREAD)`: user and system time apart; inexact per interval (see above).
    Rusage,
}

/// CPU time consumed so far by a thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuSample {
    /// User plus system time.
    pub total_ns: u64,
    /// User time, when the clock splits it (else 0).
    pub user_ns: u64,
    /// System time, when the clock splits it (else 0).
    pub sys_ns: u64,
}

impl CpuSample {
    /// `self - earlier`, field by field, never below 0.
    pub fn since(self, earlier: CpuSample) -> CpuSample {
        CpuSample {
            total_ns: self.total_ns.saturating_sub(earlier.total_ns),
            user_ns: self.user_ns.saturating_sub(earlier.user_ns),
            sys_ns: self.sys_ns.saturating_sub(earlier.sys_ns),
        }
    }

    pub(crate) fn add(&mut self, o: CpuSample) {
        self.total_ns += o.total_ns;
        self.user_ns += o.user_ns;
        self.sys_ns += o.sys_ns;
    }
}

/// A source of wall time and per-thread CPU time for the span layer.
///
/// [`SystemClock`] is the real one. A test can implement this trait to make every duration
/// exact. Implementations must not allocate, lock or panic: they run on span enter and exit.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time in nanoseconds since an arbitrary fixed origin.
    fn now_ns(&self) -> u64;

    /// CPU time consumed so far by the calling thread.
    fn thread_cpu(&self) -> CpuSample;

    /// Whether [`Clock::thread_cpu`] splits user from system time (the profiles then have
    /// `cpu_user` and `cpu_sys` sample types). Default: yes.
    fn splits_cpu(&self) -> bool {
        true
    }

    /// Whether [`Clock::now_ns`] reads tracing-prof's own monotonic clock, as
    /// [`SystemClock`] does: the CPU sampler's signal handler reads that clock to tell the
    /// samples taken in long polls. Default: no (a test clock), and then no sample is marked.
    fn is_monotonic(&self) -> bool {
        false
    }
}

/// `CLOCK_MONOTONIC` for wall time (read from the CPU's time-stamp counter where the kernel
/// keeps time with it, through the vDSO otherwise: no system call either way), and the chosen
/// [`CpuClock`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock {
    cpu: CpuClock,
}

impl SystemClock {
    /// Wall time from `CLOCK_MONOTONIC`, CPU time from `cpu`.
    pub const fn new(cpu: CpuClock) -> Self {
        SystemClock { cpu }
    }
}

impl Clock for SystemClock {
    fn splits_cpu(&self) -> bool {
        self.cpu == CpuClock::Rusage
    }

    fn is_monotonic(&self) -> bool {
        true
    }

    #[inline]
    fn now_ns(&self) -> u64 {
        crate::monotonic::now_ns()
    }

    #[inline]
    fn thread_cpu(&self) -> CpuSample {
        match self.cpu {
            CpuClock::Rusage => {
                let (user_ns, sys_ns) = thread_rusage_ns();
                CpuSample {
                    total_ns: user_ns + sys_ns,
                    user_ns,
                    sys_ns,
                }
            }
            CpuClock::Thread => CpuSample {
                total_ns: thread_cputime_ns(),
                user_ns: 0,
                sys_ns: 0,
            },
        }
    }
}

fn thread_cputime_ns() -> u64 {
    tracing_prof_cpu::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
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
        for cpu in [CpuClock::Rusage, CpuClock::Thread] {
            let c = SystemClock::new(cpu);
            let a = c.now_ns();
            let before = c.thread_cpu();
            let mut x = 0u64;
            while c.now_ns() - a < 20_000_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            let used = c.thread_cpu().since(before);
            assert!(
                used.total_ns > 0,
                "{cpu:?}: 20 ms of spinning used no CPU time"
            );
            assert_eq!(used.user_ns + used.sys_ns > 0, cpu == CpuClock::Rusage);
        }
    }
}
