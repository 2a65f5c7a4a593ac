//! Span fields as labels: exact memory per `route`, inherited by child spans, bounded per field
//! with `(other)`, on the span-path kinds and the sampled kinds alike, and read by
//! `go tool pprof -tagfocus`.

use tracing_prof_test_support as common;

use std::time::Duration;
use tracing_prof::{Profile, ProfileKind};
use tracing_subscriber::prelude::*;

/// The sum of `ty` over samples with label `key=value`.
fn sum_where(p: &Profile, ty: &str, key: &str, value: &str) -> i64 {
    let i = p.sample_type_index(ty).unwrap();
    p.samples
        .iter()
        .filter(|s| s.label(key) == Some(value))
        .map(|s| s.values[i])
        .sum()
}

/// Two callsites of `lbl_request` in this module: each goes by its line in span paths.
const LABELED: &str = "profiler::span_labels::lbl_request (span_labels.rs:41)";
const LATE: &str = "profiler::span_labels::lbl_request (span_labels.rs:50)";

#[test]
fn span_fields_become_bounded_labels() {
    if crate::isolated(module_path!(), "span_fields_become_bounded_labels") {
        return;
    }
    let (layer, guard) = tracing_prof::Profiler::builder()
        .interval(Duration::from_secs(3600))
        .heap_sampling(1)
        .span_field_labels(["route", "method"])
        .max_label_values(3)
        .build()
        .unwrap();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    tracing::dispatcher::with_default(&dispatch, || {
        for (i, route) in ["/a", "/b", "/c", "/d", "/e"].into_iter().enumerate() {
            let size = 1000 * (i + 1);
            tracing::info_span!("lbl_request", route = route, method = "GET", other = 7).in_scope(
                || {
                    std::hint::black_box(vec![1u8; size]);
                    tracing::info_span!("lbl_parse")
                        .in_scope(|| std::hint::black_box(vec![2u8; 100]));
                },
            );
        }
        // A value recorded after creation does not count.
        let late = tracing::info_span!("lbl_request", route = tracing::field::Empty);
        late.record("route", "/late");
        late.in_scope(|| std::hint::black_box(vec![3u8; 77]));
    });
    let snapshot = guard.profiler().snapshot();
    let memory = snapshot.profile(ProfileKind::SpanMemory);
    let alloc = |route| sum_where(&memory, "alloc_space", "route", route);
    // Own allocations plus the child's 100 bytes, which inherit the parent's label.
    assert_eq!(alloc("/a"), 1100);
    assert_eq!(alloc("/b"), 2100);
    assert_eq!(alloc("/c"), 3100);
    assert_eq!(alloc("(other)"), 4100 + 5100, "values past the limit of 3");
    assert_eq!(sum_where(&memory, "alloc_space", "method", "GET"), 15_500);
    assert!(
        memory.samples.iter().all(|s| s.label("other").is_none()),
        "only the configured fields are labels"
    );
    // The late-recorded span: no route label, counted under the path without one.
    let unlabeled: i64 = memory
        .samples
        .iter()
        .filter(|s| s.span_path() == LATE && s.label("route").is_none())
        .map(|s| s.values[memory.sample_type_index("alloc_space").unwrap()])
        .sum();
    assert_eq!(unlabeled, 77);
    // The child path carries the label too.
    assert!(memory.samples.iter().any(|s| {
        s.span_path() == format!("{LABELED} -> lbl_parse") && s.label("route") == Some("/b")
    }));
    // The spans kind and the sampled heap kind (every allocation sampled here) alike.
    let spans = snapshot.profile(ProfileKind::Spans);
    // Each labeled request and its child: two spans per route, four for the two past the limit.
    assert_eq!(sum_where(&spans, "spans", "route", "/c"), 2);
    assert_eq!(sum_where(&spans, "spans", "route", "(other)"), 4);
    let heap = snapshot.profile(ProfileKind::Allocs);
    assert_eq!(sum_where(&heap, "alloc_space", "route", "/a"), 1100);

    if common::have_go() {
        let file = common::write_profile(&snapshot, ProfileKind::SpanMemory, "labels");
        let top = common::pprof(
            &[
                "-top",
                "-unit=B",
                "-sample_index=alloc_space",
                "-tagfocus=route=/b",
            ],
            &file,
        );
        assert!(
            top.contains("of 2100B total") || top.contains("2100B"),
            "{top}"
        );
        let tags = common::pprof(&["-tags", "-sample_index=alloc_space"], &file);
        assert!(
            tags.contains("route") && tags.contains("/a") && tags.contains("(other)"),
            "{tags}"
        );
    }
}
