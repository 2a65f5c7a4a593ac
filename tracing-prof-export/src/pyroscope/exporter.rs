//! The [`Sink`]: each interval's window becomes a batch of series on the outbox, which the
//! sender thread empties; the aggregator never waits on the network.

use super::config::{PyroscopeApi, PyroscopeConfig};
use super::sender::Pusher;
use super::series::{Series, series_of};
use crate::PushError;
use crate::sending::{Outbox, PushStats};
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;
use tracing_prof_core::{Sink, SinkError};
use tracing_prof_model::Snapshot;

/// One interval's profiles, ready to send.
pub(super) struct Batch {
    pub(super) from: SystemTime,
    pub(super) until: SystemTime,
    pub(super) series: Vec<Series>,
}

/// A [`Sink`] pushing to Pyroscope; see the module docs.
pub struct PyroscopeExporter {
    outbox: Outbox<Batch>,
    api: PyroscopeApi,
}

impl fmt::Debug for PyroscopeExporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PyroscopeExporter")
            .field("stats", &self.outbox.stats())
            .finish_non_exhaustive()
    }
}

impl PyroscopeExporter {
    /// Validates `config` and starts the sender thread.
    pub fn start(config: PyroscopeConfig) -> Result<Self, PushError> {
        config.validate()?;
        let policy = config.policy;
        let api = config.api;
        let pusher = Pusher {
            agent: ureq::AgentBuilder::new()
                .timeout(config.policy.timeout)
                .build(),
            config,
        };
        let outbox =
            Outbox::start("pyroscope", pusher, policy).map_err(|source| PushError::Spawn {
                exporter: "Pyroscope",
                source,
            })?;
        Ok(PyroscopeExporter { outbox, api })
    }

    /// The exporter's counters; the handle stays valid after the exporter is moved into a
    /// profiler.
    pub fn stats(&self) -> Arc<PushStats> {
        self.outbox.stats()
    }
}

impl Sink for PyroscopeExporter {
    fn name(&self) -> &str {
        "pyroscope"
    }

    fn delivery(&self) -> Option<tracing_prof_core::DeliveryProbe> {
        Some(self.outbox.delivery())
    }

    /// Encodes and queues; never waits on the network.
    fn export(&mut self, profile: &Snapshot) -> Result<(), SinkError> {
        let window = self.outbox.window(profile);
        let peak = self.outbox.new_peak(profile);
        let from = window
            .time
            .checked_sub(window.duration)
            .unwrap_or(window.time);
        let (series, merged) = series_of(&window, self.api, peak.as_deref());
        self.outbox.merged(merged);
        if series.is_empty() {
            return Ok(()); // a push without a profile is refused ("no profiles received")
        }
        self.outbox.put(Batch {
            from,
            until: window.time,
            series,
        })
    }
}
