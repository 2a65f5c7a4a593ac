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
//! the slot's index and a 47-bit per-slot generation: an id comes back only after 2^47
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

/// Generations of one slot's instances before its ids come back.
const GENERATIONS: u64 = (1 << (63 - SLOT_BITS)) - 1;

/// Marks a span-instance word as the address of the span's instance cell (see
/// [`lazy_instance_word`]); instance ids are below it.
const LAZY: u64 = 1 << 63;

/// The word that makes a span's instance current (see
/// [`set_current_span`](crate::tag::set_current_span)) for an instance `id` opened already (or
/// 0: none).
pub const fn eager_instance_word(id: u64) -> u64 {
    id
}

/// The word that makes a span's instance current for a span whose instance is kept in `cell`
/// (0 until opened): the first sampled allocation made while it is current opens one and
/// stores it there. Whoever closes the span reads the cell and closes the instance in it.
pub fn lazy_instance_word(cell: &AtomicU64) -> u64 {
    cell as *const AtomicU64 as u64 | LAZY
}

/// The instance that span-instance word `word` names now (0: none opened yet), without
/// opening one: for whoever closes the span.
///
/// # Safety
/// `word` is 0, an [`eager_instance_word`], or a [`lazy_instance_word`] whose cell is live.
pub unsafe fn opened_instance(word: u64) -> u64 {
    if word & LAZY == 0 {
        return word;
    }
    // SAFETY: the caller guarantees a lazy word's cell is live.
    unsafe { &*((word & !LAZY) as *const AtomicU64) }.load(Ordering::Acquire)
}

/// The instance that span-instance word `word` names, opened now if it is a lazy word whose
/// cell holds none yet (a span entered on two threads at once may open two: the one stored
/// first is kept, and the other closed again at once). 0: none, or every slot is held.
///
/// # Safety
/// `word` is 0, an [`eager_instance_word`], or a [`lazy_instance_word`] whose cell is live.
pub(crate) unsafe fn instance_of(word: u64) -> u64 {
    if word & LAZY == 0 {
        return word;
    }
    // SAFETY: the caller guarantees a lazy word's cell is live.
    let cell = unsafe { &*((word & !LAZY) as *const AtomicU64) };
    let id = cell.load(Ordering::Acquire);
    if id != 0 {
        return id;
    }
    let new = open_span_instance();
    if new == 0 {
        return 0;
    }
    match cell.compare_exchange(0, new, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => new,
        Err(first) => {
            // Nothing was counted in it yet: closing it adds nothing anywhere.
            close_span_instance(new, crate::Tag::NO_SPAN);
            first
        }
    }
}

/// Closes the instance `id` of a span of `tag` (see [`opened_instance`]): what its sampled
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
    /// on; an instance in the cell already is the one named. Eager words and 0 name
    /// themselves.
    #[test]
    fn a_lazy_word_opens_the_instance_once() {
        let tag = crate::Tag::new(4001);
        let cell = AtomicU64::new(0);
        let word = lazy_instance_word(&cell);
        // SAFETY: `cell` lives to the end of the test.
        let first = unsafe { instance_of(word) };
        assert_ne!(first, 0);
        assert_eq!(cell.load(Ordering::Relaxed), first);
        // SAFETY: as above.
        assert_eq!(unsafe { instance_of(word) }, first);
        close_span_instance(first, tag);

        let theirs = open_span_instance();
        let cell = AtomicU64::new(theirs);
        // SAFETY: as above.
        assert_eq!(unsafe { instance_of(lazy_instance_word(&cell)) }, theirs);
        assert_eq!(eager_instance_word(theirs), theirs);
        // SAFETY: 0 and eager words name no cell.
        assert_eq!(unsafe { instance_of(0) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { instance_of(eager_instance_word(theirs)) }, theirs);
        close_span_instance(theirs, tag);
    }

    /// Two threads that open one span's instance at once name the same one, and the one that
    /// lost leaves no slot held.
    #[test]
    fn two_threads_opening_one_instance_agree() {
        use std::sync::{Arc, Barrier};
        let tag = crate::Tag::new(4002);
        let held = || {
            INSTANCES
                .iter()
                .filter(|s| s.id.load(Ordering::Relaxed) != 0)
                .count()
        };
        let before = held();
        for _ in 0..200 {
            let cell = Arc::new(AtomicU64::new(0));
            let barrier = Arc::new(Barrier::new(2));
            let open = |cell: Arc<AtomicU64>, barrier: Arc<Barrier>| {
                std::thread::spawn(move || {
                    barrier.wait();
                    // SAFETY: the cell is kept alive by this thread's handle.
                    unsafe { instance_of(lazy_instance_word(&cell)) }
                })
            };
            let a = open(cell.clone(), barrier.clone());
            let b = open(cell.clone(), barrier);
            let (a, b) = (a.join().unwrap(), b.join().unwrap());
            assert_eq!(a, b);
            assert_eq!(cell.load(Ordering::Relaxed), a);
            close_span_instance(a, tag);
        }
        // Every slot opened here was closed (the other tests of this module hold a few at
        // most meanwhile).
        assert!(
            held() <= before + 4,
            "{} slots held, {before} before",
            held()
        );
    }
}
