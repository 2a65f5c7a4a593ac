//! The example service as a user runs it, configured by Pyroscope's own variables, against a
//! local server that answers by the rules of a real one
//! (`tracing_prof_test_support::pyroscope_server`, each rule citing the Pyroscope file it comes
//! from): through both APIs every request passes every check and every one of the service's
//! requests is counted once; and CPU samples linked to OpenTelemetry spans are stored as span
//! profiles. The exporter's own conformance tests are in `tracing-prof-export/tests/pyroscope.rs`.

use std::collections::BTreeMap;
use tracing_prof_test_support::pyroscope_server::storage::{self, Ingester1x};
use tracing_prof_test_support::pyroscope_server::{
    Mock, OK, check_types_and_duplicates, group_by_interval, label, stored_spans,
};

const REQUEST: &str = "tracing_prof_examples::request [span]";

/// The example service, configured by Pyroscope's own variables (the README's command's, the
/// address the mock's, then the rest), pushing through each API with basic auth, a tenant and
/// tags: every request passes every check, and every one of its requests is counted once.
#[test]
fn the_example_service_passes_through_both_apis() {
    let _serial = crate::serial();
    let example = crate::running::example();
    for api in ["push", "ingest"] {
        let server = Mock::start(OK);
        let dir =
            std::env::temp_dir().join(format!("tracing-prof-pyro-{api}-{}", std::process::id()));
        let mut service = std::process::Command::new(&example);
        for (k, v) in crate::running::readme_variables(
            "PYROSCOPE_SERVER_ADDRESS",
            "cargo run --release --example service",
        ) {
            service.env(
                &k,
                if k == "PYROSCOPE_SERVER_ADDRESS" {
                    server.url()
                } else {
                    v
                },
            );
        }
        let out = service
            .env("SERVICE_REQUESTS", "3000")
            .env("TRACING_PROF_DIR", &dir)
            .env("TRACING_PROF_INTERVAL", "300ms")
            .env("PYROSCOPE_APPLICATION_NAME", "checkout")
            .env("PYROSCOPE_BASIC_AUTH_USER", "123456")
            .env("PYROSCOPE_BASIC_AUTH_PASSWORD", "glc_secret")
            .env("PYROSCOPE_TENANT_ID", "team-a")
            .env("PYROSCOPE_LABELS", "env=test,region=eu-west-1")
            .env("TRACING_PROF_PYROSCOPE_API", api)
            .output()
            .expect("run the example (cargo test builds it)");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for r in server.taken() {
            assert_eq!(
                r.header("authorization"),
                Some("Basic MTIzNDU2OmdsY19zZWNyZXQ=")
            );
            assert_eq!(r.header("x-scope-orgid"), Some("team-a"));
        }
        let verdicts = server.accepted();
        assert!(!verdicts.is_empty(), "{api}: nothing pushed");
        let groups = if api == "push" {
            verdicts
        } else {
            group_by_interval(&server.taken(), &verdicts)
        };
        check_types_and_duplicates(&groups);
        let mut store = Ingester1x::default();
        for s in groups.iter().flatten() {
            assert_eq!(label(&s.labels, "service_name"), "checkout", "{api}");
            assert_eq!(label(&s.labels, "region"), "eu-west-1", "{api}");
            store.ingest(s);
        }
        let requests = stored_spans(&store, REQUEST);
        assert_eq!(requests, 3000, "{api}");
    }
}

/// `SERVICE_OTEL=1`: the example's CPU samples carry the span ids of their requests, and a
/// Pyroscope server stores them as span profiles (`storage::span_profiles`): as many linked
/// samples, of as many spans, as the service counted in its own profile, each with its trace
/// id; `span_id` and `trace_id` never become series labels.
#[test]
fn span_profiles_reach_pyroscope_by_span_id() {
    let _serial = crate::serial();
    let example = crate::running::example();
    let server = Mock::start(OK);
    let dir = std::env::temp_dir().join(format!("tracing-prof-pyro-otel-{}", std::process::id()));
    let out = std::process::Command::new(&example)
        .env("SERVICE_REQUESTS", "3000")
        .env("SERVICE_OTEL", "1")
        .env("TRACING_PROF_DIR", &dir)
        .env("TRACING_PROF_INTERVAL", "300ms")
        .env("PYROSCOPE_SERVER_ADDRESS", server.url())
        .env("PYROSCOPE_APPLICATION_NAME", "checkout")
        .output()
        .expect("run the example (cargo test builds it)");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "OpenTelemetry: E spans exported, R of them local roots with pyroscope.profile.id;
    // L of S CPU samples linked to N of those spans (U linked to a span not exported)."
    let line = stdout
        .lines()
        .find(|l| l.starts_with("OpenTelemetry: "))
        .unwrap_or_else(|| panic!("no OpenTelemetry summary:\n{stdout}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let [_, roots, linked, _, spans, unknown] = numbers[..] else {
        panic!("{line}");
    };
    assert_eq!(
        roots,
        3000 + 1,
        "one root per request, and the audit task's: {line}"
    );
    assert_eq!(unknown, 0, "{line}");
    assert!(linked > 0 && spans > 0, "{line}");

    let mut stored: BTreeMap<u64, i64> = BTreeMap::new();
    for series in server.accepted().iter().flatten() {
        for labels in &series.profile.sample_labels {
            let as_series = storage::series_labels_of(labels);
            assert!(
                as_series
                    .iter()
                    .all(|(k, _)| k != "span_id" && k != "trace_id")
            );
        }
        if label(&series.labels, "__name__") != "process_cpu" {
            assert!(storage::span_profiles(&series.profile).is_empty());
            continue;
        }
        for (span, p) in storage::span_profiles(&series.profile) {
            assert_ne!(p.trace_id, [0; 16], "span {span:x} without its trace id");
            *stored.entry(span).or_default() += p.values["samples"];
        }
    }
    assert_eq!(
        stored.len() as u64,
        spans,
        "span profiles stored vs the service's"
    );
    assert_eq!(
        stored.values().sum::<i64>() as u64,
        linked,
        "linked samples stored vs the service's"
    );
}
