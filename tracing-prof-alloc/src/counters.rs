//! Exact per-tag counters that scale across threads.
//!
//! Each thread owns a [`ThreadTable`]: one [`Slot`] of counters per tag. Only the owning thread
//! writes its table, with a plain load and store (no atomic read-modify-write, no lock), so no
//! cache line is written by more than one thread. A free is counted in the *freeing* thread's
//! table under the tag found in the block's header; in-use = allocated - freed, summed over all
//! tables. Readers sum all tables.
//!
//! Tables are allocated from the system allocator the first time a thread touches the
//! allocator or a span, kept in a global append-only list and never freed: when a thread exits
//! its table is marked free and the next new thread adopts it, counts included (sums over all
//! tables are unchanged by that). Work that cannot have a table — a call re-entered while the
//! table is being set up, a call during TLS teardown after the table was released, or a system
//! allocator that refused the table — is counted in one shared [`FALLBACK`] table with atomic
//! adds: slower, equally exact.
//!
//! Ordering: owners store with `Release`; [`read_totals`] loads every table's *free* counters
//! before any *alloc* counter, with `Acquire`. A free that a reader sees happened after its
//! allocation, so that allocation is seen too and in-use never reads negative.

use crate::MAX_TAGS;
use crate::tag::STATE;
use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

/// The counters of one tag in one table.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    alloc_objects: AtomicU64,
    alloc_bytes: AtomicU64,
    free_objects: AtomicU64,
    free_bytes: AtomicU64,
    spans: AtomicU64,
    wall_ns: AtomicU64,
    busy_ns: AtomicU64,
    idle_ns: AtomicU64,
    cpu_ns: AtomicU64,
    cpu_user_ns: AtomicU64,
    cpu_sys_ns: AtomicU64,
}

impl Slot {
    const fn new() -> Self {
        Slot {
            alloc_objects: AtomicU64::new(0),
            alloc_bytes: AtomicU64::new(0),
            free_objects: AtomicU64::new(0),
            free_bytes: AtomicU64::new(0),
            spans: AtomicU64::new(0),
            wall_ns: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            idle_ns: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            cpu_user_ns: AtomicU64::new(0),
            cpu_sys_ns: AtomicU64::new(0),
        }
    }
}

/// One thread's counters.
#[derive(Debug)]
pub(crate) struct ThreadTable {
    slots: [Slot; MAX_TAGS],
    /// Next table in [`TABLES`]; written once before the table is published.
    next: *const ThreadTable,
    /// Whether a live thread owns this table.
    owned: AtomicBool,
}

/// Head of the append-only list of every table ever made.
static TABLES: AtomicPtr<ThreadTable> = AtomicPtr::new(ptr::null_mut());

/// Shared table for work that has no thread table; updated with atomic adds.
static FALLBACK: [Slot; MAX_TAGS] = [const { Slot::new() }; MAX_TAGS];

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

/// Runs `f` on this thread's slot for `tag` (or on the shared fallback slot).
#[inline(always)]
fn with_slot(tag: u32, f: impl FnOnce(&Slot, Writer)) {
    let table = STATE.try_with(table).unwrap_or(NO_TABLE);
    with_slot_in(table, tag, f);
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
    let table = adopt_free_table().unwrap_or_else(new_table);
    state.table.set(table);
    if table != NO_TABLE {
        // Registers the destructor that hands the table back when this thread exits. If TLS is
        // already being torn down this fails, and the table simply stays owned.
        let _ = RELEASE_ON_EXIT.try_with(|_| ());
    }
    state.busy.set(false);
    table
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

fn new_table() -> *const ThreadTable {
    let layout = Layout::new::<ThreadTable>();
    // SAFETY: the layout has a non-zero size. An all-zero ThreadTable is valid: atomics at 0,
    // `owned` false, `next` null.
    let raw = unsafe { System.alloc_zeroed(layout) }.cast::<ThreadTable>();
    if raw.is_null() {
        return NO_TABLE;
    }
    // SAFETY: `raw` is a fresh, zeroed, properly aligned ThreadTable that nobody else sees yet.
    let table = unsafe { &mut *raw };
    *table.owned.get_mut() = true;
    let mut head = TABLES.load(Ordering::Relaxed);
    loop {
        table.next = head;
        match TABLES.compare_exchange_weak(head, raw, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return raw,
            Err(actual) => head = actual,
        }
    }
}

/// Hands this thread's table back when the thread exits.
struct ReleaseOnExit;

impl Drop for ReleaseOnExit {
    fn drop(&mut self) {
        let _ = STATE.try_with(|s| {
            let table = s.table.replace(NO_TABLE);
            if !table.is_null() && table != NO_TABLE {
                // SAFETY: a real table pointer from `acquire`; tables are never freed.
                unsafe { &*table }.owned.store(false, Ordering::Release);
            }
        });
    }
}

thread_local! {
    static RELEASE_ON_EXIT: ReleaseOnExit = const { ReleaseOnExit };
}

// === the hot-path API ===

/// Counts an allocation of `bytes` under the tag current on this thread, and returns that tag
/// for the block's header: one thread-local access for both.
#[inline]
pub(crate) fn record_alloc_current(bytes: usize) -> u32 {
    let (tag, table) = STATE
        .try_with(|s| (s.tag.get(), table(s)))
        .unwrap_or((0, NO_TABLE));
    with_slot_in(table, tag, |s, w| {
        w.add(&s.alloc_objects, 1);
        w.add(&s.alloc_bytes, bytes as u64);
    });
    tag
}

#[inline]
pub(crate) fn record_free(tag: u32, bytes: usize) {
    with_slot(tag, |s, w| {
        w.add(&s.free_objects, 1);
        w.add(&s.free_bytes, bytes as u64);
    });
}

/// A block of `tag` changed size in place (realloc in resize mode): the object count is kept.
#[inline]
pub(crate) fn record_resize(tag: u32, old: usize, new: usize) {
    with_slot(tag, |s, w| {
        if new >= old {
            w.add(&s.alloc_bytes, (new - old) as u64);
        } else {
            w.add(&s.free_bytes, (old - new) as u64);
        }
    });
}

/// Adds one enter..exit interval of a span of `tag`: busy wall time, CPU time, and the part of
/// the CPU time known to be user and system time (both 0 when the CPU clock does not split).
///
/// Called by the span layer on exit; no allocation, lock or syscall.
#[inline]
pub fn record_interval(
    tag: crate::Tag,
    busy_ns: u64,
    cpu_ns: u64,
    cpu_user_ns: u64,
    cpu_sys_ns: u64,
) {
    with_slot(tag.get(), |s, w| {
        w.add(&s.busy_ns, busy_ns);
        w.add(&s.cpu_ns, cpu_ns);
        w.add(&s.cpu_user_ns, cpu_user_ns);
        w.add(&s.cpu_sys_ns, cpu_sys_ns);
    });
}

/// Adds one closed span of `tag`: its lifetime (`wall`) and the part of it not entered (`idle`).
#[inline]
pub fn record_span_closed(tag: crate::Tag, wall_ns: u64, idle_ns: u64) {
    with_slot(tag.get(), |s, w| {
        w.add(&s.spans, 1);
        w.add(&s.wall_ns, wall_ns);
        w.add(&s.idle_ns, idle_ns);
    });
}

// === reading ===

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
    /// Spans closed.
    pub spans: u64,
    /// Sum of closed spans' lifetimes (creation to close), nanoseconds.
    pub wall_ns: u64,
    /// Sum of enter..exit intervals, nanoseconds.
    pub busy_ns: u64,
    /// Sum of closed spans' time alive but not entered, nanoseconds.
    pub idle_ns: u64,
    /// CPU time over enter..exit intervals, nanoseconds.
    pub cpu_ns: u64,
    /// User CPU time over enter..exit intervals, nanoseconds.
    pub cpu_user_ns: u64,
    /// System CPU time over enter..exit intervals, nanoseconds.
    pub cpu_sys_ns: u64,
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
            t.spans += load(&s.spans);
            t.wall_ns += load(&s.wall_ns);
            t.busy_ns += load(&s.busy_ns);
            t.idle_ns += load(&s.idle_ns);
            t.cpu_ns += load(&s.cpu_ns);
            t.cpu_user_ns += load(&s.cpu_user_ns);
            t.cpu_sys_ns += load(&s.cpu_sys_ns);
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

/// Number of thread tables made so far (live threads plus free tables for reuse).
pub fn thread_tables() -> usize {
    let mut n = 0;
    for_each_table(|_| n += 1);
    n - 1
}
