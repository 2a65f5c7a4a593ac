//! Span metrics registered into an application's own `prometheus_client` registry: one
//! exposition with the application's metrics and ours, read from the profiler at each
//! encoding, with the numbers `/metrics` serves, and clean by `promtool check metrics`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tracing_prof_export::metrics::{Format, SpanMetrics};
use tracing_subscriber::prelude::*;

/// `n` spans `registry_request`, each with a child `registry_query`; every third request
/// records an ERROR event.
fn spans(dispatch: &tracing::Dispatch, n: usize) {
    tracing::dispatcher::with_default(dispatch, || {
        for i in 0..n {
            tracing::info_span!("registry_request").in_scope(|| {
                tracing::info_span!("registry_query").in_scope(|| {});
                if i % 3 == 0 {
                    tracing::error!("failed");
                }
            });
        }
    });
}

/// The line of `text` that starts with `prefix`, without it.
fn value<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line {prefix}… in\n{text}"))
}

#[test]
fn our_families_beside_the_applications_read_at_each_encoding() {
    let (layer, guard) = tracing_prof_core::Profiler::builder().build().unwrap();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));

    let mut registry = Registry::default();
    let orders = Counter::<u64>::default();
    registry.register("myapp_orders", "Orders taken.", orders.clone());
    SpanMetrics::new()
        .histogram_paths(1)
        .register(&mut registry, guard.profiler().clone());
    orders.inc_by(5);

    let encode = |registry: &Registry| {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    };
    spans(&dispatch, 7);
    let first = encode(&registry);
    assert_eq!(value(&first, "myapp_orders_total "), "5");
    let request = "{span_path=\"registry_request\"} ";
    let query = "{span_path=\"registry_request -> registry_query\"} ";
    assert_eq!(
        value(&first, &format!("tracing_prof_spans_total{request}")),
        "7"
    );
    assert_eq!(
        value(&first, &format!("tracing_prof_spans_total{query}")),
        "7"
    );
    // Requests 0, 3 and 6 recorded an ERROR; their child did not.
    assert_eq!(
        value(&first, &format!("tracing_prof_span_errors_total{request}")),
        "3"
    );
    assert_eq!(
        value(&first, &format!("tracing_prof_span_errors_total{query}")),
        "0"
    );
    // One histogram path, chosen by most spans closed and then by name.
    assert_eq!(
        value(
            &first,
            &format!("tracing_prof_span_duration_seconds_count{request}")
        ),
        "7"
    );
    assert!(
        !first
            .contains("tracing_prof_span_duration_seconds_count{span_path=\"registry_request -> ")
    );
    assert!(
        first.contains("# TYPE tracing_prof_exports counter"),
        "health: {first}"
    );
    // The process's memory: its resident set from /proc, beside the heap.
    let rss: u64 = value(&first, "tracing_prof_process_resident_bytes ")
        .parse()
        .unwrap();
    assert!(rss > 1 << 20, "{rss}");
    assert!(first.contains("tracing_prof_heap_inuse_bytes "), "{first}");
    // promtool reads the Prometheus text format (OpenMetrics' counters name their family
    // without `_total`, which it takes for a missing help text).
    let mut plain = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut plain, &registry).unwrap();
    tracing_prof_test_support::promtool_check_metrics(&plain);

    // Read again at the next encoding, the chosen path kept.
    spans(&dispatch, 2);
    let second = encode(&registry);
    assert_eq!(
        value(&second, &format!("tracing_prof_spans_total{request}")),
        "9"
    );
    assert_eq!(
        value(
            &second,
            &format!("tracing_prof_span_duration_seconds_count{request}")
        ),
        "9"
    );

    // The same numbers as the text `/metrics` serves.
    let served = SpanMetrics::new().histogram_paths(1).encode(
        &guard.profiler().paths_snapshot(),
        None,
        &[],
        Format::OpenMetrics,
    );
    // Every span family's lines (the health and /proc gauges move between two reads, and so
    // does the profiler's own path: a CPU sample taken while the first was encoded, say, makes
    // it appear in the second, with zeros in these families).
    let own = format!("span_path=\"{}\"", tracing_prof_model::PROFILER_FRAME);
    let span_lines = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("tracing_prof_span") && l.contains("span_path=\""))
            .filter(|l| !l.contains("_busy_") && !l.contains("_cpu_") && !l.contains(&own))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(span_lines(&served), span_lines(&second));
    assert!(span_lines(&served).len() > 10);
}
