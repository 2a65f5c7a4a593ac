//! The standalone `/debug/pprof` server under the attacks a hostile or unlucky network makes:
//! 300 slow-loris connections (a header byte every 0.2 s), 2000 idle ones, and 1000 that send a
//! bad request and then drip a byte every 0.1 s (each silenced or swelled the hand-written
//! server this one replaced); and 50 clients that each ask for a heap profile and leave at once,
//! 10 times a second (answers that outlived their connection once queued without bound). Under
//! each, a normal request (as `go tool pprof` makes it) is answered within a second and read
//! back by the real `go tool pprof`; the server's threads stay within their fixed number and
//! the process's memory within 32 MiB of where it was. (One test: the thread count and the
//! memory are the process's.) With the tagging allocator, as a service runs it: a heap profile
//! then has stacks to read, and answers take long enough for the abandoned ones to fill the
//! server's few (a normal request got `503` before identical requests shared one answer).

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing_prof_export::HttpServer;
use tracing_prof_export::http::{MAX_CONNECTIONS, PprofHandler};

#[global_allocator]
static GLOBAL: tracing_prof_alloc::TaggingAllocator<std::alloc::System> =
    tracing_prof_alloc::TaggingAllocator::new(std::alloc::System);

/// What each attacking connection does, over and over until the attack stops.
#[derive(Clone, Copy, Debug)]
enum Attack {
    /// A request head that never ends: one more header byte every 200 ms; reconnects when
    /// closed.
    SlowLoris,
    /// Connects and sends nothing; reconnects 50 ms after it is closed.
    Idle,
    /// `BAD\r\n\r\n`, then one byte every 100 ms; reconnects when closed.
    Dripping,
    /// A whole request for a heap profile, then gone at once, 10 times a second: the answers
    /// started for it must not pile up beyond the server's few at a time.
    Abandoning,
}

async fn attacker(addr: std::net::SocketAddr, attack: Attack, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (first, every): (&[u8], _) = match attack {
            Attack::SlowLoris => (
                b"GET /debug/pprof/heap HTTP/1.1\r\nHost: x\r\nX-Slow: ",
                Some(Duration::from_millis(200)),
            ),
            Attack::Idle => (b"", None),
            Attack::Dripping => (b"BAD\r\n\r\n", Some(Duration::from_millis(100))),
            Attack::Abandoning => {
                let _ = s
                    .write_all(b"GET /debug/pprof/heap HTTP/1.1\r\nHost: x\r\n\r\n")
                    .await;
                drop(s);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if s.write_all(first).await.is_err() {
            continue;
        }
        match every {
            Some(every) => {
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(every).await;
                    if s.write_all(b"a").await.is_err() {
                        break;
                    }
                }
            }
            None => {
                let mut buf = [0u8; 64];
                loop {
                    tokio::select! {
                        r = s.read(&mut buf) => if matches!(r, Ok(0) | Err(_)) { break },
                        () = tokio::time::sleep(Duration::from_millis(100)) => {
                            if stop.load(Ordering::Relaxed) { break }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// `GET path` as a plain HTTP/1.1 client: the status line, the body and how long it took.
fn get(addr: std::net::SocketAddr, path: &str) -> Result<(String, Vec<u8>, Duration), String> {
    request(addr, "GET", path)
}

fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
) -> Result<(String, Vec<u8>, Duration), String> {
    let start = Instant::now();
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    // In one write, as Go's client sends it (through a buffer): `write!` on the socket itself
    // sends each piece of the format in a write of its own, a partial head that the server may
    // close while the rest is on its way (a reset: seen once in a fresh clone's CI run).
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: Go-http-client/1.1\r\n\r\n"
    );
    s.write_all(head.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .map_err(|e| format!("read: {e}"))?;
    let took = start.elapsed();
    let at = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no head in {} bytes", answer.len()))?;
    let status = String::from_utf8_lossy(&answer[..at])
        .lines()
        .next()
        .unwrap_or("")
        .to_owned();
    Ok((status, answer[at + 4..].to_vec(), took))
}

/// The server's threads now (named `tprof-http*`).
fn server_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|name| name.starts_with("tprof-http"))
        })
        .count()
}

/// The process's resident set, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// Room for `n` more sockets: the soft limit on open files raised to the hard one.
fn allow_open_files(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write our own struct; raising the soft limit up
    // to the hard one needs no privilege.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    assert!(
        lim.rlim_cur >= n + 256,
        "this test needs {n} sockets; the hard limit on open files is {}",
        lim.rlim_cur
    );
}

#[test]
fn slow_idle_and_dripping_connections_never_keep_a_normal_request_out() {
    allow_open_files(2000);
    let (_layer, guard) = tracing_prof_core::Profiler::builder().build().unwrap();
    let server =
        HttpServer::start(PprofHandler::new(guard.profiler().clone()), "127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let go = tracing_prof_test_support::have_go();
    let attackers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Warm: the first answer starts a worker thread and fills the profiler's caches.
    assert!(get(addr, "/debug/pprof/heap").unwrap().0.contains("200"));
    // HEAD: the head alone.
    let (status, body, _) = request(addr, "HEAD", "/debug/pprof/heap").unwrap();
    assert!(
        status.contains("200") && body.is_empty(),
        "{status}: {} bytes",
        body.len()
    );
    let rss_before = rss();
    for (attack, connections, ramp) in [
        (Attack::SlowLoris, 300, Duration::ZERO),
        (Attack::Idle, 2000, Duration::ZERO),
        // 20 more every 0.1 s, as the attack that found the old server's thread per connection.
        (Attack::Dripping, 1000, Duration::from_millis(5)),
        (Attack::Abandoning, 50, Duration::ZERO),
    ] {
        let stop = Arc::new(AtomicBool::new(false));
        attackers.block_on(async {
            for _ in 0..connections {
                attackers.spawn(attacker(addr, attack, Arc::clone(&stop)));
                if !ramp.is_zero() {
                    tokio::time::sleep(ramp).await;
                }
            }
            tokio::time::sleep(Duration::from_secs(2)).await; // all connected, and dripping
        });
        let mut times = Vec::new();
        for probe in 0..5 {
            let (status, body, took) =
                get(addr, "/debug/pprof/heap").unwrap_or_else(|e| panic!("{attack:?}: {e}"));
            assert!(
                status.contains("200"),
                "{attack:?}, probe {probe}: {status}"
            );
            // Within 1 s, but for one probe in a run: on CI's two busy cores the kernel may drop
            // one SYN while the listener drains a burst of 2000 connections, and the client
            // sends it again after 1 s (seen once in a full run: 1.02 s).
            assert!(
                took < Duration::from_secs(3),
                "{attack:?}, probe {probe}: answered in {took:?}"
            );
            times.push(took);
            if go && probe == 0 {
                let file = std::env::temp_dir()
                    .join(format!("tracing-prof-attack-{}.pb.gz", std::process::id()));
                std::fs::write(&file, &body).unwrap();
                let top = tracing_prof_test_support::pprof(&["-top"], &file);
                assert!(top.contains("flat%"), "{top}");
                let _ = std::fs::remove_file(&file);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        times.sort();
        assert!(
            times[3] < Duration::from_secs(1),
            "{attack:?}: more than one of 5 probes took over 1 s: {times:?}"
        );
        // The listener and its runtime, and at most one thread per answer at once.
        let threads = server_threads();
        assert!(
            threads <= 1 + MAX_CONNECTIONS,
            "{attack:?}: {threads} server threads under {connections} connections"
        );
        let grew = rss().saturating_sub(rss_before);
        assert!(
            grew < 32 << 20,
            "{attack:?}: the process grew by {} MiB",
            grew >> 20
        );
        eprintln!(
            "{attack:?} x {connections}: {threads} server threads, RSS +{} KiB",
            grew >> 10
        );
        stop.store(true, Ordering::Relaxed);
        attackers.block_on(async { tokio::time::sleep(Duration::from_millis(500)).await });
    }
    drop(server);
}
