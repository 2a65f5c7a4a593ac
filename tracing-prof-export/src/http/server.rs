//! [`HttpServer`]: a small standalone server for services that have none. One thread accepts;
//! each request is read and answered on a thread of its own, within the limits of the module
//! docs; refusals are answered on one more thread.

use super::handler::{HttpResponse, PprofHandler};
use super::wire::{HeadError, parse_head, read_head, time_left, write_response};
use super::{
    BIND_RETRY, ENV_HTTP_ADDR, ENV_HTTP_REQUIRED, MAX_CONNECTIONS, MAX_PENDING, MAX_REFUSING,
    READ_TIMEOUT, REFUSE_WAIT, SERVICE_NAME, WRITE_TIMEOUT,
};
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
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
            tracing_prof_core::spawn_profiler_thread("tprof-http", move || {
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

    /// A server as the environment's settings say (see `crate::env`'s `HttpServer::from_env`).
    pub(crate) fn from_settings(
        profiler: &Profiler,
        settings: HttpSettings,
    ) -> Result<HttpServer, HttpError> {
        let (addr, required) = (settings.addr, settings.required);
        let mut handler = PprofHandler::new(profiler.clone());
        if let Some(token) = settings.token {
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
        HttpServer::spawn(handler, listener, addr, Some(profiler.clone()))
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
    let pending = Arc::new(AtomicUsize::new(0));
    let active = Arc::new(AtomicUsize::new(0));
    // Refusals are answered on a thread of their own, one at a time: the accept loop never
    // waits. The thread ends when this loop does (the channel closes).
    let refusals = {
        let (tx, rx) = crossbeam_channel::bounded::<TcpStream>(MAX_REFUSING);
        tracing_prof_core::spawn_profiler_thread("tprof-http-busy", move || {
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
        let spawned = tracing_prof_core::spawn_profiler_thread("tprof-http-conn", move || {
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

/// What `/debug/pprof`'s server is told by the environment.
pub(crate) struct HttpSettings {
    /// `host:port` as given (`default` replaced).
    pub(crate) addr: String,
    pub(crate) token: Option<String>,
    /// A failed bind is an error at start.
    pub(crate) required: bool,
}
