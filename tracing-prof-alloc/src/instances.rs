//! Span instances, for counting sampled allocations that outlive the span that made them.
//!
//! The span layer opens an instance when a span is created and makes it current with the tag
//! on enter. A sampled allocation adds its weight to its instance's live counters and a free of
//! it subtracts it; when the span closes, what is still live *outlived* the span and is added to
//! its path's `outlived` counters. Instances live in a fixed table of [`MAX_INSTANCES`] slots
//! (`id % MAX_INSTANCES`); a span created while its slot is held by a still-open older span is
//! not tracked (counted in [`untracked_instances`]). Only sampled allocations are seen, so the
//! counts are estimates, exact at sampling rate 1.

use crate::MAX_TAGS;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Span instances tracked at once.
pub const MAX_INSTANCES: usize = 65536;

struct Instance {
    id: AtomicU32,
    /// Live sampled weight (fixed point, see `sample`) and bytes; may transiently wrap.
    objects_fp: AtomicU64,
    bytes: AtomicU64,
}

static INSTANCES: [Instance; MAX_INSTANCES] = [const {
    Instance {
        id: AtomicU32::new(0),
        objects_fp: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
    }
}; MAX_INSTANCES];

static NEXT_ID: AtomicU32 = AtomicU32::new(1);
static UNTRACKED: AtomicU64 = AtomicU64::new(0);
/// Outlived weight (fixed point) and bytes per tag.
static OUTLIVED: [(AtomicU64, AtomicU64); MAX_TAGS] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; MAX_TAGS];

fn slot(id: u32) -> &'static Instance {
    &INSTANCES[id as usize % MAX_INSTANCES]
}

/// Opens an instance for a new span; 0 when its slot is taken (the span is not tracked).
pub fn open_span_instance() -> u32 {
    let mut id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    if id == 0 {
        id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
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
    id
}

/// Closes the instance `id` of a span of `tag`: what its sampled allocations still hold is
/// added to the tag's outlived counters.
pub fn close_span_instance(id: u32, tag: crate::Tag) {
    if id == 0 {
        return;
    }
    let s = slot(id);
    if s.id
        .compare_exchange(id, 0, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    let objects = s.objects_fp.swap(0, Ordering::AcqRel);
    let bytes = s.bytes.swap(0, Ordering::AcqRel);
    // A wrapped (negative) count is a free that raced with the close: nothing outlived.
    if objects > 0 && objects < i64::MAX as u64 && bytes < i64::MAX as u64 {
        let (o, b) = &OUTLIVED[tag.get() as usize];
        o.fetch_add(objects, Ordering::Relaxed);
        b.fetch_add(bytes, Ordering::Relaxed);
    }
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
