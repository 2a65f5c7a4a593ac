//! Real code nobody here wrote, the second: bore, a TCP tunnel (crates.io `bore-cli` 0.6.0,
//! unmodified), its server run as a new user's service would run it: the profiler installed as
//! the README says (`TaggingAllocator<Jemalloc>`, `init_from_env`, the layer in the registry)
//! inside a runtime started as `#[tokio::main]` starts it, before the profiler; built with the
//! README's `debug = "limited"` (the workspace's release profile). Under real load on
//! 127.0.0.1, and under `perf record` where perf runs, its profiles are checked against what
//! bore's source says and against perf's names for the same run of the same binary. (Under
//! `CI=true` perf must be installed; where the kernel refuses it sampling, that comparison is
//! skipped and says so.)
//!
//! What bore 0.6.0's source says (`server.rs`, `shared.rs`), and the profiles must show:
//! - every connection to the control port is handled by `Server::handle_connection`, in a task
//!   instrumented with the span `control`: the client's `Hello` (which then sends a heartbeat
//!   every 500 ms until the client goes), and one `Accept` per tunnelled connection, which
//!   proxies the two sockets with `shared::proxy`, i.e. tokio's `copy_bidirectional`;
//! - `copy_bidirectional` holds two buffers of 8 KiB (tokio's `DEFAULT_BUF_SIZE`), as boxed
//!   slices, for the life of each tunnelled connection, and the `Accept` handler keeps its
//!   control connection's two 8 KiB `Framed` buffers (`into_parts`) as long: 32 KiB per
//!   tunnel under `control`;
//! - the CPU a tunnelled byte costs the server is in that copy: reads and writes of the two
//!   sockets, under `control`.

use tracing_prof_test_support as common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tracing_prof::{ProfileKind, TaggingAllocator};
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: TaggingAllocator<tikv_jemallocator::Jemalloc> =
    TaggingAllocator::new(tikv_jemallocator::Jemalloc);

const CHILD: &str = "BORE_SERVER_DIR";
/// bore's control port (`shared::CONTROL_PORT`), fixed in its source.
const CONTROL_PORT: u16 = 7835;
/// Tunnelled connections, each held open through the load.
const CONNECTIONS: usize = 32;
/// Bytes each tunnelled connection sends (and gets back from the echo service) per round trip.
const CHUNK: usize = 4096;
/// What a tunnel holds for its life: copy_bidirectional's two buffers (tokio's
/// `DEFAULT_BUF_SIZE`) and its control connection's two `Framed` buffers, 8 KiB each.
const BUFFERS: i64 = 4 * 8 * 1024;
const CONTROL: &str = "bore_cli::server::control [span]";

/// The child: bore's server with the profiler installed as the README says, in a runtime made
/// as `#[tokio::main]` makes it (its workers run before the profiler starts). Prints
/// `listening` once the profiler is up; on a line `NAME N` on stdin, waits (up to 30 s) until N
/// `control` spans have closed, writes its profiles as `NAME-KIND.pb.gz` and says `written`;
/// when stdin closes, drops the guard (the final export) and ends.
fn server(dir: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let (layer, guard) = tracing_prof::init_from_env().expect("the profiler starts");
        tracing_subscriber::registry().with(layer).init();
        let profiler = guard.profiler().clone();
        let dir = dir.to_owned();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                let (name, closed) = line.split_once(' ').expect("NAME N");
                let closed: u64 = closed.parse().expect("a count");
                let deadline = Instant::now() + Duration::from_secs(30);
                let snapshot = loop {
                    let snapshot = profiler.snapshot();
                    let spans = snapshot.path(&["control"]).map_or(0, |p| p.time.spans);
                    if spans >= closed || Instant::now() > deadline {
                        break snapshot;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                };
                for kind in [
                    ProfileKind::Cpu,
                    ProfileKind::Heap,
                    ProfileKind::SpanMemory,
                    ProfileKind::Spans,
                ] {
                    let path = format!("{dir}/{name}-{}.pb.gz", kind.name());
                    std::fs::write(path, snapshot.encode(kind)).expect("write a profile");
                }
                println!("written");
                std::io::stdout().flush().expect("stdout");
            }
            let _ = stop_tx.send(());
        });
        let mut bore = bore_cli::server::Server::new(1024..=65535, None);
        bore.set_bind_addr(Ipv4Addr::LOCALHOST.into());
        bore.set_bind_tunnels(Ipv4Addr::LOCALHOST.into());
        println!("listening");
        std::io::stdout().flush().expect("stdout");
        tokio::select! {
            r = bore.listen() => r.expect("bore's control port (7835 on 127.0.0.1) is free"),
            _ = stop_rx => {}
        }
        drop(guard);
    });
}

/// The service behind the tunnel: echoes every byte back, a thread per connection.
fn echo_service() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("its address").port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                loop {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if conn.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    port
}

/// Whether `perf record` can sample here: installed (under `CI=true`, required) and allowed
/// by the kernel.
fn perf_runs(dir: &Path) -> bool {
    if !common::have(
        "perf",
        "--version",
        "linux-perf",
        "the comparison of names with perf's",
    ) {
        return false;
    }
    let ok = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-o"])
        .arg(dir.join("probe.data"))
        .arg("true")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "SKIPPED: perf is installed but the kernel refuses it sampling; names are not compared with perf's"
        );
    }
    ok
}

/// A profile as `go tool pprof -raw` reads it.
fn raw(dir: &Path, name: &str) -> common::Raw {
    common::raw(dir.join(format!("{name}.pb.gz")))
}

#[test]
fn bore_under_load_reads_as_its_source_and_perf_say() {
    if let Ok(dir) = std::env::var(CHILD) {
        server(&dir);
        return;
    }
    // Removed when dropped, a failing run's too (perf's data is about 45 MB).
    let scratch = common::scratch_dir("bore");
    let dir: PathBuf = scratch.path().to_path_buf();
    let perf = perf_runs(&dir);
    let exe = std::env::current_exe().unwrap();
    let cmd = if perf {
        let mut c = Command::new("perf");
        c.args(["record", "-q", "-e", "cpu-clock", "-F", "997"])
            .args(["--call-graph", "dwarf,16384", "-o"])
            .arg(dir.join("perf.data"))
            .arg("--")
            .arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let mut child = common::server_child(
        cmd,
        "bore_under_load_reads_as_its_source_and_perf_say",
        CHILD,
        &dir,
    );
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim() != "listening" {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the server did not start"
        );
    }

    // bore's client, as a user runs `bore local PORT --to 127.0.0.1`, in this process.
    let echo = echo_service();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match bore_cli::client::Client::new("127.0.0.1", echo, "127.0.0.1", 0, None).await {
                Ok(c) => break c,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    panic!("bore's client could not reach the server on {CONTROL_PORT}: {e:#}")
                }
            }
        }
    });
    let tunnel = SocketAddr::from((Ipv4Addr::LOCALHOST, client.remote_port()));
    let client_task = rt.spawn(client.listen());

    // Load: every connection sends CHUNK bytes and reads them back, again and again.
    let conns: Vec<TcpStream> = (0..CONNECTIONS)
        .map(|_| {
            let c = TcpStream::connect(tunnel).expect("the tunnel accepts");
            c.set_nodelay(true).unwrap();
            c
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(4);
    let round_trips: usize = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut c = c;
                    let send = vec![7u8; CHUNK];
                    let mut back = vec![0u8; CHUNK];
                    let mut n = 0;
                    while Instant::now() < until {
                        c.write_all(&send).unwrap();
                        c.read_exact(&mut back).unwrap();
                        assert_eq!(back, send);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert!(round_trips > CONNECTIONS, "{round_trips} round trips");

    let mut stdin = child.stdin.take().unwrap();
    let mut snapshot = |name: &str, closed: usize| {
        writeln!(stdin, "{name} {closed}").unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the server ended");
            if line.trim() == "written" {
                break;
            }
        }
    };
    // While every connection is open, and after they have all closed (each one's `control`
    // span with it).
    snapshot("open", 0);
    drop(conns);
    snapshot("closed", CONNECTIONS);
    client_task.abort();
    drop(rt);
    drop(stdin);
    assert!(child.wait().unwrap().success());

    if !common::have_go() {
        return;
    }
    // Memory: each open tunnel holds, under `control`, copy_bidirectional's two buffers and
    // the two 8 KiB buffers of its control connection's `Framed` (tokio-util's
    // `INITIAL_CAPACITY`), which `into_parts` keeps until the proxy ends: 32 KiB, and a few
    // hundred bytes more (its sockets' registrations with tokio's driver, the codec's
    // delimiters, the decoded frame's shared header: 298 B a tunnel here); it gives all of it
    // back when it closes. (The Hello handler's stale-connection tasks, a few hundred bytes
    // each, are under `control` too, alive in both captures unless their 10 s ran out in
    // between, on a slow machine: then they count here too, hence up to 2 KiB over.)
    let inuse = |name: &str| raw(&dir, name).value(&[CONTROL], "inuse_space");
    let held = inuse("open-span_memory") - inuse("closed-span_memory");
    let per = held / CONNECTIONS as i64;
    assert!(
        (BUFFERS..BUFFERS + 2048).contains(&per),
        "{held} B held by {CONNECTIONS} tunnels"
    );
    // Spans: one `control` per tunnelled connection has closed (the client's Hello is still open).
    let spans = raw(&dir, "closed-spans");
    assert_eq!(spans.value(&[CONTROL], "spans"), CONNECTIONS as i64);

    // CPU: the code under the handler, by our names and by perf's for the same run.
    let ours = Shares::under_handler(ours_cpu(&dir.join("closed-cpu.pb.gz")));
    assert!(
        ours.samples >= 200,
        "{} samples under the handler",
        ours.samples
    );
    // The copy, as tokio's source has it: copy_bidirectional's future, each direction's
    // CopyBuffer filling from one socket and writing to the other, through std's TcpStream.
    for f in [
        "tokio::io::util::copy_bidirectional::copy_bidirectional::{{closure}}",
        "tokio::io::util::copy::CopyBuffer::poll_write_buf",
        "<std::sys::net::connection::socket::TcpStream>::write",
        "tokio::io::util::copy::CopyBuffer::poll_fill_buf",
        "<std::sys::net::connection::socket::TcpStream>::read",
    ] {
        assert!(ours.of(f) >= 0.05, "{f}: {:.3}", ours.of(f));
    }
    if perf {
        let theirs = Shares::under_handler(perf_cpu(&dir.join("perf.data"), &exe));
        compare_with_perf(&ours, &theirs);
    }
}

/// Our names and shares against perf's for the same run: every function of the program's own
/// code that either side finds under the handler in 3% of its samples or more is found by the
/// other side too, by the same full name, with a share within 10 points. Both sample CPU time (perf at 997 Hz
/// by its cpu-clock event, we at 1000 Hz by each thread's CPU clock), about two thousand
/// samples each: the binomial standard deviation of a difference is about 1.3 points, and in
/// every run tried perf found the reads 2 to 4 points more often than we did and the writes as
/// much less (the kernel checks a thread's CPU timers at its tick, 4 ms here, and perf's
/// cpu-clock is a high-resolution timer).
fn compare_with_perf(ours: &Shares, theirs: &Shares) {
    let mut table = format!("{:>6} {:>6}  function\n", "ours", "perf");
    let mut names: Vec<&String> = ours.share.keys().chain(theirs.share.keys()).collect();
    names.sort();
    names.dedup();
    for n in &names {
        let (o, t) = (ours.of(n), theirs.of(n));
        if o.max(t) >= 0.02 {
            table += &format!("{:5.1}% {:5.1}%  {n}\n", 100.0 * o, 100.0 * t);
        }
    }
    table += &format!("samples: ours {}, perf {}", ours.samples, theirs.samples);
    eprintln!("{table}");
    assert!(theirs.samples >= 200, "{table}");
    let close = |a: f64, b: f64| (a - b).abs() <= 0.10;
    // The program's code, by the same name.
    for n in &names {
        let (o, t) = (ours.of(n), theirs.of(n));
        let own = ours.origin.get(*n).is_some_and(|o| o.is_none())
            || theirs.origin.get(*n).is_some_and(|o| o.is_none());
        if own && o.max(t) >= 0.03 {
            assert!(
                o > 0.0 && t > 0.0 && close(o, t),
                "{n}: ours {o:.3}, perf {t:.3}\n{table}"
            );
        }
    }
    // A shared library's functions (ours named from its symbol table, without a file): perf
    // has a function of a library there, by the name its debug information gives the same
    // entry point (`__libc_send` for our `send`).
    for (n, origin) in &ours.origin {
        let o = ours.of(n);
        if origin.is_none() || o < 0.03 {
            continue;
        }
        let found = theirs
            .origin
            .iter()
            .any(|(m, lib)| lib.is_some() && m.ends_with(n.as_str()) && close(o, theirs.of(m)));
        assert!(
            found,
            "{n} (ours {o:.3}): perf has no library function by that name with a share near it\n{table}"
        );
    }
}

/// A stack's frames, leaf first: each function's full name, and where its code is: `None` for
/// the program's own code (ours: a frame with a file; perf's: a frame in the program's binary),
/// otherwise the shared library perf found it in (ours: `Some` of an empty name, a frame the
/// symbol table named without a file).
type Stack = Vec<(String, Option<String>)>;

/// bore's handler, by its full name: the frame the comparison starts from.
const HANDLER: &str = "bore_cli::server::Server::handle_connection::{{closure}}";

/// Of the samples whose stack passes through [`HANDLER`], the share that holds each function at
/// or below it (each function once per sample).
struct Shares {
    samples: u64,
    share: BTreeMap<String, f64>,
    origin: BTreeMap<String, Option<String>>,
}

impl Shares {
    fn under_handler(stacks: Vec<(Stack, u64)>) -> Shares {
        let mut samples = 0;
        let mut count: BTreeMap<String, u64> = BTreeMap::new();
        let mut origin = BTreeMap::new();
        for (stack, n) in stacks {
            let Some(top) = stack.iter().position(|(f, _)| f == HANDLER) else {
                continue;
            };
            samples += n;
            let mut seen = std::collections::BTreeSet::new();
            for (f, from) in &stack[..=top] {
                if seen.insert(f) {
                    *count.entry(f.clone()).or_default() += n;
                    origin.insert(f.clone(), from.clone());
                }
            }
        }
        let share = count
            .into_iter()
            .map(|(f, c)| (f, c as f64 / samples.max(1) as f64))
            .collect();
        Shares {
            samples,
            share,
            origin,
        }
    }

    fn of(&self, f: &str) -> f64 {
        self.share.get(f).copied().unwrap_or(0.0)
    }
}

/// Our CPU profile's stacks, as `go tool pprof -raw` reads them, by each frame's full (system)
/// name; the sample count of each.
fn ours_cpu(file: &Path) -> Vec<(Stack, u64)> {
    let (_, samples) = common::raw_samples(file);
    samples
        .into_iter()
        .map(|(values, frames)| {
            let stack = frames
                .into_iter()
                .map(|f| (f.system_name, (!f.has_file).then(String::new)))
                .collect();
            (stack, values[0] as u64)
        })
        .collect()
}

/// perf's samples of the same run, unwound with the binary's DWARF, inlined frames included
/// (`perf script --inline`): a line per frame, `ADDRESS NAME (inlined)` for an inlined function,
/// `ADDRESS NAME (DSO)` for the physical one at that address.
fn perf_cpu(data: &Path, exe: &Path) -> Vec<(Stack, u64)> {
    let out = Command::new("perf")
        .args(["script", "-F", "tid,ip,sym,dso", "--inline", "-i"])
        .arg(data)
        .output()
        .expect("perf script runs");
    assert!(
        out.status.success(),
        "perf script: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let exe = exe.to_string_lossy();
    let mut stacks = Vec::new();
    for block in text.split("\n\n") {
        // (address, name, DSO or None for an inlined function), leaf first.
        let lines: Vec<(&str, &str, Option<&str>)> = block
            .lines()
            .skip(1)
            .filter_map(|l| {
                let (ip, rest) = l.trim().split_once(' ')?;
                let (name, tail) = rest.rsplit_once(" (")?;
                let dso = tail.strip_suffix(')').unwrap_or(tail);
                Some((ip, name, (dso != "inlined").then_some(dso)))
            })
            .collect();
        // The functions at one address are one physical frame: its DSO is theirs. Where perf
        // names only inlined functions at an address (from a library's own debug information),
        // the code is not the program's.
        let stack: Stack = lines
            .iter()
            .map(|&(ip, name, _)| {
                let dso = lines.iter().filter(|l| l.0 == ip).find_map(|l| l.2);
                let origin = match dso {
                    Some(d) if d == exe => None,
                    Some(d) => Some(d.to_owned()),
                    None => Some(String::from("?")),
                };
                (name.to_owned(), origin)
            })
            .collect();
        if !stack.is_empty() {
            stacks.push((stack, 1));
        }
    }
    stacks
}
