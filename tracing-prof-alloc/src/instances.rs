//! Span instances: what the profiler keeps per open span, in a fixed table, without allocating.
//!
//! A span's instance is opened at the first sampled allocation made while it is entered (one
//! allocation per 512 KiB by default: most spans never have one), through the word the span
//! layer makes current with the tag on enter (see [`lazy_instance_word`]); for spans whose
//! state the layer keeps where no such word can point, it opens one when the span is created
//! ([`eager_instance_word`]). A sampled allocation adds its weight to its instance's live
//! counters and a free of it subtracts it; when the span closes, what is still live
//! *outlived* the span and is added to its path's `outlived` counters (estimates, exact at
//! sampling rate 1).
//!
//! Instances live in a fixed table of [`MAX_INSTANCES`] slots. Slots are reused last-freed
//! first, from a small per-thread cache of free slots (refilled from, and spilled to, a global
//! lock-free stack), so that a thread creating and closing spans keeps touching the same few
//! cache lines; the slots of a thread that exits go back to the global stack. An instance id is
//! the slot's index and a 47-bit per-slot generation: an id comes back only after 2^47 - 1
//! instances of one slot. With every slot held by an open span, new spans are not tracked
//! (counted in [`untracked_instances`]).

use crate::MAX_TAGS;
use crate::tag::STATE;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Span instances tracked at once.
pub const MAX_INSTANCES: usize = 1 << SLOT_BITS;
const SLOT_BITS: u32 = 16;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
/// Free slots a thread keeps for itself.
pub(crate) const LOCAL_FREE: usize = 16;

#[repr(align(64))]
struct Instance {
    /// The open instance's id (generation and slot index); 0 while free.
    id: AtomicU64,
    /// Generation of the slot's last instance.
    generation: AtomicU64,
    /// Next slot in the global free stack (index + 1; 0: none).
    next_free: AtomicU32,
    /// Live sampled weight (fixed point, see `sample`) and bytes; may transiently wrap.
    objects_fp: AtomicU64,
    bytes: AtomicU64,
}

static INSTANCES: [Instance; MAX_INSTANCES] = [const {
    Instance {
        id: AtomicU64::new(0),
        generation: AtomicU64::new(0),
        next_free: AtomicU32::new(0),
        objects_fp: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
    }
}; MAX_INSTANCES];

/// Slots never used yet start here.
static FRESH: AtomicU32 = AtomicU32::new(0);
/// The global free stack: (version << 32) | (slot index + 1), 0 below the version: empty. The
/// version makes a pop that raced with a pop and a push of the same slot fail (ABA).
static FREE: AtomicU64 = AtomicU64::new(0);
static UNTRACKED: AtomicU64 = AtomicU64::new(0);
/// Outlived weight (fixed point) and bytes per tag.
static OUTLIVED: [(AtomicU64, AtomicU64); MAX_TAGS] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; MAX_TAGS];

fn slot(id: u64) -> &'static Instance {
    &INSTANCES[(id & SLOT_MASK) as usize]
}

fn push_global(index: u32) {
    let mut head = FREE.load(Ordering::Relaxed);
    loop {
        INSTANCES[index as usize]
            .next_free
            .store(head as u32, Ordering::Relaxed);
        let new = ((head >> 32).wrapping_add(1) << 32) | u64::from(index + 1);
        match FREE.compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return,
            Err(h) => head = h,
        }
    }
}

fn pop_global() -> Option<u32> {
    let mut head = FREE.load(Ordering::Acquire);
    loop {
        let top = head as u32;
        if top == 0 {
            return None;
        }
        let next = INSTANCES[(top - 1) as usize]
            .next_free
            .load(Ordering::Relaxed);
        let new = ((head >> 32).wrapping_add(1) << 32) | u64::from(next);
        match FREE.compare_exchange_weak(head, new, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => return Some(top - 1),
            Err(h) => head = h,
        }
    }
}

/// A free slot: this thread's last freed, else the global stack's, else a fresh one.
fn take_slot() -> Option<u32> {
    let local = STATE
        .try_with(|s| {
            let n = s.free_len.get();
            (n > 0).then(|| {
                s.free_len.set(n - 1);
                s.free_slots[usize::from(n - 1)].get()
            })
        })
        .ok()
        .flatten();
    local.map(u32::from).or_else(pop_global).or_else(|| {
        let fresh = FRESH.fetch_add(1, Ordering::Relaxed);
        ((fresh as usize) < MAX_INSTANCES).then_some(fresh)
    })
}

/// Gives a slot back: to this thread's cache, or the global stack when that is full.
fn give_slot(index: u32) {
    let kept = STATE
        .try_with(|s| {
            let n = s.free_len.get();
            let fits = usize::from(n) < LOCAL_FREE;
            if fits {
                s.free_slots[usize::from(n)].set(index as u16);
                s.free_len.set(n + 1);
            }
            fits
        })
        .unwrap_or(false);
    if !kept {
        push_global(index);
    }
}

/// Returns this thread's cached free slots to the global stack (at thread exit).
pub(crate) fn release_thread_slots() {
    let _ = STATE.try_with(|s| {
        for i in 0..usize::from(s.free_len.replace(0)) {
            push_global(u32::from(s.free_slots[i].get()));
        }
    });
}

/// Opens an instance for a new span; 0 when every slot is held (the span is not tracked).
pub fn open_span_instance() -> u64 {
    let Some(index) = take_slot() else {
        UNTRACKED.fetch_add(1, Ordering::Relaxed);
        return 0;
    };
    let s = &INSTANCES[index as usize];
    // From 1, so that ids are never 0, and below 2^47, so that they stay below `LAZY`.
    let generation = (s.generation.load(Ordering::Relaxed) % GENERATIONS) + 1;
    s.generation.store(generation, Ordering::Relaxed);
    s.objects_fp.store(0, Ordering::Relaxed);
    s.bytes.store(0, Ordering::Relaxed);
    let id = (generation << SLOT_BITS) | u64::from(index);
    s.id.store(id, Ordering::Release);
    id
}

/// Generations of one slot's instances before its ids come back (2^47 - 1).
const GENERATIONS: u64 = (1 << (63 - SLOT_BITS)) - 1;

/// Marks a span-instance word as the address of the span's instance cell (see
/// [`lazy_instance_word`]); instance ids are below it.
const LAZY: u64 = 1 << 63;

/// What an instance cell holds once its span closed: no instance is opened there any more (a
/// word still current on some thread after its span closed, as a leaked enter guard leaves it,
/// would otherwise open one that nobody closes). Not an instance id: those are below [`LAZY`].
const CLOSED: u64 = u64::MAX;

/// The word that makes a span's instance current (see
/// [`set_current_span`](crate::tag::set_current_span)) for an instance `id` opened already (or
/// 0: none).
pub const fn eager_instance_word(id: u64) -> u64 {
    id
}

/// The word that makes a span's instance current for a span whose instance is kept in `cell`
/// (0 until opened): the first sampled allocation made while it is current opens one and
/// stores it there. Whoever closes the span takes it out with [`take_instance`]; whoever
/// gives the cell to a new span empties it with [`reset_instance_cell`].
#[inline]
pub fn lazy_instance_word(cell: &AtomicU64) -> u64 {
    cell as *const AtomicU64 as u64 | LAZY
}

/// The cell a lazy word names.
///
/// # Safety
/// `word` is a [`lazy_instance_word`] whose cell is live.
#[inline]
unsafe fn cell_of(word: u64) -> &'static AtomicU64 {
    // SAFETY: the caller guarantees the cell is live; it is only read and written atomically.
    unsafe { &*((word & !LAZY) as *const AtomicU64) }
}

/// The instance that span-instance word `word` names, taken out for the span's close: a lazy
/// word's cell is left closed, so that no instance is opened there until the cell is reset for
/// a new span ([`reset_instance_cell`]). 0: none was opened.
///
/// # Safety
/// `word` is 0, an [`eager_instance_word`], or a [`lazy_instance_word`] whose cell is live.
#[inline]
pub unsafe fn take_instance(word: u64) -> u64 {
    if word & LAZY == 0 {
        return word;
    }
    // SAFETY: forwarded from the caller.
    let cell = unsafe { cell_of(word) };
    // Most spans never held a sampled block: a plain store closes their cell (a stale word
    // racing it, which only a leaked enter guard makes, could lose one instance to it).
    let id = cell.load(Ordering::Acquire);
    let id = if id == 0 {
        cell.store(CLOSED, Ordering::Release);
        0
    } else {
        cell.swap(CLOSED, Ordering::AcqRel)
    };
    if id == CLOSED { 0 } else { id }
}

/// Empties an instance cell for the new span that takes it; an instance opened there after its
/// last span closed (by a stale word, on a page given back and read as zeros) is closed.
#[inline]
pub fn reset_instance_cell(cell: &AtomicU64) {
    let stale = cell.load(Ordering::Relaxed);
    if stale != 0 && stale != CLOSED {
        close_stale(stale);
    }
    cell.store(0, Ordering::Relaxed);
}

#[cold]
#[inline(never)]
fn close_stale(id: u64) {
    close_span_instance(id, crate::Tag::NO_SPAN);
}

/// The instance that span-instance word `word` names, opened now if it is a lazy word whose
/// cell holds none yet (a span entered on two threads at once may open two: the one stored
/// first is kept, and the other closed again at once). 0: none, its span closed, or every slot
/// is held.
///
/// # Safety
/// `word` is 0, an [`eager_instance_word`], or a [`lazy_instance_word`] whose cell is live.
pub(crate) unsafe fn instance_of(word: u64) -> u64 {
    if word & LAZY == 0 {
        return word;
    }
    // SAFETY: forwarded from the caller.
    let cell = unsafe { cell_of(word) };
    match cell.load(Ordering::Acquire) {
        0 => install(cell, open_span_instance()),
        CLOSED => 0,
        id => id,
    }
}

/// Stores the instance `new` just opened (0: none could be) in `cell` unless one is there
/// already, in which case `new` is closed again; returns the cell's instance (0: none, or the
/// span closed).
fn install(cell: &AtomicU64, new: u64) -> u64 {
    let found = if new == 0 {
        cell.load(Ordering::Acquire)
    } else {
        match cell.compare_exchange(0, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return new,
            Err(found) => {
                // Nothing was counted in it yet: closing it adds nothing anywhere.
                close_span_instance(new, crate::Tag::NO_SPAN);
                found
            }
        }
    };
    if found == CLOSED { 0 } else { found }
}

/// Closes the instance `id` of a span of `tag` (see [`take_instance`]): what its sampled
/// allocations still hold is added to the tag's outlived counters.
pub fn close_span_instance(id: u64, tag: crate::Tag) {
    if id == 0 {
        return;
    }
    let s = slot(id);
    if s.id.load(Ordering::Acquire) != id {
        return;
    }
    // Most spans hold no sampled block (one sample per 512 KiB by default): nothing of theirs
    // can be freed or outlive them, so the slot is retired with plain stores. A locked
    // instruction costs about 5 ns, and the path below has three.
    if s.objects_fp.load(Ordering::Acquire) == 0 && s.bytes.load(Ordering::Acquire) == 0 {
        s.id.store(0, Ordering::Release);
        give_slot((id & SLOT_MASK) as u32);
        return;
    }
    if s.id
        .compare_exchange(id, 0, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    let objects = s.objects_fp.swap(0, Ordering::AcqRel);
    let bytes = s.bytes.swap(0, Ordering::AcqRel);
    give_slot((id & SLOT_MASK) as u32);
    // A wrapped (negative) count is a free that raced with the close: nothing outlived. A
    // block so large that its estimated objects round to none (over 256 times the sampling
    // rate) still outlives with its bytes.
    if (objects > 0 || bytes > 0) && objects < i64::MAX as u64 && bytes < i64::MAX as u64 {
        let (o, b) = &OUTLIVED[tag.get() as usize];
        o.fetch_add(objects, Ordering::Relaxed);
        b.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// A sampled block of weight `objects_fp` and `bytes` was allocated (`alive`) or freed in
/// instance `id`.
pub(crate) fn track(id: u64, objects_fp: u64, bytes: u64, alive: bool) {
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
            objects.load(Ordering::Relaxed) as f64 / crate::FP,
            bytes.load(Ordering::Relaxed),
        );
    }
}

/// Instances that could not be opened because every slot was held: a sampled allocation whose
/// span had none yet (it tries again at its next one), or a span created where it needs one at
/// once.
pub fn untracked_instances() -> u64 {
    UNTRACKED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outlived(tag: crate::Tag) -> (u64, u64) {
        let (o, b) = &OUTLIVED[tag.get() as usize];
        (o.load(Ordering::Relaxed), b.load(Ordering::Relaxed))
    }

    /// A span that holds no sampled block at its close is retired without locked instructions
    /// and adds nothing; one that holds some adds exactly what it holds; a block freed after
    /// its span closed changes neither the closed instance nor the slot's next one.
    #[test]
    fn closing_counts_what_is_held_and_only_that() {
        let tag = crate::Tag::new(4000);
        let before = outlived(tag);

        // Allocated and freed within the span: nothing outlives it.
        let a = open_span_instance();
        assert_ne!(a, 0);
        track(a, 3 * 256, 300, true);
        track(a, 3 * 256, 300, false);
        close_span_instance(a, tag);
        assert_eq!(outlived(tag), before);

        // Two blocks allocated, one freed: one outlives it.
        let b = open_span_instance();
        assert_ne!(b, a, "ids are never reused");
        track(b, 256, 64, true);
        track(b, 2 * 256, 128, true);
        track(b, 256, 64, false);
        close_span_instance(b, tag);
        assert_eq!(outlived(tag), (before.0 + 2 * 256, before.1 + 128));

        // A block so large that its weight rounds to no object (over 256 MiB at the default
        // rate) still holds bytes: the close counts them.
        let d = open_span_instance();
        track(d, 0, 512 << 20, true);
        close_span_instance(d, tag);
        assert_eq!(
            outlived(tag),
            (before.0 + 2 * 256, before.1 + 128 + (512 << 20))
        );
        let before = (before.0, before.1 + (512 << 20));

        // The outliving block freed later: the closed instance is not touched, and the slot's
        // next instance starts empty.
        track(b, 2 * 256, 128, false);
        let c = open_span_instance();
        close_span_instance(c, tag);
        assert_eq!(outlived(tag), (before.0 + 2 * 256, before.1 + 128));
        // Closing twice is harmless.
        close_span_instance(c, tag);
        close_span_instance(b, tag);
        assert_eq!(outlived(tag), (before.0 + 2 * 256, before.1 + 128));
    }

    /// A lazy word opens its span's instance at its first use and names that one from then
    /// on; the close takes it out and leaves the cell closed, where nothing is opened again
    /// until the cell is reset for a new span. Eager words and 0 name themselves.
    #[test]
    fn a_lazy_word_opens_the_instance_once() {
        let tag = crate::Tag::new(4001);
        let cell = AtomicU64::new(0);
        let word = lazy_instance_word(&cell);
        // The words used below name `cell`, which lives to the end of the test, or no cell.
        // SAFETY: as just said.
        let of = |w| unsafe { instance_of(w) };
        // SAFETY: as just said.
        let take = |w| unsafe { take_instance(w) };
        let first = of(word);
        assert_ne!(first, 0);
        assert_eq!(cell.load(Ordering::Relaxed), first);
        assert_eq!(of(word), first);
        assert_eq!(take(word), first);
        close_span_instance(first, tag);
        // Closed: a stale word opens nothing, and a second take finds nothing.
        assert_eq!(of(word), 0);
        assert_eq!(cell.load(Ordering::Relaxed), CLOSED);
        assert_eq!(take(word), 0);
        // A span that never held a sampled block: taken as none, closed all the same.
        reset_instance_cell(&cell);
        assert_eq!(cell.load(Ordering::Relaxed), 0);
        assert_eq!(take(word), 0);
        assert_eq!(cell.load(Ordering::Relaxed), CLOSED);

        // An instance opened in a cell after its span closed (a page given back reads as
        // zeros) is closed when the cell is reset for a new span.
        reset_instance_cell(&cell);
        let stale = of(word);
        assert_eq!(slot(stale).id.load(Ordering::Relaxed), stale);
        reset_instance_cell(&cell);
        assert_eq!(
            slot(stale).id.load(Ordering::Relaxed),
            0,
            "the stale instance is closed"
        );
        assert_eq!(cell.load(Ordering::Relaxed), 0);

        let id = open_span_instance();
        assert_eq!(eager_instance_word(id), id);
        assert_eq!(of(0), 0);
        assert_eq!(of(eager_instance_word(id)), id);
        assert_eq!(take(eager_instance_word(id)), id);
        close_span_instance(id, tag);
    }

    /// An instance opened while another thread stored one first is closed again, and the
    /// first one named; one opened for a cell that closed meanwhile is closed, and none named;
    /// without a free slot, whatever the cell holds is named.
    #[test]
    fn an_instance_stored_first_wins() {
        let tag = crate::Tag::new(4002);
        let theirs = open_span_instance();
        let cell = AtomicU64::new(theirs);
        let ours = open_span_instance();
        assert_eq!(install(&cell, ours), theirs);
        assert_eq!(slot(ours).id.load(Ordering::Relaxed), 0, "ours is closed");
        assert_eq!(slot(theirs).id.load(Ordering::Relaxed), theirs);

        let closed = AtomicU64::new(CLOSED);
        let late = open_span_instance();
        assert_eq!(install(&closed, late), 0);
        assert_eq!(
            slot(late).id.load(Ordering::Relaxed),
            0,
            "the late one is closed"
        );

        assert_eq!(install(&cell, 0), theirs);
        assert_eq!(install(&closed, 0), 0);
        let empty = AtomicU64::new(0);
        assert_eq!(install(&empty, 0), 0);
        close_span_instance(theirs, tag);
    }

    /// A slot's generation wraps below 2^47, so that ids stay below `LAZY` and never are 0.
    #[test]
    fn generations_wrap_below_the_lazy_bit() {
        let a = open_span_instance();
        close_span_instance(a, crate::Tag::new(4003)); // its slot is the next one taken here
        let s = slot(a);
        s.generation.store(GENERATIONS, Ordering::Relaxed);
        let b = open_span_instance();
        assert_eq!(b & SLOT_MASK, a & SLOT_MASK, "the slot just freed");
        assert_eq!(b >> SLOT_BITS, 1);
        assert!(b < LAZY && b != 0);
        close_span_instance(b, crate::Tag::new(4003));
    }
}
