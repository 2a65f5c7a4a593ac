//! Per-thread CPU-time timers, through the raw `timer_*` system calls.
//!
//! Each thread gets one POSIX timer on its own CPU clock (`CLOCK_THREAD_CPUTIME_ID`) that sends
//! `SIGPROF` to that thread alone (`SIGEV_THREAD_ID`), as Go does since 1.18 and
//! async-profiler's `ctimer` does: a process-wide `setitimer` undercounts once more than a
//! couple of threads are busy (golang/go#35057), and delivers the signal to whichever thread
//! the kernel picks. The system calls are made directly, not through glibc's wrappers, which
//! allocate with `malloc` on older glibc versions; the kernel's timer id is a plain `int`.

use std::ffi::c_void;

/// The value our timers put in `si_value`, to tell their signals from anyone else's.
pub(crate) const COOKIE: usize = 0x7470_6370_7500; // "tpcpu"

/// A kernel timer id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TimerId(pub(crate) i32);

/// Creates a timer on the calling thread's CPU clock that sends SIGPROF to thread `tid`
/// (the calling thread) every `period_ns` of its CPU time, the first time after `first_ns`.
pub(crate) fn arm(tid: i32, period_ns: u64, first_ns: u64) -> Result<TimerId, i32> {
    // SAFETY: an all-zero sigevent is a valid value of this plain C struct.
    let mut sev: libc::sigevent = unsafe { std::mem::zeroed() };
    sev.sigev_notify = libc::SIGEV_THREAD_ID;
    sev.sigev_signo = libc::SIGPROF;
    sev.sigev_value = libc::sigval {
        sival_ptr: COOKIE as *mut c_void,
    };
    sev.sigev_notify_thread_id = tid;
    let mut id: libc::c_int = -1;
    // SAFETY: timer_create(clockid, struct sigevent *, kernel_timer_t *) with a valid sigevent
    // and a writable int; the kernel reads and writes nothing else.
    let r = unsafe {
        libc::syscall(
            libc::SYS_timer_create,
            libc::CLOCK_THREAD_CPUTIME_ID,
            &raw const sev,
            &raw mut id,
        )
    };
    if r != 0 {
        return Err(errno());
    }
    let timer = TimerId(id);
    let spec = libc::itimerspec {
        it_interval: timespec(period_ns),
        it_value: timespec(first_ns.max(1)),
    };
    // SAFETY: timer_settime(kernel_timer_t, int, const struct itimerspec *, struct itimerspec *)
    // with a timer we just created and a valid itimerspec; no old value is asked for.
    let r = unsafe {
        libc::syscall(
            libc::SYS_timer_settime,
            timer.0,
            0,
            &raw const spec,
            std::ptr::null_mut::<libc::itimerspec>(),
        )
    };
    if r != 0 {
        let e = errno();
        delete(timer);
        return Err(e);
    }
    Ok(timer)
}

/// Deletes a timer. A signal it already queued may still arrive afterwards.
pub(crate) fn delete(timer: TimerId) {
    // SAFETY: timer_delete(kernel_timer_t) on an id; a stale id is rejected with EINVAL.
    unsafe { libc::syscall(libc::SYS_timer_delete, timer.0) };
}

fn timespec(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
