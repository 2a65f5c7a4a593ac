//! `/debug/pprof/...?debug=1` tables read as a person needs them: whole names, values in their
//! units, stacks innermost first, one frame per line with file and line.

use std::time::Duration;
use tracing_subscriber::prelude::*;

#[inline(never)]
fn allocate_for_the_table() -> Vec<u8> {
    std::hint::black_box(vec![7u8; 5000])
}

#[test]
fn debug_tables_are_readable() {
    if crate::isolated(module_path!(), "debug_tables_are_readable") {
        return;
    }
    let (layer, guard) = tracing_prof::Profiler::builder()
        .interval(Duration::from_secs(3600))
        .heap_sampling(1)
        .build()
        .unwrap();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    let kept = tracing::dispatcher::with_default(&dispatch, || {
        tracing::info_span!("a_rather_long_span_name_for_tables").in_scope(allocate_for_the_table)
    });
    let handler = tracing_prof::PprofHandler::new(guard.profiler().clone());
    let get = |path: &str| {
        let r = handler.handle("GET", path, None);
        assert_eq!(r.status, 200, "{path}");
        String::from_utf8(r.body).unwrap()
    };

    let memory = get("/debug/pprof/span_memory?debug=1");
    assert!(
        memory.starts_with("tracing-prof span_memory profile: "),
        "{memory}"
    );
    // Whole sample type names and values in units, the shown type first.
    let line = memory
        .lines()
        .find(|l| l.starts_with("inuse_space 4.9 KiB"))
        .unwrap_or_else(|| panic!("{memory}"));
    assert!(
        line.contains("alloc_space 4.9 KiB") && line.contains("inuse_objects 1"),
        "{line}"
    );
    assert!(
        memory.contains(
            "    profiler::debug_tables::a_rather_long_span_name_for_tables [span] (profiler/debug_tables.rs:24)"
        ),
        "{memory}"
    );

    let heap = get("/debug/pprof/heap?debug=1");
    let lines: Vec<&str> = heap.lines().collect();
    let code = lines
        .iter()
        .position(|l| {
            l.trim_start()
                .starts_with("profiler::debug_tables::allocate_for_the_table (")
        })
        .unwrap_or_else(|| panic!("{heap}"));
    // Innermost first: the function that allocated, then (past the closure call) the span
    // frame, each on a line of its own.
    let span = lines[code..]
        .iter()
        .position(|l| {
            l.trim_start()
                .starts_with("profiler::debug_tables::a_rather_long_span_name_for_tables [span]")
        })
        .unwrap_or_else(|| panic!("{heap}"));
    assert!((1..=2).contains(&span), "{heap}");
    assert!(lines[code].contains("debug_tables.rs:"), "{heap}");
    assert!(
        lines.iter().all(|l| l.matches(".rs:").count() <= 1),
        "one frame per line:\n{heap}"
    );
    drop(kept);
}
