//! `/debug/pprof` mounted in a service's own axum server (the `axum` feature), answered with
//! the right status codes and read by `go tool pprof`.

use tracing_prof_test_support as common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use tracing_prof_core::Profiler;
use tracing_prof_export::http::{PprofHandler, axum_router};
use tracing_subscriber::prelude::*;

fn get(addr: &str, path: &str, headers: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\r\n"
    )
    .unwrap();
    let mut bytes = Vec::new();
    s.read_to_end(&mut bytes).unwrap();
    let text = String::from_utf8_lossy(&bytes); // a pprof body is gzip, not text
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.to_owned(), body.to_owned())
}

#[test]
fn axum_router_serves_pprof_on_the_services_own_port() {
    if crate::isolated(
        module_path!(),
        "axum_router_serves_pprof_on_the_services_own_port",
    ) {
        return;
    }
    let (layer, guard) = Profiler::builder().build().unwrap();
    tracing_subscriber::registry().with(layer).init();
    tracing::info_span!("axum_work")
        .in_scope(|| std::mem::forget(std::hint::black_box(vec![1u8; 100_000])));

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let open = axum::Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .merge(axum_router(PprofHandler::new(guard.profiler().clone())));
    let locked = axum::Router::new().merge(axum_router(
        PprofHandler::new(guard.profiler().clone()).bearer_token("t0k"),
    ));
    let (open_addr, locked_addr) = rt.block_on(async {
        let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let b = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addrs = (
            a.local_addr().unwrap().to_string(),
            b.local_addr().unwrap().to_string(),
        );
        tokio::spawn(async move { axum::serve(a, open).await.unwrap() });
        tokio::spawn(async move { axum::serve(b, locked).await.unwrap() });
        addrs
    });

    let (head, body) = get(&open_addr, "/health", "");
    assert!(
        head.starts_with("HTTP/1.1 200") && body == "ok",
        "the service's own routes still work: {head}"
    );
    let (head, body) = get(&open_addr, "/debug/pprof/", "");
    assert!(
        head.starts_with("HTTP/1.1 200") && body.contains("allocs"),
        "{head}\n{body}"
    );
    let (head, body) = get(&open_addr, "/debug/pprof/span_memory?debug=1", "");
    assert!(
        head.starts_with("HTTP/1.1 200") && body.contains("axum_work"),
        "{head}\n{body}"
    );
    let (head, _) = get(&open_addr, "/debug/pprof/nope", "");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    let (head, _) = get(&locked_addr, "/debug/pprof/heap", "");
    assert!(
        head.starts_with("HTTP/1.1 401")
            && head
                .to_ascii_lowercase()
                .contains("www-authenticate: bearer"),
        "{head}"
    );
    let (head, _) = get(
        &locked_addr,
        "/debug/pprof/heap",
        "Authorization: Bearer t0k\r\n",
    );
    assert!(
        head.starts_with("HTTP/1.1 200") && head.contains("application/octet-stream"),
        "{head}"
    );

    // Answering runs on tokio's blocking pool, threads the profiler does not own: what it
    // allocates (the encoded profiles) is the profiler's, not the service's `(no span)`.
    let alloc_of = |kind: tracing_prof_model::PathKind| {
        guard
            .profiler()
            .snapshot()
            .paths
            .iter()
            .filter(|p| p.kind == kind)
            .map(|p| p.memory.alloc_bytes)
            .sum::<u64>()
    };
    use tracing_prof_model::PathKind::{NoSpan, Profiler as Own};
    let (no_span, own) = (alloc_of(NoSpan), alloc_of(Own));
    // The client's own allocations go to a span of their own.
    let answered = tracing::info_span!("client").in_scope(|| {
        (0..20)
            .map(|_| {
                get(&open_addr, "/debug/pprof/span_memory?debug=1", "")
                    .1
                    .len()
                    + get(&open_addr, "/debug/pprof/heap", "").1.len()
            })
            .sum::<usize>() as u64
    });
    let (no_span, own) = (alloc_of(NoSpan) - no_span, alloc_of(Own) - own);
    assert!(
        own >= answered && no_span < own / 4,
        "40 answers of {answered} bytes in all: the profiler's own allocations grew by {own} \
         bytes, (no span) by {no_span}"
    );

    // A third window while two run: `429` with `Retry-After` (the mount once renamed every
    // header it did not list, this one to `x-tracing-prof`).
    let windows: Vec<_> = (0..2)
        .map(|_| {
            let addr = open_addr.clone();
            std::thread::spawn(move || get(&addr, "/debug/pprof/heap?seconds=1", "").0)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (head, _) = get(&open_addr, "/debug/pprof/heap?seconds=1", "");
    assert!(
        head.starts_with("HTTP/1.1 429") && head.to_ascii_lowercase().contains("retry-after: "),
        "{head}"
    );
    for w in windows {
        assert!(w.join().unwrap().starts_with("HTTP/1.1 200"));
    }

    if common::have_go() {
        let url = format!("http://{open_addr}/debug/pprof/span_memory");
        let top = common::pprof(&["-top", "-nodefraction=0"], url);
        assert!(top.contains("axum_pprof::axum_work [span]"), "{top}");
    }
    drop(rt);
}
