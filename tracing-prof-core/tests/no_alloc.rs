//! Span enter/exit with the layer, and the allocator's tagging, allocate nothing themselves:
//! counted by an allocator under the tagging one that sees every call reaching the heap.
//!
//! The tests take turns (`SERIAL`): they set process-wide settings (the heap sampling rate,
//! the span labels) that the others' counts depend on.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use tracing_prof_alloc::TaggingAllocator;
use tracing_prof_core::ProfileLayer;
use tracing_subscriber::prelude::*;

thread_local! {
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

struct Counting;

// SAFETY: forwards every call unchanged to `System`.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = CALLS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let _ = CALLS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        let _ = CALLS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = CALLS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: TaggingAllocator<Counting> = TaggingAllocator::new(Counting);

fn calls() -> u64 {
    CALLS.with(Cell::get)
}

/// Heap calls made by 10 000 calls of `life(i)`, after 100 that warm up what fills once (the
/// registry's slots, the path cache, this thread's label cache).
fn heap_calls_once_warm(life: impl Fn(usize)) -> u64 {
    (0..100).for_each(&life);
    let before = calls();
    (0..10_000).for_each(&life);
    calls() - before
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn enter_exit_and_tagging_allocate_nothing() {
    let _serial = serial();
    for cpu in [false, true] {
        let layer = ProfileLayer::new().with_cpu_time(cpu);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            let outer = tracing::info_span!("outer");
            let inner = tracing::info_span!(parent: &outer, "inner");
            // Warm-up: the registry's per-thread span stack grows once.
            outer.in_scope(|| inner.in_scope(|| ()));

            let before = calls();
            for _ in 0..10_000 {
                let _o = outer.enter();
                let _i = inner.enter();
                let _again = outer.enter(); // re-entry path too
            }
            assert_eq!(
                calls() - before,
                0,
                "span enter/exit allocated (cpu time {cpu})"
            );

            // Each user allocation reaches the heap exactly once, tagging included.
            let before = calls();
            outer.in_scope(|| {
                for i in 0..1_000u64 {
                    drop(std::hint::black_box(Box::new(i)));
                }
            });
            assert_eq!(
                calls() - before,
                2_000,
                "tagging added heap calls (cpu time {cpu})"
            );
        });
    }
}

#[test]
fn creation_and_close_allocate_nothing() {
    let _serial = serial();
    // With heap sampling on, every span's close also takes its instance cell (a span opens an
    // instance only at its first sampled allocation, which none has here).
    for sampling in [false, true] {
        tracing_prof_alloc::__private::set_sample_rate(if sampling { 512 * 1024 } else { 0 });
        let layer = ProfileLayer::new();
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            let parent = tracing::info_span!("parent");
            let _p = parent.enter();
            let life = |i: usize| {
                tracing::info_span!("child", i).in_scope(|| std::hint::black_box(i));
                // Not entered, closed at once, and with an explicit parent.
                drop(tracing::info_span!(parent: &parent, "sibling", i));
            };
            assert_eq!(
                heap_calls_once_warm(life),
                0,
                "span creation or close allocated (heap sampling {sampling})"
            );
        });
    }
    tracing_prof_alloc::__private::set_sample_rate(0);
}

#[test]
fn a_new_threads_first_allocation_is_one_heap_call() {
    let _serial = serial();
    std::thread::spawn(|| {
        let before = calls();
        let b = std::hint::black_box(Box::new(1u64));
        // The thread's counter table comes from the system allocator directly, not through the
        // wrapped allocator, and is set up without allocating through it.
        assert_eq!(calls() - before, 1);
        drop(b);
    })
    .join()
    .unwrap();
}

#[test]
fn a_labeled_spans_creation_allocates_nothing_once_its_values_are_known() {
    let _serial = serial();
    // Labels are configured by building a profiler: nothing else of it runs here.
    let (layer, guard) = tracing_prof_core::Profiler::builder()
        .span_field_labels(["route", "method"])
        .heap_sampling(0)
        .cpu_sampling(0)
        .interval(std::time::Duration::from_secs(3600))
        .build()
        .unwrap();
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
        let routes = ["/a", "/b", "/c", "/a/long/route/with/some/segments/in/it"];
        let life = |i: usize| {
            let route = routes[i % routes.len()];
            let method = if i.is_multiple_of(2) { "GET" } else { "POST" };
            tracing::info_span!("request", route, method, i).in_scope(|| std::hint::black_box(i));
            // A callsite with a label field whose value is a number, formatted.
            tracing::info_span!("job", route = i % 3).in_scope(|| std::hint::black_box(i));
        };
        // The warm-up teaches this thread's cache every value and combination once.
        assert_eq!(
            heap_calls_once_warm(life),
            0,
            "a labeled span's creation or close allocated"
        );
    });
    // And the spans were labeled (`TRACING_PROF_LABEL_FIELDS` in the environment would
    // replace the fields asked for here).
    let spans = guard
        .profiler()
        .snapshot()
        .profile(tracing_prof_model::ProfileKind::Spans);
    for route in ["/b", "/a/long/route/with/some/segments/in/it", "2"] {
        assert!(
            spans
                .samples
                .iter()
                .any(|s| s.label("route") == Some(route)),
            "no span labeled route={route}"
        );
    }
    assert!(
        spans
            .samples
            .iter()
            .any(|s| s.label("method") == Some("POST"))
    );
}
