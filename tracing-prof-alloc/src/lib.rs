//! A header-tagging `GlobalAlloc` for tracing-prof.
//!
//! [`TaggingAllocator`] wraps any [`GlobalAlloc`](std::alloc::GlobalAlloc) (`System`,
//! `tikv_jemallocator::Jemalloc`, mimalloc, ...) and writes, in front of every block, the
//! [`Tag`] that is current on the allocating thread. The span layer of `tracing-prof-core` makes
//! the tag of the innermost entered span path current on enter and restores the previous one on
//! exit. A free reads the tag back from the header and credits that tag, whichever thread frees,
//! so per span path the counters are exact: allocated objects and bytes, freed objects and bytes,
//! and in-use as the difference. Sizes are the user's requested sizes, never header or size-class
//! bytes.
//!
//! This crate holds all of tracing-prof's allocator `unsafe`, depends on nothing but `std`,
//! `libc` and `tracing-prof-thread` (the thread's record: its id and name, read once per
//! thread), and never installs a global allocator by itself.
//!
//! # Setup
//! ```
//! use tracing_prof_alloc::TaggingAllocator;
//! #[global_allocator]
//! static GLOBAL: TaggingAllocator<std::alloc::System> = TaggingAllocator::new(std::alloc::System);
//! # fn main() {}
//! ```
//!
//! # Cost
//! - Memory: [`HEADER_SIZE`] (8) bytes per block with `align <= 8`, `align` bytes per block with a
//!   larger alignment (the header sits in the padding that keeps the user pointer aligned).
//! - Time, per call: a thread-local read, two plain stores into this thread's own counter
//!   table, the heap sampler's countdown and one compare against the giant-allocation limit;
//!   no lock, no syscall, no allocation of its own, no panic; no cache line is written by two
//!   threads (except on the rare paths: TLS teardown, giant requests, sampled allocations).
//!   A free checks the header's magic number, flags and origin in one compare.
//! - Not per call: a thread's **first** allocation takes a counter table (reusing one an
//!   exited thread left, or mapping a new one: its pages become memory as tags are first
//!   written), copies the thread's id and name from its record (`tracing-prof-thread`, which
//!   reads them then if no part of the profiler did before: `gettid`, `prctl`), and registers
//!   a thread-exit destructor to hand the table back. A **sampled** allocation (one per
//!   512 KiB on average with the profiler's default) walks its stack and takes a slot in a
//!   shared table: about 0.7 µs (0.3 µs with frame pointers) with the CPU sampler's unwinder,
//!   which the profiler installs for the threads that sampler armed, 5 µs with
//!   `_Unwind_Backtrace` otherwise (8 calls deep; `heap_sample` bench of `tracing-prof-core`).
//! - Per thread: one counter table of `MAX_TAGS` slots (32 bytes each: memory allocated and
//!   freed; 145 KiB of address space), touched only for the tags the thread uses, reused by
//!   later threads once it exits. (Span times are the span layer's, in tables of its own.)
//!
//! The functions named in the next sections (`set_sample_rate`, `read_stacks`, …) are the
//! profiler's plumbing, in the hidden `__private` module: an application sets sampling, giant
//! allocations and the rest through `tracing-prof`'s `Config`, and reads them in its profiles.
//!
//! # Heap sampling
//! `set_sample_rate` turns on sampling of code stacks: sample points fall on average every
//! `rate` bytes a thread allocates, and the allocation that covers one has its stack captured
//! (by the walker of `set_stack_walker` where it can, else `_Unwind_Backtrace`) into a fixed
//! table read with `read_stacks`; see the `sample` module
//! docs for the statistics. Sampled blocks carry a larger header (birth time, stack bucket,
//! weight, span instance), so frees of them feed lifetimes, temporaries and what outlived its
//! span (`read_outlived`). Off by default; on, the hot path pays one subtraction and one
//! compare. `record_sites` records every allocation's stack of one thread, for budgets.
//!
//! # Per-thread view
//! Each header records the allocating thread's table; `read_threads` gives allocated and
//! in-use memory per thread, frees credited to the thread that allocated.
//!
//! # Giant allocations
//! `set_giant_policy` makes requests at or above a size be recorded (read them with
//! `giant_allocations_since`) and, optionally, refused: null is returned before the inner
//! allocator is asked, so nothing leaks. Off by default; when off or not triggered it costs one
//! relaxed load and one compare per allocation.
//!
//! # Guarantees
//! - Safe before `main`, during thread exit and TLS teardown (such late calls are counted in a
//!   shared fallback table), and with or without a profiler running.
//! - `realloc` forwards to the inner `realloc`, so blocks can still grow in place; see
//!   [`ReallocMode`] for how it is counted.
//! - Every alignment works; see [`header`] for the layout and how a header is recognised.
//!
//! # Limitations
//! - At most [`MAX_TAGS`] tags; the layer maps span paths beyond its cap to [`Tag::OVERFLOW`].
//! - Memory handed out by other allocators (C libraries calling `malloc` directly) is not seen.
//! - Large alignments cost `align` bytes of header per block (a 4096-aligned block spends 4 KiB).

pub mod header;

mod allocator;
mod counters;
mod giant;
mod instances;
mod sample;
mod sites;
mod tag;
mod unwind;

pub use allocator::{ReallocMode, TaggingAllocator};
pub use header::HEADER_SIZE;
pub use sample::{DEFAULT_SAMPLE_RATE, DEFAULT_TEMPORARY_THRESHOLD};
pub use tag::{Tag, TagGuard, current_tag};

/// The plumbing the profiler (`tracing-prof-core`) and the CPU sampler drive: public because
/// they live in other crates, out of the API because an application has no use for it and no
/// promise is made about it. Everything an application may use is at the crate's root.
#[doc(hidden)]
pub mod __private {
    pub use crate::counters::{
        MAX_ORIGINS, TagTotals, ThreadTotals, after_fork_in_child, map_zeroed, read_thread_totals,
        read_threads, read_totals, set_new_thread_hook, thread_tables,
    };
    pub use crate::giant::{
        GIANT_FRAMES, GIANT_RING, GiantAllocation, giant_allocations_end, giant_allocations_since,
        set_giant_policy,
    };
    pub use crate::instances::{
        MAX_INSTANCES, close_span_instance, eager_instance_word, lazy_instance_word,
        open_span_instance, read_outlived, reset_instance_cell, take_instance, untracked_instances,
    };
    pub use crate::sample::{
        HeapSamplerStats, LIFETIME_BOUNDS_NS, LIFETIME_BUCKETS, MAX_HEAP_FRAMES, MAX_STACKS,
        StackTotals, lifetime_bucket, read_stacks, sample_rate, sampler_stats, seed_this_thread,
        set_sample_rate, set_temporary_threshold, temporary_threshold,
    };
    pub use crate::sites::{MAX_SITES, SITE_FRAMES, SiteRecorder, record_sites};
    pub use crate::tag::{set_current_span, set_current_tag, set_stretch_start, stretch_start};
    pub use crate::unwind::{StackWalker, set_stack_walker};
}

/// Fixed-point scale of estimated object counts (a sampled block stands for a fraction of an
/// object and more), in the heap sampler's stack table and the span instances alike.
pub(crate) const FP: f64 = 256.0;

/// Number of distinct tags the counter tables hold (reserved tags included).
pub const MAX_TAGS: usize = 4096;
