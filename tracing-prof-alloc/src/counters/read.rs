//! Reading the counters, off the hot paths: per tag over all threads, per thread, for the
//! calling thread alone. Readers never block the threads that write (see the parent module's
//! ordering rules).

use super::{
    FALLBACK, FALLBACK_ORIGIN, MAX_ORIGINS, NO_TABLE, OriginSlot, Slot, TABLES, origin_of,
};
use crate::MAX_TAGS;
use crate::tag::STATE;
use std::sync::atomic::{AtomicU64, Ordering};

/// Totals of one tag over all threads, as returned by [`read_totals`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TagTotals {
    /// Allocations made (realloc in resize mode keeps the count).
    pub alloc_objects: u64,
    /// Bytes requested, in user sizes (never header or size-class bytes).
    pub alloc_bytes: u64,
    /// Blocks freed, whichever thread freed them.
    pub free_objects: u64,
    /// Bytes freed, in user sizes.
    pub free_bytes: u64,
}

impl TagTotals {
    /// Objects allocated and not yet freed.
    pub fn inuse_objects(&self) -> u64 {
        self.alloc_objects.saturating_sub(self.free_objects)
    }

    /// Bytes allocated and not yet freed.
    pub fn inuse_bytes(&self) -> u64 {
        self.alloc_bytes.saturating_sub(self.free_bytes)
    }
}

fn for_each_table(mut f: impl FnMut(&[Slot])) {
    f(&FALLBACK);
    let mut cursor = TABLES.load(Ordering::Acquire).cast_const();
    while !cursor.is_null() {
        // SAFETY: every pointer in TABLES is a published, initialised, never-freed table.
        let table = unsafe { &*cursor };
        f(&table.slots);
        cursor = table.next;
    }
}

/// Sums every thread's counters for tags `0..out.len()` (at most [`MAX_TAGS`]) into `out`.
///
/// Never blocks the threads that write. Under concurrent activity the totals are a consistent
/// lower bound per counter (a free is never seen without its allocation); once the program is
/// quiescent they are exact.
pub fn read_totals(out: &mut [TagTotals]) {
    let n = out.len().min(MAX_TAGS);
    let out = &mut out[..n];
    out.fill(TagTotals::default());
    let load = |c: &AtomicU64| c.load(Ordering::Acquire);
    // Frees first, then allocations: see the module docs.
    for_each_table(|slots| {
        for (t, s) in out.iter_mut().zip(slots) {
            t.free_objects += load(&s.free_objects);
            t.free_bytes += load(&s.free_bytes);
        }
    });
    for_each_table(|slots| {
        for (t, s) in out.iter_mut().zip(slots) {
            t.alloc_objects += load(&s.alloc_objects);
            t.alloc_bytes += load(&s.alloc_bytes);
        }
    });
}

/// Like [`read_totals`], for the calling thread's own counters only: what this thread allocated
/// (and freed) per tag, whatever other threads do at the same time. All zero before the thread's
/// first allocation.
pub fn read_thread_totals(out: &mut [TagTotals]) {
    let n = out.len().min(MAX_TAGS);
    let out = &mut out[..n];
    out.fill(TagTotals::default());
    let table = STATE.try_with(|s| s.table.get()).unwrap_or(NO_TABLE);
    if table.is_null() || table == NO_TABLE {
        return;
    }
    // SAFETY: a real table pointer from `acquire`; tables are never freed.
    let table = unsafe { &*table };
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    for (t, s) in out.iter_mut().zip(&table.slots) {
        t.alloc_objects = load(&s.alloc_objects);
        t.alloc_bytes = load(&s.alloc_bytes);
        t.free_objects = load(&s.free_objects);
        t.free_bytes = load(&s.free_bytes);
    }
}

/// Allocated and in-use memory of one thread table (a thread, and the exited threads whose
/// table it adopted), as returned by [`read_threads`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ThreadTotals {
    /// The table's index, from 1 (0: work done without a table, such as during TLS teardown).
    pub index: u32,
    /// OS thread id of its current or last owner (0: unknown).
    pub tid: u64,
    /// Whether a live thread owns the table now.
    pub alive: bool,
    /// OS name of its current or last owner, as known when it adopted the table or exited
    /// (empty: unknown). Up to 15 bytes on Linux.
    pub name: [u8; 16],
    /// Blocks allocated by its threads.
    pub alloc_objects: u64,
    /// Bytes allocated by its threads (realloc growth included).
    pub alloc_bytes: u64,
    /// Blocks its threads allocated that nobody has freed yet, whichever thread frees.
    pub inuse_objects: u64,
    /// Bytes its threads allocated that nobody has freed yet.
    pub inuse_bytes: u64,
}

/// Per-thread totals, one entry per thread table plus entry 0 for table-less work. Tables from
/// index `MAX_ORIGINS - 1` on share one in-use figure, reported on the entry with that index
/// (the others report 0 in use).
///
/// In use by thread `t` = allocated in `t`'s table - freed in `t`'s table (whatever the blocks'
/// origin) + what `t` freed of other threads' blocks - what other threads freed of `t`'s.
pub fn read_threads() -> Vec<ThreadTotals> {
    let load = |c: &AtomicU64| c.load(Ordering::Acquire);
    let mut tables = Vec::new();
    let mut cursor = TABLES.load(Ordering::Acquire).cast_const();
    while !cursor.is_null() {
        // SAFETY: every pointer in TABLES is a published, initialised, never-freed table.
        let table = unsafe { &*cursor };
        tables.push(table);
        cursor = table.next;
    }
    tables.sort_by_key(|t| t.index);
    // Per origin: (objects, bytes) in use, built up with wrapping adds. Frees first (as in
    // `read_totals`), so a free is never seen without its allocation.
    let mut inuse = vec![(0u64, 0u64); MAX_ORIGINS];
    let add = |e: &mut (u64, u64), o: u64, b: u64| {
        *e = (e.0.wrapping_add(o), e.1.wrapping_add(b));
    };
    let sub = |e: &mut (u64, u64), o: u64, b: u64| {
        *e = (e.0.wrapping_sub(o), e.1.wrapping_sub(b));
    };
    let mut account_frees = |me: usize, slots: &[Slot], cross: &[OriginSlot]| {
        for s in slots {
            sub(&mut inuse[me], load(&s.free_objects), load(&s.free_bytes));
        }
        for (origin, c) in cross.iter().enumerate() {
            let (o, b) = (load(&c.objects), load(&c.bytes));
            add(&mut inuse[me], o, b);
            sub(&mut inuse[origin], o, b);
        }
    };
    account_frees(0, &FALLBACK, &FALLBACK_ORIGIN);
    for t in &tables {
        account_frees(origin_of(t.index) as usize, &t.slots, &t.origin_frees);
    }
    let sum_allocs = |slots: &[Slot]| {
        slots.iter().fold((0u64, 0u64), |(o, b), s| {
            (o + load(&s.alloc_objects), b + load(&s.alloc_bytes))
        })
    };
    let mut out = Vec::with_capacity(tables.len() + 1);
    let (o, b) = sum_allocs(&FALLBACK);
    add(&mut inuse[0], o, b);
    out.push(ThreadTotals {
        alloc_objects: o,
        alloc_bytes: b,
        ..ThreadTotals::default()
    });
    for t in &tables {
        let (o, b) = sum_allocs(&t.slots);
        add(&mut inuse[origin_of(t.index) as usize], o, b);
        out.push(ThreadTotals {
            index: t.index,
            tid: t.tid.load(Ordering::Relaxed),
            alive: t.owned.load(Ordering::Relaxed),
            name: {
                let (a, b) = (
                    t.name[0].load(Ordering::Relaxed),
                    t.name[1].load(Ordering::Relaxed),
                );
                let mut name = [0u8; 16];
                name[..8].copy_from_slice(&a.to_le_bytes());
                name[8..].copy_from_slice(&b.to_le_bytes());
                name
            },
            alloc_objects: o,
            alloc_bytes: b,
            ..ThreadTotals::default()
        });
    }
    for e in &mut out {
        let origin = origin_of(e.index);
        if origin != e.index {
            continue; // its in-use is reported on the shared entry
        }
        let (objects, bytes) = inuse[origin as usize];
        // A transient negative (a realloc correction seen before its counterpart) reads 0.
        e.inuse_objects = clamp_wrapped(objects);
        e.inuse_bytes = clamp_wrapped(bytes);
    }
    out
}

/// A wrapped `u64` difference read as signed, negatives as 0.
fn clamp_wrapped(v: u64) -> u64 {
    if v > i64::MAX as u64 { 0 } else { v }
}

/// Number of thread tables made so far (live threads plus free tables for reuse).
pub fn thread_tables() -> usize {
    let mut n = 0;
    for_each_table(|_| n += 1);
    n - 1
}
