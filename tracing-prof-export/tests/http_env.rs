//! `/debug/pprof` from the environment refuses what would expose it: an empty token (a
//! template whose secret went missing), a public address without a token; and names the
//! variable when the address is bad. A port another process holds is no reason to stop the
//! service: the server tries again in the background, and says where it stands. (Its own
//! process: environment variables are global.)

use tracing_prof_export::HttpServer;

use std::io::{Read, Write};
use std::time::{Duration, Instant};
use tracing_prof_export::PprofHandler;

fn set_env(vars: &[(&str, &str)]) {
    for v in [
        "TRACING_PROF_HTTP_ADDR",
        "TRACING_PROF_HTTP_TOKEN",
        "TRACING_PROF_HTTP_ALLOW_PUBLIC",
        "TRACING_PROF_HTTP_REQUIRED",
        "TRACING_PROF_METRICS_ADDR",
        "TRACING_PROF_METRICS_HISTOGRAMS",
        "TRACING_PROF_METRICS_BUCKETS",
    ] {
        // SAFETY: this test binary has one test, which alone touches the environment.
        unsafe { std::env::remove_var(v) };
    }
    for (k, v) in vars {
        // SAFETY: as above.
        unsafe { std::env::set_var(k, v) };
    }
}

fn try_start(vars: &[(&str, &str)]) -> Result<Option<HttpServer>, String> {
    set_env(vars);
    let (_layer, guard) = tracing_prof_core::Profiler::builder().build().unwrap();
    HttpServer::from_env(guard.profiler()).map_err(|e| e.to_string())
}

/// `GET path` on `addr`: the status line and the body.
fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// A port another process holds: the service starts without the server, which listens once
/// the port is free, and says so in `services()`, `stats()` and the index page meanwhile.
fn a_taken_port_is_tried_again() {
    let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = blocker.local_addr().unwrap();
    let taken = addr.to_string();
    set_env(&[
        ("TRACING_PROF_HTTP_ADDR", &taken),
        ("TRACING_PROF_HTTP_REQUIRED", "1"),
    ]);
    let (_layer, guard) = tracing_prof_core::Profiler::builder().build().unwrap();
    let e = HttpServer::from_env(guard.profiler())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("TRACING_PROF_HTTP_ADDR") && e.contains("TRACING_PROF_HTTP_REQUIRED"),
        "{e}"
    );
    set_env(&[("TRACING_PROF_HTTP_ADDR", &taken)]);
    let profiler = guard.profiler().clone();
    let server = HttpServer::from_env(&profiler)
        .expect("a taken port is no error at start")
        .expect("a server");
    assert_eq!(server.local_addr(), None);
    assert_eq!(profiler.stats().services_down, 1);
    let down = &profiler.services()[0];
    assert!(
        !down.up && down.detail.contains(&taken) && down.detail.contains("in use"),
        "{down:?}"
    );
    // Another mount of the endpoint (the application's own router) shows it on the index.
    let index = PprofHandler::new(profiler.clone()).handle("GET", "/debug/pprof/", None);
    let page = String::from_utf8(index.body).unwrap();
    assert!(
        page.contains("/debug/pprof server") && page.contains("<b>down</b>"),
        "{page}"
    );
    drop(blocker);
    let deadline = Instant::now() + Duration::from_secs(15);
    while server.local_addr().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        server.local_addr(),
        Some(addr),
        "it did not listen once free"
    );
    assert_eq!(profiler.stats().services_down, 0);
    let (status, page) = get(addr, "/debug/pprof/");
    assert!(status.contains("200"), "{status}");
    assert!(
        page.contains(&format!("listening on {taken}")) && !page.contains("<b>down</b>"),
        "{page}"
    );
    // Its threads' names whole, as the kernel keeps them (15 bytes) and `top -H`, `perf` and
    // the profiles' thread names show them: "tracing-prof-http" was cut to "tracing-prof-ht".
    #[cfg(target_os = "linux")]
    {
        let names: Vec<String> = std::fs::read_dir("/proc/self/task")
            .expect("/proc/self/task")
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|n| n.trim_end().to_owned())
            .collect();
        for name in ["tprof-http", "tprof-http-work"] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
    }
    drop(server);
    drop(guard);
}

#[test]
fn the_endpoint_is_never_exposed_by_accident() {
    let e = try_start(&[("TRACING_PROF_HTTP_ADDR", "0.0.0.0:0")]).unwrap_err();
    assert!(
        e.contains("TRACING_PROF_HTTP_ADDR") && e.contains("TRACING_PROF_HTTP_TOKEN"),
        "{e}"
    );
    let e = try_start(&[
        ("TRACING_PROF_HTTP_ADDR", "127.0.0.1:0"),
        ("TRACING_PROF_HTTP_TOKEN", " "),
    ])
    .unwrap_err();
    assert!(
        e.contains("TRACING_PROF_HTTP_TOKEN") && e.contains("empty"),
        "{e}"
    );
    let e = try_start(&[("TRACING_PROF_HTTP_ADDR", "127.0.0.1:notaport")]).unwrap_err();
    assert!(e.contains("TRACING_PROF_HTTP_ADDR"), "{e}");
    // Loopback, a token, or an explicit opt-in: served.
    assert!(
        try_start(&[("TRACING_PROF_HTTP_ADDR", "127.0.0.1:0")])
            .unwrap()
            .is_some()
    );
    assert!(
        try_start(&[
            ("TRACING_PROF_HTTP_ADDR", "0.0.0.0:0"),
            ("TRACING_PROF_HTTP_TOKEN", "s3cret"),
        ])
        .unwrap()
        .is_some()
    );
    assert!(
        try_start(&[
            ("TRACING_PROF_HTTP_ADDR", "0.0.0.0:0"),
            ("TRACING_PROF_HTTP_ALLOW_PUBLIC", "1"),
        ])
        .unwrap()
        .is_some()
    );
    assert!(try_start(&[]).unwrap().is_none());
    // `:PORT`, as Go users type it: loopback, that port.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let server = try_start(&[("TRACING_PROF_HTTP_ADDR", &format!(":{port}"))])
        .unwrap()
        .unwrap();
    assert_eq!(
        server.local_addr().unwrap(),
        std::net::SocketAddr::from(([127, 0, 0, 1], port))
    );
    drop(server);
    a_taken_port_is_tried_again();
    a_metrics_listener_serves_metrics_only();
}

/// `TRACING_PROF_METRICS_ADDR`: a listener for Prometheus on any address, without a token,
/// that answers `/metrics` and nothing of the profiles.
fn a_metrics_listener_serves_metrics_only() {
    set_env(&[("TRACING_PROF_METRICS_ADDR", "0.0.0.0:0")]);
    let (_layer, guard) = tracing_prof_core::Profiler::builder().build().unwrap();
    assert!(HttpServer::from_env(guard.profiler()).unwrap().is_none());
    let metrics = tracing_prof_export::http::MetricsServer::from_env(guard.profiler())
        .unwrap()
        .expect("a metrics listener");
    let port = metrics.local_addr().unwrap().port();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let (status, body) = get(addr, "/metrics");
    assert!(status.contains(" 200 "), "{status}");
    assert!(body.contains("tracing_prof_exports_total"), "{body}");
    for path in ["/debug/pprof/heap", "/debug/pprof/", "/"] {
        let (status, body) = get(addr, path);
        assert!(status.contains(" 404 "), "{path}: {status}");
        assert_eq!(body, "this listener serves /metrics only\n");
    }
    assert!(
        guard
            .profiler()
            .services()
            .iter()
            .any(|s| s.name == "/metrics server" && s.up),
        "{:?}",
        guard.profiler().services()
    );
    drop(metrics);
    set_env(&[("TRACING_PROF_METRICS_ADDR", "127.0.0.1:notaport")]);
    let e = tracing_prof_export::http::MetricsServer::from_env(guard.profiler())
        .unwrap_err()
        .to_string();
    assert!(e.contains("TRACING_PROF_METRICS_ADDR"), "{e}");
    // Its settings, checked: a bad one is an error naming its variable.
    for (var, bad, says) in [
        (
            "TRACING_PROF_METRICS_HISTOGRAMS",
            "many",
            "a number of span paths",
        ),
        ("TRACING_PROF_METRICS_BUCKETS", "10us-100s", "MIN..MAX"),
        (
            "TRACING_PROF_METRICS_BUCKETS",
            "1s..1ms",
            "below the second",
        ),
        ("TRACING_PROF_METRICS_BUCKETS", "1s..soon", "soon"),
    ] {
        set_env(&[("TRACING_PROF_METRICS_ADDR", "127.0.0.1:0"), (var, bad)]);
        let e = tracing_prof_export::http::MetricsServer::from_env(guard.profiler())
            .unwrap_err()
            .to_string();
        assert!(e.contains(var) && e.contains(says), "{var}={bad}: {e}");
    }
    set_env(&[
        ("TRACING_PROF_METRICS_ADDR", "127.0.0.1:0"),
        ("TRACING_PROF_METRICS_HISTOGRAMS", "5"),
        ("TRACING_PROF_METRICS_BUCKETS", "1ms..1s"),
    ]);
    assert!(
        tracing_prof_export::http::MetricsServer::from_env(guard.profiler())
            .unwrap()
            .is_some()
    );
}
