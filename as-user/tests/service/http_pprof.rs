//! The real `go tool pprof` fetches `/debug/pprof/heap`, `/allocs`, `/spans` and a `-seconds 2`
//! window from the running example service over HTTP, and finds the expected top span paths.

use crate::running;
use tracing_prof_test_support as common;

use running::Service;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn start(token: Option<&str>) -> (Service, String) {
    let env: Vec<(&str, &str)> = token
        .map(|t| ("TRACING_PROF_HTTP_TOKEN", t))
        .into_iter()
        .collect();
    running::start(20, &env)
}

/// The function names of `-top` output, in its order.
fn entries(top: &str) -> Vec<&str> {
    let lines = top
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1);
    // flat flat% sum% cum cum% NAME (a name may hold spaces: `app::request [span]`).
    let names: Vec<&str> = lines
        .filter_map(|l| {
            let mut rest = l.trim_start();
            for _ in 0..5 {
                rest = rest.split_once(char::is_whitespace)?.1.trim_start();
            }
            Some(rest.trim_end())
        })
        .collect();
    assert!(!names.is_empty(), "no entries:\n{top}");
    names
}

fn top_entry(top: &str) -> &str {
    entries(top)[0]
}

/// Which span leads in *self* CPU in a short window of a loaded machine varies between `render`
/// and `request`; the root leads by cumulative time, and `render` is in the top two by self time.
fn assert_cpu_shape(base: &str, extra: &[&str]) {
    let by_cum = common::pprof(
        &[&["-top", "-cum"], extra].concat(),
        format!("{base}/spans"),
    );
    assert!(by_cum.contains("Type: cpu"), "{by_cum}");
    if extra.contains(&"-seconds") {
        assert!(by_cum.contains("Duration: 2"), "a 2 s window: {by_cum}");
    }
    assert_eq!(
        top_entry(&by_cum),
        "tracing_prof_examples::request [span]",
        "{by_cum}"
    );
    let by_self = common::pprof(&[&["-top"], extra].concat(), format!("{base}/spans"));
    assert!(
        entries(&by_self)[..2].contains(&"tracing_prof_examples::render [span]"),
        "{by_self}"
    );
}

/// A raw GET, returning the status line and the body.
fn get(base: &str, path: &str, headers: &str) -> (String, String) {
    try_get(base, path, headers).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

fn try_get(base: &str, path: &str, headers: &str) -> std::io::Result<(String, String)> {
    let host = base
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap();
    let mut s = TcpStream::connect(host)?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\n{headers}\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    Ok((
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    ))
}

#[test]
fn go_tool_pprof_reads_the_live_endpoint() {
    let _serial = crate::serial();
    let have_go = common::have_go();
    let (_service, base) = start(None);
    std::thread::sleep(Duration::from_secs(2)); // let it handle some requests

    let (status, index) = get(&base, "/debug/pprof/", "");
    assert!(
        status.contains("200") && index.contains("heap") && index.contains("spans"),
        "{status}\n{index}"
    );
    let (status, table) = get(&base, "/debug/pprof/span_memory?debug=1", "");
    assert!(
        status.contains("200")
            && table
                .contains("    tracing_prof_examples::cache_fill [span] (examples/workload.rs:"),
        "{table}"
    );
    let (status, _) = get(&base, "/debug/pprof/heap?seconds=999", "");
    assert!(status.contains("400"), "{status}");
    let (status, _) = get(&base, "/nope", "");
    assert!(status.contains("404"), "{status}");
    if !have_go {
        return; // reported by have_go
    }
    // The profiler's own memory (debug info while it symbolizes new sites) left aside.
    let memory = common::pprof(
        &["-top", "-ignore=tracing-prof"],
        format!("{base}/span_memory"),
    );
    assert!(memory.contains("Type: inuse_space"), "{memory}");
    assert_eq!(
        top_entry(&memory),
        "tracing_prof_examples::cache_fill [span]",
        "{memory}"
    );
    // The sampled heap: code stacks under the same span frames.
    let heap = common::pprof(&["-traces"], format!("{base}/heap"));
    assert!(heap.contains("Type: inuse_space"), "{heap}");
    assert!(heap.contains("tracing_prof_examples::cache_fill"), "{heap}");
    let allocs = common::pprof(&["-top"], format!("{base}/allocs"));
    assert!(allocs.contains("Type: alloc_space"), "{allocs}");
    assert_cpu_shape(&base, &[]);
    // 2 s windows while the service works: the same shape, over 2 s only.
    assert_cpu_shape(&base, &["-seconds", "2"]);

    // Go's CPU profile endpoint, as `go tool pprof URL` asks for it: the next 2 s of CPU, with
    // the example's CPU-heavy function under its span frames.
    let cpu = common::pprof(&["-traces"], format!("{base}/profile?seconds=2"));
    assert!(
        cpu.contains("Type: cpu") && cpu.contains("Duration: 2"),
        "{cpu}"
    );
    // render under its span frame, with the closure `handle` gives to `in_scope` between.
    let under_render = common::traces(&cpu).iter().any(|frames| {
        frames.ends_with(
            &[
                "tracing_prof_examples::render",
                "tracing_prof_examples::handle::{{closure}}::{{closure}}",
                "tracing_prof_examples::render [span]",
                "tracing_prof_examples::request [span]",
            ]
            .map(String::from),
        )
    });
    assert!(
        under_render,
        "render is not under request -> render:\n{cpu}"
    );
}

#[test]
fn a_token_protects_the_endpoint() {
    let _serial = crate::serial();
    let (_service, base) = start(Some("s3cret"));
    let (status, body) = get(&base, "/debug/pprof/heap", "");
    assert!(status.contains("401"), "{status}");
    assert!(!body.contains("s3cret"));
    let (status, _) = get(
        &base,
        "/debug/pprof/heap",
        "Authorization: Bearer wrong\r\n",
    );
    assert!(status.contains("401"), "{status}");
    let (status, body) = get(
        &base,
        "/debug/pprof/heap?debug=1",
        "Authorization: Bearer s3cret\r\n",
    );
    // The table's header (its samples may not have been taken yet this early).
    assert!(
        status.contains("200") && body.starts_with("tracing-prof heap profile"),
        "{status}\n{body}"
    );
}

#[test]
fn slow_and_oversized_clients_are_cut_off() {
    let _serial = crate::serial();
    let (_service, base) = start(None);
    let host = base
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    // A slow-loris: 50 connections that never send a request. A real client is answered at
    // once all the same (it used to get a reset until they timed out).
    let mut idle: Vec<TcpStream> = (0..50)
        .map(|_| TcpStream::connect(&host).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200)); // all accepted
    let (status, _) = get(&base, "/debug/pprof/span_memory?debug=1", "");
    assert!(status.contains("200"), "{status}");
    if common::have_go() {
        let top = common::pprof(&["-top"], format!("http://{host}/debug/pprof/heap"));
        assert!(top.contains("flat%"), "{top}");
    }
    // Past MAX_OPEN (128) open connections: the oldest idle ones are closed to make room, so
    // a real client is still answered, and so is one whose request follows its connect by a
    // moment and comes in two writes (as any client's may, under load).
    idle.extend((0..150).map(|_| TcpStream::connect(&host).unwrap()));
    std::thread::sleep(Duration::from_millis(200));
    let (status, _) = try_get(&base, "/debug/pprof/heap?debug=1", "")
        .unwrap_or_else(|e| panic!("a server full of idle connections must answer, not {e}"));
    assert!(status.contains("200"), "{status}");
    let answer = (|| -> std::io::Result<String> {
        let mut s = TcpStream::connect(&host)?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        std::thread::sleep(Duration::from_millis(30));
        s.write_all(b"GET /debug/pprof/heap?debug=1 HTTP/1.1\r\n")?;
        std::thread::sleep(Duration::from_millis(10));
        s.write_all(format!("Host: {host}\r\n\r\n").as_bytes())?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    })()
    .unwrap_or_else(|e| panic!("a late request must be answered, not {e}"));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The idle ones are closed by the server: the oldest to make room, the rest once past
    // READ_TIMEOUT (5 s).
    std::thread::sleep(Duration::from_secs(6));
    let closed = idle
        .iter()
        .filter(|s| {
            let mut s: &TcpStream = s;
            // Closed: an end of file or a reset (or a last word, then those); open: no data yet.
            s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
            match s.read(&mut [0u8; 1]) {
                Ok(0 | 1) => true,
                Ok(_) => unreachable!("a one-byte buffer"),
                Err(e) => !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
            }
        })
        .count();
    assert_eq!(
        closed,
        idle.len(),
        "idle connections left open past the head timeout"
    );
    drop(idle);
    let huge = format!("X-Junk: {}\r\n", "a".repeat(20_000));
    let (status, _) = get(&base, "/debug/pprof/heap", &huge);
    assert!(status.contains("431"), "{status}");
}

#[test]
fn concurrent_windows_are_bounded() {
    let _serial = crate::serial();
    let (_service, base) = start(None);
    // Three windows at once: two run (MAX_WINDOWS), the third is told when to come back.
    let answers: Vec<(String, String)> = std::thread::scope(|s| {
        let asks: Vec<_> = (0..3)
            .map(|_| s.spawn(|| raw_get(&base, "/debug/pprof/spans?seconds=2&debug=1")))
            .collect();
        asks.into_iter().map(|a| a.join().unwrap()).collect()
    });
    let mut statuses: Vec<&str> = answers
        .iter()
        .map(|(head, _)| head.lines().next().unwrap_or(""))
        .collect();
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [
            "HTTP/1.1 200 OK",
            "HTTP/1.1 200 OK",
            "HTTP/1.1 429 Too Many Requests"
        ],
        "{answers:?}"
    );
    let refused = answers.iter().find(|(h, _)| h.contains(" 429 ")).unwrap();
    assert!(refused.0.contains("Retry-After: 2"), "{}", refused.0);
}

/// A raw GET, returning the whole head and the body.
fn raw_get(base: &str, path: &str) -> (String, String) {
    let host = base
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap();
    let mut s = TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    (head.to_owned(), body.to_owned())
}
