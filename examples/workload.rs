//! The request workload of the example service, shared by the example, its tests and the
//! end-to-end benchmark.
//!
//! A tokio service that handles many concurrent requests, each under nested spans: parsing,
//! a database query that waits, a cache that retains memory, rendering that burns CPU, audit
//! buffers freed by another task, and, on purpose, one slow leak.

pub mod bench;
pub mod resp;

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{Instrument, info_span};

/// How much work to do.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Requests in total.
    pub requests: u64,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Every this many requests, one leaks 1 KiB on purpose (0: never).
    pub leak_every: u64,
    /// Entries the cache keeps before evicting the oldest.
    pub cache_capacity: usize,
    /// Time a database query waits.
    pub query_latency: Duration,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            requests: 20_000,
            concurrency: 64,
            leak_every: 50,
            cache_capacity: 2_000,
            query_latency: Duration::from_micros(500),
        }
    }
}

/// What the run did, for a plausibility check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Requests handled.
    pub handled: u64,
    /// Bytes rendered.
    pub response_bytes: u64,
    /// Cache hits.
    pub cache_hits: u64,
    /// Buffers freed by the audit task.
    pub audited: u64,
    /// Bytes leaked on purpose.
    pub leaked_bytes: u64,
}

impl Summary {
    fn add(&mut self, (bytes, hit): (u64, bool)) {
        self.handled += 1;
        self.response_bytes += bytes;
        self.cache_hits += u64::from(hit);
    }
}

/// Blocks kept forever: the deliberate slow leak (a "session store" nobody cleans up).
static SESSIONS: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// Bytes leaked so far by the deliberate leak.
pub fn leaked_bytes() -> u64 {
    SESSIONS
        .lock()
        .unwrap()
        .iter()
        .map(|v| v.len() as u64)
        .sum()
}

/// The service's long-lived state: the cache keeps its entries after a run, as a server would.
#[derive(Debug)]
pub struct App {
    /// Sharded by key, so that requests rarely wait on each other's lock.
    cache: Vec<Mutex<Cache>>,
}

const SHARDS: usize = 16;

impl App {
    /// An empty cache of about `capacity` entries.
    pub fn new(capacity: usize) -> Arc<App> {
        let shard = || {
            let capacity = capacity.div_ceil(SHARDS);
            Mutex::new(Cache {
                map: HashMap::new(),
                order: VecDeque::new(),
                capacity,
            })
        };
        Arc::new(App {
            cache: (0..SHARDS).map(|_| shard()).collect(),
        })
    }
}

#[derive(Debug)]
struct Cache {
    map: HashMap<u64, Arc<Vec<u8>>>,
    order: VecDeque<u64>,
    capacity: usize,
}

/// A tiny deterministic PRNG (xorshift64*), so every run does the same work.
#[derive(Clone, Copy, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded; 0 is replaced by a fixed non-zero seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// A number in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }
}

/// Runs the workload on the current tokio runtime against `app`.
pub async fn run(app: &Arc<App>, w: &Workload) -> Summary {
    let (audit_tx, mut audit_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(1024);
    let audit = tokio::spawn(
        async move {
            let mut n = 0u64;
            while let Some(buf) = audit_rx.recv().await {
                info_span!("audit_record").in_scope(|| {
                    std::hint::black_box(buf.iter().fold(0u8, |a, b| a ^ b));
                    drop(buf); // freed here, on another task: credited to the span that made it
                });
                n += 1;
            }
            n
        }
        .instrument(info_span!("audit")),
    );

    let mut summary = Summary::default();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(w.concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for id in 0..w.requests {
        let permit = Arc::clone(&semaphore)
            .acquire_owned()
            .await
            .expect("semaphore open");
        let (app, audit_tx, w) = (Arc::clone(app), audit_tx.clone(), w.clone());
        let route = ["/users", "/orders", "/search"][(id % 3) as usize];
        tasks.spawn(
            async move {
                let r = handle(id, &w, &app.cache, &audit_tx).await;
                drop(permit);
                r
            }
            .instrument(info_span!("request", route)),
        );
        while let Some(done) = tasks.try_join_next() {
            summary.add(done.expect("request task"));
        }
    }
    while let Some(done) = tasks.join_next().await {
        summary.add(done.expect("request task"));
    }
    drop(audit_tx);
    summary.audited = audit.await.expect("audit task");
    summary.leaked_bytes = leaked_bytes();
    summary
}

async fn handle(
    id: u64,
    w: &Workload,
    cache: &[Mutex<Cache>],
    audit: &tokio::sync::mpsc::Sender<Vec<u8>>,
) -> (u64, bool) {
    let mut rng = Rng::new(id);
    let fields = info_span!("parse").in_scope(|| parse(&mut rng));
    let rows = query(&mut rng, &fields, w.query_latency)
        .instrument(info_span!("db_query"))
        .await;
    let key = rng.range(0, 4 * w.cache_capacity as u64);
    let shard = &cache[(key as usize) % cache.len()];
    let (entry, hit) = info_span!("cache_lookup").in_scope(|| lookup(shard, key, &rows));
    let body = info_span!("render").in_scope(|| render(&rows, &entry));
    let _ = audit.send(body.as_bytes().to_vec()).await;
    if w.leak_every > 0 && id.is_multiple_of(w.leak_every) {
        info_span!("session_store")
            .in_scope(|| SESSIONS.lock().unwrap().push(vec![id as u8; 1024]));
    }
    (body.len() as u64, hit)
}

fn parse(rng: &mut Rng) -> Vec<String> {
    let raw: Vec<u8> = (0..rng.range(512, 4096))
        .map(|_| b'a' + (rng.next_u64() % 26) as u8)
        .collect();
    raw.chunks(64)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect()
}

async fn query(rng: &mut Rng, fields: &[String], latency: Duration) -> Vec<(u64, String)> {
    tokio::time::sleep(latency).await; // waiting on the database: idle, not CPU
    let n = rng.range(8, 64) as usize;
    (0..n)
        .map(|i| (rng.next_u64(), fields[i % fields.len()].repeat(2)))
        .collect()
}

fn lookup(cache: &Mutex<Cache>, key: u64, rows: &[(u64, String)]) -> (Arc<Vec<u8>>, bool) {
    let mut c = cache.lock().unwrap();
    if let Some(e) = c.map.get(&key) {
        return (Arc::clone(e), true);
    }
    let entry = info_span!("cache_fill").in_scope(|| {
        Arc::new(
            rows.iter()
                .flat_map(|(k, v)| k.to_le_bytes().into_iter().chain(v.bytes()))
                .collect(),
        )
    });
    c.map.insert(key, Arc::clone(&entry));
    c.order.push_back(key);
    if c.order.len() > c.capacity
        && let Some(old) = c.order.pop_front()
    {
        c.map.remove(&old);
    }
    (entry, false)
}

fn render(rows: &[(u64, String)], entry: &[u8]) -> String {
    let mut out = String::with_capacity(256);
    out.push('[');
    for (k, v) in rows {
        // Some honest CPU work per row.
        let mut h = *k;
        for _ in 0..4 {
            for b in v.bytes().chain(entry.iter().copied().take(512)) {
                h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3);
            }
        }
        let _ = write!(
            out,
            "{{\"id\":{k},\"hash\":\"{h:016x}\",\"name\":\"{}\"}},",
            &v[..v.len().min(24)]
        );
    }
    out.push(']');
    // About one render in a hundred reports a failure, as an ERROR event in its span: what
    // the metrics' error counts and live's errors column show.
    if rows.first().is_some_and(|(k, _)| k % 97 == 0) {
        tracing::error!(rows = rows.len(), "render failed for a row");
    }
    out
}

/// The shape that hurts a profiler most: many cheap requests. Each does a few microseconds of
/// work, enters about ten spans (a polled-twice request future, a polled-twice query future,
/// five short sections) and makes about a dozen small allocations; `concurrency` are in flight
/// on the tokio runtime. Per-span costs show here that CPU-heavy requests hide.
pub async fn run_cheap(requests: u64, concurrency: usize) -> u64 {
    let semaphore = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    let mut total = 0u64;
    for id in 0..requests {
        let permit = Arc::clone(&semaphore)
            .acquire_owned()
            .await
            .expect("semaphore open");
        // The request span is made on the worker that runs the request, as a server's
        // handler makes it.
        tasks.spawn(async move {
            let r = cheap_request(id).instrument(info_span!("request")).await;
            drop(permit);
            r
        });
        while let Some(done) = tasks.try_join_next() {
            total = total.wrapping_add(done.expect("request task"));
        }
    }
    while let Some(done) = tasks.join_next().await {
        total = total.wrapping_add(done.expect("request task"));
    }
    total
}

async fn cheap_request(id: u64) -> u64 {
    let mut rng = Rng::new(id);
    let path = info_span!("parse").in_scope(|| format!("/items/{}", rng.range(0, 1000)));
    let user = info_span!("authorize").in_scope(|| {
        let token: String = (0..16)
            .map(|_| char::from(b'a' + (rng.next_u64() % 26) as u8))
            .collect();
        token.len() as u64
    });
    let rows = async {
        tokio::task::yield_now().await; // the database answers at once: a second poll
        (0..4)
            .map(|i| format!("row-{id}-{i}"))
            .collect::<Vec<String>>()
    }
    .instrument(info_span!("query"))
    .await;
    let hash = info_span!("compute").in_scope(|| {
        let mut h = user;
        for r in &rows {
            for b in r.bytes().chain(path.bytes()).cycle().take(400) {
                h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3);
            }
        }
        h
    });
    let body = info_span!("render").in_scope(|| {
        let mut out = String::with_capacity(64);
        let _ = write!(out, "{{\"path\":\"{path}\",\"hash\":{hash},\"rows\":[");
        for r in &rows {
            let _ = write!(out, "\"{r}\",");
        }
        out.push_str("]}");
        out
    });
    info_span!("respond").in_scope(|| body.len() as u64 ^ hash)
}
