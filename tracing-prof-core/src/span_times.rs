//! Span time per span path, counted by the thread that measured it: what the layer adds on every
//! exit (an enter..exit interval: its own busy time, CPU time and the bucket of its length) and
//! on every close (a span's lifetime, the part of it not entered, the bucket of its lifetime in
//! the latency histogram, and whether an ERROR event was recorded in it).
//!
//! Each thread that enters or closes a span gets a [`Table`] of a slot per span path tag, kept
//! with its thread record (`tracing-prof-thread`, the record's attachment). Only that thread
//! writes it, with plain loads and stores (no locked instruction, no line that another thread
//! writes), and when the thread exits the table stays with the record for the next thread that
//! takes it, counts included: sums over every table stay exact. A thread with no table (none
//! could be had, or its record was given back during its TLS teardown) adds to one shared table,
//! [`shared`], with atomic adds: slower, equally exact. [`read`] sums them all.
//!
//! A table is [`MAX_TAGS`] slots of 128 bytes and as many latency rows of 768 bytes (91
//! histogram buckets and the error count): 3.5 MiB of address space, a mapping of its own, of
//! which only the pages of the paths a thread uses become memory (a path's slot and the one or
//! two lines of its row that its spans' durations reach). The allocator's counter tables hold
//! memory only.

use std::sync::atomic::{AtomicU64, Ordering};
use tracing_prof_alloc::__private::{LIFETIME_BUCKETS, lifetime_bucket};
use tracing_prof_alloc::{MAX_TAGS, Tag};
use tracing_prof_model::{DURATION_BUCKETS, TimeStats, duration_bucket};
use tracing_prof_thread::ThreadRecord;

/// The time counters of one span path in one table.
#[derive(Debug)]
#[repr(align(128))]
struct Slot {
    spans: AtomicU64,
    wall_ns: AtomicU64,
    busy_ns: AtomicU64,
    idle_ns: AtomicU64,
    cpu_ns: AtomicU64,
    cpu_user_ns: AtomicU64,
    cpu_sys_ns: AtomicU64,
    /// Enter..exit intervals by own length, bucketed as lifetimes are ([`lifetime_bucket`]).
    intervals: [AtomicU64; LIFETIME_BUCKETS],
}

const _: () = assert!(size_of::<Slot>() == 128);
const _: () = assert!(MAX_TAGS.is_power_of_two());

impl Slot {
    const fn new() -> Self {
        Slot {
            spans: AtomicU64::new(0),
            wall_ns: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            idle_ns: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            cpu_user_ns: AtomicU64::new(0),
            cpu_sys_ns: AtomicU64::new(0),
            intervals: [const { AtomicU64::new(0) }; LIFETIME_BUCKETS],
        }
    }
}

/// The latency histogram of one span path in one table, and its error count: written at
/// each close.
#[derive(Debug)]
#[repr(align(128))]
struct Latency {
    /// Closed spans by wall time, in the buckets of [`tracing_prof_model::DURATION_BOUNDS_NS`].
    durations: [AtomicU64; DURATION_BUCKETS],
    /// Closed spans that recorded an ERROR event.
    errors: AtomicU64,
}

const _: () = assert!(size_of::<Latency>() == 768);

impl Latency {
    const fn new() -> Self {
        Latency {
            durations: [const { AtomicU64::new(0) }; DURATION_BUCKETS],
            errors: AtomicU64::new(0),
        }
    }
}

/// One thread's span times, a slot and a latency row per tag.
#[derive(Debug)]
pub(crate) struct Table {
    slots: [Slot; MAX_TAGS],
    latency: [Latency; MAX_TAGS],
}

/// Where threads without a table of their own add, atomically (all zeros: in `.bss`).
static SHARED_TABLE: Table = Table {
    slots: [const { Slot::new() }; MAX_TAGS],
    latency: [const { Latency::new() }; MAX_TAGS],
};

/// The writer for threads without a table of their own.
pub(crate) fn shared() -> Writer {
    Writer {
        table: &SHARED_TABLE,
        shared: true,
    }
}

/// Adds to a table: with plain loads and stores into the calling thread's own table, with
/// atomic adds into the shared table ([`shared`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Writer {
    table: &'static Table,
    shared: bool,
}

impl Writer {
    /// The writer of `table`, which only the calling thread writes; [`shared`] for `None`.
    #[inline]
    pub(crate) fn own(table: Option<&'static Table>) -> Writer {
        match table {
            Some(table) => Writer {
                table,
                shared: false,
            },
            None => shared(),
        }
    }

    #[inline]
    fn slot(self, tag: Tag) -> &'static Slot {
        // Tags are below MAX_TAGS; the mask keeps any other value in bounds, without a panic.
        &self.table.slots[tag.get() as usize & (MAX_TAGS - 1)]
    }

    #[inline]
    fn add(self, c: &AtomicU64, v: u64) {
        if self.shared {
            c.fetch_add(v, Ordering::Relaxed);
        } else {
            // Single writer: a plain read-modify-write, no locked instruction.
            c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
        }
    }

    /// One enter..exit interval of `tag`: its own busy time (the caller leaves out nested
    /// child spans) and CPU time.
    #[inline]
    pub(crate) fn interval(self, tag: Tag, busy_ns: u64, cpu_ns: u64, user_ns: u64, sys_ns: u64) {
        let s = self.slot(tag);
        self.add(&s.busy_ns, busy_ns);
        self.add(&s.cpu_ns, cpu_ns);
        self.add(&s.cpu_user_ns, user_ns);
        self.add(&s.cpu_sys_ns, sys_ns);
        self.add(&s.intervals[lifetime_bucket(busy_ns)], 1);
    }

    /// One closed span of `tag`: its lifetime (`wall_ns`), the part of it not entered, and
    /// whether an ERROR event was recorded in it.
    #[inline]
    pub(crate) fn closed(self, tag: Tag, wall_ns: u64, idle_ns: u64, errored: bool) {
        let s = self.slot(tag);
        self.add(&s.spans, 1);
        self.add(&s.wall_ns, wall_ns);
        self.add(&s.idle_ns, idle_ns);
        let l = &self.table.latency[tag.get() as usize & (MAX_TAGS - 1)];
        // duration_bucket is below DURATION_BUCKETS; `get` keeps it so without a panic.
        if let Some(c) = l.durations.get(duration_bucket(wall_ns)) {
            self.add(c, 1);
        }
        if errored {
            self.add(&l.errors, 1);
        }
    }
}

/// The table kept with `record` (the calling thread's): the one a thread before left there, or
/// a new one; `None` when the kernel refuses a mapping.
pub(crate) fn table_of(record: &'static ThreadRecord) -> Option<&'static Table> {
    let kept = record.attachment();
    if !kept.is_null() {
        // SAFETY: what records keep is only ever a `Table` from `new_table`, never unmapped (the
        // contract of `set_attachment`, which only this module calls).
        return Some(unsafe { &*kept.cast::<Table>() });
    }
    let table = new_table()?;
    let p = std::ptr::from_ref(table).cast_mut().cast::<()>();
    // SAFETY: `p` is a `Table` that lives for the rest of the process (never freed), and this
    // module is the only caller: every attachment is such a table.
    match unsafe { record.set_attachment(p) } {
        Ok(()) => Some(table),
        // Only the record's owner (this thread) keeps a table there, so this does not happen;
        // should it, the one kept wins and the new one is left unused (never freed, as tables
        // are not).
        // SAFETY: as for `kept` above.
        Err(other) => Some(unsafe { &*other.cast::<Table>() }),
    }
}

/// A zeroed table of its own anonymous mapping, never unmapped; `None` when the kernel refuses.
/// A fresh mapping's pages become memory only when a span path's slot is first written, where
/// `calloc` may clear reused memory whole (and std's `alloc_zeroed` always does for the
/// table's 128-byte alignment).
fn new_table() -> Option<&'static Table> {
    let p = tracing_prof_alloc::__private::map_zeroed(size_of::<Table>());
    // SAFETY: a non-null `p` is a fresh mapping of the table's size, page-aligned (more than
    // its alignment) and zero-filled, and an all-zero Table is valid (counters at 0); it is
    // never unmapped, so the reference is valid for the process's life.
    (!p.is_null()).then(|| unsafe { &*p.cast::<Table>() })
}

/// Adds every table's counters into `out`, by tag (`out[tag]`); tags past `out` are left out.
pub(crate) fn read(out: &mut [TimeStats]) {
    let mut add = |table: &Table| {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for (t, l) in out.iter_mut().zip(&table.latency) {
            for (a, b) in t.durations.iter_mut().zip(&l.durations) {
                *a += load(b);
            }
            t.errors += load(&l.errors);
        }
        for (t, s) in out.iter_mut().zip(&table.slots) {
            t.spans += load(&s.spans);
            t.wall_ns += load(&s.wall_ns);
            t.busy_ns += load(&s.busy_ns);
            t.idle_ns += load(&s.idle_ns);
            t.cpu_ns += load(&s.cpu_ns);
            t.cpu_user_ns += load(&s.cpu_user_ns);
            t.cpu_sys_ns += load(&s.cpu_sys_ns);
            for (a, b) in t.intervals.iter_mut().zip(&s.intervals) {
                *a += load(b);
            }
        }
    };
    add(&SHARED_TABLE);
    tracing_prof_thread::for_each_ever(|r| {
        let kept = r.attachment();
        if !kept.is_null() {
            // SAFETY: as in `table_of`.
            add(unsafe { &*kept.cast::<Table>() });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_table_becomes_memory_only_where_it_is_written() {
        let t = new_table().unwrap();
        let start = std::ptr::from_ref(t).cast::<u8>();
        assert_eq!(start as usize % align_of::<Table>(), 0);
        let before = tracing_prof_test_support::resident_pages(start, size_of::<Table>());
        // 896 pages of address space, none written yet.
        assert_eq!(before, 0, "pages resident before any write");
        Writer::own(Some(t)).closed(Tag::new(2000), 1, 1, false);
        Writer::own(Some(t)).closed(Tag::new(3000), 1, 1, true);
        let after = tracing_prof_test_support::resident_pages(start, size_of::<Table>());
        // Two slots 1000 tags (128 000 bytes) apart, and two latency rows 768 000 bytes apart:
        // four pages.
        assert_eq!(after, 4, "pages resident after two closes");
    }

    #[test]
    fn a_thread_adds_to_its_own_table_and_it_outlives_the_thread() {
        let tag = Tag::new(4000);
        let before = {
            let mut v = vec![TimeStats::default(); MAX_TAGS];
            read(&mut v);
            v[4000]
        };
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    let record = tracing_prof_thread::current().unwrap();
                    let w = Writer::own(table_of(record));
                    assert!(!w.shared);
                    for _ in 0..1000 {
                        w.interval(tag, 2_000, 3, 2, 1);
                    }
                    w.closed(tag, 10, 4, false);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        shared().interval(tag, 5, 0, 0, 0);
        shared().closed(tag, 7, 7, true);
        let mut v = vec![TimeStats::default(); MAX_TAGS];
        read(&mut v);
        let (a, b) = (&v[4000], &before);
        assert_eq!(a.busy_ns - b.busy_ns, 4 * 1000 * 2_000 + 5);
        assert_eq!(a.cpu_ns - b.cpu_ns, 4 * 1000 * 3);
        assert_eq!(a.cpu_user_ns - b.cpu_user_ns, 4 * 1000 * 2);
        assert_eq!(a.cpu_sys_ns - b.cpu_sys_ns, 4 * 1000);
        assert_eq!(a.spans - b.spans, 5);
        assert_eq!(a.wall_ns - b.wall_ns, 4 * 10 + 7);
        assert_eq!(a.idle_ns - b.idle_ns, 4 * 4 + 7);
        // 2 µs intervals fall in the bucket below 10 µs; the 5 ns one in the first.
        let d: Vec<u64> = a
            .intervals
            .iter()
            .zip(&b.intervals)
            .map(|(x, y)| x - y)
            .collect();
        assert_eq!(d[lifetime_bucket(2_000)], 4000);
        assert_eq!(d[0], 1);
        assert_eq!(d.iter().sum::<u64>(), 4001);
        // Five closes of 10 ns and 7 ns: the first duration bucket; one with an error.
        assert_eq!(a.durations[0] - b.durations[0], 5);
        assert_eq!(a.errors - b.errors, 1);
    }
}
