//! Pushing profiles to Pyroscope / Grafana Cloud Profiles.
//!
//! Every interval, [`PyroscopeExporter`] (a [`Sink`]) turns the profile into a window since the
//! previous push (counters over the interval, in-use memory at its end), encodes its series as
//! pprof and hands them to its own sender thread through a bounded queue. The aggregator never
//! waits on the network: when the queue is full the oldest batch is dropped and counted. The
//! sender retries transport errors, `429` and `5xx` answers with exponential backoff, and gives
//! up on other `4xx` answers (a configuration error) at once; every failure is counted and
//! reported on stderr once per distinct error, with the start of the server's answer (Pyroscope
//! says there why it refused). Errors and `Debug` output never contain the URL's credentials,
//! the token or the password.
//!
//! # The series
//!
//! Named so that Pyroscope's UI shows each under a profile type it knows, or in the right units,
//! and nothing twice (profile type IDs are `name:type:unit:period_type:period_unit`):
//!
//! | `__name__` | what | profile types |
//! |---|---|---|
//! | `process_cpu` | the `cpu` kind (sampled code stacks under span paths), or with CPU sampling off and a CPU clock on, the CPU time of each span path | `process_cpu:samples:count:cpu:nanoseconds` and `process_cpu:cpu:nanoseconds:cpu:nanoseconds` (Go's), or the second only |
//! | `memory` | the `heap` kind: sampled code stacks under span paths (exact span paths when heap sampling is off) | Go's four, `memory:{alloc,inuse}_{objects,space}:...:space:bytes` |
//! | `span_memory` | exact memory per span path, beside sampled `memory` (push API only: `/ingest` would name it `memory`, counting it twice) | as `memory`, under `span_memory`: bytes and counts, shown as such |
//! | `spans` | spans closed per span path | `spans:spans:count:spans:count` |
//!
//! Wall, busy and idle time per span path are not pushed: no profile type the UI knows holds
//! wall time, and under another it would show nanoseconds as plain counts. They are in the
//! files and at `/debug/pprof`.
//!
//! Every push series carries `__delta__="false"`: the values are windows already, and
//! Pyroscope 1.x would otherwise turn `memory` allocations into deltas between pushes, storing
//! 0 (2.x ignores the label; the server's own `/ingest` sets it).
//!
//! A profile beyond Pyroscope's default limits ([`MAX_SAMPLES`] samples, [`MAX_PROFILE_BYTES`]
//! uncompressed) would be refused whole: its smallest samples are summed into one
//! `(N smaller stacks merged)` sample instead, totals unchanged, counted in
//! [`PushStats::merged_samples`]. Pyroscope refuses profiles that start more than an hour ago:
//! keep the interval under an hour.
//!
//! # The APIs
//!
//! - [`PyroscopeApi::Push`] (default): `POST /push.v1.PusherService/Push`, a protobuf
//!   `PushRequest` (Connect) with one series per row above, labels `__name__`, `service_name`,
//!   `__delta__` and your tags.
//! - [`PyroscopeApi::Ingest`]: `POST /ingest?name=APP{tags}&from=..&until=..&spyName=tracing-prof`
//!   (times in Unix nanoseconds), one request per series, a multipart form with the pprof in
//!   `profile` and a `sample_type_config`. The server names the series from the sample types,
//!   to the same names as above.

use base64::Engine as _;
use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tracing_prof_core::config::{ConfigError, env_var, parse_duration};
use tracing_prof_core::{Sink, SinkError};
use tracing_prof_model::{Profile, ProfileKind, SampleType, Snapshot};

/// Batches (one interval's profiles) waiting to be sent: 8.
pub const DEFAULT_QUEUE_CAPACITY: usize = 8;
/// Time one HTTP request may take: 10 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Retries of a batch after its first attempt: 3 (waits 1 s, 2 s, 4 s).
pub const DEFAULT_RETRIES: u32 = 3;
/// First retry wait, doubled for each further retry.
pub const DEFAULT_BACKOFF: Duration = Duration::from_secs(1);
/// How long dropping the exporter waits for queued batches to be sent: 3 s.
pub const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_secs(3);

/// Server URL, e.g. `http://pyroscope:4040` (as Pyroscope's own clients name it). Unset: no push.
pub const ENV_SERVER_ADDRESS: &str = "PYROSCOPE_SERVER_ADDRESS";
/// Application name (`service_name`); default: the executable's name.
pub const ENV_APPLICATION_NAME: &str = "PYROSCOPE_APPLICATION_NAME";
/// Bearer token.
pub const ENV_AUTH_TOKEN: &str = "PYROSCOPE_AUTH_TOKEN";
/// Basic auth user (Grafana Cloud: the stack's user id).
pub const ENV_BASIC_AUTH_USER: &str = "PYROSCOPE_BASIC_AUTH_USER";
/// Basic auth password (Grafana Cloud: an access policy token).
pub const ENV_BASIC_AUTH_PASSWORD: &str = "PYROSCOPE_BASIC_AUTH_PASSWORD";
/// Tenant, sent as `X-Scope-OrgID`.
pub const ENV_TENANT_ID: &str = "PYROSCOPE_TENANT_ID";
/// Static tags, `key=value,key2=value2`.
pub const ENV_LABELS: &str = "PYROSCOPE_LABELS";
/// `push` (default) or `ingest`.
pub const ENV_API: &str = "TRACING_PROF_PYROSCOPE_API";
/// Request timeout, a duration like `10s`.
pub const ENV_TIMEOUT: &str = "TRACING_PROF_PYROSCOPE_TIMEOUT";

/// Which Pyroscope API to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PyroscopeApi {
    /// `POST /push.v1.PusherService/Push` (Connect, protobuf).
    #[default]
    Push,
    /// `POST /ingest` (multipart form).
    Ingest,
}

#[derive(Clone, PartialEq, Eq)]
enum Auth {
    None,
    Basic { user: String, password: String },
    Bearer(String),
}

/// Where and how to push. Secrets are never shown by `Debug`.
#[derive(Clone)]
pub struct PyroscopeConfig {
    url: String,
    app: String,
    api: PyroscopeApi,
    auth: Auth,
    tenant: Option<String>,
    tags: Vec<(String, String)>,
    timeout: Duration,
    queue_capacity: usize,
    retries: u32,
    backoff: Duration,
    flush_timeout: Duration,
}

impl fmt::Debug for PyroscopeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auth = match &self.auth {
            Auth::None => "none",
            Auth::Basic { .. } => "basic <redacted>",
            Auth::Bearer(_) => "bearer <redacted>",
        };
        f.debug_struct("PyroscopeConfig")
            .field("url", &redact_url(&self.url))
            .field("app", &self.app)
            .field("api", &self.api)
            .field("auth", &auth)
            .field("tenant", &self.tenant)
            .field("tags", &self.tags)
            .field("timeout", &self.timeout)
            .field("queue_capacity", &self.queue_capacity)
            .finish_non_exhaustive()
    }
}

/// `scheme://host...` with any `user:password@` removed.
fn redact_url(url: &str) -> String {
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

/// A configuration that cannot work.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum PyroscopeError {
    /// An environment variable is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Something else is invalid.
    #[error("invalid Pyroscope setting: {0}")]
    Invalid(String),
    /// The sender thread could not be spawned.
    #[error("cannot spawn the tracing-prof Pyroscope thread: {0}")]
    Spawn(#[source] std::io::Error),
}

// `fn main() -> Result<(), Box<dyn Error>>` prints an error it returns with `Debug`: the
// message, not the variant's structure, is what the user must read.
impl std::fmt::Debug for PyroscopeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl PyroscopeConfig {
    /// Pushes to `url` (e.g. `http://localhost:4040`) as application `app`.
    pub fn new(url: impl Into<String>, app: impl Into<String>) -> Self {
        PyroscopeConfig {
            url: url.into().trim_end_matches('/').to_owned(),
            app: app.into(),
            api: PyroscopeApi::default(),
            auth: Auth::None,
            tenant: None,
            tags: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            retries: DEFAULT_RETRIES,
            backoff: DEFAULT_BACKOFF,
            flush_timeout: DEFAULT_FLUSH_TIMEOUT,
        }
    }

    /// From `PYROSCOPE_SERVER_ADDRESS` and friends (see the `ENV_*` constants); `Ok(None)` when
    /// `PYROSCOPE_SERVER_ADDRESS` is unset.
    pub fn from_env() -> Result<Option<Self>, PyroscopeError> {
        let Some(url) = env_var(ENV_SERVER_ADDRESS, |s| Ok(s.to_owned()))? else {
            return Ok(None);
        };
        let app =
            env_var(ENV_APPLICATION_NAME, |s| Ok(s.to_owned()))?.unwrap_or_else(default_app_name);
        let mut c = PyroscopeConfig::new(url, app);
        if let Some(token) = env_var(ENV_AUTH_TOKEN, |s| Ok(s.to_owned()))? {
            c = c.bearer_token(token);
        }
        let user = env_var(ENV_BASIC_AUTH_USER, |s| Ok(s.to_owned()))?;
        let password = env_var(ENV_BASIC_AUTH_PASSWORD, |s| Ok(s.to_owned()))?;
        match (user, password) {
            (Some(u), Some(p)) => c = c.basic_auth(u, p),
            (None, None) => {}
            _ => {
                return Err(PyroscopeError::Invalid(format!(
                    "set both {ENV_BASIC_AUTH_USER} and {ENV_BASIC_AUTH_PASSWORD}, or neither"
                )));
            }
        }
        if let Some(t) = env_var(ENV_TENANT_ID, |s| Ok(s.to_owned()))? {
            c = c.tenant(t);
        }
        if let Some(tags) = env_var(ENV_LABELS, parse_tags)? {
            for (k, v) in tags {
                c = c.tag(k, v);
            }
        }
        if let Some(api) = env_var(ENV_API, |s| match s {
            "push" => Ok(PyroscopeApi::Push),
            "ingest" => Ok(PyroscopeApi::Ingest),
            _ => Err(format!("expected push or ingest, got {s:?}")),
        })? {
            c = c.api(api);
        }
        if let Some(t) = env_var(ENV_TIMEOUT, parse_duration)? {
            c = c.timeout(t);
        }
        Ok(Some(c))
    }

    /// Which API (default [`PyroscopeApi::Push`]).
    pub fn api(mut self, api: PyroscopeApi) -> Self {
        self.api = api;
        self
    }
    /// `Authorization: Basic` (Grafana Cloud: user id and access policy token).
    pub fn basic_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.auth = Auth::Basic {
            user: user.into(),
            password: password.into(),
        };
        self
    }
    /// `Authorization: Bearer`.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.auth = Auth::Bearer(token.into());
        self
    }
    /// Tenant, sent as `X-Scope-OrgID` (multi-tenant Pyroscope).
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }
    /// A static tag on every profile (`env=prod`, `region=eu-west-1`...).
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.push((key.into(), value.into()));
        self
    }
    /// Time one request may take (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
    /// Batches that may wait to be sent (default [`DEFAULT_QUEUE_CAPACITY`], at least 1).
    pub fn queue_capacity(mut self, n: usize) -> Self {
        self.queue_capacity = n.max(1);
        self
    }
    /// Retries per batch and the first wait (doubled each time).
    pub fn retries(mut self, retries: u32, first_backoff: Duration) -> Self {
        self.retries = retries;
        self.backoff = first_backoff;
        self
    }
    /// How long dropping the exporter waits for queued batches (default [`DEFAULT_FLUSH_TIMEOUT`]).
    pub fn flush_timeout(mut self, timeout: Duration) -> Self {
        self.flush_timeout = timeout;
        self
    }

    fn validate(&self) -> Result<(), PyroscopeError> {
        let invalid = |m: String| Err(PyroscopeError::Invalid(m));
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return invalid(format!(
                "the server address must start with http:// or https://, got {}",
                redact_url(&self.url)
            ));
        }
        if self.url.starts_with("https://") && !cfg!(feature = "tls") {
            return invalid("https needs the `tls` feature of tracing-prof-export".into());
        }
        if self.url[self.url.find("://").map_or(0, |i| i + 3)..]
            .split('/')
            .next()
            .is_some_and(|h| h.contains('@'))
        {
            return invalid(
                "put credentials in basic_auth / PYROSCOPE_BASIC_AUTH_*, not in the URL".into(),
            );
        }
        let authority = self.url[self.url.find("://").map_or(0, |i| i + 3)..]
            .split(['/', '?', '#'])
            .next()
            .unwrap_or("");
        if let Err(why) = check_authority(authority) {
            return invalid(format!(
                "the server address ({ENV_SERVER_ADDRESS}) {}: {why}",
                redact_url(&self.url)
            ));
        }
        if self
            .url
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || !c.is_ascii())
        {
            return invalid(format!(
                "the server address ({ENV_SERVER_ADDRESS}) has a space, a control or a non-ASCII \
                 character: {:?}",
                redact_url(&self.url)
            ));
        }
        // Header values: a CR or LF would split the request (ureq refuses it at every push),
        // non-ASCII is not sent as written.
        let header_ok = |v: &str| !v.is_empty() && v.bytes().all(|b| (0x20..0x7f).contains(&b));
        let secret = |what: &str, var: &str| {
            invalid(format!(
                "{what} ({var}) must be printable ASCII, without CR or LF, and not empty"
            ))
        };
        match &self.auth {
            Auth::None => {}
            Auth::Bearer(t) if !header_ok(t) => return secret("the bearer token", ENV_AUTH_TOKEN),
            Auth::Basic { user, password }
                if !header_ok(user) || !header_ok(password) || user.contains(':') =>
            {
                return secret(
                    "the basic-auth user (no ':') and password",
                    "PYROSCOPE_BASIC_AUTH_USER, PYROSCOPE_BASIC_AUTH_PASSWORD",
                );
            }
            _ => {}
        }
        if let Some(t) = &self.tenant {
            if !header_ok(t) {
                return invalid(format!(
                    "the tenant ({ENV_TENANT_ID}) {t:?} must be printable ASCII, without CR or LF"
                ));
            }
        }
        if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&self.timeout) {
            return invalid(format!(
                "the request timeout ({ENV_TIMEOUT}) must be from 100ms to 10m, got {:?}",
                self.timeout
            ));
        }
        if self.flush_timeout > MAX_TIMEOUT
            || self.retries > MAX_RETRIES
            || self.backoff > MAX_TIMEOUT
        {
            return invalid(format!(
                "flush timeout and first backoff must be at most 10m and retries at most \
                 {MAX_RETRIES}; got {:?}, {:?}, {}",
                self.flush_timeout, self.backoff, self.retries
            ));
        }
        // `service_name` is a label value (at most 2048 bytes, `pkg/validation/limits.go`);
        // `/ingest` also parses it from `name=APP{...}` and allows only letters, digits and
        // `_ . - /` (`api/model/labelset/validate.go`, `IsServiceNameRuneAllowed`).
        let ingest_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/');
        if self.app.is_empty()
            || self.app.len() > MAX_LABEL_VALUE
            || self.app.chars().any(char::is_control)
            || self.app.contains(['{', '}', ',', '=', '"'])
            || (self.api == PyroscopeApi::Ingest && !self.app.chars().all(ingest_ok))
        {
            return invalid(format!(
                "application name ({ENV_APPLICATION_NAME}) {:?}: {}",
                self.app,
                if self.api == PyroscopeApi::Ingest {
                    "the ingest API allows letters, digits and _ . - / only"
                } else {
                    "must be 1 to 2048 bytes without control characters or { } , = \""
                }
            ));
        }
        if self.tags.len() > MAX_TAGS {
            return invalid(format!(
                "{} tags ({ENV_LABELS}); Pyroscope allows {MAX_TAGS} beside the labels we set",
                self.tags.len()
            ));
        }
        for (i, (k, v)) in self.tags.iter().enumerate() {
            let key_ok = k
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
                && k.len() <= MAX_LABEL_NAME
                && !k.starts_with("__")
                && !RESERVED_TAGS.contains(&k.as_str());
            let value_ok = !v.is_empty()
                && v.len() <= MAX_LABEL_VALUE
                && v.trim() == v
                && !v.chars().any(char::is_control)
                && !v.contains(['{', '}', ',', '=', '"']);
            if !key_ok || !value_ok {
                return invalid(format!(
                    "tag {k}={v:?} ({ENV_LABELS}): keys are [A-Za-z_][A-Za-z0-9_.]* (not starting \
                     with __, not {}); values are not empty, have no space at either end and \
                     none of {{ }} , = \"",
                    RESERVED_TAGS.join(", ")
                ));
            }
            if self.tags[..i].iter().any(|(earlier, _)| earlier == k) {
                return invalid(format!(
                    "tag {k} ({ENV_LABELS}) is given twice; Pyroscope rejects duplicate label names"
                ));
            }
        }
        Ok(())
    }
}

/// Bounds on the request timeout: below 100 ms every push to a real server fails; above 10 min
/// a dead server holds the queue for good.
const MIN_TIMEOUT: Duration = Duration::from_millis(100);
const MAX_TIMEOUT: Duration = Duration::from_secs(600);
const MAX_RETRIES: u32 = 16;
/// Pyroscope's default `validation.max-length-label-name` and `-label-value`.
const MAX_LABEL_NAME: usize = 1024;
const MAX_LABEL_VALUE: usize = 2048;
/// Labels we set ourselves, or the server sets on `/ingest` (`pkg/og/convert/pprof/profile.go`,
/// `createLabels`): a tag of the same name would be a duplicate label.
const RESERVED_TAGS: [&str; 3] = ["service_name", "app_name", "pyroscope_spy"];

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

fn default_app_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "rust-app".into())
}

fn parse_tags(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .ok_or_else(|| {
                    format!("expected key=value pairs separated by commas, got {pair:?}")
                })
        })
        .collect()
}

/// Counters of a [`PyroscopeExporter`], readable from anywhere.
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
    /// Pyroscope's limits ([`MAX_SAMPLES`], [`MAX_PROFILE_BYTES`]); totals are unchanged.
    pub fn merged_samples(&self) -> u64 {
        self.merged.load(Ordering::Relaxed)
    }
}

/// One interval's profiles, ready to send.
struct Batch {
    from: SystemTime,
    until: SystemTime,
    series: Vec<Series>,
}

/// One pprof of a batch and the Pyroscope series it belongs to.
struct Series {
    /// `__name__` on the push API (the ingest API derives the same one from the sample types).
    name: &'static str,
    sample_types: Vec<SampleType>,
    /// Gzip'd pprof.
    pprof: Vec<u8>,
}

/// Pyroscope's default `validation.max-profile-stacktrace-samples` (`pkg/validation/limits.go`):
/// a profile with more samples is rejected whole.
pub const MAX_SAMPLES: usize = 16_000;
/// Pyroscope's default `validation.max-profile-size-bytes`, of the uncompressed pprof.
pub const MAX_PROFILE_BYTES: usize = 4 << 20;
/// Pyroscope's default `validation.max-label-names-per-series` is 30; `__name__`,
/// `service_name`, `__delta__` and (on `/ingest`) `pyroscope_spy` leave 26 for tags.
pub const MAX_TAGS: usize = 26;

/// The series of one window, named as the Pyroscope UI knows them (see the module docs).
fn series_of(window: &Snapshot, api: PyroscopeApi) -> (Vec<Series>, usize) {
    let mut out: Vec<(&'static str, Profile)> = Vec::new();
    let spans = window.profile(ProfileKind::Spans);
    if ProfileKind::Cpu.is_available(window) {
        out.push(("process_cpu", window.profile(ProfileKind::Cpu)));
    } else if let Some(mut cpu) = spans.with_sample_types(&["cpu"]) {
        // Measured by the CPU clock on enter and exit: exact CPU time per span path, Go's CPU
        // type without the sample count.
        cpu.period_type = Some(SampleType::new("cpu", "nanoseconds"));
        cpu.period = 1;
        out.push(("process_cpu", cpu));
    }
    out.push(("memory", window.profile(ProfileKind::Heap)));
    if api == PyroscopeApi::Push && ProfileKind::Heap.is_sampled(window) {
        // Exact per span path, beside the sampled stacks; unsampled, `memory` is this already.
        // `/ingest` would name it `memory` too (from its sample types), counting memory twice.
        out.push(("span_memory", window.profile(ProfileKind::SpanMemory)));
    }
    if let Some(counts) = spans.with_sample_types(&["spans"]) {
        out.push(("spans", counts));
    }
    let mut merged = 0;
    let series = out
        .into_iter()
        // Nothing to store (the server keeps nothing of a profile without samples).
        .filter(|(_, p)| !p.samples.is_empty())
        .map(|(name, mut p)| {
            merged += p.keep_largest(MAX_SAMPLES);
            let message = loop {
                let message = p.to_proto();
                if prost::Message::encoded_len(&message) <= MAX_PROFILE_BYTES
                    || p.samples.len() <= 1
                {
                    break message;
                }
                merged += p.keep_largest(p.samples.len() / 2);
            };
            Series {
                name,
                sample_types: p.sample_types,
                pprof: tracing_prof_model::pprof::gzip(&message),
            }
        })
        .collect();
    (series, merged)
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
        let thread = std::thread::Builder::new()
            .name("tracing-prof-pyroscope".into())
            .spawn(move || {
                tracing_prof_core::mark_profiler_thread();
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

/// The sender thread's state.
struct Pusher {
    agent: ureq::Agent,
    config: PyroscopeConfig,
    stats: Arc<PushStats>,
    closing: Arc<AtomicBool>,
    /// Last error reported, to report each distinct one once.
    reported: Option<String>,
}

/// A failed request, described without URL or credentials.
struct Failure {
    message: String,
    retry: bool,
}

impl Pusher {
    fn run(mut self, inbox: &Receiver<Batch>) {
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

/// The `/ingest` form: the pprof in `profile`, units and aggregation in `sample_type_config`.
fn multipart(boundary: &str, pprof: &[u8], types: &[SampleType]) -> Vec<u8> {
    let config: Vec<String> = types
        .iter()
        .map(|st| {
            let (t, unit) = (&st.name, st.unit.as_str());
            let (units, aggregation) = match unit {
                "bytes" => ("bytes", if t.starts_with("inuse") { "average" } else { "sum" }),
                "count" if t.ends_with("objects") => ("objects", if t.starts_with("inuse") { "average" } else { "sum" }),
                _ => ("samples", "sum"),
            };
            format!("\"{t}\":{{\"units\":\"{units}\",\"aggregation\":\"{aggregation}\",\"display-name\":\"{t}\"}}")
        })
        .collect();
    let json = format!("{{{}}}", config.join(","));
    let mut body = Vec::with_capacity(pprof.len() + json.len() + 512);
    for (name, file, bytes) in [
        ("profile", "profile.pprof", pprof),
        (
            "sample_type_config",
            "sample_type_config.json",
            json.as_bytes(),
        ),
    ] {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{file}\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    body
}

/// Pyroscope's `push.v1` messages (`api/push/v1/push.proto`, `types/v1` `LabelPair`), as prost
/// types, for the push API and for tests that play the server.
pub mod push {
    #![allow(missing_docs, reason = "mirrors push.proto field for field")]

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PushRequest {
        #[prost(message, repeated, tag = "1")]
        pub series: Vec<RawProfileSeries>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RawProfileSeries {
        #[prost(message, repeated, tag = "1")]
        pub labels: Vec<LabelPair>,
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<RawSample>,
    }

    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct LabelPair {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }

    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct RawSample {
        #[prost(bytes = "vec", tag = "1")]
        pub raw_profile: Vec<u8>,
        #[prost(string, tag = "2")]
        pub id: String,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window with `n` CPU stacks, stack `i` sampled `i + 1` times, and CPU sampling on.
    fn cpu_window(n: u64) -> Snapshot {
        use tracing_prof_model::{CodeFrame, CpuSource, CpuStack, PathKind, SpanFrame};
        let mut w = Snapshot::new(SystemTime::now(), Duration::from_secs(10));
        w.window = true;
        w.cpu = CpuSource::Sampled { hz: 100 };
        let span = vec![SpanFrame::new("app", "request", None, None)];
        for i in 0..n {
            let mut s = CpuStack::new(
                PathKind::Span,
                span.clone(),
                vec![CodeFrame::named(&format!("f{i}"))],
            );
            s.samples = i + 1;
            s.cpu_ns = (i + 1) * 10_000_000;
            w.cpu_stacks.push(s);
        }
        w
    }

    #[test]
    fn a_window_beyond_pyroscopes_sample_limit_is_merged_not_rejected() {
        let n = MAX_SAMPLES as u64 + 500;
        let (series, merged) = series_of(&cpu_window(n), PyroscopeApi::Push);
        assert_eq!(merged, 501);
        let cpu = series.iter().find(|s| s.name == "process_cpu").unwrap();
        let p = Profile::decode(&cpu.pprof).unwrap();
        assert_eq!(p.samples.len(), MAX_SAMPLES);
        // Every sample still counted: 1 + 2 + ... + n samples.
        assert_eq!(p.total(0), (n * (n + 1) / 2) as i64);
        let other = p
            .samples
            .iter()
            .find(|s| s.stack[0].function.contains("merged"))
            .unwrap();
        assert_eq!(&*other.stack[0].function, "(501 smaller stacks merged)");
        assert_eq!(other.values[0], (1..=501).sum::<i64>(), "the smallest ones");

        let (series, merged) = series_of(&cpu_window(100), PyroscopeApi::Push);
        assert_eq!(merged, 0);
        let names: Vec<&str> = series.iter().map(|s| s.name).collect();
        // No span path and no memory in this window: only CPU.
        assert_eq!(names, ["process_cpu"]);
    }

    #[test]
    fn secrets_stay_out_of_debug_and_errors() {
        let c = PyroscopeConfig::new("https://user:pw@host:4040", "app").basic_auth("u", "hunter2");
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("pw@"),
            "{shown}"
        );
        let e = PyroscopeConfig::new("https://user:pw@host:4040", "app")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(!e.contains("pw"), "{e}");
    }

    #[test]
    fn bad_settings_are_refused_with_a_reason() {
        assert!(PyroscopeConfig::new("ftp://x", "a").validate().is_err());
        assert!(PyroscopeConfig::new("http://x", "a{b}").validate().is_err());
        assert!(
            PyroscopeConfig::new("http://x", "a")
                .tag("9x", "v")
                .validate()
                .is_err()
        );
        assert!(
            PyroscopeConfig::new("http://x", "a")
                .tag("env", "a,b")
                .validate()
                .is_err()
        );
        assert!(
            PyroscopeConfig::new("http://x", "a")
                .tag("env", "prod")
                .validate()
                .is_ok()
        );
        let refused = |c: PyroscopeConfig| c.validate().unwrap_err().to_string();
        let e = refused(PyroscopeConfig::new("http://127.0.0.1:notaport", "a"));
        assert!(
            e.contains("PYROSCOPE_SERVER_ADDRESS") && e.contains("notaport"),
            "{e}"
        );
        assert!(
            PyroscopeConfig::new("http://:4040", "a")
                .validate()
                .is_err()
        );
        assert!(PyroscopeConfig::new("http://h:0", "a").validate().is_err());
        assert!(
            PyroscopeConfig::new("http://h:65536", "a")
                .validate()
                .is_err()
        );
        assert!(
            PyroscopeConfig::new("http://[::1:4040", "a")
                .validate()
                .is_err()
        );
        assert!(
            PyroscopeConfig::new("http://h st:4040", "a")
                .validate()
                .is_err()
        );
        for ok in [
            "http://[::1]:4040",
            "http://h:4040/prefix",
            "http://h",
            "https://h/x?y=1",
        ] {
            if ok.starts_with("https") && !cfg!(feature = "tls") {
                continue;
            }
            assert!(PyroscopeConfig::new(ok, "a").validate().is_ok(), "{ok}");
        }
        let base = || PyroscopeConfig::new("http://h:4040", "a");
        let e = refused(base().tenant("t\r\nX-Evil: 1"));
        assert!(e.contains("PYROSCOPE_TENANT_ID"), "{e}");
        assert!(base().tenant("tenant-é").validate().is_err());
        let e = refused(base().bearer_token("s3cr3t\n"));
        assert!(
            e.contains("PYROSCOPE_AUTH_TOKEN") && !e.contains("s3cr3t"),
            "{e}"
        );
        assert!(base().basic_auth("u:x", "p").validate().is_err());
        let e = refused(base().timeout(Duration::from_micros(1)));
        assert!(e.contains("TRACING_PROF_PYROSCOPE_TIMEOUT"), "{e}");
        assert!(
            base()
                .retries(u32::MAX, Duration::from_secs(1))
                .validate()
                .is_err()
        );
        assert!(base().retries(3, Duration::MAX).validate().is_err());
        // What Pyroscope would reject, refused at start instead of at every push.
        let ingest =
            |app: &str| PyroscopeConfig::new("http://h:4040", app).api(PyroscopeApi::Ingest);
        assert!(ingest("shop-api/v2.eu_1").validate().is_ok());
        let e = refused(ingest("shop api"));
        assert!(
            e.contains("PYROSCOPE_APPLICATION_NAME") && e.contains("_ . - /"),
            "{e}"
        );
        assert!(ingest("café").validate().is_err());
        assert!(base().tag("env", "a").tag("env", "b").validate().is_err());
        for key in ["__delta__", "service_name", "pyroscope_spy", "app_name"] {
            assert!(base().tag(key, "x").validate().is_err(), "{key}");
        }
        for value in ["", " prod", "prod ", "a\nb"] {
            assert!(base().tag("env", value).validate().is_err(), "{value:?}");
        }
        let many = (0..=MAX_TAGS).fold(base(), |c, i| c.tag(format!("t{i}"), "v"));
        assert!(refused(many).contains("26"));
        let enough = (0..MAX_TAGS).fold(base(), |c, i| c.tag(format!("t{i}"), "v"));
        assert!(enough.validate().is_ok());
        assert!(base().tag("k".repeat(1025), "v").validate().is_err());
        assert!(base().tag("k", "v".repeat(2049)).validate().is_err());
        assert_eq!(parse_tags("env=prod, region=eu").unwrap().len(), 2);
        assert!(parse_tags("env").is_err());
    }
}
