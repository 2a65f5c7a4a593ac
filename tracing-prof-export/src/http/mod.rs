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
//! | `/debug/pprof/live` | one window (default 1 s) for `tracing-prof live`: a [`LiveFrame`](tracing_prof_model::LiveFrame) | |
//! | `/metrics` | span metrics for Prometheus ([`crate::metrics`]): OpenMetrics or Prometheus text, as `Accept` asks | |
//!
//! `?seconds=N` (1 to [`DEFAULT_MAX_SECONDS`]) answers a window profile over the next N seconds
//! (`go tool pprof -seconds N URL` sends it), `?debug=1` a readable text table.
//!
//! [`PprofHandler`] answers requests and knows nothing of sockets: mount it in your own server
//! (axum, hyper, actix...) to serve it on your port. [`HttpServer`] is a standalone server for
//! services that have none, built on hyper: GET only, bound to `127.0.0.1` by default, on one
//! thread of its own whatever the connections, answering on at most [`MAX_CONNECTIONS`] more.
//! Request heads are capped at [`MAX_HEAD_BYTES`] (`431` past it) and must arrive within
//! [`READ_TIMEOUT`]; an answer must be taken within [`WRITE_TIMEOUT`]. At most [`MAX_OPEN`]
//! connections are open: a new one past that closes the oldest that has not sent its request
//! yet (one accepted less than a second ago only when nothing else can go; else the oldest
//! still taking its answer), so that idle or slow clients (a slow-loris)
//! never keep `go tool pprof` out: its request arrives whole and is answered. Past
//! [`MAX_CONNECTIONS`] answers being made at once the answer is `503` with `Retry-After`. At most [`MAX_WINDOWS`] `?seconds=` windows run at once (a
//! `tracing-prof live` holds one while it runs); more get `429` with `Retry-After`. The
//! application and the profiler never wait on a client.
//!
//! # Inside
//!
//! `handler` (requests to answers, no sockets), `pages` (the index and the `?debug=1` tables),
//! `server` (the standalone server: hyper, its threads, deadlines and limits) and `axum` (the
//! router, behind the `axum` feature).

#[cfg(feature = "axum")]
mod axum;
mod coalesce;
mod handler;
mod pages;
mod server;

use std::time::Duration;

/// Address to serve on (`host:port`, or `default` for [`DEFAULT_HTTP_ADDR`]); unset: no server.
pub const ENV_HTTP_ADDR: &str = "TRACING_PROF_HTTP_ADDR";
/// Bearer token the endpoint requires, if set.
pub const ENV_HTTP_TOKEN: &str = "TRACING_PROF_HTTP_TOKEN";
/// Address of a listener that serves `/metrics` only (`host:port`, `:port` for loopback);
/// unset: none. Span metrics hold span path names, never code or profiles: any address is
/// accepted without a token (`TRACING_PROF_HTTP_TOKEN` is required there when set).
pub const ENV_METRICS_ADDR: &str = "TRACING_PROF_METRICS_ADDR";
/// `1` to serve on a non-loopback address without a token (refused otherwise).
pub const ENV_HTTP_ALLOW_PUBLIC: &str = "TRACING_PROF_HTTP_ALLOW_PUBLIC";
/// `1` makes a `/debug/pprof` server that cannot listen an error at start; by default the
/// service runs without it and the server tries again every
/// [`BIND_RETRY`].
pub const ENV_HTTP_REQUIRED: &str = "TRACING_PROF_HTTP_REQUIRED";

#[cfg(feature = "axum")]
pub use axum::{axum_metrics_router, axum_router};
pub use handler::{HttpResponse, PprofHandler};
pub(crate) use server::HttpSettings;
pub use server::{HttpError, HttpServer, MetricsServer};

/// Where [`HttpServer::from_env`] listens when `TRACING_PROF_HTTP_ADDR` is `default`:
/// loopback only, Go's customary port.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:6060";
/// Longest `?seconds=` window accepted.
pub const DEFAULT_MAX_SECONDS: u64 = 60;
/// `/debug/pprof/profile`'s window when no `seconds` is given, as in Go.
pub const DEFAULT_PROFILE_SECONDS: u64 = 30;
/// Answers made at once, by the standalone server or the axum mount (from the request's head
/// until the handler returns, even if its client has gone); more requests are answered `503`
/// with `Retry-After`, but for one identical to a request being answered, which shares that
/// answer. Also the most threads answering.
pub const MAX_CONNECTIONS: usize = 8;
/// Connections open at once: a new one past this closes the oldest that has not sent its
/// request yet (one accepted less than a second ago only when nothing else can go), else the
/// oldest still taking its answer. Well under the file descriptors a process usually may open (1024), which the
/// application shares.
pub const MAX_OPEN: usize = 128;
/// `?seconds=` windows (each holds its connection for N seconds) at once; more get `429`.
pub const MAX_WINDOWS: usize = 2;
/// Largest request head (request line and headers) read (hyper's least buffer).
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Time a client has to send its whole request head, from its connection.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a client has to take the whole answer, once it is made.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a server from [`HttpServer::from_env`] that could not listen tries again: 5 s.
pub const BIND_RETRY: Duration = Duration::from_secs(5);
/// The name a server from [`HttpServer::from_env`] reports its state under
/// ([`Profiler::services`](tracing_prof_core::Profiler::services)).
pub const SERVICE_NAME: &str = "/debug/pprof server";
