//! Sampled heap stacks: at rate 1 every allocation is sampled, values are exact, and
//! `go tool pprof -traces` shows the function that allocated under the span frames, below the
//! closure that ran in the span.

use tracing_prof_test_support as common;

use std::time::Duration;
use tracing_prof::{ProfileKind, Profiler};
use tracing_subscriber::prelude::*;

#[inline(never)]
fn build_index(n: usize) -> Vec<Vec<u64>> {
    let index: Vec<Vec<u64>> = (0..n).map(|i| vec![i as u64; 128]).collect();
    // Not a tail call, so that this function keeps a frame of its own.
    std::hint::black_box(&index);
    index
}

/// The closure given to the inner `in_scope`.
const IN_SCOPE_CLOSURE: &str = "profiler::heap_stacks::the_allocating_function_is_under_the_span_frames::{{closure}}::{{closure}}::{{closure}}";

#[test]
fn the_allocating_function_is_under_the_span_frames() {
    if crate::isolated(
        module_path!(),
        "the_allocating_function_is_under_the_span_frames",
    ) {
        return;
    }
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .heap_sampling(1)
        .build()
        .unwrap();
    let subscriber = tracing_subscriber::registry().with(layer);
    let kept = tracing::subscriber::with_default(subscriber, || {
        tracing::info_span!("hs_request")
            .in_scope(|| tracing::info_span!("hs_handler").in_scope(|| build_index(100)))
    });
    let profile = guard.profiler().snapshot();
    // A later capture shares each stack's code frames with this one: a stack is symbolized
    // once, not at every capture (nor again for the peak's or the flight recorder's snapshot).
    let again = guard.profiler().snapshot();
    drop(guard);
    assert!(!profile.stacks.is_empty());
    for s in &profile.stacks {
        let same = again
            .stacks
            .iter()
            .find(|t| t.kind == s.kind && t.frames == s.frames && t.code == s.code)
            .unwrap_or_else(|| panic!("{s:?} is not in the second capture"));
        assert!(
            tracing_prof::model::CodeStack::ptr_eq(&same.code, &s.code),
            "{s:?} was built again"
        );
    }
    // The model: exact at rate 1.
    let m = profile.sampled_memory(&["hs_request", "hs_handler"]);
    assert_eq!(
        (m.inuse_objects, m.inuse_bytes),
        (101, 100 * 1024 + 100 * 24)
    );
    let exact = profile.path(&["hs_request", "hs_handler"]).unwrap().memory;
    assert_eq!(
        (m.alloc_objects, m.alloc_bytes),
        (exact.alloc_objects, exact.alloc_bytes)
    );

    let file = common::write_profile(&profile, ProfileKind::Heap, "heap_stacks");
    if !common::have_go() {
        return;
    }
    let traces = common::pprof(&["-traces", "-sample_index=inuse_space"], &file);
    // Each trace lists its frames leaf first; find the one of the inner vectors.
    let trace = traces
        .split("-----------+")
        .find(|t| t.contains("hs_handler") && t.contains("build_index::{{closure}}"))
        .unwrap_or_else(|| panic!("no trace under hs_handler:\n{traces}"));
    let frames = common::traces(&format!("-----------+{trace}"))
        .pop()
        .unwrap();
    // Leaf: the closure that called vec![]; the library frames in between are the iterator's.
    assert_eq!(
        frames[0], "profiler::heap_stacks::build_index::{{closure}}",
        "{trace}"
    );
    // Root: the span frames, the closure given to `in_scope` (code that ran in the span),
    // then build_index.
    assert_eq!(
        frames[frames.len() - 4..],
        [
            "profiler::heap_stacks::build_index",
            IN_SCOPE_CLOSURE,
            "profiler::heap_stacks::hs_handler [span]",
            "profiler::heap_stacks::hs_request [span]"
        ],
        "{trace}"
    );
    assert!(trace.contains("100kB"), "{trace}");
    // The outer vector is allocated by build_index itself.
    let raw = common::raw(&file);
    let stack = [
        "profiler::heap_stacks::hs_request [span]",
        "profiler::heap_stacks::hs_handler [span]",
        IN_SCOPE_CLOSURE,
        "profiler::heap_stacks::build_index",
    ];
    assert_eq!(raw.value(&stack, "inuse_space"), 2400);
    assert_eq!(raw.value(&stack, "inuse_objects"), 1);
    let inner = |k: &[String]| {
        k.len() > 4
            && k[..4] == stack
            && k.last().unwrap() == "profiler::heap_stacks::build_index::{{closure}}"
    };
    assert_eq!(raw.sum("inuse_space", inner), 102_400);
    assert_eq!(raw.sum("alloc_objects", inner), 100);
    let head = common::pprof(&["-raw"], &file);
    assert!(
        head.contains("PeriodType: space bytes") && head.contains("Period: 1"),
        "{head}"
    );
    drop(kept);
}
