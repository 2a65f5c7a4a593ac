//! Whether a profiler runs in this process: one at a time, from `build` until its aggregator
//! thread has finished; none in a child of `fork` (the aggregator thread is not copied).

use std::sync::atomic::{AtomicBool, Ordering};

static RUNNING: AtomicBool = AtomicBool::new(false);

/// Whether a profiler runs now.
pub(crate) fn is_running() -> bool {
    RUNNING.load(Ordering::Acquire)
}

/// Owns the one running profiler's place: cleared when dropped (the aggregator's end, or a
/// failed build).
pub(crate) struct RunningToken(());

impl RunningToken {
    /// The place, if no profiler runs.
    pub(crate) fn take() -> Option<Self> {
        RUNNING
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| RunningToken(()))
    }
}

impl Drop for RunningToken {
    fn drop(&mut self) {
        RUNNING.store(false, Ordering::Release);
    }
}

/// In a child of `fork`: no aggregator runs there.
pub(crate) fn after_fork_in_child() {
    RUNNING.store(false, Ordering::Release);
}
