//! Platforms without per-thread CPU timers: sampling never starts.

use crate::{CpuSamplerStats, RawSample, StartError, Unwind};

/// Always [`StartError::Unsupported`] here.
pub fn start(_hz: u32, _unwind: Unwind) -> Result<(), StartError> {
    Err(StartError::Unsupported)
}

/// No unwinder of ours here: always `None`.
pub fn walk_own_stack(_out: &mut [usize]) -> Option<usize> {
    None
}

/// Nothing to stop.
pub fn stop() {}

/// Nothing to arm.
#[inline]
pub fn ensure_armed() {}

/// Nothing to drain.
pub fn drain(_f: impl FnMut(RawSample<'_>)) -> bool {
    true
}

/// No modules.
pub fn refresh_modules() -> usize {
    0
}

/// No handler.
pub fn handler_installed() -> bool {
    false
}

/// All zero.
pub fn stats() -> CpuSamplerStats {
    CpuSamplerStats::default()
}
