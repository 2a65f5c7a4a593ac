//! How the pushing exporters (Pyroscope, OTLP) send without ever making the aggregator wait:
//! an [`Outbox`] of batches with a bound (when full, the oldest batch goes and is counted), and
//! a thread of its own that sends each batch with retries and exponential backoff, says a
//! failure on stderr at most once a minute per cause (the same cause then ever more rarely,
//! with a count of what was held back), and never shows a URL's credentials or a token.
//!
//! An exporter brings what differs: a [`Courier`] that makes one attempt at one batch, and
//! tells whether its failure is worth another.

mod report;

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use report::Reporter;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing_prof_core::{Delivery, DeliveryProbe, SinkError};

/// Why a pushing exporter (Pyroscope, OTLP) could not start: its settings cannot work, or its
/// sender thread could not be spawned.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum PushError {
    /// An environment variable is invalid.
    #[error(transparent)]
    Config(#[from] tracing_prof_core::config::ConfigError),
    /// Another setting is invalid.
    #[error("invalid {exporter} setting: {reason}")]
    Invalid {
        /// `Pyroscope` or `OTLP`.
        exporter: &'static str,
        /// What is wrong, and what would do.
        reason: String,
    },
    /// The sender thread could not be spawned.
    #[error("cannot spawn the tracing-prof {exporter} thread: {source}")]
    Spawn {
        /// `Pyroscope` or `OTLP`.
        exporter: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

// `fn main() -> Result<(), Box<dyn Error>>` prints an error it returns with `Debug`: the
// message, not the variant's structure, is what the user must read.
impl std::fmt::Debug for PushError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Counters of a pushing exporter, readable from anywhere.
#[derive(Debug, Default)]
pub struct PushStats {
    sent: AtomicU64,
    failed_attempts: AtomicU64,
    dropped: AtomicU64,
    queued: AtomicU64,
    merged: AtomicU64,
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
    /// the server's limits (Pyroscope's
    /// [`MAX_SAMPLES`](crate::pyroscope::MAX_SAMPLES) and
    /// [`MAX_PROFILE_BYTES`](crate::pyroscope::MAX_PROFILE_BYTES)); totals are unchanged.
    pub fn merged_samples(&self) -> u64 {
        self.merged.load(Ordering::Relaxed)
    }
}

/// A failed attempt, described without URL or credentials.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) message: String,
    /// What stderr groups it under (`HTTP 500`, `transport: Io`): the message may differ at
    /// every attempt (a request id in a server's answer), its cause does not.
    pub(crate) cause: String,
    /// Whether another attempt may succeed (a transport error, `429`, a `5xx`...).
    pub(crate) retry: bool,
    /// How long the server asked us to wait (`Retry-After`), if it did.
    pub(crate) retry_after: Option<Duration>,
}

/// The longest `Retry-After` obeyed: a server asking for more waits this long.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// One exporter's way of sending a batch: one attempt, no retries (the outbox retries).
pub(crate) trait Courier: Send + 'static {
    /// What one interval's export becomes.
    type Batch: Send + 'static;
    /// Sends `batch` once.
    fn send(&mut self, batch: &Self::Batch) -> Result<(), Failure>;
}

/// Batches (one interval's profiles) waiting to be sent: 8.
pub const DEFAULT_QUEUE_CAPACITY: usize = 8;
/// Retries of a batch after its first attempt: 3 (waits 1 s, 2 s, 4 s).
pub const DEFAULT_RETRIES: u32 = 3;
/// First retry wait, doubled for each further retry.
pub const DEFAULT_BACKOFF: Duration = Duration::from_secs(1);
/// How long dropping the exporter waits for queued batches to be sent: 3 s.
pub const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_secs(3);

/// How hard an outbox tries, how long one request may take, and how long it waits at the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Policy {
    /// One request's time limit (each exporter's `DEFAULT_TIMEOUT` unless set).
    pub(crate) timeout: Duration,
    pub(crate) queue_capacity: usize,
    pub(crate) retries: u32,
    pub(crate) backoff: Duration,
    pub(crate) flush_timeout: Duration,
}

impl Policy {
    /// The default policy, with requests limited to `timeout` (the exporter's own default).
    pub(crate) fn with_timeout(timeout: Duration) -> Self {
        Policy {
            timeout,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            retries: DEFAULT_RETRIES,
            backoff: DEFAULT_BACKOFF,
            flush_timeout: DEFAULT_FLUSH_TIMEOUT,
        }
    }

    /// Why this policy cannot work, if it cannot: a request timeout (set by variable
    /// `timeout_var`) outside [`MIN_TIMEOUT`]..=[`MAX_TIMEOUT`], waits over 10 minutes, or too
    /// many retries.
    pub(crate) fn check(&self, timeout_var: &str) -> Result<(), String> {
        if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&self.timeout) {
            return Err(format!(
                "the request timeout ({timeout_var}) must be from 100ms to 10m, got {:?}",
                self.timeout
            ));
        }
        if self.flush_timeout > MAX_TIMEOUT
            || self.retries > MAX_RETRIES
            || self.backoff > MAX_TIMEOUT
        {
            return Err(format!(
                "flush timeout and first backoff must be at most 10m and retries at most \
                 {MAX_RETRIES}; got {:?}, {:?}, {}",
                self.flush_timeout, self.backoff, self.retries
            ));
        }
        Ok(())
    }
}

/// The setters of a pushing exporter's settings that tune its outbox, for a settings type
/// with a `policy: Policy` field: the same methods, documented once.
macro_rules! policy_setters {
    () => {
        /// Time one request may take (default `DEFAULT_TIMEOUT`, 10 s; 100 ms to 10 minutes).
        pub fn timeout(mut self, timeout: std::time::Duration) -> Self {
            self.policy.timeout = timeout;
            self
        }
        /// Batches that may wait to be sent (default
        /// [`DEFAULT_QUEUE_CAPACITY`](crate::pyroscope::DEFAULT_QUEUE_CAPACITY), at least 1).
        pub fn queue_capacity(mut self, n: usize) -> Self {
            self.policy.queue_capacity = n.max(1);
            self
        }
        /// Retries per batch and the first wait, doubled for each further retry unless the
        /// server says how long to wait (`Retry-After`).
        pub fn retries(mut self, retries: u32, first_backoff: std::time::Duration) -> Self {
            self.policy.retries = retries;
            self.policy.backoff = first_backoff;
            self
        }
        /// How long dropping the exporter waits for queued batches (default
        /// [`DEFAULT_FLUSH_TIMEOUT`](crate::pyroscope::DEFAULT_FLUSH_TIMEOUT)).
        pub fn flush_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.policy.flush_timeout = timeout;
            self
        }
    };
}
pub(crate) use policy_setters;

/// Batches waiting for a sender thread; see the module docs. It also keeps the snapshot last
/// sent, so that each batch is a window since it ([`Outbox::window`]).
pub(crate) struct Outbox<B> {
    previous: Option<tracing_prof_model::Snapshot>,
    /// The heap's peak as last handed out by [`Outbox::new_peak`].
    peak_sent: Option<Arc<tracing_prof_model::Snapshot>>,
    queue: Option<Sender<B>>,
    /// A receiver of the same queue, to drop the oldest batch when it is full.
    oldest: Receiver<B>,
    stats: Arc<PushStats>,
    closing: Arc<AtomicBool>,
    done: Receiver<()>,
    thread: Option<JoinHandle<()>>,
    flush_timeout: Duration,
    name: &'static str,
}

impl<B: Send + 'static> Outbox<B> {
    /// Starts the sender thread `tprof-{name}` (short enough for the kernel's 15 bytes: see
    /// [`spawn_profiler_thread`](tracing_prof_core::spawn_profiler_thread)), which sends with
    /// `courier`. `name` also begins every message on stderr (`tracing-prof: {name}: push
    /// failed: ...`).
    pub(crate) fn start<C: Courier<Batch = B>>(
        name: &'static str,
        courier: C,
        policy: Policy,
    ) -> std::io::Result<Self> {
        let (queue, inbox) = bounded::<B>(policy.queue_capacity.max(1));
        let (done_tx, done) = bounded::<()>(1);
        let stats = Arc::new(PushStats::default());
        let closing = Arc::new(AtomicBool::new(false));
        let mut sender = SenderThread {
            courier,
            name,
            policy,
            stats: Arc::clone(&stats),
            closing: Arc::clone(&closing),
            reporter: Reporter::default(),
        };
        let oldest = inbox.clone();
        let thread =
            tracing_prof_core::spawn_profiler_thread(&format!("tprof-{name}"), move || {
                for batch in &inbox {
                    sender.stats.queued.fetch_sub(1, Ordering::Relaxed);
                    sender.deliver(&batch);
                }
                let _ = done_tx.send(());
            })?;
        Ok(Outbox {
            previous: None,
            peak_sent: None,
            queue: Some(queue),
            oldest,
            stats,
            closing,
            done,
            thread: Some(thread),
            flush_timeout: policy.flush_timeout,
            name,
        })
    }

    /// The counters; the handle stays valid after the exporter is moved into a profiler.
    pub(crate) fn stats(&self) -> Arc<PushStats> {
        Arc::clone(&self.stats)
    }

    /// What `profile` adds to the snapshot before it (counters over the interval, in-use
    /// memory at its end); the first covers everything since the start.
    pub(crate) fn window(
        &mut self,
        profile: &tracing_prof_model::Snapshot,
    ) -> tracing_prof_model::Snapshot {
        let window = match &self.previous {
            Some(previous) => profile.window_since(previous),
            None => profile.clone(),
        };
        self.previous = Some(profile.clone());
        window
    }

    /// The heap's peak that `profile` carries, if it is not the one this outbox last handed
    /// out: a peak is sent once, in the window in which it was read.
    pub(crate) fn new_peak(
        &mut self,
        profile: &tracing_prof_model::Snapshot,
    ) -> Option<Arc<tracing_prof_model::Snapshot>> {
        let peak = profile.heap_peak.as_ref()?;
        if self
            .peak_sent
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(p, peak))
        {
            return None;
        }
        self.peak_sent = Some(Arc::clone(peak));
        Some(Arc::clone(peak))
    }

    /// Counts `n` samples merged to keep a profile within a server's limits.
    pub(crate) fn merged(&self, n: usize) {
        if n > 0 {
            self.stats.merged.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// What [`Sink::delivery`](tracing_prof_core::Sink::delivery) reports.
    pub(crate) fn delivery(&self) -> DeliveryProbe {
        let stats = self.stats();
        Arc::new(move || {
            Delivery::new(
                stats.sent(),
                stats.failed_attempts(),
                stats.dropped(),
                stats.queued(),
            )
        })
    }

    /// Queues `batch`; never waits. When the queue is full the oldest batch goes, counted.
    pub(crate) fn put(&self, mut batch: B) -> Result<(), SinkError> {
        let Some(queue) = &self.queue else {
            return Ok(());
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
                    return Err(format!("the {} sender thread is gone", self.name).into());
                }
            }
        }
    }
}

impl<B> Drop for Outbox<B> {
    /// Lets the sender deliver what is queued, without retries, for at most the flush timeout.
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        drop(self.queue.take());
        if self.done.recv_timeout(self.flush_timeout).is_ok()
            && let Some(t) = self.thread.take()
        {
            let _ = t.join();
        }
    }
}

/// The sender thread's state.
struct SenderThread<C> {
    courier: C,
    name: &'static str,
    policy: Policy,
    stats: Arc<PushStats>,
    closing: Arc<AtomicBool>,
    reporter: Reporter,
}

impl<C: Courier> SenderThread<C> {
    fn deliver(&mut self, batch: &C::Batch) {
        let mut wait = self.policy.backoff;
        for attempt in 0..=self.policy.retries {
            match self.courier.send(batch) {
                Ok(()) => {
                    self.stats.sent.fetch_add(1, Ordering::Relaxed);
                    if self.reporter.works_again() {
                        eprintln!("tracing-prof: {}: pushing works again", self.name);
                    }
                    return;
                }
                Err(f) => {
                    self.stats.failed_attempts.fetch_add(1, Ordering::Relaxed);
                    if let Some(line) = self.reporter.failed(&f, Instant::now()) {
                        eprintln!("tracing-prof: {}: push failed: {line}", self.name);
                    }
                    let closing = self.closing.load(Ordering::SeqCst);
                    // As long as the server asks (up to a minute), never less than the backoff.
                    let pause = f
                        .retry_after
                        .map_or(wait, |w| w.min(MAX_RETRY_AFTER).max(wait));
                    if !f.retry || closing || attempt == self.policy.retries || !self.sleep(pause) {
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
}

/// The most of a success's body read: OTLP's client-side limit on responses (4 MiB).
const MAX_ANSWER_BYTES: u64 = 4 << 20;

/// An HTTP exchange's outcome: the answer's body when it is a success, else a [`Failure`] whose
/// `retry` is `retryable(status)` (transport errors are always worth another try). The
/// failure's message has the status and the start of the server's answer (servers say there
/// why they refused), never the URL. A success whose body ends before the length it announced
/// (the connection cut) is a failure that is not retried: the server may have the request.
pub(crate) fn outcome(
    r: Result<ureq::Response, ureq::Error>,
    retryable: fn(u16) -> bool,
) -> Result<Vec<u8>, Failure> {
    match r {
        Ok(response) => {
            use std::io::Read as _;
            let status = response.status();
            let mut body = Vec::new();
            match response
                .into_reader()
                .take(MAX_ANSWER_BYTES)
                .read_to_end(&mut body)
            {
                Ok(_) => Ok(body),
                Err(e) => Err(Failure {
                    message: format!(
                        "the server answered HTTP {status} but its answer was cut short after \
                         {} bytes ({}); not sent again, as the server may have it",
                        body.len(),
                        e.kind()
                    ),
                    cause: "answer cut short".into(),
                    retry: false,
                    retry_after: None,
                }),
            }
        }
        Err(ureq::Error::Status(code, response)) => {
            let retry_after = response
                .header("Retry-After")
                .and_then(|s| s.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            Err(Failure {
                message: match reason(response) {
                    r if r.is_empty() => format!("the server answered HTTP {code}"),
                    r => format!("the server answered HTTP {code}: {r}"),
                },
                cause: format!("HTTP {code}"),
                retry: retryable(code),
                retry_after,
            })
        }
        // The transport error's kind only: its Display would include the URL.
        Err(ureq::Error::Transport(t)) => Err(Failure {
            message: format!("transport error: {}", t.kind()),
            cause: format!("transport: {:?}", t.kind()),
            retry: true,
            retry_after: None,
        }),
    }
}

/// The start of an error answer's body, printable ASCII, at most 300 bytes.
fn reason(response: ureq::Response) -> String {
    use std::io::Read as _;
    let mut body = Vec::new();
    let _ = response.into_reader().take(300).read_to_end(&mut body);
    printable(&body)
}

/// `bytes` as one line of printable ASCII (anything else a `?`), trimmed.
pub(crate) fn printable(bytes: &[u8]) -> String {
    let text: String = bytes
        .iter()
        .map(|&b| match b {
            b'\r' | b'\n' | b'\t' => ' ',
            0x20..0x7f => b as char,
            _ => '?',
        })
        .collect();
    text.trim().to_owned()
}

/// Bounds on a request timeout: below 100 ms every push to a real server fails; above 10 min
/// a dead server holds the queue for good.
pub(crate) const MIN_TIMEOUT: Duration = Duration::from_millis(100);
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// Where a pushing exporter sends, and how: what every such exporter's settings must pass.
pub(crate) struct Destination<'a> {
    /// `Pyroscope` or `OTLP`, for the error.
    pub(crate) exporter: &'static str,
    /// The server's URL, and the setting it comes from, as the error names it.
    pub(crate) url: &'a str,
    pub(crate) url_setting: &'a str,
    /// Where credentials go instead of the URL.
    pub(crate) credentials_go: &'a str,
    /// How it sends, and the variable of its request timeout.
    pub(crate) policy: &'a Policy,
    pub(crate) timeout_var: &'a str,
}

impl Destination<'_> {
    /// Checks the URL ([`check_url`]) and the policy ([`Policy::check`]).
    pub(crate) fn check(&self) -> Result<(), PushError> {
        check_url(self.url, self.url_setting, self.credentials_go)
            .and_then(|()| self.policy.check(self.timeout_var))
            .map_err(|reason| PushError::Invalid {
                exporter: self.exporter,
                reason,
            })
    }
}

/// The most retries of a batch.
pub(crate) const MAX_RETRIES: u32 = 16;

/// Checks a server URL: `http://` or `https://` (the latter with the `tls` feature), a host
/// and a port from 1 to 65535 when given, no credentials (`credentials_go` says where they
/// go instead), no space, control or non-ASCII character. `what` names the setting in the
/// message, which never shows the URL's credentials.
pub(crate) fn check_url(url: &str, what: &str, credentials_go: &str) -> Result<(), String> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!(
            "{what} must start with http:// or https://, got {}",
            redact_url(url)
        ));
    }
    if url.starts_with("https://") && !cfg!(feature = "tls") {
        return Err("https needs the `tls` feature of tracing-prof-export".into());
    }
    let after_scheme = &url[url.find("://").map_or(0, |i| i + 3)..];
    if after_scheme
        .split('/')
        .next()
        .is_some_and(|h| h.contains('@'))
    {
        return Err(format!(
            "put credentials in {credentials_go}, not in the URL"
        ));
    }
    let authority = after_scheme.split(['/', '?', '#']).next().unwrap_or("");
    if let Err(why) = check_authority(authority) {
        return Err(format!("{what} {}: {why}", redact_url(url)));
    }
    if url
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || !c.is_ascii())
    {
        return Err(format!(
            "{what} has a space, a control or a non-ASCII character: {:?}",
            redact_url(url)
        ));
    }
    Ok(())
}

/// `scheme://host...` with any `user:password@` removed.
pub(crate) fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let rest = rest
                .split_once('@')
                .filter(|(cred, _)| !cred.contains('/'))
                .map_or(rest, |(_, r)| r);
            format!("{scheme}://{rest}")
        }
        None => url.to_owned(),
    }
}

/// `host[:port]` of a URL: a host, and a port that is a number from 1 to 65535 when given.
fn check_authority(authority: &str) -> Result<(), String> {
    let (host, port) = match authority.strip_prefix('[') {
        // [IPv6]:port
        Some(rest) => {
            let (h, after) = rest
                .split_once(']')
                .ok_or("an IPv6 address needs its closing ]")?;
            (h, after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    if let Some(p) = port {
        match p.parse::<u16>() {
            Ok(n) if n > 0 => {}
            _ => return Err(format!("the port {p:?} is not a number from 1 to 65535")),
        }
    }
    Ok(())
}

/// Whether `v` can be sent as an HTTP header value as written: printable ASCII, so no CR or
/// LF that would split the request, and not empty.
pub(crate) fn header_ok(v: &str) -> bool {
    !v.is_empty() && v.bytes().all(|b| (0x20..0x7f).contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A server on loopback that answers one request with `answer`, as raw bytes, and closes.
    fn answer_once(answer: &'static [u8]) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", l.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(answer);
        });
        url
    }

    /// A `200` whose body stops before its `Content-Length` (the connection cut) is a failure
    /// that is not retried (the server may have the request: never sent twice); a whole one is
    /// a success with its body.
    #[test]
    fn a_success_cut_short_is_a_failure_not_retried() {
        let url = answer_once(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort");
        let f = outcome(ureq::post(&url).send_bytes(b"x"), |_| true).unwrap_err();
        assert_eq!((f.cause.as_str(), f.retry), ("answer cut short", false));
        assert!(
            f.message.contains("cut short after 5 bytes"),
            "{}",
            f.message
        );
        let url = answer_once(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nwhole");
        let body = outcome(ureq::post(&url).send_bytes(b"x"), |_| true).unwrap();
        assert_eq!(body, b"whole");
    }
}
