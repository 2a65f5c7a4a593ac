//! The global allocator of the whole-process benchmarks: tagging or plain jemalloc, chosen per
//! child process.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicU8, Ordering};
use tikv_jemallocator::Jemalloc;
use tracing_prof::TaggingAllocator;

/// Chooses, once per process and before the first allocation returns, between the tagging
/// allocator and plain jemalloc; both sides pay the same branch. The child's mode
/// (`TRACING_PROF_BENCH_CHILD`) picks: modes starting with `off` (and the parent, which has
/// none) get plain jemalloc, every other mode the tagging allocator.
#[derive(Debug)]
pub struct Switch;

static MODE: AtomicU8 = AtomicU8::new(0);
static TAGGED: TaggingAllocator<Jemalloc> = TaggingAllocator::new(Jemalloc);

fn tagged() -> bool {
    let mut m = MODE.load(Ordering::Relaxed);
    if m == 0 {
        let mode = super::child::env_bytes(c"TRACING_PROF_BENCH_CHILD");
        let on = !mode.is_empty() && !mode.starts_with(b"off");
        m = if on { 1 } else { 2 };
        MODE.store(m, Ordering::Relaxed);
    }
    m == 1
}

// SAFETY: every call goes to one of two allocators, the same one for the whole process (the
// mode is fixed by the first call), so each block is freed by the allocator that made it.
unsafe impl GlobalAlloc for Switch {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe {
            if tagged() {
                TAGGED.alloc(l)
            } else {
                Jemalloc.alloc(l)
            }
        }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe {
            if tagged() {
                TAGGED.alloc_zeroed(l)
            } else {
                Jemalloc.alloc_zeroed(l)
            }
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded contract; same allocator as the allocation.
        unsafe {
            if tagged() {
                TAGGED.dealloc(p, l)
            } else {
                Jemalloc.dealloc(p, l)
            }
        }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // SAFETY: forwarded contract; same allocator as the allocation.
        unsafe {
            if tagged() {
                TAGGED.realloc(p, l, n)
            } else {
                Jemalloc.realloc(p, l, n)
            }
        }
    }
}
