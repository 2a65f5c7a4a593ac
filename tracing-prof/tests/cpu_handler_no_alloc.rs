//! The SIGPROF handler allocates nothing: a thread that does pure arithmetic, sampled a few
//! hundred times, makes no heap call at all, counted by an allocator under the tagging one.
//! (The handler takes no lock either: it has none to take, see `tracing-prof-cpu`'s `signal`
//! module; a handler that allocated would show here, since glibc's and jemalloc's allocators
//! lock.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::time::Duration;
use tracing_prof::{Profiler, TaggingAllocator};
use tracing_prof_test_support as common;
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

use common::thread_cpu_ns;

#[test]
fn the_handler_makes_no_heap_call() {
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .cpu_sampling(1000)
        .build()
        .unwrap();
    tracing_subscriber::registry().with(layer).init();
    let span = tracing::info_span!("na_burn");
    // Warm-up: the thread is armed, the registry's span stack has grown.
    span.in_scope(|| ());
    let samples_before = guard.profiler().stats().cpu.samples;
    let calls_before = CALLS.with(Cell::get);
    let _entered = span.enter();
    let start = thread_cpu_ns();
    let mut x = 1u64;
    while thread_cpu_ns() - start < 400_000_000 {
        for _ in 0..20_000 {
            x = black_box(x.wrapping_mul(31).wrapping_add(7));
        }
    }
    let calls = CALLS.with(Cell::get) - calls_before;
    drop(_entered);
    let samples = guard.profiler().stats().cpu.samples - samples_before;
    assert!(samples >= 300, "only {samples} samples were taken");
    assert_eq!(
        calls, 0,
        "{calls} heap calls on a thread that only computed while {samples} samples were taken"
    );
}
