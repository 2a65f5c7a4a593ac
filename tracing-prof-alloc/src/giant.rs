//! Giant allocations: requests at or above a threshold, reported and optionally refused.
//!
//! The hot path pays one relaxed load and one compare. A giant request takes a cold path that
//! captures its code stack and writes a record into a fixed ring of [`GIANT_RING`] slots (no
//! allocation, no lock: each slot is a sequence lock, claimed by one writer at a time with a
//! compare-and-swap, so a reader accepts a record only if it read it whole) and,
//! when refusal is on, returns null *before* the inner allocator is asked, so nothing can leak
//! and the program's allocation-error handling runs (`try_reserve` returns an error, `Vec::new`
//! and friends call `handle_alloc_error`). The profiler's own requests and requests made while
//! the thread is panicking are reported but never refused.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};

/// Frames of code stack kept per giant request, innermost first.
pub const GIANT_FRAMES: usize = 32;

/// Records kept between two reads; older ones are overwritten and counted as missed.
pub const GIANT_RING: usize = 64;

/// Requests at or above this size or alignment take the cold path: the giant threshold, or
/// [`SAFE_LIMIT`] when that is lower. Below it, the header arithmetic cannot overflow.
static LIMIT: AtomicUsize = AtomicUsize::new(SAFE_LIMIT);
/// The giant threshold itself (`usize::MAX`: off).
static THRESHOLD: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Below this size and alignment, `size + offset` rounded up to the alignment fits a `Layout`.
pub(crate) const SAFE_LIMIT: usize = isize::MAX as usize / 4;
static REFUSE: AtomicBool = AtomicBool::new(false);
static NEXT: AtomicU64 = AtomicU64::new(0);

struct Slot {
    /// `2 * n + 1` while record `n` is written, `2 * n + 2` once it is complete; 0: never
    /// written. Only grows.
    seq: AtomicU64,
    size: AtomicU64,
    tag: AtomicU64,
    refused: AtomicBool,
    depth: AtomicU32,
    ips: [AtomicUsize; GIANT_FRAMES],
}

static RING: [Slot; GIANT_RING] = [const {
    Slot {
        seq: AtomicU64::new(0),
        size: AtomicU64::new(0),
        tag: AtomicU64::new(0),
        refused: AtomicBool::new(false),
        depth: AtomicU32::new(0),
        ips: [const { AtomicUsize::new(0) }; GIANT_FRAMES],
    }
}; GIANT_RING];

/// Reports requests of at least `threshold` bytes (`None`: never), refusing them if `refuse`.
///
/// Process-wide; takes effect for the next allocation on every thread.
pub fn set_giant_policy(threshold: Option<usize>, refuse: bool) {
    let threshold = threshold.unwrap_or(usize::MAX).max(1);
    REFUSE.store(refuse, Ordering::Relaxed);
    THRESHOLD.store(threshold, Ordering::Relaxed);
    LIMIT.store(threshold.min(SAFE_LIMIT), Ordering::Relaxed);
}

/// Whether a request must take the cold path (giant, or large enough to need overflow checks):
/// the hot path's only check, one load and one compare.
#[inline(always)]
pub(crate) fn needs_cold_path(size: usize, align: usize) -> bool {
    // `size | align` is at least the larger of the two: nothing at or above the limit slips by.
    (size | align) >= LIMIT.load(Ordering::Relaxed)
}

/// Whether `size` is at or above the giant threshold.
pub(crate) fn is_giant(size: usize) -> bool {
    size >= THRESHOLD.load(Ordering::Relaxed)
}

/// Records a giant request of `size` bytes by `tag`; returns whether to refuse it.
///
/// Never refused, only reported: the profiler's own requests, and requests made while the
/// thread is panicking. A panic's backtrace symbolization allocates large buffers; refusing them
/// would run the allocation-error handler inside the panic, which deadlocks on the backtrace lock.
#[cold]
#[inline(never)]
pub(crate) fn record(size: usize, tag: u32) -> bool {
    let refused = REFUSE.load(Ordering::Relaxed)
        && tag != crate::Tag::PROFILER.get()
        && !std::thread::panicking();
    let mut ips = [0usize; GIANT_FRAMES];
    let depth = crate::unwind::capture(&mut ips);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let slot = &RING[(n % GIANT_RING as u64) as usize];
    // Claim the slot: only from a complete record older than this one. A slot still being
    // written (a writer GIANT_RING records ahead or behind, preempted) or already holding a
    // newer record is left alone, and record `n` is counted as missed by the reader.
    let mut current = slot.seq.load(Ordering::Relaxed);
    loop {
        if current % 2 == 1 || current > 2 * n {
            return refused;
        }
        match slot.seq.compare_exchange_weak(
            current,
            2 * n + 1,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => break,
            Err(now) => current = now,
        }
    }
    // The odd number must be visible before any of the data stores (a reader that sees new
    // data then sees the odd number, or a changed one, in its second read).
    fence(Ordering::Release);
    slot.size.store(size as u64, Ordering::Relaxed);
    slot.tag.store(u64::from(tag), Ordering::Relaxed);
    slot.refused.store(refused, Ordering::Relaxed);
    slot.depth.store(depth as u32, Ordering::Relaxed);
    for (s, &ip) in slot.ips.iter().zip(&ips[..depth]) {
        s.store(ip, Ordering::Relaxed);
    }
    slot.seq.store(2 * n + 2, Ordering::Release);
    refused
}

/// One giant request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GiantAllocation {
    /// Its position among all giant requests of the process, from 0.
    pub seq: u64,
    /// Bytes requested (for `realloc`, the new size).
    pub size: usize,
    /// The tag current when it was requested: the span path that asked (for `realloc` too).
    pub tag: crate::Tag,
    /// Whether it was refused (null returned).
    pub refused: bool,
    /// Return addresses of the code that asked, innermost first (the first few are the
    /// allocator's own frames).
    pub ips: Vec<usize>,
}

/// Giant requests recorded from position `from` on (0: all still in the ring), oldest first.
///
/// Returns the records, how many of them were overwritten (or abandoned by a writer that found
/// its slot busy) before they could be read, and the position to pass next time. A record still
/// being written ends the batch: it and the ones after it are read next time.
pub fn giant_allocations_since(from: u64) -> (Vec<GiantAllocation>, u64, u64) {
    let end = NEXT.load(Ordering::Acquire);
    let oldest_kept = end.saturating_sub(GIANT_RING as u64);
    let mut missed = oldest_kept.saturating_sub(from);
    let mut out = Vec::new();
    for n in from.max(oldest_kept)..end {
        let slot = &RING[(n % GIANT_RING as u64) as usize];
        let seq = slot.seq.load(Ordering::Acquire);
        if seq == 2 * n + 1 {
            return (out, missed, n); // still being written
        }
        if seq != 2 * n + 2 {
            missed += 1; // overwritten, or abandoned
            continue;
        }
        let record = GiantAllocation {
            seq: n,
            size: slot.size.load(Ordering::Relaxed) as usize,
            tag: crate::Tag::new(slot.tag.load(Ordering::Relaxed) as u32),
            refused: slot.refused.load(Ordering::Relaxed),
            ips: {
                let depth = (slot.depth.load(Ordering::Relaxed) as usize).min(GIANT_FRAMES);
                slot.ips[..depth]
                    .iter()
                    .map(|ip| ip.load(Ordering::Relaxed))
                    .collect()
            },
        };
        // The data loads above must complete before the second read of the sequence number.
        fence(Ordering::Acquire);
        if slot.seq.load(Ordering::Relaxed) == 2 * n + 2 {
            out.push(record);
        } else {
            missed += 1; // overwritten while read
        }
    }
    (out, missed, end.max(from))
}

/// The position the next giant request will take: pass it to [`giant_allocations_since`] to
/// read only what comes after now.
pub fn giant_allocations_end() -> u64 {
    NEXT.load(Ordering::Acquire)
}
