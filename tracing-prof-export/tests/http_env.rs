//! `/debug/pprof` from the environment refuses what would expose it: an empty token (a
//! template whose secret went missing), a public address without a token; and names the
//! variable when the address is bad. (Its own process: environment variables are global.)

use tracing_prof_export::HttpServer;

fn try_start(vars: &[(&str, &str)]) -> Result<Option<HttpServer>, String> {
    for v in [
        "TRACING_PROF_HTTP_ADDR",
        "TRACING_PROF_HTTP_TOKEN",
        "TRACING_PROF_HTTP_ALLOW_PUBLIC",
    ] {
        // SAFETY: this test binary has one test, which alone touches the environment.
        unsafe { std::env::remove_var(v) };
    }
    for (k, v) in vars {
        // SAFETY: as above.
        unsafe { std::env::set_var(k, v) };
    }
    let (_layer, guard) = tracing_prof_core::Profiler::builder().build().unwrap();
    HttpServer::from_env(guard.profiler()).map_err(|e| e.to_string())
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
}
