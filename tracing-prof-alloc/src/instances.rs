//! Span instances: what the profiler keeps per open span, in a fixed table, without allocating.
//!
//! The span layer opens an instance when a span is created and makes it current with the tag
//! on enter. Two things accrue to it while the span is open:
//! - its **busy time** (the layer adds each enter..exit interval), from which its idle time is
//!   computed when it closes;
//! - its **live sampled memory**: a sampled allocation adds its weight and a free of it
//!   subtracts it; when the span closes, what is still live *outlived* the span and is added to
//!   its path's `outlived` counters (estimates, exact at sampling rate 1).
//!
//! Instances live in a fixed table of [`MAX_INSTANCES`] slots (`id % MAX_INSTANCES`); a span
//! created while its slot is held by a still-open older span is not tracked (counted in
//! [`untracked_instances`]; the layer then keeps its busy time itself). Ids are handed out to
//! each thread in blocks, so that span creation on different threads writes no common counter.

use crate::MAX_TAGS;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Span instances tracked at once.
pub const MAX_INSTANCES: usize = 65536;

struct Instance {
    id: AtomicU32,
    /// Live sampled weight (fixed point, see `sample`) and bytes; may transiently wrap.
    objects_fp: AtomicU64,
    bytes: AtomicU64,
    /// Sum of the span's enter..exit intervals, nanoseconds.
    busy_ns: AtomicU64,
}

static INSTANCES: [Instance; MAX_INSTANCES] = [const {
    Instance {
        id: AtomicU32::new(0),
        objects_fp: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        busy_ns: AtomicU64::new(0),
    }
}; MAX_INSTANCES];

/// The next block of ids to hand to a thread.
static NEXT_ID: AtomicU32 = AtomicU32::new(0);
/// Ids a thread takes at a time.
const ID_BLOCK: u32 = 64;
static UNTRACKED: AtomicU64 = AtomicU64::new(0);
/// Outlived weight (fixed point) and bytes per tag.
static OUTLIVED: [(AtomicU64, AtomicU64); MAX_TAGS] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; MAX_TAGS];

fn slot(id: u32) -> &'static Instance {
    &INSTANCES[id as usize % MAX_INSTANCES]
}

/// The next instance id for this thread: from its current block, or a new block.
fn next_id() -> u32 {
    crate::tag::STATE
        .try_with(|s| {
            let (next, end) = (s.next_instance.get(), s.instance_end.get());
            let id = if next == end {
                let start = NEXT_ID.fetch_add(ID_BLOCK, Ordering::Relaxed);
                s.instance_end.set(start.wrapping_add(ID_BLOCK));
                start
            } else {
                next
            };
            s.next_instance.set(id.wrapping_add(1));
            id
        })
        .unwrap_or_else(|_| NEXT_ID.fetch_add(1, Ordering::Relaxed))
}

/// Opens an instance for a new span; 0 when its slot is taken (the span is not tracked).
pub fn open_span_instance() -> u32 {
    let mut id = next_id();
    if id == 0 {
        id = next_id();
    }
    let s = slot(id);
    if s.id
        .compare_exchange(0, id, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        UNTRACKED.fetch_add(1, Ordering::Relaxed);
        return 0;
    }
    s.objects_fp.store(0, Ordering::Relaxed);
    s.bytes.store(0, Ordering::Relaxed);
    s.busy_ns.store(0, Ordering::Relaxed);
    id
}

/// Whether instance `id` is open (its span has not closed). A closed instance's number is not
/// handed out again for 2^32 spans.
#[inline]
pub fn is_open(id: u32) -> bool {
    id != 0 && slot(id).id.load(Ordering::Acquire) == id
}

/// Adds `ns` of busy time to the open instance `id`; false (nothing added) when it is not
/// open or not tracked.
#[inline]
pub fn add_busy(id: u32, ns: u64) -> bool {
    if !is_open(id) {
        return false;
    }
    slot(id).busy_ns.fetch_add(ns, Ordering::Relaxed);
    true
}

/// Closes the instance `id` of a span of `tag`: what its sampled allocations still hold is
/// added to the tag's outlived counters. Returns the instance's busy time.
pub fn close_span_instance(id: u32, tag: crate::Tag) -> u64 {
    if id == 0 {
        return 0;
    }
    let s = slot(id);
    let busy = s.busy_ns.load(Ordering::Acquire);
    if s.id
        .compare_exchange(id, 0, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return 0;
    }
    let objects = s.objects_fp.swap(0, Ordering::AcqRel);
    let bytes = s.bytes.swap(0, Ordering::AcqRel);
    // A wrapped (negative) count is a free that raced with the close: nothing outlived.
    if objects > 0 && objects < i64::MAX as u64 && bytes < i64::MAX as u64 {
        let (o, b) = &OUTLIVED[tag.get() as usize];
        o.fetch_add(objects, Ordering::Relaxed);
        b.fetch_add(bytes, Ordering::Relaxed);
    }
    busy
}

/// A sampled block of weight `objects_fp` and `bytes` was allocated (`alive`) or freed in
/// instance `id`.
pub(crate) fn track(id: u32, objects_fp: u64, bytes: u64, alive: bool) {
    if id == 0 {
        return;
    }
    let s = slot(id);
    if s.id.load(Ordering::Acquire) != id {
        return; // closed: already counted as outlived (or not tracked)
    }
    if alive {
        s.objects_fp.fetch_add(objects_fp, Ordering::Relaxed);
        s.bytes.fetch_add(bytes, Ordering::Relaxed);
    } else {
        s.objects_fp.fetch_sub(objects_fp, Ordering::Relaxed);
        s.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Estimated allocations and bytes that outlived their span, per tag `0..out.len()`.
pub fn read_outlived(out: &mut [(f64, u64)]) {
    for (o, (objects, bytes)) in out.iter_mut().zip(&OUTLIVED) {
        *o = (
            objects.load(Ordering::Relaxed) as f64 / crate::sample::FP,
            bytes.load(Ordering::Relaxed),
        );
    }
}

/// Spans that could not be tracked because their instance slot was held.
pub fn untracked_instances() -> u64 {
    UNTRACKED.load(Ordering::Relaxed)
}
