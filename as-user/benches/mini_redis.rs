//! The profiler's cost on a real server nobody here wrote: tokio's mini-redis 0.4.1, unmodified
//! (`mini_redis::server::run`, `#[instrument] async fn apply` per command under `Handler::run`'s
//! span), loaded on 127.0.0.1 as `tests/mini_redis.rs` loads it.
//!
//! Each run is a child process (this same binary) that serves; this process is the client, so
//! the server's CPU time and peak RSS are its own. The load: 4 connections, one command at a
//! time each (as a service's callers wait for their answers), `TRACING_PROF_BENCH_REQUESTS`
//! SETs of 100-byte values (default 20 000 per connection), then as many GETs of those keys.
//! Reported per run:
//! - wall time: the load, as the client saw it (closed loop: every command's round trip);
//! - CPU time: the server's user+system time up to the end of the load, read in the server
//!   (`getrusage`) before it shuts down, so its final export is not counted in it;
//! - peak RSS of the server (`wait4`), its final export included;
//! - the final flush: the profiler's guard dropped at shutdown.
//!
//! Variants, rotating over the rounds:
//! - `off`: plain jemalloc, a registry with a no-op layer (the same server, unprofiled);
//! - `default`: the README's installation: `TaggingAllocator<Jemalloc>`, `init_from_env()`'s
//!   defaults (heap sampling at 512 KiB, CPU sampling at 100 Hz, files every 10 s and at exit);
//! - `off-layer-only`: the span layer alone, with plain jemalloc and no profiler.
//!
//! `TRACING_PROF_BENCH_ROUNDS=9 cargo bench -p tracing-prof-as-user --bench mini_redis`

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tracing_prof::{FileExporter, Profiler};
use tracing_prof_examples::bench::child;
use tracing_prof_examples::bench::switch;
use tracing_prof_examples::resp::{self, command, send_all};
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: switch::Switch = switch::Switch;

const ENV: &str = "TRACING_PROF_BENCH_CHILD";
const MODES: [&str; 3] = ["off", "default", "off-layer-only"];
const CONNECTIONS: usize = 4;
const VALUE: usize = 100;

/// The server: prints its address, serves until its stdin closes, then prints its CPU time up
/// to then and how long the final flush took.
fn server(mode: &str) {
    let dir = std::env::temp_dir().join(format!("tracing-prof-mini-redis-{}", std::process::id()));
    let guard = match mode {
        "off" | "off-layer-only" => {
            child::init_unprofiled(mode == "off-layer-only");
            None
        }
        "default" => {
            let (layer, guard) = Profiler::builder()
                .sink(FileExporter::new(&dir))
                .build()
                .expect("profiler");
            tracing_subscriber::registry().with(layer).init();
            Some(guard)
        }
        other => panic!("unknown mode {other}"),
    };
    let (rt, listener) = resp::listen(2);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<(Duration, Duration)>();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        let _ = stop_tx.send(child::cpu_time());
    });
    let cpu = rt.block_on(async {
        let mut cpu = (Duration::ZERO, Duration::ZERO);
        mini_redis::server::run(listener, async {
            cpu = stop_rx.await.unwrap_or_default();
        })
        .await
        .unwrap();
        cpu
    });
    drop(rt);
    let flush = Instant::now();
    drop(guard);
    let flush = flush.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "user_ns={} sys_ns={} flush_ns={}",
        cpu.0.as_nanos(),
        cpu.1.as_nanos(),
        flush.as_nanos()
    );
}

/// The load on the server at `addr`: SETs, then GETs of the same keys, `per` of each on each
/// connection. Returns its wall time.
fn load(addr: SocketAddr, per: usize) -> Duration {
    let value = [b'v'; VALUE];
    let phase = |get: bool| -> usize {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..CONNECTIONS)
                .map(|c| {
                    s.spawn(move || {
                        send_all(addr, per, |i, out| {
                            let key = format!("key:{:012}", c * per + i);
                            if get {
                                command(&[b"GET", key.as_bytes()], out);
                            } else {
                                command(&[b"SET", key.as_bytes(), &value], out);
                            }
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        })
    };
    let start = Instant::now();
    assert_eq!(phase(false), CONNECTIONS * per, "every SET answered OK");
    assert_eq!(phase(true), CONNECTIONS * per, "every GET found its key");
    start.elapsed()
}

/// One server's numbers.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// The load's wall time, in seconds.
    wall_s: f64,
    /// The server's user and system CPU time up to the end of the load, in seconds.
    user_s: f64,
    sys_s: f64,
    /// The server's peak resident memory, in MiB.
    maxrss_mib: f64,
    /// Its final flush, in milliseconds.
    flush_ms: f64,
}

/// One run: a server in `mode`, loaded, shut down and reaped.
fn run(mode: &str, per: usize) -> Run {
    #[allow(
        clippy::zombie_processes,
        reason = "reaped below by wait4, which also returns its rusage"
    )]
    let mut c = Command::new(std::env::current_exe().unwrap())
        .env(ENV, mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the server");
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let addr = resp::server_addr(&mut out);
    let wall = load(addr, per);
    drop(c.stdin.take());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pid is our child's; status and ru are valid, writable locals.
    let pid = unsafe { libc::wait4(c.id() as libc::pid_t, &mut status, 0, &mut ru) };
    assert!(pid > 0 && status == 0, "the {mode} server failed: {line}");
    let field = |k: &str| -> f64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {line:?}"))
    };
    Run {
        wall_s: wall.as_secs_f64(),
        user_s: field("user_ns=") / 1e9,
        sys_s: field("sys_ns=") / 1e9,
        maxrss_mib: ru.ru_maxrss as f64 / 1024.0,
        flush_ms: field("flush_ns=") / 1e6,
    }
}

fn main() {
    if let Ok(mode) = std::env::var(ENV) {
        return server(&mode);
    }
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with("--") && !"mini_redis".contains(a.as_str()))
    {
        return; // filtered out by `cargo bench -- NAME`
    }
    let rounds = child::setting("TRACING_PROF_BENCH_ROUNDS", 9) as usize;
    let per = child::setting("TRACING_PROF_BENCH_REQUESTS", 20_000) as usize;
    let runs = child::rotate_runs(&MODES, rounds, |mode| {
        let r = run(mode, per);
        eprintln!("{mode}: {r:?}");
        r
    });
    println!(
        "\n### mini-redis 0.4.1 under load ({CONNECTIONS} connections, {per} SETs of {VALUE} bytes \
         and {per} GETs each, one command at a time): the defaults vs off\n"
    );
    println!(
        "{rounds} rotating rounds, one server process per run; CPU times are the server's up to \
         the end of the load; ratios are medians of per-round ratios to off.\n"
    );
    let us = 1e6 / (2 * CONNECTIONS * per) as f64;
    child::print_table(
        &MODES,
        &runs,
        &[
            ("wall time of the load", "s", &|r: &Run| r.wall_s),
            ("server user CPU per command", "µs", &|r: &Run| {
                r.user_s * us
            }),
            ("server system CPU per command", "µs", &|r: &Run| {
                r.sys_s * us
            }),
            ("server CPU (user+sys) per command", "µs", &|r: &Run| {
                (r.user_s + r.sys_s) * us
            }),
            ("server peak RSS", "MiB", &|r: &Run| r.maxrss_mib),
        ],
        Some(&|r| r.flush_ms),
    );
}
