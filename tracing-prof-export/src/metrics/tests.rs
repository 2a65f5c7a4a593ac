//! The exposition, exactly, for a snapshot of known numbers; and `promtool check metrics` on
//! it where promtool is installed (CI installs Debian's `prometheus`; the real Prometheus
//! scrapes the example in the as-user tests).

use super::*;
use tracing_prof_model::{PathKind, SpanFrame, duration_bucket};

/// A snapshot of two paths: `request` (four spans: 5 µs, 1.1 ms twice, 2 s; one errored) and
/// `request -> render` (no span closed yet, memory only).
fn snapshot() -> Snapshot {
    let mut s = Snapshot::new(std::time::SystemTime::UNIX_EPOCH, Duration::from_secs(1));
    let frame = |n: &str| SpanFrame::new("app", n, None, None);
    let mut request = PathProfile::new(PathKind::Span, vec![frame("request")]);
    for ns in [5_000, 1_100_000, 1_100_000, 2_000_000_000] {
        request.time.durations[duration_bucket(ns)] += 1;
        request.time.wall_ns += ns;
        request.time.spans += 1;
    }
    request.time.errors = 1;
    request.time.busy_ns = 1_500_000_000;
    request.time.cpu_ns = 250_000_000;
    request.memory.alloc_bytes = 4096;
    request.memory.inuse_bytes = 1024;
    let mut render = PathProfile::new(PathKind::Span, vec![frame("request"), frame("render")]);
    render.memory.alloc_bytes = 100;
    s.paths = vec![request, render];
    s
}

#[test]
fn every_family_with_its_numbers() {
    let m = SpanMetrics::new().buckets(Duration::from_millis(1), Duration::from_secs(1));
    assert_eq!(m.bucket_bounds().len(), 31);
    let text = m.encode(&snapshot(), None, &[], Format::OpenMetrics);
    let lines: Vec<&str> = text.lines().collect();
    for expected in [
        "# TYPE tracing_prof_span_duration_seconds histogram",
        "# UNIT tracing_prof_span_duration_seconds seconds",
        "tracing_prof_span_duration_seconds_sum{span_path=\"request\"} 2.002205",
        "tracing_prof_span_duration_seconds_count{span_path=\"request\"} 4",
        // 5 µs counts in the first bucket exposed (1 ms); 1.1 ms in (1 ms, 1.25 ms].
        "tracing_prof_span_duration_seconds_bucket{le=\"0.001\",span_path=\"request\"} 1",
        "tracing_prof_span_duration_seconds_bucket{le=\"0.00125\",span_path=\"request\"} 3",
        "tracing_prof_span_duration_seconds_bucket{le=\"0.8\",span_path=\"request\"} 3",
        "tracing_prof_span_duration_seconds_bucket{le=\"1.0\",span_path=\"request\"} 3",
        "tracing_prof_span_duration_seconds_bucket{le=\"+Inf\",span_path=\"request\"} 4",
        "tracing_prof_spans_total{span_path=\"request\"} 4",
        "tracing_prof_spans_total{span_path=\"request -> render\"} 0",
        "tracing_prof_span_errors_total{span_path=\"request\"} 1",
        "tracing_prof_span_busy_seconds_total{span_path=\"request\"} 1.5",
        "tracing_prof_span_cpu_seconds_total{span_path=\"request\"} 0.25",
        "tracing_prof_span_allocated_bytes_total{span_path=\"request -> render\"} 100",
        "tracing_prof_span_inuse_bytes{span_path=\"request\"} 1024",
        "# EOF",
    ] {
        assert!(lines.contains(&expected), "{expected:?} not in\n{text}");
    }
    // No histogram for a path with no span closed.
    assert!(!text.contains("duration_seconds_count{span_path=\"request -> render\"}"));
    assert!(!text.contains("slow"), "no threshold, no slow family");
    let slow = tracing_prof_core::SlowSpan::parse_list("request:1ms,*:1s").unwrap();
    let with_slow = m.encode(&snapshot(), None, &slow, Format::OpenMetrics);
    // Over 1 ms: the two of 1.1 ms and the one of 2 s. (render closed no span: no row.)
    assert!(
        with_slow
            .lines()
            .any(|l| l
                == "tracing_prof_span_slow_total{span_path=\"request\",threshold=\"0.001\"} 3"),
        "{with_slow}"
    );
    tracing_prof_test_support::promtool_check_metrics(&m.encode(
        &snapshot(),
        None,
        &slow,
        Format::Prometheus,
    ));
    let plain = m.encode(&snapshot(), None, &[], Format::Prometheus);
    assert!(!plain.contains("# EOF") && plain.contains("tracing_prof_spans_total"));
    // promtool reads the Prometheus text format (OpenMetrics' counters name their family
    // without `_total`, which it takes for a missing help text).
    tracing_prof_test_support::promtool_check_metrics(&plain);
}

/// Histograms go to at most N paths, the busiest first, and a path once chosen keeps its
/// series at every later scrape, even when busier paths come and when it disappears.
#[test]
fn histogram_paths_are_chosen_stickily() {
    let m = SpanMetrics::new().histogram_paths(1);
    let has = |text: &str, path: &str| {
        text.contains(&format!(
            "tracing_prof_span_duration_seconds_count{{span_path=\"{path}\"}}"
        ))
    };
    let s = snapshot();
    let first = m.encode(&s, None, &[], Format::Prometheus);
    assert!(has(&first, "request"));
    let mut busier = s.clone();
    busier.paths[1].time.spans = 1000;
    busier.paths[1].time.durations[0] = 1000;
    let second = m.encode(&busier, None, &[], Format::Prometheus);
    assert!(has(&second, "request") && !has(&second, "request -> render"));
    let mut gone = s.clone();
    gone.paths.remove(0);
    let third = m.encode(&gone, None, &[], Format::Prometheus);
    assert!(
        third.contains("tracing_prof_span_duration_seconds_count{span_path=\"request\"} 0"),
        "{third}"
    );
    let none = SpanMetrics::new().histogram_paths(0);
    assert!(!has(
        &none.encode(&s, None, &[], Format::Prometheus),
        "request"
    ));
}

#[test]
fn the_format_follows_the_accept_header() {
    // What Prometheus 2.42 sends.
    let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                      version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    assert_eq!(Format::from_accept(Some(prometheus)), Format::OpenMetrics);
    assert_eq!(Format::from_accept(Some("text/plain")), Format::Prometheus);
    assert_eq!(Format::from_accept(None), Format::Prometheus);
}

#[test]
fn the_default_buckets_are_ten_per_decade_from_10us_to_100s() {
    let b = SpanMetrics::new().bucket_bounds();
    assert_eq!(b.len(), 71);
    assert_eq!((b[0], b[1], b[70]), (1e-5, 1.25e-5, 100.0));
    // A bound asked for between two is the nearest on a log scale.
    let m = SpanMetrics::new().buckets(Duration::from_micros(1_120), Duration::from_secs(60));
    let b = m.bucket_bounds();
    assert_eq!((b[0], *b.last().unwrap()), (0.00125, 63.0));
}

/// Exemplars follow their buckets' lines in OpenMetrics (none in the Prometheus text format),
/// one per exposed bucket: a span past the last bound on `+Inf`, one below the first on the
/// first.
#[test]
fn exemplars_follow_their_buckets_in_open_metrics() {
    use tracing_prof_model::{DurationExemplar, TraceLink};
    let mut s = snapshot();
    let link = |span_id| TraceLink {
        trace_id: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
        span_id,
    };
    s.paths[0].exemplars = vec![
        DurationExemplar {
            bucket: duration_bucket(1_100_000),
            link: link(0xa),
            duration_ns: 1_100_000,
        },
        DurationExemplar {
            bucket: duration_bucket(5_000),
            link: link(0xb),
            duration_ns: 5_000,
        },
        DurationExemplar {
            bucket: duration_bucket(2_000_000_000),
            link: link(0xc),
            duration_ns: 2_000_000_000,
        },
    ];
    let m = SpanMetrics::new().buckets(Duration::from_millis(1), Duration::from_secs(1));
    let text = m.encode(&s, None, &[], Format::OpenMetrics);
    let trace = "trace_id=\"0123456789abcdef0011223344556677\"";
    for expected in [
        format!(
            "tracing_prof_span_duration_seconds_bucket{{le=\"0.001\",span_path=\"request\"}} 1 # {{span_id=\"000000000000000b\",{trace}}} 0.000005"
        ),
        format!(
            "tracing_prof_span_duration_seconds_bucket{{le=\"0.00125\",span_path=\"request\"}} 3 # {{span_id=\"000000000000000a\",{trace}}} 0.0011"
        ),
        format!(
            "tracing_prof_span_duration_seconds_bucket{{le=\"+Inf\",span_path=\"request\"}} 4 # {{span_id=\"000000000000000c\",{trace}}} 2"
        ),
    ] {
        assert!(
            text.lines().any(|l| l == expected),
            "{expected}\nnot in\n{text}"
        );
    }
    assert_eq!(text.matches(" # {").count(), 3, "{text}");
    assert!(!m.encode(&s, None, &[], Format::Prometheus).contains(" # {"));
}

/// Paths that write the same label (one callsite whose span fields became labels) are one
/// series, their numbers summed: Prometheus drops all but one of a repeated series.
#[test]
fn paths_of_one_label_are_summed_into_one_series() {
    let mut s = snapshot();
    let mut again = s.paths[0].clone();
    again.time = Default::default();
    again.time.spans = 1;
    again.time.durations[duration_bucket(5_000)] = 1;
    again.time.wall_ns = 5_000;
    again.memory.inuse_bytes = 10;
    s.paths.push(again);
    let text = SpanMetrics::new().encode(&s, None, &[], Format::Prometheus);
    let lines =
        |prefix: &str| -> Vec<&str> { text.lines().filter(|l| l.starts_with(prefix)).collect() };
    assert_eq!(
        lines("tracing_prof_spans_total{span_path=\"request\"}"),
        ["tracing_prof_spans_total{span_path=\"request\"} 5"]
    );
    assert_eq!(
        lines("tracing_prof_span_duration_seconds_count{span_path=\"request\"}"),
        ["tracing_prof_span_duration_seconds_count{span_path=\"request\"} 5"]
    );
    assert_eq!(
        lines("tracing_prof_span_inuse_bytes{span_path=\"request\"}"),
        ["tracing_prof_span_inuse_bytes{span_path=\"request\"} 1034"]
    );
    tracing_prof_test_support::promtool_check_metrics(&text);
}

/// A span name with a quote, a backslash and a newline: escaped in the label as the text
/// formats want, and its exemplars still found for their lines.
#[test]
fn odd_span_names_are_escaped_and_keep_their_exemplars() {
    use tracing_prof_model::{DurationExemplar, TraceLink};
    let mut s = snapshot();
    s.paths[0].frames = vec![SpanFrame::new("app", "say \"hi\" \\ now\n", None, None)];
    s.paths[0].exemplars = vec![DurationExemplar {
        bucket: duration_bucket(1_100_000),
        link: TraceLink {
            trace_id: 1,
            span_id: 2,
        },
        duration_ns: 1_100_000,
    }];
    let text = SpanMetrics::new().encode(&s, None, &[], Format::OpenMetrics);
    let line = text
        .lines()
        .find(|l| l.contains(" # {"))
        .unwrap_or_else(|| panic!("no exemplar in\n{text}"));
    assert!(
        line.starts_with(
            "tracing_prof_span_duration_seconds_bucket{le=\"0.00125\",span_path=\"say \\\"hi\\\" \\\\ now\\n\"} 3 # "
        ),
        "{line}"
    );
    tracing_prof_test_support::promtool_check_metrics(&SpanMetrics::new().encode(
        &s,
        None,
        &[],
        Format::Prometheus,
    ));
}
