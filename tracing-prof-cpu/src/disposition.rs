//! Signal dispositions, for every signal the profiler touches (SIGPROF, the toggle signal,
//! SIGTERM): a handler of ours is installed only where the signal still has its default action
//! (nobody else's handler is ever replaced), and a handler can ask, at signal time, whether it
//! is still the one installed: `tokio::signal` registers through `signal-hook-registry`,
//! which *chains* a handler it finds, so ours may run after the application's own.

use std::ffi::c_int;

/// A handler's address as `sigaction` stores it (`SIG_DFL`, `SIG_IGN` or a function).
pub type Handler = libc::sighandler_t;

/// The handler installed for `sig` now. Async-signal-safe (`sigaction` is).
pub fn current(sig: c_int) -> std::io::Result<Handler> {
    // SAFETY: an all-zero sigaction is valid storage for sigaction to fill.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: querying only (the new action is null); `old` is valid and writable.
    if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(old.sa_sigaction)
}

/// Why a handler was not installed.
#[derive(Debug)]
pub enum Refused {
    /// Another handler is installed (or the signal is ignored, where that is not taken over).
    Taken(Handler),
    /// `sigaction` failed.
    Os(std::io::Error),
}

/// Installs `handler` for `sig` with `SA_RESTART | flags` and an empty mask, if the signal has
/// its default action, or is ignored and `over_ignored`, or has `handler` already (then
/// nothing changes). Otherwise [`Refused::Taken`] with the handler found.
///
/// # Safety
/// `handler` must be a function of the signature `flags` implies (`extern "C" fn(c_int)`, or
/// with `SA_SIGINFO` `extern "C" fn(c_int, *mut siginfo_t, *mut c_void)`) that does only what
/// is async-signal-safe, for as long as it may be installed.
pub unsafe fn install(
    sig: c_int,
    handler: Handler,
    flags: c_int,
    over_ignored: bool,
) -> Result<(), Refused> {
    let found = current(sig).map_err(Refused::Os)?;
    if found == handler {
        return Ok(());
    }
    if found != libc::SIG_DFL && !(found == libc::SIG_IGN && over_ignored) {
        return Err(Refused::Taken(found));
    }
    // SAFETY: an all-zero sigaction is a valid starting value.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler;
    action.sa_flags = libc::SA_RESTART | flags;
    // SAFETY: `sa_mask` is valid storage; an empty mask blocks nothing beyond the signal itself,
    // which the kernel blocks while its handler runs.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: the caller vouches for `handler` (this function's contract).
    if unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) } != 0 {
        return Err(Refused::Os(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Gives `sig` its default action back. Async-signal-safe.
pub fn restore_default(sig: c_int) -> std::io::Result<()> {
    // SAFETY: an all-zero sigaction with `SIG_DFL` (0) is the default action, empty mask.
    let action: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: installs the default action, which runs no code of ours.
    if unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
