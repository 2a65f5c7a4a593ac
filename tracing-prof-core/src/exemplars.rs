//! Exemplars of the latency histograms (the `opentelemetry` feature): per span path and
//! duration bucket, the trace of a recent span that closed in that bucket, so that a latency
//! panel's slow bucket leads to a trace, and the trace to its profile.
//!
//! One slot per (path, bucket), [`MAX_TAGS`] × [`DURATION_BUCKETS`] slots of 48 bytes in an
//! anonymous mapping of its own (17 MiB of address space, made when the layer is registered;
//! only the slots written become memory). A linked span's close reads its slot's time (a
//! load of a line written at most once per [`REFRESH_NS`]) and writes the slot only when it is
//! empty or older than that: one writer at a time, by a compare-and-swap on a sequence word
//! (a writer that loses skips; the slot is fresh anyway), so no line is written by every
//! thread at every close. Readers retry while a write is in progress (a seqlock).

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use tracing_prof_alloc::{MAX_TAGS, Tag};
use tracing_prof_model::{DURATION_BUCKETS, TraceLink};

/// A slot is written again once its exemplar is this old: 5 s (Prometheus scrapes every 15 s
/// or so; each scrape sees a recent exemplar per bucket).
pub(crate) const REFRESH_NS: u64 = 5_000_000_000;

/// One exemplar: the sequence word (odd while written), when it was written (the layer's
/// clock, nanoseconds; 0: empty), the trace, and the span's duration.
#[derive(Debug, Default)]
#[repr(C)]
struct Slot {
    seq: AtomicU64,
    at_ns: AtomicU64,
    trace_hi: AtomicU64,
    trace_lo: AtomicU64,
    span_id: AtomicU64,
    duration_ns: AtomicU64,
}

const SLOTS: usize = MAX_TAGS * DURATION_BUCKETS;

/// The slots, once made.
static TABLE: AtomicPtr<Slot> = AtomicPtr::new(std::ptr::null_mut());

/// Makes the table if it is not there yet (cold: when a layer is registered). A refused
/// mapping leaves it absent: exemplars are then not kept.
pub(crate) fn make_table() {
    if !TABLE.load(Ordering::Acquire).is_null() {
        return;
    }
    let p = tracing_prof_alloc::__private::map_zeroed(SLOTS * size_of::<Slot>()).cast::<Slot>();
    if p.is_null() {
        return;
    }
    // Another thread may have made it first: ours then stays unused (never unmapped, like the
    // tables).
    let _ = TABLE.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire);
}

fn table() -> Option<&'static [Slot]> {
    let p = TABLE.load(Ordering::Acquire);
    // SAFETY: a non-null TABLE is a zero-filled mapping of SLOTS slots (an all-zero Slot is
    // valid: atomics at 0), page-aligned, never unmapped: valid for the process's life.
    (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p, SLOTS) })
}

/// A span of `tag` linked to `link` closed after `duration_ns` in `bucket`, at `now_ns`:
/// kept when its slot is empty or stale. Never blocks, never allocates.
#[inline]
pub(crate) fn offer(tag: Tag, bucket: usize, link: TraceLink, now_ns: u64, duration_ns: u64) {
    let Some(slot) = table()
        .and_then(|t| t.get((tag.get() as usize & (MAX_TAGS - 1)) * DURATION_BUCKETS + bucket))
    else {
        return;
    };
    let at = slot.at_ns.load(Ordering::Relaxed);
    if at != 0 && now_ns.wrapping_sub(at) < REFRESH_NS {
        return;
    }
    let seq = slot.seq.load(Ordering::Relaxed);
    if seq & 1 == 1
        || slot
            .seq
            .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
    {
        return; // another thread is writing it
    }
    // The odd sequence is seen before any of the stores below.
    std::sync::atomic::fence(Ordering::Release);
    slot.trace_hi
        .store((link.trace_id >> 64) as u64, Ordering::Relaxed);
    slot.trace_lo.store(link.trace_id as u64, Ordering::Relaxed);
    slot.span_id.store(link.span_id, Ordering::Relaxed);
    slot.duration_ns.store(duration_ns, Ordering::Relaxed);
    slot.at_ns.store(now_ns.max(1), Ordering::Relaxed);
    slot.seq.store(seq + 2, Ordering::Release);
}

/// The exemplars of `tag`: `(bucket, link, duration_ns)`, by bucket.
pub(crate) fn of(tag: Tag) -> Vec<(usize, TraceLink, u64)> {
    let Some(t) = table() else {
        return Vec::new();
    };
    let start = (tag.get() as usize & (MAX_TAGS - 1)) * DURATION_BUCKETS;
    let mut out = Vec::new();
    for (bucket, slot) in t[start..start + DURATION_BUCKETS].iter().enumerate() {
        // A slot never written is all zeros: one load says so.
        if slot.seq.load(Ordering::Relaxed) == 0 {
            continue;
        }
        for _ in 0..4 {
            let before = slot.seq.load(Ordering::Acquire);
            if before & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let trace_id = (u128::from(slot.trace_hi.load(Ordering::Relaxed)) << 64)
                | u128::from(slot.trace_lo.load(Ordering::Relaxed));
            let span_id = slot.span_id.load(Ordering::Relaxed);
            let duration_ns = slot.duration_ns.load(Ordering::Relaxed);
            std::sync::atomic::fence(Ordering::Acquire);
            if slot.seq.load(Ordering::Relaxed) == before {
                out.push((bucket, TraceLink { trace_id, span_id }, duration_ns));
                break;
            }
        }
    }
    out
}
