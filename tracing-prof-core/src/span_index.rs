//! Every open span's state, keyed by span id, in one fixed table that every thread reads
//! without a lock: what span enter, exit and close need, without a registry lookup.
//!
//! Each span takes one entry (a cache line) when it is created: the first free of two places
//! given by its id (see [`places`]). Its path, its parent's path, its creation time and its span
//! instance are written once, before the id is published; its busy time accrues there on
//! every exit; the entry is freed when it closes. Span ids are reused by the registry as spans
//! close, so the entries of a running service's spans are the same few cache lines over and
//! over. Ids are only unique within one registry: each layer has an owner token, part of the
//! key. When both places are taken (more open spans than the table holds, or an unlucky pair),
//! the layer keeps that span's state in the registry's extensions instead, at the cost of a
//! lookup per enter.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use tracing_prof_alloc::Tag;

/// Entries in the table: 32768 (2 MiB of address space, touched as spans use them).
pub(crate) const ENTRIES: usize = 1 << 15;
const HASH_SHIFT: u32 = 64 - ENTRIES.trailing_zeros();

/// A key while its entry is being written.
const WRITING: u64 = u64::MAX;

/// What the layer knows of a span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SpanState {
    /// The interned path of this span.
    pub(crate) tag: Tag,
    /// The interned path of its parent ([`Tag::NO_SPAN`] for a root).
    pub(crate) parent: Tag,
    pub(crate) created_ns: u64,
    /// The allocator's instance for it (0: none), where the sampled memory it holds accrues.
    pub(crate) instance: u64,
}

#[repr(C, align(64))]
struct Entry {
    /// The span id; 0: free; [`WRITING`]: being filled.
    key: AtomicU64,
    owner: AtomicU32,
    tag: AtomicU32,
    parent: AtomicU32,
    created_ns: AtomicU64,
    busy_ns: AtomicU64,
    instance: AtomicU64,
}

static TABLE: [Entry; ENTRIES] = [const {
    Entry {
        key: AtomicU64::new(0),
        owner: AtomicU32::new(0),
        tag: AtomicU32::new(0),
        parent: AtomicU32::new(0),
        created_ns: AtomicU64::new(0),
        busy_ns: AtomicU64::new(0),
        instance: AtomicU64::new(0),
    }
}; ENTRIES];

static NEXT_OWNER: AtomicU32 = AtomicU32::new(1);

/// A fresh owner token for a layer.
pub(crate) fn new_owner() -> u32 {
    NEXT_OWNER.fetch_add(1, Ordering::Relaxed)
}

/// Where an entry of the table is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot(u32);

impl Slot {
    /// The entry's index, to keep in a compact frame.
    pub(crate) fn index(self) -> u32 {
        self.0
    }

    /// The slot at `index` (from [`Slot::index`]).
    pub(crate) fn at(index: u32) -> Slot {
        Slot(index)
    }
}

/// Bits of a registry span id (less one) that hold the slot address within its thread's
/// shard, and the thread's shard number above them: tracing-subscriber's registry keys spans
/// with sharded-slab's default configuration (32 pages from 32 slots: 38 address bits; 4096
/// threads: 13 bits). Only locality depends on this: were the layout different, spans would
/// just land in other places (a test checks it).
const ADDR_BITS: u32 = 38;
const TID_BITS: u32 = 13;
/// Entries set aside per registry shard (thread) in the first place.
const REGION: usize = 1024;

/// The two places of span `id`. The first keeps the registry's locality: each thread's spans
/// in a region of their own, in the order of the registry's own slots, so the spans one thread
/// has open are neighbouring entries that it alone writes; the second is a plain hash.
#[inline]
fn places(id: u64) -> [usize; 2] {
    let key = id.wrapping_sub(1);
    let addr = key & ((1 << ADDR_BITS) - 1);
    let shard = (key >> ADDR_BITS) & ((1 << TID_BITS) - 1);
    let a = (shard as usize)
        .wrapping_mul(REGION)
        .wrapping_add(addr as usize)
        & (ENTRIES - 1);
    let b = (id ^ (id >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9) >> HASH_SHIFT;
    [a, b as usize]
}

/// Adds span `id` of `owner`; `None` when both of its places are taken.
pub(crate) fn insert(owner: u32, id: u64, state: SpanState) -> Option<Slot> {
    for i in places(id) {
        let e = &TABLE[i];
        if e.key
            .compare_exchange(0, WRITING, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            e.owner.store(owner, Ordering::Relaxed);
            e.tag.store(state.tag.get(), Ordering::Relaxed);
            e.parent.store(state.parent.get(), Ordering::Relaxed);
            e.created_ns.store(state.created_ns, Ordering::Relaxed);
            e.busy_ns.store(0, Ordering::Relaxed);
            e.instance.store(state.instance, Ordering::Relaxed);
            e.key.store(id, Ordering::Release);
            return Some(Slot(i as u32));
        }
    }
    None
}

/// The entry of span `id` of `owner`, if it is in the table.
#[inline]
pub(crate) fn find(owner: u32, id: u64) -> Option<(Slot, SpanState)> {
    for i in places(id) {
        let e = &TABLE[i];
        if e.key.load(Ordering::Acquire) == id && e.owner.load(Ordering::Relaxed) == owner {
            let state = SpanState {
                tag: Tag::new(e.tag.load(Ordering::Relaxed)),
                parent: Tag::new(e.parent.load(Ordering::Relaxed)),
                created_ns: e.created_ns.load(Ordering::Relaxed),
                instance: e.instance.load(Ordering::Relaxed),
            };
            return Some((Slot(i as u32), state));
        }
    }
    None
}

/// Adds busy time to span `id`'s entry at `slot`.
#[inline]
pub(crate) fn add_busy(slot: Slot, id: u64, ns: u64) {
    let Some(e) = TABLE.get(slot.0 as usize) else {
        return;
    };
    // The span cannot close while it is entered, so the entry is still its own; the check
    // keeps a misuse of the raw subscriber API from charging another span.
    if e.key.load(Ordering::Relaxed) == id {
        e.busy_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Frees span `id`'s entry at `slot`; returns its busy time.
pub(crate) fn remove(slot: Slot, id: u64) -> u64 {
    let e = &TABLE[slot.0 as usize];
    if e.key.load(Ordering::Acquire) != id {
        return 0;
    }
    let busy = e.busy_ns.load(Ordering::Relaxed);
    e.key.store(0, Ordering::Release);
    busy
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_found_by_id_and_owner_only() {
        let state = SpanState {
            tag: Tag::new(7),
            parent: Tag::new(3),
            created_ns: 99,
            instance: 5,
        };
        let (a, b) = (new_owner(), new_owner());
        let slot = insert(a, 12345, state).unwrap();
        assert_eq!(find(a, 12345), Some((slot, state)));
        assert_eq!(
            find(b, 12345),
            None,
            "another registry's span of the same id"
        );
        assert_eq!(find(a, 12346), None);
        add_busy(slot, 12345, 40);
        add_busy(slot, 12345, 2);
        assert_eq!(remove(slot, 12345), 42);
        assert_eq!(find(a, 12345), None);

        // An id whose two places are both taken has no room: ids of the first shard whose
        // slot addresses are its two places take them first.
        let x = 1u64 << 40;
        let [p1, p2] = places(x);
        assert_ne!(p1, p2);
        let (y1, y2) = (p1 as u64 + 1, p2 as u64 + 1);
        assert_eq!((places(y1)[0], places(y2)[0]), (p1, p2));
        let s1 = insert(a, y1, state).unwrap();
        let s2 = insert(a, y2, state).unwrap();
        assert_eq!(insert(a, x, state), None);
        remove(s1, y1);
        remove(s2, y2);
        let s3 = insert(a, x, state).unwrap();
        remove(s3, x);
    }
}
