//! The [`Sink`]: each interval's window becomes a request on the outbox, and the [`Courier`]
//! that posts it.

use super::config::{MAX_REQUEST_BYTES, OtlpConfig};
use super::convert::request;
use crate::PushError;
use crate::pushed::{Pushed, Select, window_profiles};
use crate::sending::{Courier, Failure, Outbox, PushStats, outcome, printable};
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceResponse;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tracing_prof_core::AttributeValue;
use tracing_prof_core::{Sink, SinkError};
use tracing_prof_model::Snapshot;

/// One interval's requests, encoded: one, or one per profile when together they would pass
/// [`MAX_REQUEST_BYTES`]. A retry resumes at the first not yet done, so that nothing is sent
/// twice.
pub(super) struct Batch {
    bodies: Vec<Vec<u8>>,
    /// How many bodies were accepted or refused for good.
    done: AtomicUsize,
}

/// A [`Sink`] sending OTLP profiles; see the module docs.
pub struct OtlpExporter {
    outbox: Outbox<Batch>,
    resource: Vec<(String, AttributeValue)>,
}

impl fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpExporter")
            .field("stats", &self.outbox.stats())
            .finish_non_exhaustive()
    }
}

impl OtlpExporter {
    /// Validates `config` and starts the sender thread.
    pub fn start(config: OtlpConfig) -> Result<Self, PushError> {
        config.validate()?;
        let policy = config.policy;
        let resource = config.resource.clone();
        let poster = Poster {
            agent: ureq::AgentBuilder::new()
                .timeout(config.policy.timeout)
                .build(),
            config,
            warned: None,
        };
        let outbox = Outbox::start("otlp", poster, policy).map_err(|source| PushError::Spawn {
            exporter: "OTLP",
            source,
        })?;
        Ok(OtlpExporter { outbox, resource })
    }

    /// The exporter's counters; the handle stays valid after the exporter is moved into a
    /// profiler.
    pub fn stats(&self) -> Arc<PushStats> {
        self.outbox.stats()
    }
}

impl Sink for OtlpExporter {
    fn name(&self) -> &str {
        "otlp"
    }

    fn delivery(&self) -> Option<tracing_prof_core::DeliveryProbe> {
        Some(self.outbox.delivery())
    }

    /// Encodes and queues; never waits on the network.
    fn export(&mut self, profile: &Snapshot) -> Result<(), SinkError> {
        let window = self.outbox.window(profile);
        let peak = self.outbox.new_peak(profile);
        let (pushed, merged) = window_profiles(
            &window,
            Select {
                span_memory: true,
                span_times: true,
                span_path_labels: true,
            },
            peak.as_deref(),
        );
        self.outbox.merged(merged);
        let bodies = encode(&pushed, &self.resource);
        if bodies.is_empty() {
            return Ok(()); // no empty envelopes
        }
        self.outbox.put(Batch {
            bodies,
            done: AtomicUsize::new(0),
        })
    }
}

/// The request bodies for `pushed` (uncompressed).
fn encode(pushed: &[Pushed], resource: &[(String, AttributeValue)]) -> Vec<Vec<u8>> {
    let Some(all) = request(pushed, resource) else {
        return Vec::new();
    };
    if prost::Message::encoded_len(&all) <= MAX_REQUEST_BYTES {
        return vec![prost::Message::encode_to_vec(&all)];
    }
    pushed
        .iter()
        .filter_map(|p| request(std::slice::from_ref(p), resource))
        .map(|r| prost::Message::encode_to_vec(&r))
        .collect()
}

/// Posts a batch's requests.
struct Poster {
    agent: ureq::Agent,
    config: OtlpConfig,
    /// The receiver's last warning said (a partial success with a message), to say each once.
    warned: Option<String>,
}

/// OTLP/HTTP's retryable answers (opentelemetry-proto's `docs/specification.md`, "Retryable
/// Response Codes"): every other `4xx` and `5xx` must not be retried.
fn retryable(code: u16) -> bool {
    matches!(code, 429 | 502 | 503 | 504)
}

impl Courier for Poster {
    type Batch = Batch;

    /// Posts the bodies not yet done: a failure worth a retry stops here (the retry resumes
    /// at it); one that is not (a refusal) leaves that body behind and goes on with the next,
    /// and is returned at the end.
    fn send(&mut self, batch: &Batch) -> Result<(), Failure> {
        let mut refused = None;
        for body in &batch.bodies[batch.done.load(Ordering::Relaxed)..] {
            match self.post(body) {
                Ok(()) => {}
                Err(f) if f.retry => return Err(f),
                Err(f) => refused = refused.or(Some(f)),
            }
            batch.done.fetch_add(1, Ordering::Relaxed);
        }
        refused.map_or(Ok(()), Err)
    }
}

impl Poster {
    fn post(&mut self, body: &[u8]) -> Result<(), Failure> {
        let mut r = self
            .agent
            .post(&self.config.endpoint)
            .set(
                "User-Agent",
                concat!("tracing-prof/", env!("CARGO_PKG_VERSION")),
            )
            // Exactly this: Pyroscope refuses a parameter after it (`ingest_handler.go`).
            .set("Content-Type", "application/x-protobuf");
        for (name, value) in &self.config.headers {
            r = r.set(name, value);
        }
        let sent = if self.config.gzip {
            r.set("Content-Encoding", "gzip").send_bytes(&gzip(body))
        } else {
            r.send_bytes(body)
        };
        let answer = outcome(sent, retryable).map_err(|mut f| {
            if f.message.starts_with("the server answered HTTP 404") {
                f.message.push_str(
                    " (no profiles endpoint there: a Collector takes profiles only with the \
                     service.profilesSupport feature gate and a profiles pipeline)",
                );
            }
            f
        })?;
        // A partial success: never retried (the specification says so); a rejection loses
        // data and counts as a failure, a warning alone is said once.
        let Ok(answer) = <ExportProfilesServiceResponse as prost::Message>::decode(&*answer) else {
            return Ok(()); // a 200 whose body is no response (Pyroscope's may be empty)
        };
        let Some(partial) = answer.partial_success else {
            return Ok(());
        };
        let message = printable(partial.error_message.as_bytes());
        if partial.rejected_profiles > 0 {
            return Err(Failure {
                message: format!(
                    "the receiver rejected {} profiles: {message}",
                    partial.rejected_profiles
                ),
                cause: "rejected".into(),
                retry: false,
                retry_after: None,
            });
        }
        if !message.is_empty() && self.warned.as_deref() != Some(message.as_str()) {
            eprintln!("tracing-prof: otlp: the receiver says: {message}");
            self.warned = Some(message);
        }
        Ok(())
    }
}

fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    // Writing to a Vec cannot fail.
    let _ = e.write_all(body);
    e.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pushed::Pushed;
    use tracing_prof_test_support::otlp_receiver::OtlpReceiver;
    use tracing_prof_test_support::stub_server::Answer;

    /// Three small valid requests, as a window too large for one would be split.
    fn batch() -> Batch {
        let mut p = tracing_prof_model::Profile::new(vec![tracing_prof_model::SampleType::new(
            "spans", "count",
        )]);
        p.period_type = Some(tracing_prof_model::SampleType::new("spans", "count"));
        p.time = Some(std::time::SystemTime::now());
        p.samples.push(tracing_prof_model::Sample {
            stack: vec![tracing_prof_model::Frame::new(
                tracing_prof_model::FrameKind::Span,
                "app::request",
                None,
                None,
            )],
            values: vec![1],
            labels: Vec::new(),
        });
        let pushed = Pushed {
            name: "spans",
            sample_types: p.sample_types.clone(),
            message: p.to_proto(),
        };
        let body = encode(std::slice::from_ref(&pushed), &[]).remove(0);
        Batch {
            bodies: vec![body.clone(), body.clone(), body],
            done: AtomicUsize::new(0),
        }
    }

    /// A retry resumes at the body that failed; a refusal leaves its body behind and goes on
    /// with the rest: no body is sent twice, none is lost to another's refusal.
    #[test]
    fn a_split_batch_resumes_and_outlives_a_refusal() {
        let receiver = OtlpReceiver::start();
        let config = OtlpConfig::with_base_url(&receiver.url()).gzip(false);
        let mut poster = Poster {
            agent: ureq::AgentBuilder::new()
                .timeout(config.policy.timeout)
                .build(),
            config,
            warned: None,
        };
        let batch = batch();
        // The first body: unavailable, worth a retry: nothing after it is tried.
        receiver.answer_next([Answer::text(503, "busy")]);
        let f = poster.send(&batch).unwrap_err();
        assert!(f.retry);
        assert_eq!(batch.done.load(Ordering::Relaxed), 0);
        assert_eq!(receiver.taken().len(), 1);
        // The retry: the first body refused for good, the two others taken.
        receiver.answer_next([Answer::text(400, "bad")]);
        let f = poster.send(&batch).unwrap_err();
        assert!(!f.retry && f.message.contains("400"), "{}", f.message);
        assert_eq!(batch.done.load(Ordering::Relaxed), 3);
        assert_eq!(receiver.taken().len(), 4);
        assert_eq!(receiver.verdicts().iter().filter(|v| v.is_ok()).count(), 2);
        // Nothing left: a further try sends nothing.
        assert!(poster.send(&batch).is_ok());
        assert_eq!(receiver.taken().len(), 4);
    }
}
