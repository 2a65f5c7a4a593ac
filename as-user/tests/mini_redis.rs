//! Real code nobody here wrote: tokio's mini-redis server (crates.io `mini-redis` 0.4.1,
//! unmodified), with the profiler installed as the README says, under real load on
//! 127.0.0.1, checked against what is known of that code.
//!
//! This test binary runs itself as the server (a child process: the load generator's own
//! allocations and CPU stay out of its profiles): `TaggingAllocator<Jemalloc>`,
//! `init_from_env`, the layer in the registry, and `mini_redis::server::run`. The test sends
//! SETs and GETs over plain TCP (RESP, one command at a time per connection, 4 connections),
//! then asks the child for its profiles while the server still holds its data.
//!
//! What mini-redis 0.4.1's source says, and the profiles must show:
//! - its handlers are `#[instrument] async fn apply` in `cmd/set.rs`, `cmd/get.rs` and
//!   `cmd/unknown.rs`, under `Handler::run`'s span `run` (`server.rs`): three callsites named
//!   `apply`, so the span paths name them by module;
//! - SET keeps the key (a `String` from `Parse::next_string`) and the value (`Bytes` copied
//!   from the frame, `Frame::parse`) while parsing in `run`, and inserts them into the `Db`'s
//!   `HashMap<String, Entry>` in `set::apply`: the table is one allocation of
//!   81 bytes per bucket (an 80-byte entry and a control byte) + 16;
//! - GET clones the value (`Db::get`); the first clone of a `Bytes` made from a `Vec` makes
//!   a 24-byte shared header that stays with the entry (bytes 1.x `promotable` clone);
//! - replies go out through `Connection::write_frame` (an async fn) and tokio's `Flush` to
//!   `send`: gdb and perf on the same server showed that chain under `Instrumented::poll` for
//!   most of each handler's CPU (README, "Tried on real code").

use tracing_prof_test_support as common;

use std::io::{BufRead, BufReader, Write};
use std::process::Command;
use tracing_prof::{ProfileKind, TaggingAllocator};
use tracing_prof_examples::resp::{self, command, send_all};
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: TaggingAllocator<tikv_jemallocator::Jemalloc> =
    TaggingAllocator::new(tikv_jemallocator::Jemalloc);

const CHILD: &str = "MINI_REDIS_SERVER_DIR";
/// Distinct keys set, value size, keys asked that were never set.
const KEYS: usize = 20_000;
const VALUE: usize = 1000;
const MISSES: usize = 1000;
const CONNECTIONS: usize = 4;

/// The child: mini-redis's own server with the profiler installed as the README says. Prints
/// its address; on a line on stdin (the number of `apply` spans the client's commands made),
/// writes its profiles to the directory once that many have closed (at most 5 s later) and
/// says `written`; when stdin closes, shuts down.
fn server(dir: &str) {
    let (layer, guard) = tracing_prof::init_from_env().unwrap();
    tracing_subscriber::registry().with(layer).init();
    let (rt, listener) = resp::listen(2);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let profiler = guard.profiler().clone();
    let dir = dir.to_owned();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            // A command's reply is written inside its `apply` span, which closes just after:
            // the client can have the last reply before its span has closed.
            let commands: u64 = line.trim().parse().unwrap_or(0);
            let applied = |s: &tracing_prof::Snapshot| -> u64 {
                s.paths
                    .iter()
                    .filter(|p| p.frames.last().is_some_and(|f| &*f.name == "apply"))
                    .map(|p| p.time.spans)
                    .sum()
            };
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            let mut snapshot = profiler.snapshot();
            while applied(&snapshot) < commands && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(10));
                snapshot = profiler.snapshot();
            }
            for kind in [
                ProfileKind::Cpu,
                ProfileKind::Heap,
                ProfileKind::SpanMemory,
                ProfileKind::Spans,
            ] {
                let path = format!("{dir}/{}.pb.gz", kind.name());
                std::fs::write(path, snapshot.encode(kind)).unwrap();
            }
            println!("written");
            std::io::stdout().flush().unwrap();
        }
        let _ = stop_tx.send(());
    });
    rt.block_on(mini_redis::server::run(listener, async {
        let _ = stop_rx.await;
    }))
    .unwrap();
    drop(rt);
    drop(guard);
}

/// A profile as `go tool pprof -raw` reads it.
fn raw(dir: &std::path::Path, kind: &str) -> common::Raw {
    common::raw(dir.join(format!("{kind}.pb.gz")))
}

const RUN: &str = "mini_redis::server::run [span]";
const SET: &str = "mini_redis::cmd::set::apply [span]";
const GET: &str = "mini_redis::cmd::get::apply [span]";

#[test]
fn mini_redis_under_load_reads_as_its_source_says() {
    if let Ok(dir) = std::env::var(CHILD) {
        server(&dir);
        return;
    }
    let dir = std::env::temp_dir().join(format!("tracing-prof-mini-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = common::server_child(
        Command::new(std::env::current_exe().unwrap()),
        "mini_redis_under_load_reads_as_its_source_says",
        CHILD,
        &dir,
    );
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addr = resp::server_addr(&mut out);

    // N distinct keys set, then every key got once, with misses.
    let value = vec![b'v'; VALUE];
    let key = |i: usize| format!("key:{i:012}");
    let per = KEYS / CONNECTIONS;
    let sets: Vec<usize> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CONNECTIONS)
            .map(|c| {
                let value = &value;
                s.spawn(move || {
                    send_all(addr, per, |i, out| {
                        command(&[b"SET", key(c * per + i).as_bytes(), value], out);
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sets.iter().sum::<usize>(), KEYS);
    let per_get = (KEYS + MISSES) / CONNECTIONS;
    let hits: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CONNECTIONS)
            .map(|c| {
                s.spawn(move || {
                    send_all(addr, per_get, |i, out| {
                        command(&[b"GET", key(c * per_get + i).as_bytes()], out);
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(hits, KEYS);
    // The profiles, while the server holds the data.
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", 2 * KEYS + MISSES).unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "written");
    drop(stdin);
    assert!(child.wait().unwrap().success());

    if !common::have_go() {
        return;
    }
    // Exact memory per span path, against the source.
    let m = raw(&dir, "span_memory");
    fn stack(leaf: &'static str) -> Vec<&'static str> {
        if leaf == RUN {
            vec![RUN]
        } else {
            vec![RUN, leaf]
        }
    }
    // Besides its own, a handler's path may hold tokio's list of deferred wakers: a worker
    // allocates it (4 wakers, 64 bytes) the first time a task it polls runs out of its
    // cooperative budget, and keeps it for its life. Under load that can be inside a handler's
    // span; one per worker at most (2 here).
    let own_and_tokios = |path: &'static str, objects: usize, bytes: usize| {
        let (o, b) = (
            m.value(&stack(path), "inuse_objects"),
            m.value(&stack(path), "inuse_space"),
        );
        let deferred = o - objects as i64;
        assert!(
            (0..=2).contains(&deferred) && b == bytes as i64 + 64 * deferred,
            "{path} holds {o} objects, {b} bytes; its own are {objects} and {bytes}"
        );
    };
    // GET: a 24-byte shared header per value read.
    own_and_tokios(GET, KEYS, KEYS * 24);
    // SET: the table, 81 bytes per bucket + 16 (20 000 keys: 32 768 buckets).
    let buckets = ((KEYS * 8 / 7) + 1).next_power_of_two();
    own_and_tokios(SET, 1, buckets * 81 + 16);
    // run: each key (16 bytes) and value, parsed before `apply`, and a few bytes of tokio's
    // and the registry's own.
    let (objects, bytes) = (
        m.value(&stack(RUN), "inuse_objects"),
        m.value(&stack(RUN), "inuse_space"),
    );
    let kept = (KEYS * (16 + VALUE)) as i64;
    assert!(
        (2 * KEYS as i64..2 * KEYS as i64 + 16).contains(&objects)
            && (kept..kept + 64 * 1024).contains(&bytes),
        "run holds {objects} objects, {bytes} bytes; the keys and values are {kept}"
    );
    // Span counts, exactly.
    let spans = raw(&dir, "spans");
    assert_eq!(spans.value(&stack(SET), "spans"), KEYS as i64);
    assert_eq!(spans.value(&stack(GET), "spans"), (KEYS + MISSES) as i64);

    // CPU: the code under each handler's span frame is its own body, the async fn it awaits
    // and the send it ends in (as gdb and perf showed); its labels keep the three `apply`s
    // apart.
    let cpu = raw(&dir, "cpu");
    let tags = common::pprof(&["-tags"], dir.join("cpu.pb.gz"));
    for path in [
        "run -> mini_redis::cmd::set::apply",
        "run -> mini_redis::cmd::get::apply",
    ] {
        assert!(tags.contains(path), "{tags}");
    }
    for (span, body) in [
        (
            SET,
            "mini_redis::cmd::set::Set::apply::{{closure}}::{{closure}}",
        ),
        (
            GET,
            "mini_redis::cmd::get::Get::apply::{{closure}}::{{closure}}",
        ),
    ] {
        let under: Vec<(&Vec<String>, i64)> = cpu
            .samples
            .iter()
            .filter(|(k, _)| k.len() > 2 && k[1] == span)
            .map(|(k, v)| (k, v[1]))
            .collect();
        let total: i64 = under.iter().map(|u| u.1).sum();
        assert!(total > 0, "no CPU under {span}");
        let share = |keep: &dyn Fn(&[String]) -> bool| -> f64 {
            under
                .iter()
                .filter(|(k, _)| keep(k))
                .map(|u| u.1)
                .sum::<i64>() as f64
                / total as f64
        };
        // Every stack starts with the handler's own body, but for the instrumentation's own
        // cost (the span's exit as the instrumented future's poll returns, a sample taken
        // inside tracing's entry into the span, every frame of it trimmed) and the drop of the
        // body's state when it is done.
        let machinery = |k: &[String]| {
            k[2] == "core::ptr::drop_in_place"
                || k[2] == tracing_prof::model::ALL_TRIMMED_FRAME
                || k[2].starts_with("<tracing_prof_core::layer::ProfileLayer")
                || k.iter()
                    .any(|f| f.starts_with("<tracing::span::Entered") || f.contains("Span::do_"))
        };
        assert_eq!(
            share(&|k| k[2] == body || machinery(k)),
            1.0,
            "{span}: {under:?}"
        );
        // (Mostly: on a saturated host, late samples pile onto the exit.)
        assert!(share(&|k| k[2] == body) > 0.7, "{span}: {under:?}");
        // Most of it replies: write_frame, and send at the leaf.
        let writes = share(&|k| {
            k.iter()
                .any(|f| f == "mini_redis::connection::Connection::write_frame::{{closure}}")
        });
        let sends = share(&|k| k.last().is_some_and(|f| f.contains("send")));
        assert!(
            writes > 0.5 && sends > 0.4,
            "{span}: write_frame {writes}, send {sends}"
        );
        // Nothing of tracing's machinery, nor of the other command.
        assert!(share(&|k| k.iter().any(|f| f.contains("Instrumented"))) == 0.0);
        assert!(share(&|k| k.iter().any(|f| f.contains("cmd::get") && span == SET)) == 0.0);
        // The TCP write by its name (a symbol alias named it UnixStream's).
        assert!(share(&|k| k.iter().any(|f| f.contains("TcpStream as Write>::write"))) > 0.4);
        assert!(share(&|k| k.iter().any(|f| f.contains("UnixStream"))) == 0.0);
    }
    // Parsing is `run`'s own work: read_frame under it.
    assert!(
        cpu.samples.keys().any(|k| k.len() > 1
            && k[0] == RUN
            && k[1] != SET
            && k.iter().any(|f| f.contains("read_frame"))),
        "no read_frame under run"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
