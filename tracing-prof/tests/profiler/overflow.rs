//! Beyond the span path cap, new paths are lumped into `(other span paths)`, counted, and said
//! so in the pprof file. The path table is process-wide, so this is a test binary of its own.

use tracing_prof_test_support as common;

use tracing_prof::Profiler;
use tracing_prof::model::{OVERFLOW_FRAME, PathKind};
use tracing_subscriber::prelude::*;

/// One callsite for `ov_1`, used before and after the profiler shuts down.
fn ov_1() -> tracing::Span {
    tracing::info_span!("ov_1")
}

#[test]
fn paths_beyond_the_cap_are_counted_not_lost() {
    if crate::isolated(module_path!(), "paths_beyond_the_cap_are_counted_not_lost") {
        return;
    }
    let (layer, guard) = Profiler::builder().max_span_paths(3).build().unwrap();
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
        ov_1().in_scope(|| {
            tracing::info_span!("ov_2").in_scope(|| std::hint::black_box(vec![0u8; 100]));
        });
        tracing::info_span!("ov_3").in_scope(|| ());
        for _ in 0..4 {
            // Two more paths: over the cap of 3, and a child of an overflowed span.
            tracing::info_span!("ov_4").in_scope(|| {
                tracing::info_span!("ov_5").in_scope(|| std::hint::black_box(vec![0u8; 1000]));
            });
        }
    });
    let p = guard.profiler().snapshot();
    assert!(p.path(&["ov_1", "ov_2"]).is_some() && p.path(&["ov_3"]).is_some());
    assert!(p.paths.iter().all(|x| {
        !x.frames
            .iter()
            .any(|f| &*f.name == "ov_4" || &*f.name == "ov_5")
    }));
    let other = p
        .paths
        .iter()
        .find(|x| x.kind == PathKind::Overflow)
        .expect("overflow path");
    assert_eq!(&*other.frames[0].name, OVERFLOW_FRAME);
    assert_eq!(
        (
            other.time.spans,
            other.memory.alloc_objects,
            other.memory.alloc_bytes
        ),
        (8, 4, 4000)
    );
    assert_eq!(p.overflowed_spans, 8);
    assert_eq!(guard.profiler().stats().overflowed_spans, 8);

    if common::have_go() {
        let file = common::write_profile(&p, tracing_prof::ProfileKind::SpanMemory, "overflow");
        let comments = common::pprof(&["-comments"], &file);
        assert!(
            comments.contains("8 spans were counted under (other span paths)"),
            "{comments}"
        );
        assert_eq!(
            common::raw(&file).value(&[OVERFLOW_FRAME], "alloc_space"),
            4000
        );
    }
    drop(guard);

    // After the profiler has shut down, the layer and the allocator go on counting exactly.
    let before = tracing_prof::core::capture(Default::default());
    let dispatch = tracing::Dispatch::new(
        tracing_subscriber::registry().with(tracing_prof::ProfileLayer::new()),
    );
    tracing::dispatcher::with_default(&dispatch, || {
        ov_1().in_scope(|| std::mem::forget(std::hint::black_box(vec![0u8; 777])));
    });
    let after = tracing_prof::core::capture(Default::default());
    let bytes = |p: &tracing_prof::Snapshot| p.path(&["ov_1"]).unwrap().memory.inuse_bytes;
    assert_eq!(bytes(&after) - bytes(&before), 777);
}
