//! A million spans open at once: what the profiler itself holds for them, and that it gives it
//! back once they close.
//!
//! Before: the layer kept each span beyond its fixed 32 Ki-entry index in the registry's
//! extensions (a boxed state, an `Arc` and the extensions' own map, about 200 bytes, charged to
//! the profiler), and the registry keeps every slot's map after the span closes: 197 MB charged
//! to the profiler with the spans open, 143 MB still after they had all closed. Now: one
//! 64-byte entry per open span in a table outside the allocator, given back at the next capture
//! (128 bytes with the `opentelemetry` feature, which keeps each span's trace link there too).

use std::time::Duration;
use tracing_prof::Profiler;
use tracing_prof_alloc::__private::TagTotals;
use tracing_prof_alloc::__private::read_totals;
use tracing_prof_alloc::Tag;
use tracing_subscriber::prelude::*;

const SPANS: usize = 1_000_000;

/// Bytes the profiler's own allocations hold now.
fn profiler_in_use() -> i64 {
    let mut t = vec![TagTotals::default(); Tag::PROFILER.get() as usize + 1];
    read_totals(&mut t);
    let p = &t[Tag::PROFILER.get() as usize];
    p.alloc_bytes as i64 - p.free_bytes as i64
}

/// The process's resident memory, for the log (the registry's share, not asserted).
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

#[test]
fn a_million_open_spans_cost_64_bytes_each_and_come_back() {
    if crate::isolated(
        module_path!(),
        "a_million_open_spans_cost_64_bytes_each_and_come_back",
    ) {
        return;
    }
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    let profiler = guard.profiler();
    let (mem0, table0, rss0) = (profiler_in_use(), profiler.stats().span_table_bytes, rss());

    let spans: Vec<_> = (0..SPANS).map(|_| tracing::info_span!("live")).collect();
    // Every one of them is the layer's: entering one finds its path.
    spans[SPANS / 2].in_scope(|| std::hint::black_box(vec![0u8; 1000]));
    let (mem1, table1, rss1) = (profiler_in_use(), profiler.stats().span_table_bytes, rss());
    drop(spans);
    let _ = profiler.snapshot(); // a capture gives the free pages back
    let (mem2, table2, rss2) = (profiler_in_use(), profiler.stats().span_table_bytes, rss());
    eprintln!(
        "profiler allocations {mem0} -> {mem1} open -> {mem2} closed; \
         span table {table0} -> {table1} -> {table2}; process RSS {rss0} -> {rss1} -> {rss2}"
    );

    let per_span = (table1 - table0) as f64 / SPANS as f64;
    let entry = if cfg!(feature = "opentelemetry") {
        128.0
    } else {
        64.0
    };
    assert!(
        (entry..=entry + 2.0).contains(&per_span),
        "span table: {per_span:.1} bytes per open span"
    );
    assert!(
        mem1 - mem0 < 1 << 20,
        "the profiler's allocations grew by {} bytes with {SPANS} open spans",
        mem1 - mem0
    );
    assert!(
        table2 <= table0 + (64 << 10),
        "span table kept {table2} bytes after every span closed (before: {table0})"
    );
    assert!(
        mem2 - mem0 < 1 << 20,
        "the profiler kept {} bytes after every span closed",
        mem2 - mem0
    );
    assert_eq!(
        profiler.stats().spans_outside_table,
        0,
        "a million spans of one thread all have room in the table"
    );
    let p = profiler.snapshot();
    let live = p.path(&["live"]).expect("the spans' path");
    assert_eq!(live.time.spans, SPANS as u64);
    assert_eq!(live.memory.alloc_bytes, 1000);
}
