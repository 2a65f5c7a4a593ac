//! The profiler's cost on the most common shape of service: an axum 0.8 JSON service with
//! tower-http's `TraceLayer`, three `#[instrument]` handlers over in-memory stores behind an
//! `RwLock`, started as `#[tokio::main]` starts it (the runtime first, then the profiler), with
//! jemalloc, loaded by `wrk` (Debian's package) on 127.0.0.1: the number a user's service sees,
//! and the first row of the README's overhead table (command 17 in BENCHMARKS.md).
//!
//! Each run is a server child process (this binary); this process runs `wrk` against it twice:
//! the first `TRACING_PROF_BENCH_SECS` seconds from start (default 15: the first export, 10 s
//! in, falls inside), then as long again (the steady state). Between the two, and at the end,
//! it reads the server's CPU time (`/__cpu`, the server's own `getrusage`), so each phase's
//! server CPU per request is its own. Reported per variant: server CPU per request in each
//! phase, requests per second, p99 latency (wrk's), peak RSS (`wait4`).
//!
//! Variants, rotating over the rounds (fresh processes):
//! - `off`: plain jemalloc, a registry with no profiling layer;
//! - `default`: as the README installs it: `TaggingAllocator<Jemalloc>`, `init_from_env()`'s
//!   defaults (heap sampling at 512 KiB, CPU sampling at 100 Hz, files every 10 s) and
//!   `/debug/pprof` on (`TRACING_PROF_HTTP_ADDR`);
//! - `no-cpu-sampling`, `no-heap-sampling`, `no-exports` (interval of an hour),
//!   `no-memory-watch` (no peak watch, flight recorder or OOM thresholds): the default less one
//!   thing;
//! - `alloc-only`: the tagging allocator and nothing else (the header's cost);
//! - `off-layer-only`: the span layer alone, plain jemalloc.
//!
//! `TRACING_PROF_BENCH_ROUNDS=5 cargo bench -p tracing-prof-as-user --bench web_service`
//! (`-- default off` runs only those variants). Needs `wrk`.

use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, RwLock};
use tracing_prof_examples::bench::{child, switch};
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: switch::Switch = switch::Switch;

const ENV: &str = "TRACING_PROF_BENCH_CHILD";
const MODES: [&str; 8] = [
    "off",
    "default",
    "no-cpu-sampling",
    "no-heap-sampling",
    "no-exports",
    "no-memory-watch",
    "alloc-only",
    "off-layer-only",
];
const CONNECTIONS: usize = 32;

#[derive(Clone, Serialize, Deserialize)]
struct User {
    id: u64,
    name: String,
    email: String,
    tags: Vec<String>,
}

#[derive(Clone, Serialize, Deserialize)]
struct Order {
    id: u64,
    user: u64,
    items: Vec<Item>,
    note: String,
}

#[derive(Clone, Serialize, Deserialize)]
struct Item {
    sku: String,
    quantity: u32,
    cents: u64,
}

#[derive(Deserialize)]
struct NewOrder {
    user: u64,
    items: Vec<Item>,
    note: String,
}

#[derive(Deserialize)]
struct ByUser {
    user: u64,
}

/// The stores: users (fixed), and the last orders per user (a ring of 20 each).
#[derive(Default)]
struct Stores {
    users: RwLock<HashMap<u64, User>>,
    orders: RwLock<HashMap<u64, Vec<Order>>>,
    next: std::sync::atomic::AtomicU64,
}

const USERS: u64 = 1000;

#[tracing::instrument(skip_all)]
async fn get_user(State(s): State<Arc<Stores>>, Path(id): Path<u64>) -> Json<Option<User>> {
    Json(s.users.read().unwrap().get(&id).cloned())
}

#[tracing::instrument(skip_all)]
fn validate(order: &NewOrder) -> bool {
    order.user < USERS && !order.items.is_empty() && order.items.iter().all(|i| i.quantity > 0)
}

#[tracing::instrument(skip_all)]
async fn create_order(State(s): State<Arc<Stores>>, Json(new): Json<NewOrder>) -> Json<Order> {
    let ok = validate(&new);
    let order = Order {
        id: s.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        user: new.user,
        items: new.items,
        note: if ok {
            new.note
        } else {
            String::from("invalid")
        },
    };
    let mut orders = s.orders.write().unwrap();
    let list = orders.entry(order.user).or_default();
    if list.len() == 20 {
        list.remove(0);
    }
    list.push(order.clone());
    Json(order)
}

#[tracing::instrument(skip_all)]
fn newest(orders: &[Order]) -> Vec<Order> {
    orders.iter().rev().take(10).cloned().collect()
}

#[tracing::instrument(skip_all)]
async fn list_orders(State(s): State<Arc<Stores>>, Query(q): Query<ByUser>) -> Json<Vec<Order>> {
    let orders = s.orders.read().unwrap();
    Json(orders.get(&q.user).map(|o| newest(o)).unwrap_or_default())
}

/// The server's CPU time so far: `user_ns sys_ns`.
async fn cpu() -> String {
    let (user, sys) = child::cpu_time();
    format!("{} {}", user.as_nanos(), sys.as_nanos())
}

fn stores() -> Arc<Stores> {
    let s = Stores::default();
    {
        let mut users = s.users.write().unwrap();
        for id in 0..USERS {
            users.insert(
                id,
                User {
                    id,
                    name: format!("user number {id}"),
                    email: format!("user{id}@example.com"),
                    tags: (0..4).map(|t| format!("tag-{}", (id + t) % 17)).collect(),
                },
            );
        }
    }
    Arc::new(s)
}

/// The server: as `#[tokio::main]` runs it, the runtime first and the profiler set up in main's
/// body; prints its address, serves until stdin closes.
fn server(mode: &str) {
    let dir = std::env::temp_dir().join(format!("tracing-prof-web-{}", std::process::id()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        // SAFETY: set before any other thread of this process reads the environment (the
        // runtime's workers do not).
        let setenv = |k: &str, v: &str| unsafe { std::env::set_var(k, v) };
        setenv("TRACING_PROF_DIR", dir.to_str().expect("a UTF-8 path"));
        if std::env::var_os("TRACING_PROF_HTTP_ADDR").is_none() {
            setenv("TRACING_PROF_HTTP_ADDR", "127.0.0.1:0");
        }
        match mode {
            "no-cpu-sampling" => setenv("TRACING_PROF_CPU_HZ", "0"),
            "no-heap-sampling" => setenv("TRACING_PROF_SAMPLE_RATE", "0"),
            "no-exports" => setenv("TRACING_PROF_INTERVAL", "1h"),
            "no-memory-watch" => {
                setenv("TRACING_PROF_PEAK_EVERY", "off");
                setenv("TRACING_PROF_FLIGHT_RECORDER", "off");
                setenv("TRACING_PROF_OOM_THRESHOLDS", "off");
            }
            _ => {}
        }
        let guard = match mode {
            "off" | "alloc-only" | "off-layer-only" => {
                child::init_unprofiled(mode == "off-layer-only");
                None
            }
            _ => {
                let (layer, guard) = tracing_prof::init_from_env().expect("the profiler");
                tracing_subscriber::registry().with(layer).init();
                Some(guard)
            }
        };
        let app = Router::new()
            .route("/users/{id}", get(get_user))
            .route("/orders", post(create_order).get(list_orders))
            .route("/__cpu", get(cpu))
            .layer(tower_http::trace::TraceLayer::new_for_http())
            .with_state(stores());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        println!("listening {}", listener.local_addr().expect("an address"));
        std::io::stdout().flush().expect("stdout");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            let _ = stop_tx.send(());
        });
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stop_rx.await;
            })
            .await
            .expect("serve");
        drop(guard);
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// The request mix, as a wrk script: two reads of a user, one new order, one list of orders.
const SCRIPT: &str = r#"
local n = 0
request = function()
  n = n + 1
  local user = (n * 7919) % 1000
  local k = n % 4
  if k == 0 then
    return wrk.format("POST", "/orders", {["Content-Type"] = "application/json"},
      '{"user":' .. user .. ',"items":[{"sku":"SKU-' .. n % 97 .. '","quantity":2,"cents":1999},{"sku":"SKU-7","quantity":1,"cents":500}],"note":"leave it at the door"}')
  elseif k == 1 then
    return wrk.format("GET", "/orders?user=" .. user)
  else
    return wrk.format("GET", "/users/" .. user)
  end
end
"#;

/// wrk's result: requests, and the 99th percentile latency in ms.
fn wrk(addr: SocketAddr, secs: u64, script: &std::path::Path) -> (f64, f64) {
    let out = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{CONNECTIONS}"),
            &format!("-d{secs}s"),
            "--latency",
            "-s",
        ])
        .arg(script)
        .arg(format!("http://{addr}/"))
        .output()
        .expect("run wrk (apt install wrk)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !text.contains("Non-2xx"),
        "wrk: {text}"
    );
    let requests = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no request count in {text}"));
    let p99 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("99%"))
        .map(|v| {
            let v = v.trim();
            let (num, unit) = v.split_at(v.find(|c: char| c.is_alphabetic()).unwrap_or(v.len()));
            let num: f64 = num.parse().unwrap_or(f64::NAN);
            match unit {
                "us" => num / 1000.0,
                "ms" => num,
                "s" => num * 1000.0,
                _ => f64::NAN,
            }
        })
        .unwrap_or(f64::NAN);
    (requests, p99)
}

/// The server's CPU time, in seconds, from its `/__cpu`.
fn server_cpu(addr: SocketAddr) -> f64 {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET /__cpu HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("ask");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    body.split_whitespace()
        .filter_map(|v| v.parse::<f64>().ok())
        .sum::<f64>()
        / 1e9
}

/// One server's numbers.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Server CPU per request, µs: the first phase (first export included), the steady state.
    first_us: f64,
    steady_us: f64,
    /// Requests per second in the steady state.
    rps: f64,
    /// wrk's 99th percentile in the steady state, ms.
    p99_ms: f64,
    /// Peak RSS, MiB.
    maxrss_mib: f64,
}

fn run(mode: &str, secs: u64, script: &std::path::Path) -> Run {
    #[allow(
        clippy::zombie_processes,
        reason = "reaped below by wait4, which also returns its rusage"
    )]
    let mut c = Command::new(std::env::current_exe().expect("this binary"))
        .env(ENV, mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the server");
    let mut out = BufReader::new(c.stdout.take().expect("stdout"));
    let addr = tracing_prof_examples::resp::server_addr(&mut out);
    let cpu0 = server_cpu(addr);
    let (n1, _) = wrk(addr, secs, script);
    let cpu1 = server_cpu(addr);
    let (n2, p99) = wrk(addr, secs, script);
    let cpu2 = server_cpu(addr);
    drop(c.stdin.take());
    let _ = out.read_to_string(&mut String::new());
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pid is our child's; status and ru are valid, writable locals.
    let pid = unsafe { libc::wait4(c.id() as libc::pid_t, &mut status, 0, &mut ru) };
    assert!(pid > 0 && status == 0, "the {mode} server failed");
    Run {
        first_us: (cpu1 - cpu0) / n1 * 1e6,
        steady_us: (cpu2 - cpu1) / n2 * 1e6,
        rps: n2 / secs as f64,
        p99_ms: p99,
        maxrss_mib: ru.ru_maxrss as f64 / 1024.0,
    }
}

fn main() {
    if let Ok(mode) = std::env::var(ENV) {
        return server(&mode);
    }
    let asked: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let modes: Vec<&str> = MODES
        .iter()
        .copied()
        .filter(|m| asked.is_empty() || asked.iter().any(|a| a == m || a == "web_service"))
        .collect();
    if modes.is_empty() {
        return; // filtered out by `cargo bench -- NAME`
    }
    // (`wrk -v` prints its version and exits 1: found is enough.)
    if Command::new("wrk").arg("-v").output().is_err() {
        eprintln!("SKIPPED: the web service benchmark needs wrk (apt install wrk)");
        return;
    }
    let rounds = child::setting("TRACING_PROF_BENCH_ROUNDS", 5) as usize;
    let secs = child::setting("TRACING_PROF_BENCH_SECS", 15);
    let script = std::env::temp_dir().join(format!("tracing-prof-web-{}.lua", std::process::id()));
    std::fs::write(&script, SCRIPT).expect("write the wrk script");
    let runs = child::rotate_runs(&modes, rounds, |mode| {
        let r = run(mode, secs, &script);
        eprintln!("{mode}: {r:?}");
        r
    });
    let _ = std::fs::remove_file(&script);
    println!(
        "\n### An axum JSON service with TraceLayer under wrk ({CONNECTIONS} connections, 1 wrk \
         thread, {secs} s from start, then {secs} s more): the defaults and variants vs off\n"
    );
    println!(
        "{rounds} rotating rounds, one server process per run; ratios are medians of per-round \
         ratios to the first column.\n"
    );
    child::print_table(
        &modes,
        &runs,
        &[
            (
                "server CPU per request, first phase (first export in it)",
                "µs",
                &|r: &Run| r.first_us,
            ),
            ("server CPU per request, steady state", "µs", &|r: &Run| {
                r.steady_us
            }),
            ("requests per second, steady state", "", &|r: &Run| r.rps),
            ("p99 latency, steady state", "ms", &|r: &Run| r.p99_ms),
            ("peak RSS", "MiB", &|r: &Run| r.maxrss_mib),
        ],
        None,
    );
}
