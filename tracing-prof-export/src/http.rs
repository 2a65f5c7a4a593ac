//! A Go-compatible `/debug/pprof/*` endpoint, so that
//! `go tool pprof http://127.0.0.1:6060/debug/pprof/heap` just works.
//!
//! | path | answers | default sample type |
//! |---|---|---|
//! | `/debug/pprof/` | an index of the endpoints | |
//! | `/debug/pprof/profile` | Go's CPU profile of the next `seconds` (default 30): code stacks under span paths | `cpu` |
//! | `/debug/pprof/cpu` | the same since the profiler started | `cpu` |
//! | `/debug/pprof/heap` | memory held, by code stack under span path | `inuse_space` |
//! | `/debug/pprof/allocs` | memory allocated, the same | `alloc_space` |
//! | `/debug/pprof/spans` | time per span path | `cpu` |
//! | `/debug/pprof/span_memory`, `lifetimes`, `threads` | as the files of the same names | |
//! | `/debug/pprof/goroutine` | what runs now: open spans per span path, each thread's path | `open_spans` |
//! | `/debug/pprof/live` | one window (default 1 s) for `tracing-prof live`: a [`LiveFrame`] | |
//!
//! `?seconds=N` (1 to [`DEFAULT_MAX_SECONDS`]) answers a window profile over the next N seconds
//! (`go tool pprof -seconds N URL` sends it), `?debug=1` a readable text table.
//!
//! [`PprofHandler`] answers requests and knows nothing of sockets: mount it in your own server
//! (axum, hyper, actix...) to serve it on your port. [`HttpServer`] is a small standalone server
//! for services that have none: GET only, bound to `127.0.0.1` by default, request heads capped
//! at [`MAX_HEAD_BYTES`] and read within [`READ_TIMEOUT`]. Connections whose head is still
//! arriving ([`MAX_PENDING`] at once) are kept apart from requests being answered
//! ([`MAX_CONNECTIONS`] at once), so clients that connect and send nothing (a slow-loris) do not
//! keep `go tool pprof` out: its request arrives whole and is answered. Past either limit the
//! answer is `503` with `Retry-After`, sent after the request was read so that it arrives rather
//! than a reset (past [`MAX_REFUSING`] more waiting for it, a connection is closed unanswered).
//! At most [`MAX_WINDOWS`] `?seconds=` windows run at once (a `tracing-prof live` holds one
//! while it runs); more get `429` with `Retry-After`. The application and the profiler never wait on a client.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing_prof_core::config::{ConfigError, env_var};
use tracing_prof_core::{Profiler, ServiceStatus};
use tracing_prof_model::{LiveFrame, ProfileKind, Snapshot, units};

/// Where [`HttpServer::from_env`] listens when `TRACING_PROF_HTTP_ADDR` is `default`:
/// loopback only, Go's customary port.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:6060";
/// Longest `?seconds=` window accepted.
pub const DEFAULT_MAX_SECONDS: u64 = 60;
/// `/debug/pprof/profile`'s window when no `seconds` is given, as in Go.
pub const DEFAULT_PROFILE_SECONDS: u64 = 30;
/// Requests answered at once (their head read); more are answered `503` with `Retry-After`.
pub const MAX_CONNECTIONS: usize = 8;
/// Connections whose request head is still being read; more are answered `503` (by one thread,
/// in turn, within [`REFUSE_WAIT`] twice each).
pub const MAX_PENDING: usize = 64;
/// Connections past [`MAX_PENDING`] waiting for their `503`; more are closed unanswered.
pub const MAX_REFUSING: usize = 64;
/// How long a refused connection's request head is waited for, and then its close.
pub const REFUSE_WAIT: Duration = Duration::from_millis(100);
/// `?seconds=` windows (each holds its connection for N seconds) at once; more get `429`.
pub const MAX_WINDOWS: usize = 2;
/// Largest request head (request line and headers) read.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Time a client has to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a client has to take each write of the answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Address to serve on (`host:port`, or `default` for [`DEFAULT_HTTP_ADDR`]); unset: no server.
pub const ENV_HTTP_ADDR: &str = "TRACING_PROF_HTTP_ADDR";
/// Bearer token the endpoint requires, if set.
pub const ENV_HTTP_TOKEN: &str = "TRACING_PROF_HTTP_TOKEN";
/// `1` to serve on a non-loopback address without a token (refused otherwise).
pub const ENV_HTTP_ALLOW_PUBLIC: &str = "TRACING_PROF_HTTP_ALLOW_PUBLIC";
/// `1` makes a `/debug/pprof` server that cannot listen an error at start; by default the
/// service runs without it and the server tries again every [`BIND_RETRY`].
pub const ENV_HTTP_REQUIRED: &str = "TRACING_PROF_HTTP_REQUIRED";
/// How often a server from [`HttpServer::from_env`] that could not listen tries again: 5 s.
pub const BIND_RETRY: Duration = Duration::from_secs(5);
/// The name a server from [`HttpServer::from_env`] reports its state under
/// ([`Profiler::services`](tracing_prof_core::Profiler::services)).
pub const SERVICE_NAME: &str = "/debug/pprof server";

/// An answer, for whichever server carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Other headers.
    pub headers: Vec<(&'static str, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl HttpResponse {
    fn text(status: u16, body: impl Into<String>) -> Self {
        let body = body.into().into_bytes();
        HttpResponse {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body,
        }
    }

    /// A gzip'd pprof `body`, offered as `{name}.pb.gz`.
    fn pprof(name: &str, body: Vec<u8>) -> Self {
        Self::file(&format!("{name}.pb.gz"), body)
    }

    /// Binary `body`, offered as `file_name`.
    fn file(file_name: &str, body: Vec<u8>) -> Self {
        HttpResponse {
            status: 200,
            content_type: "application/octet-stream",
            headers: vec![(
                "Content-Disposition",
                format!("attachment; filename=\"{file_name}\""),
            )],
            body,
        }
    }
}

/// Answers `/debug/pprof/*` requests from a [`Profiler`]'s numbers.
#[derive(Clone)]
pub struct PprofHandler {
    profiler: Profiler,
    token: Option<Arc<str>>,
    max_seconds: u64,
    /// `?seconds=` windows running, shared by the handler's clones.
    windows: Arc<AtomicUsize>,
}

impl std::fmt::Debug for PprofHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PprofHandler")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("max_seconds", &self.max_seconds)
            .finish_non_exhaustive()
    }
}

impl PprofHandler {
    /// Serves `profiler`'s numbers, without a token.
    pub fn new(profiler: Profiler) -> Self {
        PprofHandler {
            profiler,
            token: None,
            max_seconds: DEFAULT_MAX_SECONDS,
            windows: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Requires `Authorization: Bearer TOKEN` on every request.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into().into());
        self
    }

    /// Longest `?seconds=` window accepted (default [`DEFAULT_MAX_SECONDS`]).
    pub fn max_seconds(mut self, seconds: u64) -> Self {
        self.max_seconds = seconds.max(1);
        self
    }

    /// Answers one request. `path_and_query` is the request target (`/debug/pprof/heap?debug=1`),
    /// `authorization` the `Authorization` header if any. Blocks for `?seconds=N`: call it from a
    /// thread that may wait (in async servers, `spawn_blocking`).
    ///
    /// # Examples
    /// ```
    /// # let (_layer, guard) = tracing_prof_core::Profiler::builder().build().unwrap();
    /// let handler = tracing_prof_export::http::PprofHandler::new(guard.profiler().clone());
    /// let answer = handler.handle("GET", "/debug/pprof/heap?debug=1", None);
    /// assert_eq!(answer.status, 200);
    /// ```
    pub fn handle(
        &self,
        method: &str,
        path_and_query: &str,
        authorization: Option<&str>,
    ) -> HttpResponse {
        if let Some(token) = &self.token {
            let given = authorization
                .and_then(|a| a.strip_prefix("Bearer "))
                .unwrap_or("");
            if !constant_time_eq(given.as_bytes(), token.as_bytes()) {
                let mut r =
                    HttpResponse::text(401, "a valid `Authorization: Bearer` token is required\n");
                r.headers.push(("WWW-Authenticate", "Bearer".into()));
                return r;
            }
        }
        if method != "GET" && method != "HEAD" {
            let mut r = HttpResponse::text(405, "only GET is served\n");
            r.headers.push(("Allow", "GET, HEAD".into()));
            return r;
        }
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        let mut seconds = None;
        let mut debug = false;
        let mut every = false;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "seconds" => match v.parse::<u64>() {
                    Ok(n) if (1..=self.max_seconds).contains(&n) => seconds = Some(n),
                    _ => {
                        let msg = format!(
                            "seconds must be a whole number from 1 to {}\n",
                            self.max_seconds
                        );
                        return HttpResponse::text(400, msg);
                    }
                },
                "debug" => {
                    debug = v != "0";
                    every = v == "2";
                }
                _ => {} // gc=, sample_index= and the like: accepted and ignored, as Go does
            }
        }
        let kind = match path.trim_end_matches('/') {
            "/debug/pprof" => return index(&self.profiler),
            "/debug/pprof/goroutine" => return self.goroutine(debug, every),
            "/debug/pprof/cmdline" => return cmdline(),
            "/debug/pprof/live" => return self.live(seconds.unwrap_or(1)),
            "/debug/pprof/symbol" => {
                return HttpResponse::text(
                    404,
                    "tracing-prof's profiles carry their function names, files and lines: \
                     there is nothing to look up at /symbol\n",
                );
            }
            "/debug/pprof/trace" => {
                return HttpResponse::text(
                    404,
                    "execution traces are Go's runtime/trace, which a Rust process does not \
                     have; /debug/pprof/goroutine shows what runs now, /debug/pprof/profile \
                     the CPU\n",
                );
            }
            "/debug/pprof/profile" => {
                seconds = Some(seconds.unwrap_or(DEFAULT_PROFILE_SECONDS.min(self.max_seconds)));
                ProfileKind::Cpu
            }
            other => match other
                .strip_prefix("/debug/pprof/")
                .and_then(ProfileKind::from_name)
            {
                Some(kind) => kind,
                None => return HttpResponse::text(404, "not found; see /debug/pprof/\n"),
            },
        };
        if let (ProfileKind::Cpu, Some(why)) = (kind, self.cpu_not_running()) {
            let msg = format!("{why}\n/debug/pprof/spans has the time per span path.\n");
            return HttpResponse::text(503, msg);
        }
        let profile = match seconds {
            Some(n) => match self.window(n) {
                Ok(window) => window,
                Err(busy) => return busy,
            },
            None => self.profiler.snapshot(),
        };
        if debug {
            return HttpResponse::text(200, text_table(&profile, kind));
        }
        HttpResponse::pprof(kind.name(), profile.profile(kind).encode())
    }

    /// Why CPU sampling is not running, in words; `None` while it runs.
    fn cpu_not_running(&self) -> Option<String> {
        (self.profiler.stats().cpu.hz == 0).then(|| {
            let why = self
                .profiler
                .cpu_error()
                .unwrap_or_else(|| "it is turned off (TRACING_PROF_CPU_HZ=0)".into());
            format!("CPU sampling is not running: {why}")
        })
    }

    /// What happens in the next `n` seconds, or `429` when [`MAX_WINDOWS`] windows run already.
    fn window(&self, n: u64) -> Result<Snapshot, HttpResponse> {
        let Some(_window) = Window::take(&self.windows) else {
            let mut r = HttpResponse::text(
                429,
                format!(
                    "{MAX_WINDOWS} ?seconds= windows are running already; try again after they \
                     end\n"
                ),
            );
            r.headers.push(("Retry-After", n.to_string()));
            return Err(r);
        };
        let base = self.profiler.snapshot();
        std::thread::sleep(Duration::from_secs(n));
        Ok(self.profiler.snapshot().window_since(&base))
    }

    /// `/debug/pprof/live`: the next `n` seconds as one [`LiveFrame`], with what runs at their
    /// end and the profiler's state, for `tracing-prof live`.
    fn live(&self, n: u64) -> HttpResponse {
        let window = match self.window(n) {
            Ok(window) => window,
            Err(busy) => return busy,
        };
        let mut frame = LiveFrame::new(
            &window,
            self.profiler.in_flight(),
            self.profiler.is_paused(),
        );
        frame.notes.extend(self.cpu_not_running());
        if window.sample_rate == 0 {
            frame.notes.push(
                "heap sampling is off (TRACING_PROF_SAMPLE_RATE=0): no code stacks for memory"
                    .into(),
            );
        }
        HttpResponse::file("live.bin", frame.encode())
    }

    /// `/debug/pprof/goroutine`, for spans: what runs now (see `Profiler::in_flight`). Plain:
    /// Go's goroutine profile shape, open spans per span path; `?debug=1`: paths with counts
    /// and oldest ages, then threads; `?debug=2`: every listed open span, oldest first.
    fn goroutine(&self, debug: bool, every: bool) -> HttpResponse {
        let now = self.profiler.in_flight();
        if debug {
            return HttpResponse::text(200, now.text(every));
        }
        HttpResponse::pprof("goroutine", now.profile().encode())
    }
}

/// `/debug/pprof/cmdline`: the command line, arguments separated by NUL bytes, as Go's.
fn cmdline() -> HttpResponse {
    let mut body = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    if body.last() == Some(&0) {
        body.pop();
    }
    HttpResponse {
        status: 200,
        content_type: "text/plain; charset=utf-8",
        headers: Vec::new(),
        body,
    }
}

/// One running `?seconds=` window; its slot is given back when dropped.
struct Window<'a>(&'a AtomicUsize);

impl<'a> Window<'a> {
    fn take(running: &'a AtomicUsize) -> Option<Self> {
        if running.fetch_add(1, Ordering::SeqCst) >= MAX_WINDOWS {
            running.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Window(running))
    }
}

impl Drop for Window<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `s` with the characters HTML gives a meaning escaped.
fn html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// What the profiler's sinks and services are doing: exports, failures, the last error.
fn health(profiler: &Profiler) -> String {
    let mut out = String::from("<table>\n");
    for s in profiler.sink_stats() {
        let state = match &s.last_error {
            Some(e) => format!("<b>failing</b>: {}", html(e)),
            None => "ok".to_owned(),
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{} exports, {} failed</td><td>{state}</td></tr>",
            html(&s.name),
            s.exports,
            s.export_errors
        );
    }
    for s in profiler.services() {
        let state = if s.up { "ok" } else { "<b>down</b>" };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{state}</td><td>{}</td></tr>",
            html(&s.name),
            html(&s.detail)
        );
    }
    out.push_str("</table>\n");
    out
}

fn index(profiler: &Profiler) -> HttpResponse {
    let paused = profiler.is_paused();
    let state = if paused {
        "<p><b>Profiling is paused</b> (no heap or CPU sampling, no exports; exact counters \
         keep counting).</p>\n"
    } else {
        "<p>Profiling is running.</p>\n"
    };
    let state = format!("{state}{}", health(profiler));
    let body = "<table>\n\
        <tr><td><a href=\"heap?debug=1\">heap</a></td><td>memory held now, by code stack under span path, sampled (inuse_space by default)</td></tr>\n\
        <tr><td><a href=\"allocs?debug=1\">allocs</a></td><td>memory allocated since start, as heap (alloc_space by default)</td></tr>\n\
        <tr><td><a href=\"span_memory?debug=1\">span_memory</a></td><td>memory per span path, exact (inuse_space by default)</td></tr>\n\
        <tr><td><a href=\"lifetimes?debug=1\">lifetimes</a></td><td>frees by lifetime and temporary allocations, by code stack, sampled</td></tr>\n\
        <tr><td><a href=\"threads?debug=1\">threads</a></td><td>memory per thread, exact (inuse_space by default)</td></tr>\n\
        <tr><td><a href=\"spans?debug=1\">spans</a></td><td>time per span path: count, wall, busy, idle, CPU, off-CPU</td></tr>\n\
        <tr><td><a href=\"cpu?debug=1\">cpu</a></td><td>CPU time by code stack under span path, sampled, since start</td></tr>\n\
        <tr><td><a href=\"profile?seconds=5&amp;debug=1\">profile</a></td><td>CPU profile of the next <code>seconds</code> (default 30), as Go's</td></tr>\n\
        <tr><td><a href=\"goroutine?debug=1\">goroutine</a></td><td>what runs now: open spans per span path, oldest first (<code>?debug=2</code>: each one), and the span path each thread is in</td></tr>\n\
        <tr><td><a href=\"cmdline\">cmdline</a></td><td>the command line</td></tr>\n\
        <tr><td>live</td><td>one window (<code>?seconds=N</code>, default 1) for <code>tracing-prof live URL</code>, a terminal view</td></tr>\n\
        </table>\n<p>Add <code>?seconds=N</code> for what happens in the next N seconds, <code>?debug=1</code> for text.\n\
        Use: <code>go tool pprof http://HOST/debug/pprof/heap</code></p></body></html>\n";
    HttpResponse {
        status: 200,
        content_type: "text/html; charset=utf-8",
        headers: Vec::new(),
        body: format!(
            "<html><head><title>/debug/pprof/</title></head><body>\n\
             <h1>tracing-prof: /debug/pprof/</h1>\n{state}{body}"
        )
        .into(),
    }
}

/// `?debug=1`: a header, then the kind's samples, largest default sample type first, each with
/// its values in their units, its labels, and its stack one frame per line with file and line.
fn text_table(snapshot: &Snapshot, kind: ProfileKind) -> String {
    let profile = snapshot.profile(kind);
    let what = if kind == ProfileKind::Threads {
        "threads"
    } else if kind.is_sampled(snapshot) {
        "sampled stacks"
    } else {
        "span paths"
    };
    let mut out = format!(
        "tracing-prof {} profile{}: {} {what}\n",
        kind.name(),
        if snapshot.window {
            format!(", last {:.1} s", snapshot.duration.as_secs_f64())
        } else {
            String::new()
        },
        profile.merged().samples.len()
    );
    if kind.is_sampled(snapshot) && matches!(kind, ProfileKind::Heap | ProfileKind::Allocs) {
        let _ = writeln!(
            out,
            "estimates from one sample per {} allocated on average",
            units::format_bytes(snapshot.sample_rate)
        );
    }
    out.push('\n');
    match profile.samples_text(None, 0) {
        Ok(text) if text.is_empty() => out.push_str("(no samples yet)\n"),
        Ok(text) => out.push_str(&text),
        Err(e) => {
            let _ = writeln!(out, "{e}");
        }
    }
    out
}

/// Why the server could not start.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The accept thread could not be spawned.
    #[error("cannot spawn the tracing-prof HTTP thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// An environment variable is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

// `fn main() -> Result<(), Box<dyn Error>>` prints an error it returns with `Debug`: the
// message, not the variant's structure, is what the user must read.
impl std::fmt::Debug for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// A standalone `/debug/pprof` server; stops when dropped.
#[derive(Debug)]
pub struct HttpServer {
    /// The address listened on, once listening.
    addr: Arc<OnceLock<SocketAddr>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Where a server from [`HttpServer::from_env`] reports its state.
    profiler: Option<Profiler>,
}

impl HttpServer {
    /// Serves `handler` on `addr` (e.g. `"127.0.0.1:6060"`; port 0 picks a free port). An
    /// address that cannot be listened on is an error ([`HttpServer::from_env`] tries again
    /// in the background instead).
    pub fn start(
        handler: PprofHandler,
        addr: impl ToSocketAddrs + std::fmt::Display,
    ) -> Result<HttpServer, HttpError> {
        let listener = TcpListener::bind(&addr).map_err(|source| HttpError::Bind {
            addr: addr.to_string(),
            source,
        })?;
        HttpServer::spawn(handler, Ok(listener), addr.to_string(), None)
    }

    /// The server's thread: serves `listener`, or, when binding failed, tries `addr` again
    /// every [`BIND_RETRY`] until it can (reporting to `profiler`), then serves.
    fn spawn(
        handler: PprofHandler,
        listener: std::io::Result<TcpListener>,
        addr: String,
        profiler: Option<Profiler>,
    ) -> Result<HttpServer, HttpError> {
        // What was said of a failed bind at start, so that a retry says only what differs.
        let said = match &listener {
            Err(source) => cannot_listen(&addr, source),
            Ok(_) => String::new(),
        };
        let bound = Arc::new(OnceLock::new());
        let stop = Arc::new(AtomicBool::new(false));
        let listener = match listener {
            Ok(l) => {
                let local = l.local_addr().map_err(|source| HttpError::Bind {
                    addr: addr.clone(),
                    source,
                })?;
                let _ = bound.set(local);
                Some(l)
            }
            Err(_) => None,
        };
        let reports_to = profiler.clone();
        let thread = {
            let (bound, stop) = (Arc::clone(&bound), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("tracing-prof-http".into())
                .spawn(move || {
                    let listener = match listener {
                        Some(l) => l,
                        None => match bind_again(&addr, &stop, profiler.as_ref(), said) {
                            Some(l) => l,
                            None => return, // stopped before it could listen
                        },
                    };
                    if let Ok(local) = listener.local_addr() {
                        let _ = bound.set(local);
                    }
                    // A drop that came while it was binding found no address to wake it
                    // with: it set `stop` first, and is told here (both SeqCst).
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    accept_loop(&listener, &handler, &stop);
                })
                .map_err(HttpError::Spawn)?
        };
        Ok(HttpServer {
            addr: bound,
            stop,
            thread: Some(thread),
            profiler: reports_to,
        })
    }

    /// Starts a server if `TRACING_PROF_HTTP_ADDR` is set (`default` means
    /// [`DEFAULT_HTTP_ADDR`]), requiring `TRACING_PROF_HTTP_TOKEN` as a bearer token if that is
    /// set. A bad setting is an error. An address that cannot be listened on now (a port
    /// another process holds) is not: it is said once on stderr, the server tries again every
    /// [`BIND_RETRY`] in the background, and its state is in
    /// [`Profiler::services`](tracing_prof_core::Profiler::services) and on the index page of
    /// any other `/debug/pprof` mount; `TRACING_PROF_HTTP_REQUIRED=1` makes it an error.
    pub fn from_env(profiler: &Profiler) -> Result<Option<HttpServer>, HttpError> {
        let Some(addr) = env_var(ENV_HTTP_ADDR, |s| Ok(s.to_owned()))? else {
            return Ok(None);
        };
        let addr = if addr == "default" {
            DEFAULT_HTTP_ADDR.to_owned()
        } else {
            addr
        };
        let mut handler = PprofHandler::new(profiler.clone());
        let token = env_var(ENV_HTTP_TOKEN, |s| Ok(s.to_owned()))?;
        let public =
            env_var(ENV_HTTP_ALLOW_PUBLIC, tracing_prof_core::config::parse_bool)?.unwrap_or(false);
        let required =
            env_var(ENV_HTTP_REQUIRED, tracing_prof_core::config::parse_bool)?.unwrap_or(false);
        let resolved: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| ConfigError::Env {
                name: ENV_HTTP_ADDR,
                value: addr.clone(),
                reason: format!("not an address to listen on: {e}"),
            })?
            .collect();
        if token.is_none() && !public && resolved.iter().any(|a| !a.ip().is_loopback()) {
            return Err(ConfigError::Env {
                name: ENV_HTTP_ADDR,
                value: addr,
                reason: format!(
                    "not a loopback address, and no {ENV_HTTP_TOKEN}: anyone who can reach it \
                     could read the profiles; set a token, or {ENV_HTTP_ALLOW_PUBLIC}=1 to serve \
                     without one"
                ),
            }
            .into());
        }
        if let Some(token) = token {
            handler = handler.bearer_token(token);
        }
        let listener = TcpListener::bind(addr.as_str());
        match &listener {
            Ok(l) => profiler.set_service_status(ServiceStatus::new(
                SERVICE_NAME,
                true,
                format!(
                    "listening on {}",
                    l.local_addr().map_or(addr.clone(), |a| a.to_string())
                ),
            )),
            Err(source) if required => {
                return Err(ConfigError::Env {
                    name: ENV_HTTP_ADDR,
                    value: addr.clone(),
                    reason: format!("cannot listen there: {source} ({ENV_HTTP_REQUIRED} is set)"),
                }
                .into());
            }
            Err(source) => {
                let why = cannot_listen(&addr, source);
                eprintln!(
                    "tracing-prof: {why}; the service runs without /debug/pprof until it can \
                     ({ENV_HTTP_REQUIRED}=1 makes this an error at start)"
                );
                profiler.set_service_status(ServiceStatus::new(SERVICE_NAME, false, why));
            }
        }
        HttpServer::spawn(handler, listener, addr, Some(profiler.clone())).map(Some)
    }

    /// The address listened on; `None` while a server from [`HttpServer::from_env`] is still
    /// trying to listen.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.addr.get().copied()
    }
}

/// The reason a server could not listen on `addr`, and when it tries again.
fn cannot_listen(addr: &str, source: &std::io::Error) -> String {
    format!(
        "cannot listen on {addr} for /debug/pprof: {source}; trying again every {} s",
        BIND_RETRY.as_secs()
    )
}

/// Tries to listen on `addr` every [`BIND_RETRY`] until it can (`Some`) or `stop` is set
/// (`None`). Says on stderr, once per distinct error and once when it listens at last.
fn bind_again(
    addr: &str,
    stop: &AtomicBool,
    profiler: Option<&Profiler>,
    mut said: String,
) -> Option<TcpListener> {
    // The profiler's own thread, from its first allocation.
    tracing_prof_core::mark_profiler_thread();
    loop {
        let deadline = Instant::now() + BIND_RETRY;
        while Instant::now() < deadline {
            if stop.load(Ordering::SeqCst) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        match TcpListener::bind(addr) {
            Ok(l) => {
                let at = l.local_addr().map_or(addr.to_owned(), |a| a.to_string());
                eprintln!("tracing-prof: /debug/pprof listening on {at} now");
                if let Some(p) = profiler {
                    p.set_service_status(ServiceStatus::new(
                        SERVICE_NAME,
                        true,
                        format!("listening on {at}"),
                    ));
                }
                return Some(l);
            }
            Err(e) => {
                let why = cannot_listen(addr, &e);
                if why != said {
                    eprintln!("tracing-prof: {why}");
                }
                if let Some(p) = profiler {
                    p.set_service_status(ServiceStatus::new(SERVICE_NAME, false, why.clone()));
                }
                said = why;
            }
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a connection of our own (a server still trying to
        // listen sees the flag within 50 ms).
        if let Some(addr) = self.addr.get() {
            let _ = TcpStream::connect_timeout(addr, Duration::from_secs(1));
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(p) = &self.profiler {
            p.remove_service(SERVICE_NAME);
        }
    }
}

fn accept_loop(listener: &TcpListener, handler: &PprofHandler, stop: &AtomicBool) {
    // This thread's and its connection threads' memory is the profiler's own.
    tracing_prof_core::mark_profiler_thread();
    let pending = Arc::new(AtomicUsize::new(0));
    let active = Arc::new(AtomicUsize::new(0));
    // Refusals are answered on a thread of their own, one at a time: the accept loop never
    // waits. The thread ends when this loop does (the channel closes).
    let refusals = {
        let (tx, rx) = crossbeam_channel::bounded::<TcpStream>(MAX_REFUSING);
        std::thread::Builder::new()
            .name("tracing-prof-http-refuse".into())
            .spawn(move || {
                tracing_prof_core::mark_profiler_thread();
                for stream in rx {
                    refuse(stream);
                }
            })
            .ok()
            .map(|_| tx)
    };
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else {
            // Out of file descriptors, say: back off instead of spinning on accept.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        if pending.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING {
            pending.fetch_sub(1, Ordering::SeqCst);
            // Past MAX_REFUSING waiting for their 503 too, or with no refusing thread: closed.
            if let Some(refusals) = &refusals {
                let _ = refusals.try_send(stream);
            }
            continue;
        }
        let (handler, pending_c, active_c) =
            (handler.clone(), Arc::clone(&pending), Arc::clone(&active));
        let spawned = std::thread::Builder::new()
            .name("tracing-prof-http-conn".into())
            .spawn(move || {
                tracing_prof_core::mark_profiler_thread();
                serve(stream, &handler, &pending_c, &active_c);
            });
        if spawned.is_err() {
            pending.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// `503` with `Retry-After`.
fn busy() -> HttpResponse {
    let mut r = HttpResponse::text(503, "too many requests at once; try again\n");
    r.headers.push(("Retry-After", "1".into()));
    r
}

/// Past [`MAX_PENDING`], on the refusing thread: waits up to [`REFUSE_WAIT`] for the request
/// head (closing with unread input makes the kernel answer with a reset, not the `503`; a
/// client that connected a moment ago may not have sent it yet), answers `503`, then gives the
/// client as long again to read it and close first.
fn refuse(mut stream: TcpStream) {
    let _ = read_head(&mut stream, REFUSE_WAIT);
    let _ = stream.set_write_timeout(Some(REFUSE_WAIT));
    let _ = write_response(&mut stream, &busy(), false);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + REFUSE_WAIT;
    let mut buf = [0u8; 1024];
    while let Some(left) = time_left(deadline)
        && stream.set_read_timeout(Some(left)).is_ok()
        && matches!(stream.read(&mut buf), Ok(n) if n > 0)
    {}
}

/// The time until `deadline`, if any is left.
fn time_left(deadline: Instant) -> Option<Duration> {
    Some(deadline.saturating_duration_since(Instant::now())).filter(|d| !d.is_zero())
}

/// One request on one connection, then close.
fn serve(
    mut stream: TcpStream,
    handler: &PprofHandler,
    pending: &AtomicUsize,
    active: &AtomicUsize,
) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let head = read_head(&mut stream, READ_TIMEOUT);
    pending.fetch_sub(1, Ordering::SeqCst);
    let response = match head {
        Ok(head) => match parse_head(&head) {
            Some((method, target, auth)) => {
                if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                    active.fetch_sub(1, Ordering::SeqCst);
                    busy()
                } else {
                    let head_only = method == "HEAD";
                    let r = handler.handle(method, target, auth);
                    let _ = write_response(&mut stream, &r, head_only);
                    active.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
            }
            None => HttpResponse::text(400, "malformed request\n"),
        },
        Err(HeadError::TooLarge) => HttpResponse::text(431, "request head too large\n"),
        Err(HeadError::Io) => return, // timed out or closed: nothing to answer
    };
    let _ = write_response(&mut stream, &response, false);
    // Closing with unread input makes the kernel send a reset that can destroy the answer in
    // flight: stop writing, then drain a bounded amount for a short while before closing.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let _ = std::io::copy(&mut (&mut stream).take(1 << 20), &mut std::io::sink());
}

enum HeadError {
    TooLarge,
    Io,
}

/// Reads up to the blank line ending the head, within `within` in total.
fn read_head(stream: &mut TcpStream, within: Duration) -> Result<Vec<u8>, HeadError> {
    let deadline = Instant::now() + within;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
        let Some(left) = time_left(deadline) else {
            return Err(HeadError::Io);
        };
        if stream.set_read_timeout(Some(left)).is_err() {
            return Err(HeadError::Io);
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return Err(HeadError::Io),
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Ok(head)
}

/// `(method, target, Authorization)` from a request head.
fn parse_head(head: &[u8]) -> Option<(&str, &str, Option<&str>)> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let mut request = lines.next()?.split(' ');
    let (method, target, version) = (request.next()?, request.next()?, request.next()?);
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return None;
    }
    let auth = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.trim());
    Some((method, target, auth))
}

fn write_response(
    stream: &mut TcpStream,
    r: &HttpResponse,
    head_only: bool,
) -> std::io::Result<()> {
    let reason = match r.status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    };
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        r.status,
        r.content_type,
        r.body.len()
    );
    for (k, v) in &r.headers {
        let _ = write!(head, "{k}: {v}\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    if !head_only {
        stream.write_all(&r.body)?;
    }
    stream.flush()
}

/// `/debug/pprof` as an axum [`Router`](axum::Router), to merge into your own:
/// `app.merge(axum_router(handler))`. Requests run on tokio's blocking pool, since `?seconds=N`
/// waits. Behind the `axum` feature.
///
/// # Examples
/// ```no_run
/// # async fn serve(guard: tracing_prof_core::ProfilerGuard) -> std::io::Result<()> {
/// use tracing_prof_export::http::{PprofHandler, axum_router};
/// let app = axum::Router::new().merge(axum_router(PprofHandler::new(guard.profiler().clone())));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// axum::serve(listener, app).await
/// # }
/// ```
#[cfg(feature = "axum")]
pub fn axum_router(handler: PprofHandler) -> axum::Router {
    use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
    use axum::response::{IntoResponse, Response};

    let serve = move |method: Method, uri: Uri, headers: HeaderMap| {
        let handler = handler.clone();
        async move {
            let auth = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let target = uri
                .path_and_query()
                .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned());
            let answer = tokio::task::spawn_blocking(move || {
                handler.handle(method.as_str(), &target, auth.as_deref())
            })
            .await
            .unwrap_or_else(|e| {
                HttpResponse::text(500, format!("the pprof handler failed: {e}\n"))
            });
            let mut response: Response = answer.body.into_response();
            *response.status_mut() =
                StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let h = response.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(answer.content_type),
            );
            for (k, v) in answer.headers {
                if let Ok(v) = HeaderValue::from_str(&v) {
                    h.insert(HeaderName::from_static(static_lower(k)), v);
                }
            }
            response
        }
    };
    axum::Router::new()
        .route("/debug/pprof", axum::routing::any(serve.clone()))
        .route("/debug/pprof/", axum::routing::any(serve.clone()))
        .route("/debug/pprof/{*rest}", axum::routing::any(serve))
}

/// The header names [`PprofHandler`] uses, lower-cased as `HeaderName::from_static` requires.
#[cfg(feature = "axum")]
fn static_lower(name: &'static str) -> &'static str {
    match name {
        "WWW-Authenticate" => "www-authenticate",
        "Allow" => "allow",
        "Content-Disposition" => "content-disposition",
        _ => "x-tracing-prof",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One profiler runs at a time in a process: tests that build one take turns.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// The turn first: bound first, it is dropped last, after the guard.
    fn handler() -> (
        std::sync::MutexGuard<'static, ()>,
        PprofHandler,
        tracing_prof_core::ProfilerGuard,
    ) {
        let serial = SERIAL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (_layer, guard) = tracing_prof_core::Profiler::builder().build().unwrap();
        (
            serial,
            PprofHandler::new(guard.profiler().clone()).max_seconds(5),
            guard,
        )
    }

    #[test]
    fn live_answers_a_window_frame_with_the_state() {
        let (_serial, h, _guard) = handler();
        h.profiler.pause();
        let r = h.handle("GET", "/debug/pprof/live", None);
        h.profiler.resume();
        assert_eq!(r.status, 200);
        assert!(r.headers.iter().any(|(_, v)| v.contains("live.bin")));
        let frame = LiveFrame::decode(&r.body).unwrap();
        assert!(frame.paused);
        let d = frame.duration.as_secs_f64();
        assert!((0.9..2.0).contains(&d), "a window of 1 s, not {d} s");
        for kind in [
            ProfileKind::Spans,
            ProfileKind::SpanMemory,
            ProfileKind::Threads,
        ] {
            assert!(frame.profile(kind).is_some(), "{kind:?}");
        }
        assert_eq!(
            h.handle("GET", "/debug/pprof/live?seconds=6", None).status,
            400
        );
    }

    #[test]
    fn methods_paths_and_queries() {
        let (_serial, h, _guard) = handler();
        let get = |target: &str| h.handle("GET", target, None);
        assert_eq!(get("/debug/pprof/").status, 200);
        assert_eq!(get("/debug/pprof").content_type, "text/html; charset=utf-8");
        let running = String::from_utf8(get("/debug/pprof/").body).unwrap();
        assert!(running.contains("Profiling is running."), "{running}");
        h.profiler.pause();
        let paused = String::from_utf8(get("/debug/pprof/").body).unwrap();
        assert!(paused.contains("Profiling is paused"), "{paused}");
        h.profiler.resume();
        let heap = get("/debug/pprof/heap");
        assert_eq!(
            (heap.status, heap.content_type),
            (200, "application/octet-stream")
        );
        assert_eq!(&heap.body[..2], &[0x1f, 0x8b], "gzip'd pprof");
        assert!(
            heap.headers
                .iter()
                .any(|(k, v)| *k == "Content-Disposition" && v.contains("heap.pb.gz"))
        );
        assert_eq!(h.handle("HEAD", "/debug/pprof/heap", None).status, 200);
        let post = h.handle("POST", "/debug/pprof/heap", None);
        assert_eq!(post.status, 405);
        assert!(post.headers.contains(&("Allow", "GET, HEAD".to_owned())));
        for bad in ["seconds=0", "seconds=6", "seconds=x", "seconds="] {
            assert_eq!(
                get(&format!("/debug/pprof/heap?{bad}")).status,
                400,
                "{bad}"
            );
        }
        assert_eq!(get("/debug/pprof/goroutine").status, 200);
        assert!(
            String::from_utf8_lossy(&get("/debug/pprof/goroutine?debug=1").body)
                .starts_with("open spans: total ")
        );
        let cmdline = get("/debug/pprof/cmdline");
        assert!(!cmdline.body.is_empty() && !cmdline.body.ends_with(b"\0"));
        for path in ["/debug/pprof/symbol", "/debug/pprof/trace"] {
            let r = get(path);
            assert_eq!(r.status, 404);
            assert!(r.body.len() > 60, "a reason, not a bare 404");
        }
        assert_eq!(get("/debug/pprof/nothing").status, 404);
        assert_eq!(get("/elsewhere").status, 404);
        // Parameters Go's tools send are accepted and ignored.
        assert_eq!(
            get("/debug/pprof/heap?gc=1&sample_index=inuse_space").status,
            200
        );
        let table = get("/debug/pprof/spans?debug=1");
        assert!(
            String::from_utf8(table.body)
                .unwrap()
                .starts_with("tracing-prof spans profile")
        );
    }

    #[test]
    fn the_token_is_required_and_never_echoed() {
        let (_serial, h, _guard) = handler();
        let h = h.bearer_token("s3cret");
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("Basic s3cret"),
            Some("Bearer s3cre"),
            Some("Bearer s3cret "),
        ] {
            let r = h.handle("GET", "/debug/pprof/heap", auth);
            assert_eq!(r.status, 401, "{auth:?}");
            assert!(!String::from_utf8_lossy(&r.body).contains("s3cret"));
        }
        assert_eq!(
            h.handle("GET", "/debug/pprof/heap", Some("Bearer s3cret"))
                .status,
            200
        );
        assert!(!format!("{h:?}").contains("s3cret"));
    }

    #[test]
    fn request_heads_are_parsed_strictly() {
        let head =
            b"GET /debug/pprof/heap?debug=1 HTTP/1.1\r\nHost: x\r\nauthorization: Bearer t\r\n\r\n";
        assert_eq!(
            parse_head(head),
            Some(("GET", "/debug/pprof/heap?debug=1", Some("Bearer t")))
        );
        assert_eq!(
            parse_head(b"GET /x HTTP/1.0\r\n\r\n"),
            Some(("GET", "/x", None))
        );
        assert_eq!(
            parse_head(b"GET x HTTP/1.1\r\n\r\n"),
            None,
            "a target must be a path"
        );
        assert_eq!(parse_head(b"GET /x SPDY/3\r\n\r\n"), None);
        assert_eq!(parse_head(b"\xff\xfe\r\n\r\n"), None);
        assert_eq!(parse_head(b"GET\r\n\r\n"), None);
    }
}
