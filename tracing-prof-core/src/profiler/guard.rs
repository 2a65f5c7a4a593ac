//! [`ProfilerGuard`]: keeps the profiler running; its drop makes the final export.

use super::Profiler;
use super::aggregator::Command;
use crossbeam_channel::{Receiver, Sender, bounded};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Keeps the profiler running; dropping it exports a last profile and stops the thread.
///
/// The drop waits at most the configured shutdown timeout; past it the thread is left to finish
/// alone and a message says so.
#[derive(Debug)]
#[must_use = "dropping the guard stops the profiler"]
pub struct ProfilerGuard {
    pub(super) profiler: Profiler,
    pub(super) commands: Sender<Command>,
    pub(super) done: Receiver<()>,
    pub(super) thread: Option<JoinHandle<()>>,
    pub(super) timeout: Duration,
    /// What lives as long as the profiler and stops before its final export (see
    /// [`ProfilerGuard::attach`]).
    pub(super) attached: Vec<Box<dyn std::any::Any + Send>>,
}

/// A flush that did not complete in time.
#[derive(Debug, thiserror::Error)]
#[error("tracing-prof: the aggregator did not finish exporting within {0:?}")]
pub struct FlushTimeout(pub Duration);

impl ProfilerGuard {
    /// A handle for snapshots and stats, usable after the guard is gone.
    pub fn profiler(&self) -> &Profiler {
        &self.profiler
    }

    /// Keeps `thing` (a `/debug/pprof` server, say) alive as long as the guard, and drops it,
    /// last attached first, before the final export when the guard drops.
    ///
    /// # Examples
    /// ```
    /// let (_layer, mut guard) = tracing_prof_core::Profiler::builder().build().unwrap();
    /// guard.attach(String::from("anything that must live as long as the profiler"));
    /// assert!(guard.attached::<String>().is_some());
    /// ```
    pub fn attach(&mut self, thing: impl std::any::Any + Send) {
        self.attached.push(Box::new(thing));
    }

    /// The first attached thing of type `T`, if any.
    pub fn attached<T: std::any::Any>(&self) -> Option<&T> {
        self.attached.iter().find_map(|b| b.downcast_ref::<T>())
    }

    /// Exports to every sink now and waits for it, at most `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<(), FlushTimeout> {
        let (tx, rx) = bounded(1);
        let deadline = Instant::now() + timeout;
        self.commands
            .send_deadline(Command::Flush(tx), deadline)
            .map_err(|_| FlushTimeout(timeout))?;
        rx.recv_deadline(deadline)
            .map_err(|_| FlushTimeout(timeout))
    }
}

impl Drop for ProfilerGuard {
    fn drop(&mut self) {
        while let Some(thing) = self.attached.pop() {
            drop(thing);
        }
        let deadline = Instant::now() + self.timeout;
        let _ = self.commands.send_deadline(Command::Shutdown, deadline);
        match self.done.recv_deadline(deadline) {
            Ok(()) | Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => eprintln!(
                "tracing-prof: the final export did not finish within {:?}; not waiting for it",
                self.timeout
            ),
        }
    }
}
