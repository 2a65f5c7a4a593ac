//! What an exporter implements, and what the profiler counts of its deliveries.

use crate::fork::ForkSafe;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use tracing_prof_model::Snapshot;

/// The error a [`Sink`] returns.
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// Somewhere profiles go: files, a server, a test's buffer.
///
/// Sinks run on the aggregator thread, never on an application thread. A failing export is
/// counted and reported on stderr once (again only when the error changes, and once when the
/// sink recovers); the next interval tries again.
pub trait Sink: Send + 'static {
    /// A short name for error messages, e.g. `"pprof files"`.
    fn name(&self) -> &str;

    /// Exports one snapshot (cumulative: counters since the profiler started).
    fn export(&mut self, snapshot: &Snapshot) -> Result<(), SinkError>;

    /// Keeps the evidence of an incident (a threshold of the cgroup's memory limit crossed,
    /// or a flight recorder trigger): the file exporter writes it into `incidents/`. The
    /// default keeps nothing.
    fn incident(&mut self, incident: &Incident) -> Result<(), SinkError> {
        let _ = incident;
        Ok(())
    }

    /// Whether [`incident`](Self::incident) keeps anything: when no sink does, an incident is
    /// only said (a `warn` event), nothing is captured for it. Default `false`.
    fn keeps_incidents(&self) -> bool {
        false
    }

    /// For a sink that delivers after `export` returns (a push queue): a way to read its
    /// delivery counters from any thread, asked once when the profiler is built, shown by
    /// [`Profiler::sink_stats`](super::Profiler::sink_stats). `None` (the default): `export`'s result is the whole story.
    fn delivery(&self) -> Option<DeliveryProbe> {
        None
    }
}

/// An incident (the cgroup's memory limit near, or a flight recorder trigger): why, and a
/// snapshot taken at once (its `heap_peak` and `process_memory` set), for
/// [`Sink::incident`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Incident {
    /// A short name for file names: `memory-90pct`.
    pub cause: String,
    /// What happened, in words: `the working set reached 91.2% of the cgroup's 256.0 MiB
    /// limit (threshold 90%)`.
    pub reason: String,
    /// Everything as it stood when it happened.
    pub snapshot: Snapshot,
    /// The flight recorder's windows: the minutes before (see
    /// [`Profiler::flight_recording`](super::Profiler::flight_recording)).
    pub flight: Vec<crate::FlightFile>,
}

impl Incident {
    /// An incident `cause` (a name for files), said by `reason`, with its `snapshot`.
    pub fn new(cause: impl Into<String>, reason: impl Into<String>, snapshot: Snapshot) -> Self {
        Incident {
            cause: cause.into(),
            reason: reason.into(),
            snapshot,
            flight: Vec::new(),
        }
    }
}

/// Reads a sink's [`Delivery`] counters; see [`Sink::delivery`].
pub type DeliveryProbe = Arc<dyn Fn() -> Delivery + Send + Sync>;

/// What a sink that delivers later has done with what it was given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Delivery {
    /// Batches delivered.
    pub delivered: u64,
    /// Attempts that failed (each retry counts).
    pub failed_attempts: u64,
    /// Batches given up (queue full, retries exhausted, refused by the receiver).
    pub dropped: u64,
    /// Batches waiting.
    pub queued: u64,
}

impl Delivery {
    /// Counters as a sink reports them.
    pub fn new(delivered: u64, failed_attempts: u64, dropped: u64, queued: u64) -> Self {
        Delivery {
            delivered,
            failed_attempts,
            dropped,
            queued,
        }
    }
}

/// One sink's counters; see [`Profiler::sink_stats`](super::Profiler::sink_stats).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SinkStats {
    /// The sink's name.
    pub name: String,
    /// Exports that succeeded.
    pub exports: u64,
    /// Exports that failed.
    pub export_errors: u64,
    /// The last export's error, until an export succeeds again.
    pub last_error: Option<String>,
    /// Its delivery counters, for a sink that delivers later (Pyroscope).
    pub delivery: Option<Delivery>,
}

/// The state of a service the profiler runs beside its sinks, such as the `/debug/pprof`
/// server; see [`Profiler::set_service_status`](super::Profiler::set_service_status).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServiceStatus {
    /// What it is (`/debug/pprof server`).
    pub name: String,
    /// Whether it works (`false`: it could not start and is trying again).
    pub up: bool,
    /// What it is doing, or why it is not: `listening on 127.0.0.1:6060`, or the error and
    /// when it will try again.
    pub detail: String,
}

impl ServiceStatus {
    /// `name` in the state `up`, said by `detail`.
    pub fn new(name: impl Into<String>, up: bool, detail: impl Into<String>) -> Self {
        ServiceStatus {
            name: name.into(),
            up,
            detail: detail.into(),
        }
    }
}

/// The profiler's side of one sink's counters.
pub(crate) struct SinkCounters {
    pub(super) name: String,
    pub(super) exports: AtomicU64,
    pub(super) export_errors: AtomicU64,
    pub(super) last_error: ForkSafe<Option<String>>,
    pub(super) delivery: Option<DeliveryProbe>,
}

impl fmt::Debug for SinkCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkCounters")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}
