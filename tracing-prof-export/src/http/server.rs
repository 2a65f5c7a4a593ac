//! [`HttpServer`]: the standalone server, hyper's HTTP/1 on a current-thread tokio runtime of
//! its own thread (`tprof-http`): a fixed number of threads whatever the connections, each
//! request answered on a bounded pool of the profiler's own (`tprof-http-work`, at most
//! [`MAX_CONNECTIONS`]), never on the application's runtime.
//!
//! Every connection has an absolute deadline: [`READ_TIMEOUT`] for its request head (hyper's
//! header timeout, and ours from the accept, for a client that sends nothing at all), then none
//! while its answer is made (a window is bounded by its `seconds`), then [`WRITE_TIMEOUT`] for
//! the answer to be taken. At most [`MAX_OPEN`] connections are open; a new one past that
//! closes the oldest that has not sent its request yet (an idle or slow client; one accepted
//! less than a second ago only when nothing else can go), else the oldest still taking its
//! answer (a slow reader), as nginx and Go's servers reclaim idle
//! connections, so that `go tool pprof`'s request, which arrives whole at once, is answered
//! under any number of slow ones. A request identical to one being answered shares its answer
//! (see `coalesce`). Past [`MAX_CONNECTIONS`] answers being made at once (each holds its permit
//! until its handler returns, even if its client has gone) a request gets `503` with
//! `Retry-After`.

use super::coalesce::{Answering, to_http};
use super::handler::{HttpResponse, PprofHandler};
use super::{
    BIND_RETRY, ENV_HTTP_REQUIRED, MAX_CONNECTIONS, MAX_HEAD_BYTES, MAX_OPEN, READ_TIMEOUT,
    WRITE_TIMEOUT,
};
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing_prof_core::config::ConfigError;
use tracing_prof_core::{Profiler, ServiceStatus};

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

/// A listener that serves `/metrics` only (see [`MetricsServer::from_env`]); stops when
/// dropped. Its own type, so that a guard holds it beside the `/debug/pprof` server.
#[derive(Debug)]
pub struct MetricsServer(pub HttpServer);

impl MetricsServer {
    /// The address listened on; `None` while it is still trying to listen.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.0.local_addr()
    }
}

/// A standalone `/debug/pprof` server; stops when dropped.
#[derive(Debug)]
pub struct HttpServer {
    /// The address listened on, once listening.
    addr: Arc<OnceLock<SocketAddr>>,
    stop: Arc<Stop>,
    thread: Option<JoinHandle<()>>,
    /// Where a server from [`HttpServer::from_env`] reports its state.
    profiler: Option<Profiler>,
    /// What it serves, as services and messages name it: `/debug/pprof` or `/metrics`.
    name: &'static str,
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
        let name = handler.serves();
        // What was said of a failed bind at start, so that a retry says only what differs.
        let said = match &listener {
            Err(source) => cannot_listen(&addr, source, name),
            Ok(_) => String::new(),
        };
        let bound = Arc::new(OnceLock::new());
        let stop = Arc::new(Stop::default());
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
            tracing_prof_core::spawn_profiler_thread("tprof-http", move || {
                let listener = match listener {
                    Some(l) => l,
                    None => match bind_again(&addr, &stop.flag, profiler.as_ref(), said, name) {
                        Some(l) => l,
                        None => return, // stopped before it could listen
                    },
                };
                if let Ok(local) = listener.local_addr() {
                    let _ = bound.set(local);
                }
                // A drop that came while it was binding is seen here (it set the flag first,
                // and its notification is kept for the loop otherwise).
                if stop.flag.load(Ordering::SeqCst) {
                    return;
                }
                serve(listener, handler, &stop);
            })
            .map_err(HttpError::Spawn)?
        };
        Ok(HttpServer {
            addr: bound,
            stop,
            thread: Some(thread),
            profiler: reports_to,
            name,
        })
    }

    /// A server as the environment's settings say (see `crate::env`'s `HttpServer::from_env`).
    pub(crate) fn from_settings(
        profiler: &Profiler,
        settings: HttpSettings,
    ) -> Result<HttpServer, HttpError> {
        let (addr, required) = (settings.addr, settings.required);
        let mut handler = PprofHandler::new(profiler.clone()).span_metrics(settings.metrics);
        if settings.metrics_only {
            handler = handler.metrics_only();
        }
        let name = handler.serves();
        if let Some(token) = settings.token {
            handler = handler.bearer_token(token);
        }
        let listener = TcpListener::bind(addr.as_str());
        match &listener {
            Ok(l) => profiler.set_service_status(ServiceStatus::new(
                format!("{name} server"),
                true,
                format!(
                    "listening on {}",
                    l.local_addr().map_or(addr.clone(), |a| a.to_string())
                ),
            )),
            Err(source) if required => {
                return Err(ConfigError::Env {
                    name: settings.var,
                    value: addr.clone(),
                    reason: format!("cannot listen there: {source} ({ENV_HTTP_REQUIRED} is set)"),
                }
                .into());
            }
            Err(source) => {
                let why = cannot_listen(&addr, source, name);
                eprintln!(
                    "tracing-prof: {why}; the service runs without {name} until it can \
                     ({ENV_HTTP_REQUIRED}=1 makes this an error at start)"
                );
                profiler.set_service_status(ServiceStatus::new(
                    format!("{name} server"),
                    false,
                    why,
                ));
            }
        }
        HttpServer::spawn(handler, listener, addr, Some(profiler.clone()))
    }

    /// The address listened on; `None` while a server from [`HttpServer::from_env`] is still
    /// trying to listen.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.addr.get().copied()
    }
}

/// The reason a server could not listen on `addr`, and when it tries again.
fn cannot_listen(addr: &str, source: &std::io::Error, name: &str) -> String {
    format!(
        "cannot listen on {addr} for {name}: {source}; trying again every {} s",
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
    name: &'static str,
) -> Option<TcpListener> {
    loop {
        let deadline = std::time::Instant::now() + BIND_RETRY;
        while std::time::Instant::now() < deadline {
            if stop.load(Ordering::SeqCst) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        match TcpListener::bind(addr) {
            Ok(l) => {
                let at = l.local_addr().map_or(addr.to_owned(), |a| a.to_string());
                eprintln!("tracing-prof: {name} listening on {at} now");
                if let Some(p) = profiler {
                    p.set_service_status(ServiceStatus::new(
                        format!("{name} server"),
                        true,
                        format!("listening on {at}"),
                    ));
                }
                return Some(l);
            }
            Err(e) => {
                let why = cannot_listen(addr, &e, name);
                if why != said {
                    eprintln!("tracing-prof: {why}");
                }
                if let Some(p) = profiler {
                    p.set_service_status(ServiceStatus::new(
                        format!("{name} server"),
                        false,
                        why.clone(),
                    ));
                }
                said = why;
            }
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.flag.store(true, Ordering::SeqCst);
        // Wakes the accept loop (a permit is kept if it is not waiting yet); a server still
        // trying to listen sees the flag within 50 ms.
        self.stop.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(p) = &self.profiler {
            p.remove_service(&format!("{} server", self.name));
        }
    }
}

/// How a server is told to stop: a flag for the thread while it binds, a wake-up for the loop.
#[derive(Debug, Default)]
struct Stop {
    flag: AtomicBool,
    wake: Notify,
}

/// Runs the server on this thread until `stop`: a current-thread runtime whose blocking pool
/// (where requests are answered) has at most [`MAX_CONNECTIONS`] threads, all the profiler's.
fn serve(listener: TcpListener, handler: PprofHandler, stop: &Stop) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(MAX_CONNECTIONS)
        .thread_name("tprof-http-work")
        .on_thread_start(tracing_prof_core::mark_profiler_thread)
        .build();
    let listener = listener.set_nonblocking(true).map(|()| listener);
    let (runtime, listener) = match (runtime, listener) {
        (Ok(r), Ok(l)) => (r, l),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("tracing-prof: {} cannot run: {e}", handler.serves());
            return;
        }
    };
    runtime.block_on(async {
        match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => accept_loop(listener, handler, stop).await,
            Err(e) => eprintln!("tracing-prof: {} cannot run: {e}", handler.serves()),
        }
    });
    // Open connections close now; an answer still being made (a window) ends on its own.
    runtime.shutdown_timeout(Duration::from_millis(100));
}

/// What the connections share: the open ones, oldest first, and the answers being made (a
/// permit each, held until the handler returns, whatever became of its connection).
struct Connections {
    open: Mutex<BTreeMap<u64, Arc<Connection>>>,
    /// The answers being made.
    answering: Answering,
}

/// Where a connection is: its request head is still coming; it is being answered; its answer
/// is made and being taken (or it is lingering).
const WAITING: u8 = 0;
const WORKING: u8 = 1;
const WRITING: u8 = 2;

/// One open connection.
struct Connection {
    /// [`WAITING`], [`WORKING`] or [`WRITING`]: a new connection past [`MAX_OPEN`] closes the
    /// oldest waiting one, else the oldest writing one; never one being answered.
    phase: AtomicU8,
    /// When it is closed, whatever it is doing; moved by the answer's phases (`moved`).
    deadline: Mutex<Instant>,
    moved: Notify,
    /// Closed to make room (`evicted` wakes it; a notification sent before it waits is kept).
    closed: AtomicBool,
    evicted: Notify,
    /// When it was accepted: one still sending its head is closed to make room only once it
    /// is [`GRACE`] old, while any other can be closed instead.
    accepted: Instant,
}

/// How long a new connection has to have its request head read before it may be closed to
/// make room for another, while an older one waiting, or one taking its answer or lingering
/// after it, can be closed instead. Without it, under 1000 connections that drip after their
/// `400` (each new one closing the oldest waiting), a normal request accepted a moment before
/// the next attacker was closed before its head was read, about one run in five of the attack
/// test on 2 busy cores: a reset, where the README promises none.
const GRACE: Duration = Duration::from_secs(1);

impl Connection {
    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enters `phase`, to be closed at `deadline`.
    fn enter(&self, phase: u8, deadline: Instant) {
        self.phase.store(phase, Ordering::SeqCst);
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) = deadline;
        self.moved.notify_one();
    }
}

impl Connections {
    fn new() -> Self {
        Connections {
            open: Mutex::new(BTreeMap::new()),
            answering: Answering::default(),
        }
    }

    /// Registers a new connection as `id`, closing one to make room when [`MAX_OPEN`] are
    /// open: the oldest still sending its request after [`GRACE`], else the oldest taking its
    /// answer (or lingering after it), else the oldest still sending its request; `None` when
    /// every open one is being answered.
    fn admit(&self, id: u64) -> Option<Arc<Connection>> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if open.len() >= MAX_OPEN {
            let oldest_in = |phase: u8, grace: Duration| {
                open.iter()
                    .find(|(_, c)| {
                        c.phase.load(Ordering::SeqCst) == phase
                            && now.saturating_duration_since(c.accepted) >= grace
                    })
                    .map(|(&id, _)| id)
            };
            let victim = oldest_in(WAITING, GRACE)
                .or_else(|| oldest_in(WRITING, Duration::ZERO))
                .or_else(|| oldest_in(WAITING, Duration::ZERO))?;
            if let Some(c) = open.remove(&victim) {
                c.closed.store(true, Ordering::SeqCst);
                c.evicted.notify_one();
            }
        }
        let c = Arc::new(Connection {
            phase: AtomicU8::new(WAITING),
            deadline: Mutex::new(now + READ_TIMEOUT),
            moved: Notify::new(),
            closed: AtomicBool::new(false),
            evicted: Notify::new(),
            accepted: now,
        });
        open.insert(id, Arc::clone(&c));
        Some(c)
    }

    fn close(&self, id: u64) {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, handler: PprofHandler, stop: &Stop) {
    let connections = Arc::new(Connections::new());
    for id in 0u64.. {
        let accepted = tokio::select! {
            () = stop.wake.notified() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            // Out of file descriptors, say: back off instead of spinning on accept.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        // Let the connections read what came (a waiting request head) before more are
        // accepted: a burst of accepts must not make room by closing a request just arrived.
        tokio::task::yield_now().await;
        let Some(connection) = connections.admit(id) else {
            // Every open connection is being answered: a `503` if the socket takes it now.
            let _ = stream.try_write(BUSY);
            continue;
        };
        let (handler, connections) = (handler.clone(), Arc::clone(&connections));
        tokio::spawn(async move {
            drive(stream, &handler, &connections, &connection).await;
            connections.close(id);
        });
    }
}

/// The whole `503` written when no connection can be closed to make room for a new one.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

/// Serves one request on `stream` with hyper, within the connection's deadline.
async fn drive(
    mut stream: tokio::net::TcpStream,
    handler: &PprofHandler,
    connections: &Arc<Connections>,
    connection: &Arc<Connection>,
) {
    let service = {
        let (handler, connections, connection) = (
            handler.clone(),
            Arc::clone(connections),
            Arc::clone(connection),
        );
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let (handler, connections, connection) = (
                handler.clone(),
                Arc::clone(&connections),
                Arc::clone(&connection),
            );
            async move {
                let (head, _body) = request.into_parts();
                let answer = answer(&handler, head, &connections, &connection).await;
                connection.enter(WRITING, Instant::now() + WRITE_TIMEOUT);
                Ok::<_, std::convert::Infallible>(to_http(answer))
            }
        })
    };
    {
        let http = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(READ_TIMEOUT)
            .max_buf_size(MAX_HEAD_BYTES)
            .keep_alive(false)
            // A client may close its side once its request is sent (`nc -N`): still answered.
            .half_close(true)
            .title_case_headers(true)
            .serve_connection(hyper_util::rt::TokioIo::new(&mut stream), service);
        tokio::pin!(http);
        loop {
            if connection.closed.load(Ordering::SeqCst) {
                return;
            }
            let deadline = connection.deadline();
            tokio::select! {
                _ = &mut http => break,
                () = tokio::time::sleep_until(deadline) => {
                    if connection.deadline() <= Instant::now() {
                        return;
                    }
                }
                () = connection.moved.notified() => {}
                () = connection.evicted.notified() => return,
            }
        }
    }
    // A lingering close, as nginx makes one: unread input (an oversized head, say) would make
    // the kernel answer the close with a reset that can destroy the answer in flight, so it is
    // read and dropped first, for at most LINGER and 256 KiB. The connection still counts, as
    // one taking its answer: closed to make room after those still sending a request.
    connection.phase.store(WRITING, Ordering::SeqCst);
    let linger = tokio::time::timeout(LINGER, async {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let _ = stream.shutdown().await;
        let (mut buf, mut left) = ([0u8; 4096], 256usize << 10);
        while left > 0 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    });
    tokio::select! {
        _ = linger => {}
        () = connection.evicted.notified() => {}
    }
}

/// The most a closing connection's unread input is waited for (see `drive`).
const LINGER: Duration = Duration::from_secs(1);

/// The answer to a request whose head has come (see [`Answering`]); the connection is not
/// closed to make room while it is made.
async fn answer(
    handler: &PprofHandler,
    head: http::request::Parts,
    connections: &Connections,
    connection: &Connection,
) -> Arc<HttpResponse> {
    connection.enter(WORKING, Instant::now() + Duration::from_secs(24 * 3600));
    connections.answering.answer(handler, head).await
}

/// What `/debug/pprof`'s (or `/metrics`') server is told by the environment.
pub(crate) struct HttpSettings {
    /// The variable that gave the address.
    pub(crate) var: &'static str,
    /// Serves `/metrics` only.
    pub(crate) metrics_only: bool,
    /// How `/metrics` is encoded (`TRACING_PROF_METRICS_*`).
    pub(crate) metrics: crate::metrics::SpanMetrics,
    /// `host:port` as given (`default` replaced).
    pub(crate) addr: String,
    pub(crate) token: Option<String>,
    /// A failed bind is an error at start.
    pub(crate) required: bool,
}
