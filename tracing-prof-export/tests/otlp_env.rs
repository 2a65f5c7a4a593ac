//! The OTLP exporter's settings from the environment, read as OpenTelemetry's SDKs read them
//! (opentelemetry-specification, `specification/protocol/exporter.md`): the profiles variables
//! before the general ones, a base URL given the profiles path, empty values as unset; and a
//! setting that cannot work is an error naming its variable, without the secret it holds.
//! (Its own process: environment variables are global.)

use tracing_prof_export::otlp::OtlpConfig;

const VARS: [&str; 12] = [
    "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
];

/// The configuration the environment `vars` makes, as `Debug` shows it, or the error.
fn from(vars: &[(&str, &str)]) -> Result<Option<String>, String> {
    for v in VARS {
        // SAFETY: this test binary has one test, which alone touches the environment.
        unsafe { std::env::remove_var(v) };
    }
    for (k, v) in vars {
        // SAFETY: as above.
        unsafe { std::env::set_var(k, v) };
    }
    OtlpConfig::from_env()
        .map(|c| c.map(|c| format!("{c:?}")))
        .map_err(|e| e.to_string())
}

#[test]
fn settings_come_from_the_opentelemetry_variables() {
    assert_eq!(from(&[]), Ok(None));
    assert_eq!(
        from(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "")]),
        Ok(None),
        "empty is unset"
    );

    let c = from(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")])
        .unwrap()
        .unwrap();
    assert!(
        c.contains("endpoint: \"http://collector:4318/v1development/profiles\""),
        "{c}"
    );
    assert!(
        c.contains("gzip: true") && c.contains("timeout: 10s"),
        "{c}"
    );

    // The profiles endpoint is used as is, and wins.
    let c = from(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        (
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
            "http://pyroscope:4040/v1development/profiles",
        ),
        ("OTEL_EXPORTER_OTLP_HEADERS", "X-General=general"),
        (
            "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
            "X-Scope-OrgID=team%20a,Authorization=Bearer%20s3cret",
        ),
        ("OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT", "2500"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_SERVICE_NAME", "checkout"),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod"),
    ])
    .unwrap()
    .unwrap();
    assert!(
        c.contains("endpoint: \"http://pyroscope:4040/v1development/profiles\""),
        "{c}"
    );
    // The profiles headers replace the general ones (not merged), values never shown.
    assert!(
        c.contains("headers: [\"X-Scope-OrgID: <redacted>\", \"Authorization: <redacted>\"]"),
        "{c}"
    );
    assert!(!c.contains("X-General") && !c.contains("s3cret"), "{c}");
    assert!(
        c.contains("gzip: false") && c.contains("timeout: 2.5s"),
        "{c}"
    );
    assert!(c.contains("(\"service.name\", Str(\"checkout\"))"), "{c}");
    assert!(
        c.contains("(\"deployment.environment\", Str(\"prod\"))"),
        "{c}"
    );

    // What cannot work is an error naming the variable.
    let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317");
    let e = from(&[base, ("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "grpc")]).unwrap_err();
    assert!(
        e.contains("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL") && e.contains("http/protobuf"),
        "{e}"
    );
    // The general protocol is the traces' too: gRPC there means no profiles (said), no error...
    assert_eq!(
        from(&[base, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]),
        Ok(None)
    );
    // ... but a profiles endpoint is HTTP whatever the general protocol says...
    let c = from(&[
        base,
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        (
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
            "http://collector:4318/v1development/profiles",
        ),
    ]);
    assert!(c.is_ok_and(|c| c.is_some()));
    // ... and so is a profiles protocol of http/protobuf.
    assert!(
        from(&[
            base,
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "http/protobuf"),
        ])
        .is_ok_and(|c| c.is_some())
    );
    let e = from(&[base, ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")]).unwrap_err();
    assert!(
        e.contains("OTEL_EXPORTER_OTLP_TIMEOUT") && e.contains("milliseconds"),
        "{e}"
    );
    let e = from(&[base, ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")]).unwrap_err();
    assert!(e.contains("gzip or none"), "{e}");
    let e = from(&[
        base,
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "Authorization=Bearer%zzsecret",
        ),
    ])
    .unwrap_err();
    assert!(
        e.contains("OTEL_EXPORTER_OTLP_HEADERS") && e.contains("pair 1 (key \"Authorization\")"),
        "{e}"
    );
    assert!(!e.contains("secret"), "{e}");
    // A pair without `=` may be a whole header: only its place is said.
    let e = from(&[
        base,
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "a=1,Authorization: Bearer s3cret",
        ),
    ])
    .unwrap_err();
    assert!(
        e.contains("pair 2 is not") && !e.contains("s3cret") && !e.contains("Bearer"),
        "{e}"
    );
    let c = from(&[base, ("OTEL_EXPORTER_OTLP_TIMEOUT", "0")])
        .unwrap()
        .unwrap();
    assert!(c.contains("timeout: 600s"), "0 is the longest allowed: {c}");
    let e = from(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]).unwrap_err();
    assert!(e.contains("http://"), "{e}");
}
