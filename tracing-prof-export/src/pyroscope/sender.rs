//! The sender thread: delivers each batch with retries and exponential backoff, says each
//! distinct failure once, and never shows the URL's credentials or the token.

use super::config::{Auth, PyroscopeApi, PyroscopeConfig};
use super::exporter::{Batch, PushStats};
use super::wire::{multipart, push};
use base64::Engine as _;
use crossbeam_channel::Receiver;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The sender thread's state.
pub(super) struct Pusher {
    pub(super) agent: ureq::Agent,
    pub(super) config: PyroscopeConfig,
    pub(super) stats: Arc<PushStats>,
    pub(super) closing: Arc<AtomicBool>,
    /// Last error reported, to report each distinct one once.
    pub(super) reported: Option<String>,
}

/// A failed request, described without URL or credentials.
struct Failure {
    message: String,
    retry: bool,
}

impl Pusher {
    pub(super) fn run(mut self, inbox: &Receiver<Batch>) {
        for batch in inbox {
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            self.deliver(&batch);
        }
    }

    fn deliver(&mut self, batch: &Batch) {
        let mut wait = self.config.backoff;
        for attempt in 0..=self.config.retries {
            match self.send(batch) {
                Ok(()) => {
                    self.stats.sent.fetch_add(1, Ordering::Relaxed);
                    if self.reported.take().is_some() {
                        eprintln!("tracing-prof: pyroscope: pushing works again");
                    }
                    return;
                }
                Err(f) => {
                    self.stats.failed_attempts.fetch_add(1, Ordering::Relaxed);
                    if self.reported.as_deref() != Some(f.message.as_str()) {
                        eprintln!(
                            "tracing-prof: pyroscope: push failed: {} (retrying with backoff, dropping \
                             when the queue is full; this error is reported once)",
                            f.message
                        );
                        self.reported = Some(f.message.clone());
                    }
                    let closing = self.closing.load(Ordering::SeqCst);
                    if !f.retry || closing || attempt == self.config.retries || !self.sleep(wait) {
                        break;
                    }
                    wait = wait.saturating_mul(2);
                }
            }
        }
        self.stats.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Sleeps `d` unless closing begins; returns whether it slept the whole time.
    fn sleep(&self, d: Duration) -> bool {
        let end = Instant::now() + d;
        while Instant::now() < end {
            if self.closing.load(Ordering::SeqCst) {
                return false;
            }
            std::thread::sleep(
                Duration::from_millis(20).min(end.saturating_duration_since(Instant::now())),
            );
        }
        true
    }

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

    fn send(&self, batch: &Batch) -> Result<(), Failure> {
        match self.config.api {
            PyroscopeApi::Push => {
                let body = prost::Message::encode_to_vec(&self.push_request(batch));
                let r = self
                    .request("/push.v1.PusherService/Push")
                    .set("Content-Type", "application/proto")
                    .set("Connect-Protocol-Version", "1");
                outcome(r.send_bytes(&body))
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
                    outcome(r.send_bytes(&body))?;
                }
                Ok(())
            }
        }
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

fn outcome(r: Result<ureq::Response, ureq::Error>) -> Result<(), Failure> {
    match r {
        Ok(_) => Ok(()),
        Err(ureq::Error::Status(code, response)) => Err(Failure {
            message: match reason(response) {
                r if r.is_empty() => format!("the server answered HTTP {code}"),
                r => format!("the server answered HTTP {code}: {r}"),
            },
            retry: code == 429 || code >= 500,
        }),
        // The transport error's kind only: its Display would include the URL.
        Err(ureq::Error::Transport(t)) => Err(Failure {
            message: format!("transport error: {}", t.kind()),
            retry: true,
        }),
    }
}

/// The start of an error answer's body (Pyroscope says there why it refused a profile: "outside
/// of ingestion window", "exceeds the samples count limit"...), printable ASCII, at most 300
/// bytes.
fn reason(response: ureq::Response) -> String {
    use std::io::Read as _;
    let mut body = Vec::new();
    let _ = response.into_reader().take(300).read_to_end(&mut body);
    let text: String = body
        .iter()
        .map(|&b| match b {
            b'\r' | b'\n' | b'\t' => ' ',
            0x20..0x7f => b as char,
            _ => '?',
        })
        .collect();
    text.trim().to_owned()
}
