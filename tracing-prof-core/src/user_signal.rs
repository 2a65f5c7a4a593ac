//! The signals a setting names, each for one purpose: the toggle
//! (`TRACING_PROF_TOGGLE_SIGNAL=SIGUSR2`, as bytehound offers: pauses and resumes profiling,
//! see [`Profiler::pause`](crate::Profiler::pause)) and the flight recorder's dump
//! (`TRACING_PROF_FLIGHT_SIGNAL`: an incident with its recording).
//!
//! The handler only adds one to the signal's counter (an atomic add: async-signal-safe); the
//! aggregator thread looks at the counters every [`POLL`] and does the work. Paused, the
//! profiler takes no heap or CPU samples and exports nothing; the exact counters keep counting,
//! so in-use memory stays right across a pause, and span enter and exit cost what they always
//! do.

use crate::UserSignal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often the aggregator looks for a signal, when one is configured.
pub(crate) const POLL: Duration = Duration::from_millis(100);

/// Signals received so far: `SIGUSR1`'s, `SIGUSR2`'s.
static RECEIVED: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

fn index(sig: libc::c_int) -> usize {
    usize::from(sig == libc::SIGUSR2)
}

extern "C" fn on_signal(sig: libc::c_int) {
    RECEIVED[index(sig)].fetch_add(1, Ordering::Relaxed);
}

/// How many `signal`s have arrived in this process so far.
pub(crate) fn received(signal: UserSignal) -> u64 {
    RECEIVED[index(signal.number())].load(Ordering::Relaxed)
}

/// `signal`s received since `seen`; updates `seen`.
pub(crate) fn received_since(signal: UserSignal, seen: &mut u64) -> u64 {
    let now = received(signal);
    let n = now.wrapping_sub(*seen);
    *seen = now;
    n
}

/// Installs the handler for `signal`, unless the application handles or ignores it already
/// (then says so). Left installed when the profiler stops: a late signal then does nothing,
/// where restoring the default action would kill the process.
pub(crate) fn install(signal: UserSignal) -> Result<(), String> {
    let ours = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: `on_signal` has the plain handler signature and only does an atomic add, which
    // is async-signal-safe; it is never removed.
    match unsafe { tracing_prof_cpu::disposition::install(signal.number(), ours, 0, false) } {
        Ok(()) => Ok(()),
        Err(tracing_prof_cpu::disposition::Refused::Taken(_)) => Err(format!(
            "{} already has a handler (or is ignored) in this process",
            signal.name()
        )),
        Err(tracing_prof_cpu::disposition::Refused::Os(e)) => Err(e.to_string()),
    }
}
