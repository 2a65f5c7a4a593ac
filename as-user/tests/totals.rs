//! The example workload's exported totals equal, to the byte, what an independent counting
//! allocator saw the program request.
//!
//! The counter wraps the tagging allocator from outside and counts every request: `alloc`,
//! `alloc_zeroed` and `realloc` as one object of their (new) size, as heap profilers count them
//! (and the default resize mode does). Both sides leave out the profiler's own allocations.

use tracing_prof_test_support as common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing_prof::{ProfileKind, ProfileLayer, TaggingAllocator};
use tracing_prof_alloc::{Tag, current_tag};
use tracing_prof_examples::{App, Workload, run};
use tracing_subscriber::prelude::*;

struct Counting<A>(A);

static OBJECTS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

fn count(objects: u64, bytes: u64) {
    if current_tag() != Tag::PROFILER {
        OBJECTS.fetch_add(objects, Ordering::Relaxed);
        BYTES.fetch_add(bytes, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call unchanged to the wrapped allocator; counting has no effect on it.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { self.0.alloc(l) };
        if !p.is_null() {
            count(1, l.size() as u64);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { self.0.alloc_zeroed(l) };
        if !p.is_null() {
            count(1, l.size() as u64);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { self.0.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let q = unsafe { self.0.realloc(p, l, new) };
        if !q.is_null() {
            count(1, new as u64);
        }
        q
    }
}

#[global_allocator]
static GLOBAL: Counting<TaggingAllocator<System>> = Counting(TaggingAllocator::new(System));

#[test]
fn exported_totals_equal_what_the_program_requested() {
    let have_go = common::have_go();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(ProfileLayer::new()),
    )
    .unwrap();
    let app = App::new(500);
    let workload = Workload {
        requests: 3_000,
        concurrency: 32,
        ..Workload::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let summary = rt.block_on(run(&app, &workload));
    drop(rt); // joins the workers: the program is quiescent from here
    assert_eq!(summary.handled, 3_000);

    let (objects, bytes) = (OBJECTS.load(Ordering::SeqCst), BYTES.load(Ordering::SeqCst));
    let profile = tracing_prof::core::capture(std::time::Duration::from_secs(1));
    let not_profiler =
        |p: &&tracing_prof::model::PathProfile| p.kind != tracing_prof::model::PathKind::Profiler;
    let model: (u64, u64) = profile
        .paths
        .iter()
        .filter(not_profiler)
        .fold((0, 0), |(o, b), p| {
            (o + p.memory.alloc_objects, b + p.memory.alloc_bytes)
        });
    assert_eq!(
        model,
        (objects, bytes),
        "the profile model disagrees with the counter"
    );
    assert!(
        bytes > 50 << 20,
        "the workload allocated only {bytes} bytes"
    );

    if !have_go {
        return; // reported by have_go
    }
    let scratch = common::scratch_dir("totals");
    let dir = scratch.path();
    let file = dir.join("heap.pb.gz");
    std::fs::write(&file, profile.encode(ProfileKind::Heap)).unwrap();
    let (go_objects, go_bytes) = (
        pprof_total(&file, "alloc_objects"),
        pprof_total(&file, "alloc_space"),
    );
    assert_eq!(
        (go_objects, go_bytes),
        (objects, bytes),
        "go tool pprof disagrees with the counter"
    );
}

/// Total of one sample type over every sample except the profiler's own, per `go tool pprof -raw`.
fn pprof_total(file: &Path, sample_type: &str) -> u64 {
    let raw = common::raw(file);
    raw.sum(sample_type, |stack| stack != ["(tracing-prof)"]) as u64
}
