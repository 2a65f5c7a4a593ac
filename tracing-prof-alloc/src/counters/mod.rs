//! Exact per-tag counters that scale across threads.
//!
//! Each thread owns a [`ThreadTable`]: one [`Slot`] of counters per tag. Only the owning thread
//! writes its table, with a plain load and store (no atomic read-modify-write, no lock), so no
//! cache line is written by more than one thread. A free is counted in the *freeing* thread's
//! table under the tag found in the block's header; in-use = allocated - freed, summed over all
//! tables. Readers sum all tables.
//!
//! Tables are mapped (a mapping each, whose pages become memory as tags are first written) the
//! first time a thread touches the allocator, kept in a global append-only list and never
//! unmapped: when a thread exits its table is marked free and the next new thread adopts it,
//! counts included (sums over all tables are unchanged by that). Work that cannot have a table
//! — a call re-entered while the table is being set up, a call during TLS teardown after the
//! table was released, or a kernel that refused the mapping — is counted in one shared
//! [`FALLBACK`] table with atomic adds: slower, equally exact.
//!
//! Ordering: owners store with `Release`; [`read_totals`] loads every table's *free* counters
//! before any *alloc* counter, with `Acquire`. A free that a reader sees happened after its
//! allocation, so that allocation is seen too and in-use never reads negative.

mod read;

pub use read::{
    TagTotals, ThreadTotals, read_thread_totals, read_threads, read_totals, thread_tables,
};

use crate::MAX_TAGS;
use crate::tag::STATE;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

/// The counters of one tag in one table.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    alloc_objects: AtomicU64,
    alloc_bytes: AtomicU64,
    free_objects: AtomicU64,
    free_bytes: AtomicU64,
}

impl Slot {
    const fn new() -> Self {
        Slot {
            alloc_objects: AtomicU64::new(0),
            alloc_bytes: AtomicU64::new(0),
            free_objects: AtomicU64::new(0),
            free_bytes: AtomicU64::new(0),
        }
    }
}

/// Frees of *other* threads' blocks, by the thread that allocated them (their *origin*), for the
/// per-thread view. `bytes` also takes resizes of other threads' blocks and may wrap; sums over
/// tables are right.
#[derive(Debug, Default)]
pub(crate) struct OriginSlot {
    objects: AtomicU64,
    bytes: AtomicU64,
}

impl OriginSlot {
    const fn new() -> Self {
        OriginSlot {
            objects: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }
}

/// Origins the per-thread view tells apart: 0 stands for work without a thread table, the last
/// one for every table from `MAX_ORIGINS - 1` on.
pub const MAX_ORIGINS: usize = 1024;

// What the crate docs and the README say a thread's table costs: 32 bytes a tag, 145 KiB of
// address space in all.
const _: () = assert!(std::mem::size_of::<Slot>() == 32);
const _: () = assert!(std::mem::size_of::<ThreadTable>().div_ceil(1024) == 145);

/// One thread's counters.
#[derive(Debug)]
pub(crate) struct ThreadTable {
    slots: [Slot; MAX_TAGS],
    /// Frees (and resizes) this thread made of other threads' blocks, by their origin.
    origin_frees: [OriginSlot; MAX_ORIGINS],
    /// Next table in [`TABLES`]; written once before the table is published.
    next: *const ThreadTable,
    /// Whether a live thread owns this table.
    owned: AtomicBool,
    /// This table's index, from 1, in creation order; written once before publication.
    index: u32,
    /// OS thread id of the thread that last adopted this table (0: unknown).
    tid: AtomicU64,
    /// Its OS thread name (up to 15 bytes, NUL-padded), read when it adopted the table and
    /// again when it exited: a thread's name outlives it.
    name: [AtomicU64; 2],
}

/// Head of the append-only list of every table ever made.
static TABLES: AtomicPtr<ThreadTable> = AtomicPtr::new(ptr::null_mut());

/// Shared table for work that has no thread table; updated with atomic adds.
static FALLBACK: [Slot; MAX_TAGS] = [const { Slot::new() }; MAX_TAGS];
/// Origin frees of work that has no thread table; updated with atomic adds.
static FALLBACK_ORIGIN: [OriginSlot; MAX_ORIGINS] = [const { OriginSlot::new() }; MAX_ORIGINS];
/// Index of the next table made.
static NEXT_INDEX: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

/// The origin stored in headers for a table index.
const fn origin_of(index: u32) -> u32 {
    if (index as usize) < MAX_ORIGINS {
        index
    } else {
        MAX_ORIGINS as u32 - 1
    }
}

/// [`crate::tag::ThreadState::table`] value once the thread has released its table (TLS teardown)
/// or could not get one: use [`FALLBACK`] from then on.
const NO_TABLE: *const ThreadTable = ptr::dangling();

/// How the hot path may update a slot.
#[derive(Clone, Copy)]
enum Writer {
    /// The slot belongs to this thread's table: load + store.
    Owner,
    /// The slot is in the shared fallback table: atomic add.
    Shared,
}

impl Writer {
    #[inline(always)]
    fn add(self, counter: &AtomicU64, n: u64) {
        match self {
            Writer::Owner => counter.store(
                counter.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Release,
            ),
            Writer::Shared => {
                counter.fetch_add(n, Ordering::Release);
            }
        }
    }
}

/// This thread's table, or [`NO_TABLE`].
#[inline(always)]
fn table(s: &crate::tag::ThreadState) -> *const ThreadTable {
    let t = s.table.get();
    if t.is_null() { acquire(s) } else { t }
}

/// This thread's own slot for `tag`.
///
/// # Safety
/// `table` must be this thread's real table (neither null nor [`NO_TABLE`]).
#[inline(always)]
unsafe fn own_slot(table: *const ThreadTable, tag: u32) -> &'static Slot {
    // SAFETY: real tables are fully initialised and never freed (the caller's contract); the
    // mask keeps the index in bounds.
    unsafe { &(*table).slots[tag as usize & (MAX_TAGS - 1)] }
}

/// Runs `f` on the slot for `tag` in `table` (or in the shared fallback table).
#[inline(always)]
fn with_slot_in(table: *const ThreadTable, tag: u32, f: impl FnOnce(&Slot, Writer)) {
    // MAX_TAGS is a power of two, so the mask keeps the index in bounds without a branch.
    let index = tag as usize & (MAX_TAGS - 1);
    if table == NO_TABLE {
        f(&FALLBACK[index], Writer::Shared);
        return;
    }
    // SAFETY: `table` is neither null nor NO_TABLE, so it came from `acquire`, which only stores
    // pointers to tables that are fully initialised and never freed (they live in TABLES forever).
    let table = unsafe { &*table };
    f(&table.slots[index], Writer::Owner);
}

/// Runs `f` on the origin slot for `origin` in `table` (or in the shared fallback).
#[inline(always)]
fn with_origin_in(table: *const ThreadTable, origin: u32, f: impl FnOnce(&OriginSlot, Writer)) {
    let index = (origin as usize).min(MAX_ORIGINS - 1);
    if table == NO_TABLE {
        f(&FALLBACK_ORIGIN[index], Writer::Shared);
        return;
    }
    // SAFETY: as in `with_slot_in`.
    let table = unsafe { &*table };
    f(&table.origin_frees[index], Writer::Owner);
}

const _: () = assert!(MAX_TAGS.is_power_of_two());

/// Slow path: adopts a free table or makes a new one for this thread.
#[cold]
#[inline(never)]
fn acquire(state: &crate::tag::ThreadState) -> *const ThreadTable {
    if state.busy.get() {
        // Re-entered from inside this function (e.g. TLS destructor registration allocated).
        return NO_TABLE;
    }
    state.busy.set(true);
    // The thread's record first (its id and name): its exit destructor is then registered
    // before this table's, and runs after it.
    let record = tracing_prof_thread::current();
    let table = adopt_free_table().unwrap_or_else(new_table);
    state.table.set(table);
    if table != NO_TABLE {
        // SAFETY: a real, never-freed table that this thread now owns.
        let t = unsafe { &*table };
        state.origin.set(origin_of(t.index));
        // (Without a record, during its TLS teardown, the thread's id is read now.)
        let tid = record.map_or_else(tracing_prof_thread::os_tid, |r| r.tid());
        t.tid.store(tid, Ordering::Relaxed);
        store_thread_name(t, record);
        // Registers the destructor that hands the table back when this thread exits. If TLS is
        // already being torn down this fails, and the table simply stays owned.
        let _ = RELEASE_ON_EXIT.try_with(|_| ());
    }
    state.busy.set(false);
    if table != NO_TABLE {
        let hook = NEW_THREAD_HOOK.load(Ordering::Acquire);
        if !hook.is_null() {
            // SAFETY: NEW_THREAD_HOOK only ever holds null or a `fn()` stored by
            // `set_new_thread_hook`.
            let hook: fn() = unsafe { std::mem::transmute::<*mut (), fn()>(hook) };
            hook();
        }
    }
    table
}

/// What runs on a thread's first allocation (see [`set_new_thread_hook`]); null: nothing.
static NEW_THREAD_HOOK: AtomicPtr<()> = AtomicPtr::new(ptr::null_mut());

/// Makes `hook` run on every thread's first allocation (once per thread, after its counter
/// table is set up), or nothing with `None`. The CPU sampler arms a thread's timer this way.
///
/// The hook runs inside the allocator: it must not allocate through the global allocator, lock
/// or panic.
pub fn set_new_thread_hook(hook: Option<fn()>) {
    let p = hook.map_or(ptr::null_mut(), |f| f as *mut ());
    NEW_THREAD_HOOK.store(p, Ordering::Release);
}

/// Stores the name in the thread's record into `t` (empty without a record).
fn store_thread_name(t: &ThreadTable, record: Option<&tracing_prof_thread::ThreadRecord>) {
    let b = record.map_or([0; 16], |r| r.name_bytes());
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    t.name[0].store(word(&b[..8]), Ordering::Relaxed);
    t.name[1].store(word(&b[8..]), Ordering::Relaxed);
}

/// In a child of `fork`: only the calling thread runs, so the tables of the parent's other
/// threads are handed back (with their counts, as at a thread's exit) for the child's new
/// threads, and the caller's takes the caller's new id. Only loads, stores and at most one
/// `gettid`: fit for a child of a multi-threaded `fork`.
pub fn after_fork_in_child() {
    let own = STATE.try_with(|s| s.table.get()).unwrap_or(NO_TABLE);
    let mut cursor = TABLES.load(Ordering::Acquire).cast_const();
    while !cursor.is_null() {
        // SAFETY: every pointer in TABLES is a published, initialised, never-freed table.
        let table = unsafe { &*cursor };
        if ptr::eq(cursor, own) {
            table
                .tid
                .store(tracing_prof_thread::refresh_tid(), Ordering::Relaxed);
        } else {
            table.owned.store(false, Ordering::Release);
        }
        cursor = table.next;
    }
}

fn adopt_free_table() -> Option<*const ThreadTable> {
    let mut cursor = TABLES.load(Ordering::Acquire).cast_const();
    while !cursor.is_null() {
        // SAFETY: every pointer in TABLES is a published, initialised, never-freed table.
        let table = unsafe { &*cursor };
        if table
            .owned
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return Some(cursor);
        }
        cursor = table.next;
    }
    None
}

/// A new table, owned by the caller and on [`TABLES`]; [`NO_TABLE`] when the kernel refuses.
///
/// A mapping of its own rather than `calloc`: `calloc` may hand back memory it reuses and must
/// clear, writing zeros over the whole table (145 KiB resident at a thread's first allocation),
/// where a fresh mapping's pages become memory only when a tag's counters are first written.
/// It asks for no transparent huge pages, which would make the first write cost 2 MiB.
fn new_table() -> *const ThreadTable {
    let raw = map_zeroed(size_of::<ThreadTable>()).cast::<ThreadTable>();
    if raw.is_null() {
        return NO_TABLE;
    }
    // SAFETY: `raw` is a fresh, zero-filled, page-aligned (so aligned enough) mapping of a
    // ThreadTable's size that nobody else sees yet; an all-zero ThreadTable is valid (atomics
    // at 0, `owned` false, `next` null).
    let table = unsafe { &mut *raw };
    *table.owned.get_mut() = true;
    table.index = NEXT_INDEX.fetch_add(1, Ordering::Relaxed);
    let mut head = TABLES.load(Ordering::Relaxed);
    loop {
        table.next = head;
        match TABLES.compare_exchange_weak(head, raw, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return raw,
            Err(actual) => head = actual,
        }
    }
}

/// `len` bytes of zeros in an anonymous mapping of their own; null when the kernel refuses.
/// Page-aligned. Its pages become memory only when first written (no transparent huge pages).
/// The profiler's per-thread and sample tables are made this way (`calloc` may hand back
/// reused memory and clear it whole).
pub fn map_zeroed(len: usize) -> *mut u8 {
    // SAFETY: a new private anonymous mapping at an address the kernel picks: it touches no
    // memory of ours.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return ptr::null_mut();
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    // SAFETY: advice on our own mapping; failure (a kernel without THP) changes nothing.
    unsafe {
        libc::madvise(p, len, libc::MADV_NOHUGEPAGE)
    };
    p.cast()
}

/// Hands this thread's table back when the thread exits.
struct ReleaseOnExit;

impl Drop for ReleaseOnExit {
    fn drop(&mut self) {
        crate::instances::release_thread_slots();
        let _ = STATE.try_with(|s| {
            let table = s.table.replace(NO_TABLE);
            s.origin.set(0);
            if !table.is_null() && table != NO_TABLE {
                // SAFETY: a real table pointer from `acquire`; tables are never freed.
                let table = unsafe { &*table };
                // Final by now. (The record is still there: it was claimed before this
                // destructor was registered, so its own destructor runs after this one.)
                if let Some(r) = tracing_prof_thread::current() {
                    r.refresh_name();
                    store_thread_name(table, Some(r));
                }
                table.owned.store(false, Ordering::Release);
            }
        });
    }
}

thread_local! {
    static RELEASE_ON_EXIT: ReleaseOnExit = const { ReleaseOnExit };
}

// === the hot-path API ===

/// What an allocation needs from this thread's state, read with one thread-local access.
#[derive(Clone, Copy)]
pub(crate) struct Ticket {
    /// The tag current on this thread.
    pub(crate) tag: u32,
    /// This thread's origin for the header.
    pub(crate) origin: u32,
    table: *const ThreadTable,
    /// Whether the heap sampler picked this request.
    pub(crate) sample: bool,
}

/// The fast path's countdown: when this thread has a table and the request does not reach the
/// next heap sample, counts `bytes` down and returns `true`; otherwise changes nothing (the
/// caller then takes the full path, [`begin_alloc`]).
#[inline(always)]
pub(crate) fn fast_countdown(bytes: usize) -> bool {
    STATE
        .try_with(|s| {
            let left = s.sample_left.get().wrapping_sub(bytes as i64);
            // A non-zero origin means a real table (set together in `acquire`, cleared
            // together at thread exit).
            let fast = s.origin.get() != 0 && left >= 0;
            if fast {
                s.sample_left.set(left);
            }
            fast
        })
        .unwrap_or(false)
}

/// Counts a plain allocation of `bytes` that the fast path made, after [`fast_countdown`]
/// returned `true` on this thread (so it has a table); returns the header's tag and origin.
///
/// Read again from the thread state after the inner allocator returns, rather than kept
/// across the call: fewer registers to save on the hot path.
#[inline(always)]
pub(crate) fn fast_commit_alloc(bytes: usize) -> (u32, u32) {
    STATE
        .try_with(|s| {
            let tag = s.tag.get();
            // SAFETY: `fast_countdown` saw a non-zero origin, so the table is a real one.
            let slot = unsafe { own_slot(s.table.get(), tag) };
            Writer::Owner.add(&slot.alloc_objects, 1);
            Writer::Owner.add(&slot.alloc_bytes, bytes as u64);
            (tag, s.origin.get())
        })
        .unwrap_or((0, 0))
}

/// The fast path of a free: when `meta` (the header's meta word) is exactly that
/// of a plain block allocated by this thread, which has a table, counts the free and returns
/// `true`. Anything else (another thread's block, a sampled block, no table, a header that is
/// not ours) returns `false` with nothing counted.
#[inline(always)]
pub(crate) fn fast_free(tag: u32, meta: u32, bytes: usize) -> bool {
    STATE
        .try_with(|s| {
            let origin = s.origin.get();
            if origin == 0 || meta != crate::header::Header::new(0, origin, 0).meta {
                return false;
            }
            // SAFETY: a non-zero origin means a real table.
            let slot = unsafe { own_slot(s.table.get(), tag) };
            Writer::Owner.add(&slot.free_objects, 1);
            Writer::Owner.add(&slot.free_bytes, bytes as u64);
            true
        })
        .unwrap_or(false)
}

/// Starts an allocation of `bytes`: reads the current tag and table, and counts the bytes down
/// to the next heap sample (the sampler's slow path runs only when the countdown runs out).
#[inline(always)]
pub(crate) fn begin_alloc(bytes: usize) -> Ticket {
    STATE
        .try_with(|s| {
            let table = table(s);
            let left = s.sample_left.get().wrapping_sub(bytes as i64);
            s.sample_left.set(left);
            Ticket {
                tag: s.tag.get(),
                origin: s.origin.get(),
                table,
                sample: left < 0 && crate::sample::countdown_ran_out(s, bytes),
            }
        })
        .unwrap_or(Ticket {
            tag: 0,
            origin: 0,
            table: NO_TABLE,
            sample: false,
        })
}

/// Counts an allocation of `bytes` that succeeded, under the ticket's tag.
#[inline(always)]
pub(crate) fn commit_alloc(ticket: &Ticket, bytes: usize) {
    with_slot_in(ticket.table, ticket.tag, |s, w| {
        w.add(&s.alloc_objects, 1);
        w.add(&s.alloc_bytes, bytes as u64);
    });
}

/// Counts a free of `bytes` of a block of `tag` allocated by the thread with origin `origin`.
///
/// A block freed by the thread that allocated it (the common case) costs nothing more for the
/// per-thread view: only frees across threads are recorded apart, by origin.
#[inline]
pub(crate) fn record_free(tag: u32, origin: u32, bytes: usize) {
    let (table, me) = STATE
        .try_with(|s| (table(s), s.origin.get()))
        .unwrap_or((NO_TABLE, 0));
    free_in(table, me, tag, origin, bytes);
}

/// [`record_free`] on behalf of a realloc, with the thread state its ticket already read.
#[inline]
pub(crate) fn record_free_for(ticket: &Ticket, tag: u32, origin: u32, bytes: usize) {
    free_in(ticket.table, ticket.origin, tag, origin, bytes);
}

#[inline(always)]
fn free_in(table: *const ThreadTable, me: u32, tag: u32, origin: u32, bytes: usize) {
    with_slot_in(table, tag, |s, w| {
        w.add(&s.free_objects, 1);
        w.add(&s.free_bytes, bytes as u64);
    });
    if origin != me {
        cross_free(table, origin, bytes);
    }
}

/// A free by this thread of `bytes` of another thread's block.
#[cold]
#[inline(never)]
fn cross_free(table: *const ThreadTable, origin: u32, bytes: usize) {
    with_origin_in(table, origin, |o, w| {
        w.add(&o.objects, 1);
        w.add(&o.bytes, bytes as u64);
    });
}

const _: () = assert!(MAX_ORIGINS.is_power_of_two());

/// A block of `tag` from `origin` was reallocated and keeps its tag (realloc in resize mode):
/// an allocation of the new size and a free of the old one, as heap profilers (and the heap
/// sampler) count a realloc; in-use changes by the difference.
///
/// The calling thread's table and origin come from the realloc's `ticket`.
#[inline]
pub(crate) fn record_resize(ticket: &Ticket, tag: u32, origin: u32, old: usize, new: usize) {
    let (table, me) = (ticket.table, ticket.origin);
    with_slot_in(table, tag, |s, w| {
        w.add(&s.alloc_objects, 1);
        w.add(&s.alloc_bytes, new as u64);
        w.add(&s.free_objects, 1);
        w.add(&s.free_bytes, old as u64);
    });
    // Per-thread view: a resize of another thread's block is a cross-thread change of its
    // size: growth counts against the cross frees (wrapping), a shrink as a cross free.
    if origin != me {
        let delta = (old as u64).wrapping_sub(new as u64);
        with_origin_in(table, origin, |o, w| w.add(&o.bytes, delta));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_prof_test_support::resident_pages;

    #[test]
    fn a_new_table_becomes_memory_only_where_it_is_written() {
        let t = new_table();
        assert!(!t.is_null() && t != NO_TABLE);
        let len = size_of::<ThreadTable>();
        // SAFETY: a table from `new_table`, never unmapped, owned by this test.
        let table = unsafe { &*t };
        // The distinct pages of what was written (wherever the compiler put the fields).
        let pages = |written: &[usize]| {
            let mut p: Vec<usize> = written.iter().map(|a| a / 4096).collect();
            p.sort_unstable();
            p.dedup();
            p.len()
        };
        let own = [
            std::ptr::from_ref(&table.index) as usize,
            std::ptr::from_ref(&table.next) as usize,
            std::ptr::from_ref(&table.owned) as usize,
        ];
        // 37 pages of address space; only the table's own fields were written.
        assert_eq!(resident_pages(t.cast(), len), pages(&own));
        Writer::Owner.add(&table.slots[5].alloc_bytes, 1);
        Writer::Owner.add(&table.slots[4000].alloc_bytes, 1);
        let slots = [
            std::ptr::from_ref(&table.slots[5].alloc_bytes) as usize,
            std::ptr::from_ref(&table.slots[4000].alloc_bytes) as usize,
        ];
        assert_eq!(
            resident_pages(t.cast(), len),
            pages(&[&own[..], &slots[..]].concat())
        );
        assert!(pages(&[&own[..], &slots[..]].concat()) >= 2);
        // Free for any thread to adopt (with these counts, as after a thread's exit).
        table.owned.store(false, Ordering::Release);
    }
}
