//! [`PprofHandler`]: a request in, an [`HttpResponse`] out; no sockets.

use super::pages::{index, text_table};
use super::{DEFAULT_MAX_SECONDS, DEFAULT_PROFILE_SECONDS, MAX_WINDOWS};
use crate::metrics::{Format, SpanMetrics};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tracing_prof_core::Profiler;
use tracing_prof_model::{LiveFrame, ProfileKind, Snapshot};

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
    pub(super) fn text(status: u16, body: impl Into<String>) -> Self {
        let body = body.into().into_bytes();
        HttpResponse {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body,
        }
    }

    /// A gzip'd pprof `body`, offered as `{name}.pb.gz`.
    pub(super) fn pprof(name: &str, body: Vec<u8>) -> Self {
        Self::file(&format!("{name}.pb.gz"), body)
    }

    /// Binary `body`, offered as `file_name`.
    pub(super) fn file(file_name: &str, body: Vec<u8>) -> Self {
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
    /// `/metrics`: which paths have histograms, shared by the handler's clones.
    metrics: Arc<SpanMetrics>,
    /// Answers `/metrics` only (a metrics listener: profiles are not served).
    only_metrics: bool,
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
            metrics: Arc::new(SpanMetrics::new()),
            only_metrics: false,
        }
    }

    /// Answers `/metrics` only; every other path is `404`: for a listener that Prometheus
    /// scrapes on an address where the profiles must not be served.
    pub fn metrics_only(mut self) -> Self {
        self.only_metrics = true;
        self
    }

    /// What it serves, as messages name it: `/metrics` for [`metrics_only`](Self::metrics_only),
    /// `/debug/pprof` otherwise.
    pub fn serves(&self) -> &'static str {
        if self.only_metrics {
            "/metrics"
        } else {
            "/debug/pprof"
        }
    }

    /// How `/metrics` is encoded: which span paths get latency histograms, which buckets
    /// (default [`SpanMetrics::new`]).
    pub fn span_metrics(mut self, metrics: SpanMetrics) -> Self {
        self.metrics = Arc::new(metrics);
        self
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
    ///
    /// What answering allocates, and the CPU samples taken in it, count under `(tracing-prof)`,
    /// whichever thread calls it (see [`tracing_prof_core::as_profiler`]).
    pub fn handle(
        &self,
        method: &str,
        path_and_query: &str,
        authorization: Option<&str>,
    ) -> HttpResponse {
        tracing_prof_core::as_profiler(|| self.answer(method, path_and_query, authorization, None))
    }

    /// Answers one request from its head, as `http` (hyper, axum) has it: its method, target
    /// and headers. Blocks like [`handle`](Self::handle).
    pub fn handle_request(&self, head: &http::request::Parts) -> HttpResponse {
        let target = head
            .uri
            .path_and_query()
            .map_or_else(|| head.uri.path(), |p| p.as_str());
        let header = |name| head.headers.get(name).and_then(|v| v.to_str().ok());
        let (authorization, accept) = (
            header(http::header::AUTHORIZATION),
            header(http::header::ACCEPT),
        );
        tracing_prof_core::as_profiler(|| {
            self.answer(head.method.as_str(), target, authorization, accept)
        })
    }

    fn answer(
        &self,
        method: &str,
        path_and_query: &str,
        authorization: Option<&str>,
        accept: Option<&str>,
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
        if path == "/metrics" {
            return self.metrics(Format::from_accept(accept));
        }
        if self.only_metrics {
            return HttpResponse::text(404, "this listener serves /metrics only\n");
        }
        let mut seconds = None;
        let mut debug = false;
        let mut every = false;
        let mut peak = false;
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
                "peak" => peak = v != "0",
                _ => {} // gc=, sample_index= and the like: accepted and ignored, as Go does
            }
        }
        let kind = match path.trim_end_matches('/') {
            "/debug/pprof" => return index(&self.profiler),
            "/debug/pprof/goroutine" => return self.goroutine(debug, every),
            "/debug/pprof/cmdline" => return cmdline(),
            "/debug/pprof/flightrecorder" => return self.flight_recording(),
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
        if peak {
            if !crate::files::PEAK_KINDS.contains(&kind) || seconds.is_some() {
                return HttpResponse::text(
                    400,
                    "peak=1 is for /debug/pprof/heap and /debug/pprof/span_memory, without \
                     seconds=\n",
                );
            }
            let Some(at_peak) = self.profiler.peak() else {
                return HttpResponse::text(
                    404,
                    "no peak read yet: the heap is read for its peak every 100 ms by default \
                     (TRACING_PROF_PEAK_EVERY; off here?), once something is allocated\n",
                );
            };
            if debug {
                return HttpResponse::text(200, text_table(&at_peak, kind));
            }
            return HttpResponse::pprof(kind.name(), at_peak.encode(kind));
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
        HttpResponse::pprof(kind.name(), profile.encode(kind))
    }

    /// `/debug/pprof/flightrecorder`: the flight recorder's windows as a tar.gz
    /// (`flightrecorder/END/KIND.pb.gz`); `404` while it holds none.
    fn flight_recording(&self) -> HttpResponse {
        let files = self.profiler.flight_recording();
        if files.is_empty() {
            return HttpResponse::text(
                404,
                "the flight recorder holds no window yet (one per export after the first), or \
                 is off (TRACING_PROF_FLIGHT_RECORDER)\n",
            );
        }
        match flight_tar(&files) {
            Ok(body) => {
                let mut r = HttpResponse::file("flightrecorder.tar.gz", body);
                r.content_type = "application/gzip";
                r
            }
            Err(e) => HttpResponse::text(500, format!("cannot build the archive: {e}\n")),
        }
    }

    /// `/metrics`: the span paths' counters read now, and the profiler's health.
    fn metrics(&self, format: Format) -> HttpResponse {
        let snapshot = self.profiler.paths_snapshot();
        let stats = self.profiler.stats();
        let slow = self.profiler.slow_spans();
        let body = self.metrics.encode(&snapshot, Some(&stats), slow, format);
        HttpResponse {
            status: 200,
            content_type: format.content_type(),
            headers: Vec::new(),
            body: body.into_bytes(),
        }
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

/// `files` as a gzip'd tar, each under `flightrecorder/`, read-only for everyone, stamped
/// with the time it is made.
fn flight_tar(files: &[tracing_prof_core::FlightFile]) -> std::io::Result<Vec<u8>> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for (name, bytes) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o444);
        header.set_mtime(now);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, format!("flightrecorder/{name}"), &bytes[..])?;
    }
    tar.into_inner()?.finish()
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
}
