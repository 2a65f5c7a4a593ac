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

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A signal a setting names: the one that pauses and resumes profiling
/// ([`Config::toggle_signal`](crate::Config::toggle_signal), see [`crate::Profiler::pause`]),
/// the one that writes the flight recorder's recording
/// ([`Config::flight_signal`](crate::Config::flight_signal)). Each setting takes its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UserSignal {
    /// `SIGUSR1`.
    Usr1,
    /// `SIGUSR2`.
    Usr2,
}

/// The name [`UserSignal`] had when only the toggle used it.
pub type ToggleSignal = UserSignal;

impl UserSignal {
    pub(crate) fn number(self) -> libc::c_int {
        match self {
            UserSignal::Usr1 => libc::SIGUSR1,
            UserSignal::Usr2 => libc::SIGUSR2,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            UserSignal::Usr1 => "SIGUSR1",
            UserSignal::Usr2 => "SIGUSR2",
        }
    }

    /// `SIGUSR1` or `SIGUSR2`, with or without `SIG`, in any case.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_uppercase().trim_start_matches("SIG") {
            "USR1" => Ok(UserSignal::Usr1),
            "USR2" => Ok(UserSignal::Usr2),
            _ => Err(format!("expected SIGUSR1 or SIGUSR2, got {s:?}")),
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toggle_signals_parse_by_name() {
        for ok in ["SIGUSR2", "usr2", " SigUsr2 "] {
            assert_eq!(UserSignal::parse(ok), Ok(UserSignal::Usr2), "{ok}");
        }
        assert_eq!(UserSignal::parse("SIGUSR1"), Ok(UserSignal::Usr1));
        for bad in ["SIGTERM", "12", ""] {
            assert!(UserSignal::parse(bad).is_err(), "{bad}");
        }
    }
}
