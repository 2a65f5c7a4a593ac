//! The [`Sink`]: each interval's window becomes a batch of series on a bounded queue, which the
//! sender thread empties; the aggregator never waits on the network.

use super::config::{PyroscopeApi, PyroscopeConfig, PyroscopeError};
use super::sender::Pusher;
use super::series::{Series, series_of};
use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};
use tracing_prof_core::{Sink, SinkError};
use tracing_prof_model::Snapshot;

/// Counters of a [`PyroscopeExporter`], readable from anywhere.
#[derive(Debug, Default)]
pub struct PushStats {
    pub(super) sent: AtomicU64,
    pub(super) failed_attempts: AtomicU64,
    pub(super) dropped: AtomicU64,
    pub(super) queued: AtomicU64,
    pub(super) merged: AtomicU64,
}

impl PushStats {
    /// Batches delivered.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
    /// Requests that failed (each retry counts).
    pub fn failed_attempts(&self) -> u64 {
        self.failed_attempts.load(Ordering::Relaxed)
    }
    /// Batches given up: queue full (the oldest goes), retries exhausted, or rejected by the server.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
    /// Batches waiting now (at most the queue capacity).
    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }
    /// Samples summed into a `(N smaller stacks merged)` sample so that a profile stays within
    /// Pyroscope's limits ([`MAX_SAMPLES`](super::MAX_SAMPLES),
    /// [`MAX_PROFILE_BYTES`](super::MAX_PROFILE_BYTES)); totals are unchanged.
    pub fn merged_samples(&self) -> u64 {
        self.merged.load(Ordering::Relaxed)
    }
}

/// One interval's profiles, ready to send.
pub(super) struct Batch {
    pub(super) from: SystemTime,
    pub(super) until: SystemTime,
    pub(super) series: Vec<Series>,
}

/// A [`Sink`] pushing to Pyroscope; see the module docs.
pub struct PyroscopeExporter {
    queue: Option<Sender<Batch>>,
    /// A receiver of the same queue, to drop the oldest batch when it is full.
    oldest: Receiver<Batch>,
    stats: Arc<PushStats>,
    previous: Option<Snapshot>,
    closing: Arc<AtomicBool>,
    done: Receiver<()>,
    thread: Option<JoinHandle<()>>,
    flush_timeout: Duration,
    api: PyroscopeApi,
}

impl fmt::Debug for PyroscopeExporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PyroscopeExporter")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl PyroscopeExporter {
    /// Validates `config` and starts the sender thread.
    pub fn start(config: PyroscopeConfig) -> Result<Self, PyroscopeError> {
        config.validate()?;
        let (queue, inbox) = bounded::<Batch>(config.queue_capacity);
        let (done_tx, done) = bounded::<()>(1);
        let stats = Arc::new(PushStats::default());
        let closing = Arc::new(AtomicBool::new(false));
        let flush_timeout = config.flush_timeout;
        let api = config.api;
        let sender = Pusher {
            agent: ureq::AgentBuilder::new().timeout(config.timeout).build(),
            config,
            stats: Arc::clone(&stats),
            closing: Arc::clone(&closing),
            reported: None,
        };
        let oldest = inbox.clone();
        let thread =
            tracing_prof_core::spawn_profiler_thread("tracing-prof-pyroscope", move || {
                sender.run(&inbox);
                let _ = done_tx.send(());
            })
            .map_err(PyroscopeError::Spawn)?;
        Ok(PyroscopeExporter {
            queue: Some(queue),
            oldest,
            stats,
            previous: None,
            closing,
            done,
            thread: Some(thread),
            flush_timeout,
            api,
        })
    }

    /// The exporter's counters; the handle stays valid after the exporter is moved into a
    /// profiler.
    pub fn stats(&self) -> Arc<PushStats> {
        Arc::clone(&self.stats)
    }
}

impl Sink for PyroscopeExporter {
    fn name(&self) -> &str {
        "pyroscope"
    }

    fn delivery(&self) -> Option<tracing_prof_core::DeliveryProbe> {
        let stats = self.stats();
        Some(Arc::new(move || {
            tracing_prof_core::Delivery::new(
                stats.sent(),
                stats.failed_attempts(),
                stats.dropped(),
                stats.queued(),
            )
        }))
    }

    /// Encodes and queues; never waits on the network.
    fn export(&mut self, profile: &Snapshot) -> Result<(), SinkError> {
        let window = match &self.previous {
            Some(previous) => profile.window_since(previous),
            None => profile.clone(), // the first push covers everything since the start
        };
        let from = window
            .time
            .checked_sub(window.duration)
            .unwrap_or(window.time);
        let (series, merged) = series_of(&window, self.api);
        if merged > 0 {
            self.stats
                .merged
                .fetch_add(merged as u64, Ordering::Relaxed);
        }
        self.previous = Some(profile.clone());
        let Some(queue) = &self.queue else {
            return Ok(());
        };
        if series.is_empty() {
            return Ok(()); // a push without a profile is refused ("no profiles received")
        }
        let mut batch = Batch {
            from,
            until: window.time,
            series,
        };
        loop {
            match queue.try_send(batch) {
                Ok(()) => {
                    self.stats.queued.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(TrySendError::Full(b)) => {
                    // Keep the newest: drop the oldest waiting batch and try again.
                    if self.oldest.try_recv().is_ok() {
                        self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                        self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    batch = b;
                }
                Err(TrySendError::Disconnected(_)) => {
                    return Err("the Pyroscope sender thread is gone".into());
                }
            }
        }
    }
}

impl Drop for PyroscopeExporter {
    /// Lets the sender deliver what is queued, without retries, for at most the flush timeout.
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        drop(self.queue.take());
        if self.done.recv_timeout(self.flush_timeout).is_ok() {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}
