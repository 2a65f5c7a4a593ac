//! Profiling turned off and on at run time: [`Profiler::pause`](crate::Profiler::pause),
//! [`Profiler::resume`](crate::Profiler::resume), and an opt-in signal that toggles
//! (`TRACING_PROF_TOGGLE_SIGNAL=SIGUSR2`, as bytehound offers).
//!
//! Paused: no heap sampling (the rate is set to 0), no CPU sampling (the timers are deleted),
//! no exports and so no files or pushes. The exact counters keep counting, so in-use memory
//! stays right across a pause, and span enter and exit cost what they always do.
//!
//! The signal handler only adds one to a counter (an atomic add: async-signal-safe); the
//! aggregator thread looks at it every [`TOGGLE_POLL`] and does the work.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often the aggregator looks for a toggle signal, when one is configured.
pub(crate) const TOGGLE_POLL: Duration = Duration::from_millis(100);

/// Toggle signals received so far.
static TOGGLES: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_toggle(_: libc::c_int) {
    TOGGLES.fetch_add(1, Ordering::Relaxed);
}

/// Toggle signals received since `seen`; updates `seen`.
pub(crate) fn toggles_since(seen: &mut u64) -> u64 {
    let now = TOGGLES.load(Ordering::Relaxed);
    let n = now.wrapping_sub(*seen);
    *seen = now;
    n
}

/// Installs the toggle handler for `sig`, unless the application handles or ignores `sig`
/// already (then says so). Left installed when the profiler stops: a late signal then does
/// nothing, where restoring the default action would kill the process.
pub(crate) fn install(signal: crate::ToggleSignal) -> Result<(), String> {
    let ours = on_toggle as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: `on_toggle` has the plain handler signature and only does an atomic add, which
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
