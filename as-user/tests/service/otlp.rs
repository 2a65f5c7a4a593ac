//! The example service as the README's "OTLP profiles" section runs it, its variables read from
//! the README's command line: its profiles go to an OTLP receiver (the stand-in of
//! `tracing_prof_test_support::otlp_receiver`, which answers as the Collector and Pyroscope
//! would and decodes with the official `.proto` files, in place of the README's
//! `localhost:4318`), every request is taken, and with `SERVICE_OTEL=1` the CPU samples linked
//! to its requests' spans arrive as span profiles: as many samples, of as many spans, as the
//! service counted. Added for the test: fewer requests, a short interval, a directory of its
//! own, and one resource attribute.

use crate::running;

use std::collections::BTreeMap;
use tracing_prof_test_support::otlp_receiver::OtlpReceiver;

#[test]
fn the_service_sends_otlp_profiles_with_span_links() {
    let _serial = crate::serial();
    let receiver = OtlpReceiver::start();
    let dir = std::env::temp_dir().join(format!("tracing-prof-otlp-{}", std::process::id()));
    let mut service = std::process::Command::new(running::example());
    let variables = running::readme_variables(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "cargo run --release --example service --features otel",
    );
    assert!(
        variables
            .iter()
            .any(|(k, v)| k == "SERVICE_OTEL" && v == "1"),
        "{variables:?}"
    );
    for (k, v) in variables {
        match k.as_str() {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => service.env(k, receiver.url()),
            _ => service.env(k, v),
        };
    }
    let out = service
        .env("SERVICE_REQUESTS", "3000")
        .env("TRACING_PROF_DIR", &dir)
        .env("TRACING_PROF_INTERVAL", "300ms")
        .env("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
        .output()
        .expect("run the example (cargo test builds it)");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("otlp: push failed"), "{stderr}");

    let verdicts = receiver.verdicts();
    assert!(!verdicts.is_empty(), "nothing sent:\n{stderr}");
    assert_eq!(receiver.taken().len(), verdicts.len());
    let series: Vec<_> = verdicts
        .into_iter()
        .flat_map(|v| v.unwrap_or_else(|r| panic!("refused: {r:?}")))
        .collect();
    let names: std::collections::BTreeSet<&str> =
        series.iter().map(|s| s.profile_type.as_str()).collect();
    for name in [
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        "memory:inuse_space:bytes:memory:bytes",
        "span_memory:alloc_space:bytes:span_memory:bytes",
        "spans:spans:count:spans:count",
        "spans:wall:nanoseconds:spans:count",
    ] {
        assert!(names.contains(name), "no {name} in {names:#?}");
    }
    for s in &series {
        assert_eq!(s.labels["service_name"], "checkout");
        assert_eq!(s.labels["deployment.environment"], "test");
    }

    // "OpenTelemetry: E spans exported, R of them local roots with pyroscope.profile.id;
    // L of S CPU samples linked to N of those spans (U linked to a span not exported)."
    let line = stdout
        .lines()
        .find(|l| l.starts_with("OpenTelemetry: "))
        .unwrap_or_else(|| panic!("no OpenTelemetry summary:\n{stdout}"));
    let numbers: Vec<i64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let [_, _, linked, _, spans, unknown] = numbers[..] else {
        panic!("{line}");
    };
    assert_eq!(unknown, 0, "{line}");
    assert!(linked > 0, "{line}");
    let mut stored: BTreeMap<&str, i64> = BTreeMap::new();
    for s in series
        .iter()
        .filter(|s| s.profile_type.starts_with("process_cpu:"))
    {
        for (span, (trace, value)) in &s.spans {
            assert_eq!(trace.len(), 32, "span {span} without its trace id");
            *stored.entry(span).or_default() += value / s.scale;
        }
    }
    assert_eq!(
        stored.len() as i64,
        spans,
        "span profiles stored vs the service's: {line}"
    );
    assert_eq!(
        stored.values().sum::<i64>(),
        linked,
        "linked samples: {line}"
    );
}
