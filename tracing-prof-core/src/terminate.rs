//! A service stopped with SIGTERM (systemd, Kubernetes, `docker stop`) keeps its profile up to
//! the signal, with no code of the application's, and then fares exactly as it would without
//! the profiler.
//!
//! At `build`, where SIGTERM still has its default action (and
//! [`Config::flush_on_sigterm`](crate::config::Config::flush_on_sigterm) is on), a handler of
//! ours is installed. It decides at signal time, not at install:
//! - if ours is no longer the installed handler, another was installed after it and chained
//!   to it (`tokio::signal` does, through `signal-hook-registry`): the application handles
//!   SIGTERM itself, and its graceful shutdown (which drops the guard: the final export) runs
//!   uncut; ours does nothing;
//! - otherwise it writes a byte to a pipe, and the thread `tprof-sigterm`, which waits on it
//!   and nothing else, has the aggregator make its final export and the sinks flush (at most
//!   the shutdown timeout), then gives SIGTERM its default action back and sends it again:
//!   the process ends by SIGTERM (status 143 in a shell), as it would have.
//!
//! A process that is PID 1 (a container's first process, to which the kernel does not deliver
//! a signal at its default action) exports and goes on, as it would have. In a child forked
//! without exec, the handler acts as the default action. An application that installed its own
//! handler before `build` is left alone: its shutdown drops the guard.
//!
//! In the handler, only: `getpid`, `sigaction` (query, or the default action back), `write` to
//! the pipe, `raise`, and `errno` saved and restored: async-signal-safe, as POSIX lists them.

use crate::profiler::Command;
use crossbeam_channel::{Sender, bounded};
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// The pipe's write end, for the handler; -1 until armed.
static PIPE: AtomicI32 = AtomicI32::new(-1);
/// The process that armed the handler (a forked child is another).
static OWNER: AtomicI32 = AtomicI32::new(0);
/// Whether the handler and its thread are set up, and why not if they could not be.
static ARMED: OnceLock<Result<(), String>> = OnceLock::new();
/// The running profiler's aggregator, and how long its final export may take.
static TARGET: Mutex<Option<(Sender<Command>, Duration)>> = Mutex::new(None);

fn ours() -> libc::sighandler_t {
    on_sigterm as extern "C" fn(libc::c_int) as libc::sighandler_t
}

extern "C" fn on_sigterm(_: libc::c_int) {
    // SAFETY: __errno_location returns this thread's errno, valid for the thread's life.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: as above.
    let saved = unsafe { errno.read() };
    // SAFETY: getpid is async-signal-safe and cannot fail.
    let pid = unsafe { libc::getpid() };
    if !tracing_prof_cpu::disposition::current(libc::SIGTERM).is_ok_and(|h| h == ours()) {
        // Another handler was installed after ours and chained to it: the application
        // handles SIGTERM (in a forked child too); nothing to do.
    } else if pid != OWNER.load(Ordering::Relaxed) {
        // A child forked without exec: no thread of ours there; the default action.
        let _ = tracing_prof_cpu::disposition::restore_default(libc::SIGTERM);
        // SAFETY: raise is async-signal-safe; SIGTERM now ends the process.
        unsafe { libc::raise(libc::SIGTERM) };
    } else {
        let fd = PIPE.load(Ordering::Relaxed);
        let byte = 1u8;
        // SAFETY: write is async-signal-safe; one byte from our stack to our pipe, whose
        // write end never blocks (a full pipe means signals are pending already: nothing is
        // lost by a failed write).
        let _ = unsafe { libc::write(fd, (&raw const byte).cast(), 1) };
    }
    // SAFETY: as above.
    unsafe { errno.write(saved) };
}

/// Makes the profiler whose aggregator takes `commands` the one a SIGTERM flushes; installs
/// the handler and starts its thread on first use. `Err` says why SIGTERM is not handled (the
/// application handles or ignores it: then nothing needs doing).
pub(crate) fn arm(commands: Sender<Command>, timeout: Duration) -> Result<(), String> {
    *TARGET.lock().unwrap_or_else(|e| e.into_inner()) = Some((commands, timeout));
    ARMED.get_or_init(set_up).clone()
}

/// The profiler stopped: a later SIGTERM only ends the process.
pub(crate) fn disarm() {
    *TARGET.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

fn set_up() -> Result<(), String> {
    let found = tracing_prof_cpu::disposition::current(libc::SIGTERM).map_err(|e| e.to_string())?;
    if found != libc::SIG_DFL {
        return Err("the application handles (or ignores) SIGTERM itself".into());
    }
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into our array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    let [read, write] = fds;
    let close_both = || {
        // SAFETY: closing the two descriptors pipe2 just made, used by nothing else yet.
        unsafe {
            libc::close(read);
            libc::close(write);
        }
    };
    // The handler's write never blocks: a flood of SIGTERMs fills the pipe and no more.
    // SAFETY: fcntl on a descriptor of ours.
    if unsafe { libc::fcntl(write, libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        close_both();
        return Err(std::io::Error::last_os_error().to_string());
    }
    PIPE.store(write, Ordering::Relaxed);
    // SAFETY: getpid cannot fail.
    OWNER.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    let installed =
        // SAFETY: `on_sigterm` has the plain handler signature and does only what the module
        // docs list, all async-signal-safe.
        unsafe { tracing_prof_cpu::disposition::install(libc::SIGTERM, ours(), 0, false) };
    if let Err(e) = installed {
        PIPE.store(-1, Ordering::Relaxed);
        close_both();
        return Err(format!("{e:?}"));
    }
    // The thread last: if it cannot start, the default action goes back, so that SIGTERM
    // still ends the process.
    if let Err(e) = crate::spawn_profiler_thread("tprof-sigterm", move || watch(read)) {
        let _ = tracing_prof_cpu::disposition::restore_default(libc::SIGTERM);
        PIPE.store(-1, Ordering::Relaxed);
        close_both();
        return Err(e.to_string());
    }
    Ok(())
}

/// Reads and drops what is in `pipe` now, without waiting for more.
fn drain(pipe: libc::c_int) {
    let mut fds = libc::pollfd {
        fd: pipe,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut buf = [0u8; 64];
    // SAFETY: poll on one descriptor of ours with no wait; read into our own buffer.
    while unsafe { libc::poll(&mut fds, 1, 0) } > 0 && fds.revents & libc::POLLIN != 0 {
        // SAFETY: as above.
        if unsafe { libc::read(pipe, buf.as_mut_ptr().cast(), buf.len()) } <= 0 {
            return;
        }
    }
}

/// The `tprof-sigterm` thread: for each SIGTERM ours acted on, the final export, then the end.
fn watch(pipe: libc::c_int) {
    loop {
        let mut byte = 0u8;
        // SAFETY: reads at most one byte into our own.
        let n = unsafe { libc::read(pipe, (&raw mut byte).cast(), 1) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            return;
        }
        // One export for every SIGTERM that came meanwhile (the write end never blocks, so
        // this end is read as the pipe empties: a flood is one export).
        drain(pipe);
        // SAFETY: getpid cannot fail.
        let init = unsafe { libc::getpid() } == 1;
        let target = TARGET.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((commands, timeout)) = target {
            let (tx, rx) = bounded(1);
            let deadline = Instant::now() + timeout;
            // PID 1 goes on: an export; anyone else ends: the final one, and the sinks flush.
            let command = if init {
                Command::Flush(tx)
            } else {
                Command::Terminate(tx)
            };
            let done = commands.send_deadline(command, deadline).is_ok()
                && rx.recv_deadline(deadline).is_ok();
            if !done && !init {
                eprintln!(
                    "tracing-prof: SIGTERM: the final export did not finish within {timeout:?}; \
                     ending without it"
                );
            }
        }
        if !init {
            let _ = tracing_prof_cpu::disposition::restore_default(libc::SIGTERM);
            // SAFETY: kill to our own process; SIGTERM at its default action ends it.
            unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
        }
    }
}
