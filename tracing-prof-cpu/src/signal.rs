//! The SIGPROF handler: installing it without fighting anyone, and what it does.
//!
//! The handler is installed once per process with `SA_SIGINFO | SA_RESTART` (system calls
//! interrupted by a sample are restarted; `epoll_wait` and a few others still return `EINTR`,
//! as with any signal) and is **never removed**: SIGPROF's default action kills the process,
//! and a timer's last signal may still be queued when sampling stops (pyroscope-rs#399,
//! pprof-rs#288). Once stopped, it returns at once.
//!
//! If another SIGPROF handler is installed when sampling starts (pprof-rs, a user's own), we
//! refuse to start rather than replace it; if one replaces ours later, [`still_ours`] says so
//! and sampling stops.
//!
//! In the handler, only: reads of `siginfo_t` and the interrupted registers, four
//! thread-local reads (this thread's sampler state, the span path tag the layer set, when its
//! stretch began, the trace link of [`crate::trace_link`]), the stack walk of [`crate::unwind`], stores into this thread's own ring and
//! counters, two `clock_gettime(CLOCK_MONOTONIC)` reads timing the handler (async-signal-safe;
//! vDSO, no system call, on a `tsc` clocksource), on an async runtime's worker in a span one
//! read of the layer's clock (the counter or the same vDSO call: see
//! [`crate::watch_long_polls`]), and `errno` saved and restored. No allocation, no
//! lock, no other system call, no `dl_iterate_phdr`, no `_Unwind_Backtrace`. Signals that are not from our timers (a `kill -PROF`, someone's
//! `setitimer`) are counted and ignored.

use crate::disposition;
use crate::thread::{LOCAL, ThreadSampler};
use crate::timer::COOKIE;
use crate::MAX_CPU_FRAMES;
use crate::unwind::{self, Regs, Stack};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

/// SIGPROFs from somewhere else than our timers.
pub(crate) static FOREIGN: AtomicU64 = AtomicU64::new(0);
/// Our timers' signals that arrived for a thread no longer armed (queued before its exit).
pub(crate) static LATE: AtomicU64 = AtomicU64::new(0);

/// `si_code` of a signal sent by a POSIX timer.
const SI_TIMER: i32 = -2;

/// Why the handler could not be installed.
#[derive(Debug)]
pub(crate) enum InstallError {
    Foreign(usize),
    Os(std::io::Error),
}

fn ours() -> usize {
    on_sigprof as *const () as usize
}

/// Installs the handler unless another one is there. Idempotent.
pub(crate) fn install() -> Result<(), InstallError> {
    // SAFETY: `on_sigprof` has the SA_SIGINFO signature and does only what the module docs
    // list, all async-signal-safe; it is never removed.
    unsafe { disposition::install(libc::SIGPROF, ours(), libc::SA_SIGINFO, true) }.map_err(|e| {
        match e {
            disposition::Refused::Taken(handler) => InstallError::Foreign(handler),
            disposition::Refused::Os(e) => InstallError::Os(e),
        }
    })
}

/// Whether our handler is still the one installed.
pub(crate) fn still_ours() -> bool {
    disposition::current(libc::SIGPROF).is_ok_and(|h| h == ours())
}

/// Reads an `i32` or `usize` field of the `siginfo_t` at `info`.
///
/// Layout on the 64-bit Linux targets (x86_64, aarch64): `si_signo`, `si_errno`, `si_code`
/// (ints at 0, 4, 8), then the union at 16; for timers `si_tid` (16), `si_overrun` (20) and
/// `si_value` (24).
///
/// # Safety
/// `info` must be the `siginfo_t` of a running SA_SIGINFO handler.
unsafe fn field<T: Copy>(info: *const libc::siginfo_t, offset: usize) -> T {
    // SAFETY: the kernel passes a whole siginfo_t (128 bytes); every offset read is within it
    // and aligned for T.
    unsafe { info.cast::<u8>().add(offset).cast::<T>().read() }
}

extern "C" fn on_sigprof(_signal: libc::c_int, info: *mut libc::siginfo_t, uc: *mut c_void) {
    // SAFETY: __errno_location returns this thread's errno, valid for the thread's life.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: as above.
    let saved = unsafe { errno.read() };
    // SAFETY: `info` and `uc` are the kernel's arguments to this SA_SIGINFO handler.
    unsafe { handle(info, uc) };
    // SAFETY: as above.
    unsafe { errno.write(saved) };
}

/// # Safety
/// `info` and `uc` must be the arguments of a running SA_SIGINFO handler.
unsafe fn handle(info: *const libc::siginfo_t, uc: *const c_void) {
    // SAFETY: forwarded from the caller.
    let (code, overrun, value) = unsafe {
        (
            field::<i32>(info, 8),
            field::<i32>(info, 20),
            field::<usize>(info, 24),
        )
    };
    if code != SI_TIMER || value != COOKIE {
        FOREIGN.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let ts = LOCAL
        .try_with(|l| l.current.get())
        .unwrap_or(std::ptr::null());
    if ts.is_null() {
        LATE.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let start = now_ns();
    // SAFETY: a state from `thread::acquire`, owned by this thread; states are never freed.
    let ts: &ThreadSampler = unsafe { &*ts };
    let weight = u64::from(overrun.max(0).unsigned_abs()) + 1;
    let tag = tracing_prof_alloc::current_tag().get();
    // SAFETY: forwarded from the caller.
    let regs = unsafe { Regs::from_ucontext(uc) };
    let stack = Stack::of(ts, regs.sp);
    let mut ips = [0u64; MAX_CPU_FRAMES];
    let hint = ts.tid.load(Ordering::Relaxed).unsigned_abs() as usize;
    let walk = unwind::walk(regs, stack, &mut ips, hint);
    let long_poll = crate::long_poll::now();
    let link = crate::trace_link::current();
    let header = crate::record_header(
        tag,
        walk.depth,
        weight,
        walk.truncated,
        long_poll,
        link.is_some(),
    );
    let words = link.to_words();
    let prefix: &[u64] = if link.is_some() { &words } else { &[] };
    let bump = |c: &AtomicU64, n: u64| c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    if ts.ring.push(header, prefix, &ips[..walk.depth]) {
        bump(&ts.samples, weight);
        if walk.truncated {
            bump(&ts.truncated, 1);
        }
    } else {
        bump(&ts.dropped, weight);
    }
    bump(&ts.handled, 1);
    bump(&ts.frames, walk.depth as u64);
    let took = now_ns().wrapping_sub(start);
    bump(&ts.handler_ns, took);
    bump(&ts.handler_hist[crate::handler_bucket(took)], 1);
}

/// `CLOCK_MONOTONIC` in nanoseconds (async-signal-safe: see [`crate::clock_ns`]).
fn now_ns() -> u64 {
    crate::clock_ns(libc::CLOCK_MONOTONIC)
}
