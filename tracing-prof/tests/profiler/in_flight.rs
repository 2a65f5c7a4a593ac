//! What is running now: a request stuck for 5 s comes first in the open spans listing, with
//! its age, through the API and through `/debug/pprof/goroutine` (plain, `?debug=1`,
//! `?debug=2`, and read back by `go tool pprof`); each thread shows the span path it is in;
//! a thread that exits and a span that closes leave the listing.

use tracing_prof_test_support as common;

use std::io::{Read, Write};
use std::sync::{Arc, Barrier};
use std::time::Duration;
use tracing::info_span;
use tracing_prof::Profiler;
use tracing_prof::export::{HttpServer, PprofHandler};
use tracing_subscriber::prelude::*;

fn get(addr: std::net::SocketAddr, path: &str) -> (u16, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let head_end = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = String::from_utf8_lossy(&answer[9..12]).parse().unwrap();
    (status, answer[head_end + 4..].to_vec())
}

/// The stuck request's span path name, and the young requests': another callsite of the same
/// name in the same module.
const STUCK: &str = "profiler::in_flight::request (in_flight.rs:57)";
const YOUNG: &str = "profiler::in_flight::request (in_flight.rs:71)";

#[test]
fn a_stuck_request_comes_first_with_its_age() {
    if crate::isolated(module_path!(), "a_stuck_request_comes_first_with_its_age") {
        return;
    }
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    tracing_subscriber::registry().with(layer).init();
    let profiler = guard.profiler().clone();
    let server = HttpServer::start(PprofHandler::new(profiler.clone()), "127.0.0.1:0").unwrap();

    // One request stuck in its query for 5 s; 8 requests open (not entered) for the last 1 s;
    // 200 quick requests done before.
    let started = Arc::new(Barrier::new(2));
    let release = Arc::new(Barrier::new(2));
    let stuck = {
        let (started, release) = (Arc::clone(&started), Arc::clone(&release));
        std::thread::Builder::new()
            .name("stuck-worker".into())
            .spawn(move || {
                info_span!("request").in_scope(|| {
                    info_span!("query").in_scope(|| {
                        started.wait();
                        release.wait(); // held until the listing was read
                    })
                })
            })
            .unwrap()
    };
    started.wait();
    for _ in 0..200 {
        info_span!("request").in_scope(|| info_span!("render").in_scope(|| {}));
    }
    std::thread::sleep(Duration::from_secs(4));
    let young: Vec<tracing::Span> = (0..8).map(|_| info_span!("request")).collect();
    std::thread::sleep(Duration::from_secs(1));

    // Paths are per callsite: the stuck request and its query come first (oldest first), then
    // the 8 young requests of another callsite, 1 s old.
    let now = profiler.in_flight();
    let rows: Vec<(String, u64)> = now
        .paths
        .iter()
        .map(|p| (tracing_prof::model::display_path(&p.frames), p.open))
        .collect();
    // Three callsites share the name `request` in one module: each goes by its line.
    assert_eq!(
        rows,
        [
            (STUCK.to_owned(), 1),
            (format!("{STUCK} -> query"), 1),
            (YOUNG.to_owned(), 8)
        ],
        "{now:#?}"
    );
    for stuck in &now.paths[..2] {
        let age = stuck.oldest[0].age;
        assert!(
            (Duration::from_secs(5)..Duration::from_secs(30)).contains(&age),
            "{age:?}"
        );
    }
    let young_ages: Vec<Duration> = now.paths[2].oldest.iter().map(|s| s.age).collect();
    assert_eq!(young_ages.len(), 8);
    assert!(
        young_ages
            .iter()
            .all(|a| (Duration::from_secs(1)..Duration::from_secs(4)).contains(a)),
        "{young_ages:?}"
    );
    assert_eq!(now.open(), 10, "no render span is left open");
    // The stuck thread is in request -> query, for as long; this thread is in no span.
    let t = now
        .threads
        .iter()
        .find(|t| t.name == "stuck-worker")
        .unwrap();
    let names: Vec<&str> = t.frames.iter().map(|f| &*f.name).collect();
    assert_eq!(names, ["request", "query"]);
    assert!(t.since.unwrap() >= Duration::from_secs(5));
    // This thread: libtest's, named after the test (the kernel keeps 15 bytes of a name), or
    // the main thread, named after the binary.
    let me = now
        .threads
        .iter()
        .find(|t| t.name == "in_flight::a_st" || t.name == "profiler");
    assert!(
        me.is_some_and(|t| t.frames.is_empty()),
        "{:#?}",
        now.threads
    );

    // The endpoint says the same.
    let (status, body) = get(
        server.local_addr().unwrap(),
        "/debug/pprof/goroutine?debug=1",
    );
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    let first = text.lines().nth(2).unwrap();
    assert!(
        first.starts_with("1 open, oldest 5.") && first.ends_with(&format!(": {STUCK}")),
        "{text}"
    );
    assert!(text.contains("\n8 open, oldest 1."), "{text}");
    assert!(text.starts_with("open spans: total 10\n"), "{text}");
    assert!(
        text.contains(&format!("[stuck-worker]: {STUCK} -> query for 5.")),
        "{text}"
    );
    let (_, body) = get(
        server.local_addr().unwrap(),
        "/debug/pprof/goroutine?debug=2",
    );
    let every = String::from_utf8(body).unwrap();
    assert!(
        every.lines().nth(2).unwrap().starts_with("span [open 5."),
        "{every}"
    );
    assert_eq!(every.matches("span [open ").count(), 10, "{every}");
    let (status, pprof) = get(server.local_addr().unwrap(), "/debug/pprof/goroutine");
    assert_eq!(status, 200);
    let p = tracing_prof::Profile::decode(&pprof).unwrap();
    assert_eq!(p.sample_types[0].name, "open_spans");
    assert!(
        p.binary.is_some(),
        "viewers show the program's name, not `unknown`"
    );
    assert_eq!(p.total(0), 10);
    if common::have_go() {
        let file = std::env::temp_dir().join(format!("in-flight-{}.pb.gz", std::process::id()));
        std::fs::write(&file, &pprof).unwrap();
        let raw = common::raw(&file);
        let _ = std::fs::remove_file(&file);
        assert_eq!(raw.types, ["open_spans"]);
        assert_eq!(
            raw.get(&[
                "profiler::in_flight::request [span]",
                "profiler::in_flight::query [span]"
            ]),
            Some(&vec![1]),
            "{:?}",
            raw.samples
        );
        // The two `request` callsites are one function for pprof: 1 + 8 open.
        assert_eq!(
            raw.get(&["profiler::in_flight::request [span]"]),
            Some(&vec![9])
        );
    }

    // Closed and exited: gone.
    release.wait();
    stuck.join().unwrap();
    drop(young);
    let now = profiler.in_flight();
    assert_eq!(now.open(), 0, "{now:#?}");
    assert!(!now.threads.iter().any(|t| t.name == "stuck-worker"));
    drop(server);
    drop(guard);
}
