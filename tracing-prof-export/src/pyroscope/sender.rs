//! One attempt at a batch, by either API (the outbox retries): the requests, their headers
//! and credentials. Nothing here shows the URL's credentials or the token.

use super::config::{Auth, PyroscopeApi, PyroscopeConfig};
use super::exporter::Batch;
use super::wire::{multipart, push};
use crate::sending::{Courier, Failure, outcome};
use base64::Engine as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// One attempt at a batch, by either API.
pub(super) struct Pusher {
    pub(super) agent: ureq::Agent,
    pub(super) config: PyroscopeConfig,
}

/// Pyroscope refuses for good with a `4xx` but `429` (a configuration error); other answers
/// may pass later.
fn retryable(code: u16) -> bool {
    code == 429 || code >= 500
}

impl Courier for Pusher {
    type Batch = Batch;

    fn send(&mut self, batch: &Batch) -> Result<(), Failure> {
        match self.config.api {
            PyroscopeApi::Push => {
                let body = prost::Message::encode_to_vec(&self.push_request(batch));
                let r = self
                    .request("/push.v1.PusherService/Push")
                    .set("Content-Type", "application/proto")
                    .set("Connect-Protocol-Version", "1");
                outcome(r.send_bytes(&body), retryable).map(drop)
            }
            PyroscopeApi::Ingest => {
                for series in &batch.series {
                    let boundary = format!("tracing-prof-{:016x}", nanos(SystemTime::now()));
                    let body = multipart(&boundary, &series.pprof, &series.sample_types);
                    // No `format`: the server reads `format=pprof` as a raw pprof body and
                    // parses a multipart form only without it (`pkg/ingester/pyroscope/
                    // ingest_handler.go`, `readInputRawDataFromRequest`).
                    let r = self
                        .request("/ingest")
                        .query("name", &self.ingest_name())
                        // Unix nanoseconds, 19 digits, as pyroscope-go sends them
                        // (`pkg/og/util/attime`: 19 digits are read as nanoseconds).
                        .query("from", &nanos(batch.from).to_string())
                        .query("until", &nanos(batch.until).to_string())
                        .query("spyName", "tracing-prof")
                        .set(
                            "Content-Type",
                            &format!("multipart/form-data; boundary={boundary}"),
                        );
                    outcome(r.send_bytes(&body), retryable)?;
                }
                Ok(())
            }
        }
    }
}

impl Pusher {
    fn request(&self, path: &str) -> ureq::Request {
        let mut r = self
            .agent
            .post(&format!("{}{path}", self.config.url))
            .set("User-Agent", "tracing-prof");
        match &self.config.auth {
            Auth::None => {}
            Auth::Basic { user, password } => {
                let b64 =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                r = r.set("Authorization", &format!("Basic {b64}"));
            }
            Auth::Bearer(token) => r = r.set("Authorization", &format!("Bearer {token}")),
        }
        if let Some(t) = &self.config.tenant {
            r = r.set("X-Scope-OrgID", t);
        }
        r
    }

    /// `APP{tag=value,...}` for the ingest API.
    fn ingest_name(&self) -> String {
        let tags: Vec<String> = self
            .config
            .tags
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!("{}{{{}}}", self.config.app, tags.join(","))
    }

    fn push_request(&self, batch: &Batch) -> push::PushRequest {
        let series = batch
            .series
            .iter()
            .map(|series| {
                let mut labels = vec![
                    push::LabelPair {
                        name: "__name__".into(),
                        value: series.name.into(),
                    },
                    push::LabelPair {
                        name: "service_name".into(),
                        value: self.config.app.clone(),
                    },
                    // Our values are windows already: Pyroscope 1.x would otherwise compute
                    // deltas of `memory` `alloc_*` between pushes, storing 0 (`pkg/phlaredb/
                    // head.go`, `delta.go`); 2.x drops the label. Its own `/ingest` sets it.
                    push::LabelPair {
                        name: "__delta__".into(),
                        value: "false".into(),
                    },
                ];
                labels.extend(self.config.tags.iter().map(|(k, v)| push::LabelPair {
                    name: k.clone(),
                    value: v.clone(),
                }));
                push::RawProfileSeries {
                    labels,
                    samples: vec![push::RawSample {
                        raw_profile: series.pprof.clone(),
                        id: String::new(),
                    }],
                }
            })
            .collect();
        push::PushRequest { series }
    }
}

fn nanos(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos()
}
