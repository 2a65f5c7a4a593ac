//! Every open span's state, keyed by span id, in one table that every thread reads without a
//! lock: what span enter, exit and close need, without a registry lookup.
//!
//! Each span takes one entry (a cache line, 64 bytes; two with the `opentelemetry` feature, which
//! keeps the span's trace link there too) when it is created: the first free of two places given by
//! its id (see [`places`]). Its path, its parent's path, its creation time and the thread that
//! created it are written once, before the id is published; its busy time accrues there on every
//! exit; the heap sampler opens its span instance there at its first sampled allocation; the
//! entry is freed when it closes. Busy time is two counters: one that only
//! the creating thread writes (plain stores, the common case: a locked add would cost an exit about
//! 5 ns, the latency of the instruction on this project's machine), and one that every other thread
//! adds to atomically. Span ids are reused by the registry as spans close, so the entries of a
//! running service's spans are the same few cache lines over and over. Ids are only unique within
//! one registry: each layer has an owner token, part of the key. When both places are taken (an
//! unlucky pair, or no table), the layer keeps that span's state in the registry's extensions
//! instead, at the cost of a lookup per enter.
//!
//! # Memory
//! The table is one anonymous mapping made when the first layer is built: 4 Mi entries
//! (256 MiB of address space, reserved with `MAP_NORESERVE`), of which only the pages that
//! spans land on become memory: 64 bytes per open span, in 4 KiB pages of 64 entries. Each page
//! has a flag byte, set when a span first lands there; [`trim`] (each capture) hands the flagged
//! pages without an open span back to the kernel (`MADV_DONTNEED`), so the memory of a million
//! open spans returns once they close. The mapping asks for no transparent huge pages, which
//! would make one open span cost 2 MiB. Should the reservation be refused
//! (`vm.overcommit_memory = 2` with little commit left, an address-space limit), every span's
//! state goes to the registry's extensions, as before this table: slower enters, and memory the
//! registry keeps.
//!
//! Creating a span costs one more load (its page's flag) and closing one nothing more. A page is
//! given back only after it is marked and then seen with no taken entry; a span created there
//! meanwhile sees the mark and takes its other place (see [`insert`] and [`trim`]).

use crate::trace_link::{Link, LinkCell};
use std::cell::Cell;
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use tracing_prof_alloc::Tag;

/// Entries of the table: 4 Mi, one region of [`REGION`] for each of 4096 registry shards. A
/// constant: a size read at run time cost span creation 4 ns more (`span/lifecycle` bench).
const BITS: u32 = 22;
/// Bytes of a page of memory, the unit the table is given back in.
const PAGE_BYTES: usize = 4096;
/// Entries per page of memory.
const PAGE_ENTRIES: usize = PAGE_BYTES / size_of::<Entry>();
/// A page's flag: set while [`trim`] looks at the page and gives it back.
const RECLAIMING: u8 = 1 << 1;
/// A page's flag: set once an entry of the page was taken since it was last given back.
const TOUCHED: u8 = 1 << 0;

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
    /// Its span-instance word for the allocator (see `set_current_span`), where the sampled
    /// memory it holds accrues: for a span in this table, read by [`find`], its entry's
    /// instance cell (`insert` leaves it empty; the heap sampler opens the instance there at
    /// the span's first sampled allocation); for one kept in its extensions, the instance
    /// opened when it was created (0: none).
    pub(crate) instance: u64,
    /// Its trace span (see `trace_link`; nothing without the `opentelemetry` feature).
    pub(crate) link: Link,
}

#[repr(C, align(64))]
struct Entry {
    /// The span id; 0: free; [`WRITING`]: being filled.
    key: AtomicU64,
    owner: AtomicU32,
    tag: AtomicU32,
    parent: AtomicU32,
    /// Non-zero once an ERROR event was recorded in the span (in what was padding).
    errored: AtomicU32,
    created_ns: AtomicU64,
    /// Busy time added by the thread that created the span, its only writer.
    busy_home_ns: AtomicU64,
    /// Busy time added by every other thread (atomic adds).
    busy_away_ns: AtomicU64,
    instance: AtomicU64,
    /// The creating thread's token (see [`thread_token`]); 0: none, never a thread's.
    home: AtomicU64,
    /// With the `opentelemetry` feature, 24 bytes more: the entry takes two cache lines.
    link: LinkCell,
}

// One cache line a span (the README's memory figure), two with trace links.
const _: () = assert!(
    size_of::<Entry>()
        == if cfg!(feature = "opentelemetry") {
            128
        } else {
            64
        }
);

/// The table: `1 << BITS` entries, then one flag byte per page of entries. Null until made.
static ENTRIES: AtomicPtr<Entry> = AtomicPtr::new(std::ptr::null_mut());
/// Pages of the table that hold memory (touched and not given back since), for [`Stats`].
///
/// [`Stats`]: crate::Stats
static RESIDENT_PAGES: AtomicUsize = AtomicUsize::new(0);

static NEXT_OWNER: AtomicU32 = AtomicU32::new(1);

/// The next thread token (see [`thread_token`]): never 0, never given twice.
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's token; 0 until it first needs one. No destructor: readable to the end.
    static TOKEN: Cell<u64> = const { Cell::new(0) };
}

/// The calling thread's token, unique in the process for the thread's whole life (64 bits: no
/// wrap), given on first use: it says which of a span's busy counters the thread writes, the
/// creating thread's own (plain stores) or the shared one.
#[inline]
pub(crate) fn thread_token() -> u64 {
    TOKEN
        .try_with(|t| match t.get() {
            0 => {
                let token = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
                t.set(token);
                token
            }
            token => token,
        })
        .unwrap_or(0)
}

/// A fresh owner token for a layer; makes the table on first use.
pub(crate) fn new_owner() -> u32 {
    make_table();
    NEXT_OWNER.fetch_add(1, Ordering::Relaxed)
}

/// Bytes of the whole mapping: the entries, then a flag per page.
const MAPPING_LEN: usize = (1 << BITS) * size_of::<Entry>() + (1 << BITS) / PAGE_ENTRIES;

/// Maps the table once (at most one mapping is ever kept; a racing loser unmaps its own).
fn make_table() {
    if !ENTRIES.load(Ordering::Acquire).is_null() {
        return;
    }
    // SAFETY: a fresh private anonymous mapping; nothing else refers to it yet. Zeroed memory
    // is a valid table: every key 0 (free), every flag 0.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            MAPPING_LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        eprintln!(
            "tracing-prof: the span table's {} MiB of address space was refused ({}); span \
             state goes to the registry's extensions instead (slower span enters)",
            MAPPING_LEN >> 20,
            std::io::Error::last_os_error()
        );
        return;
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    // SAFETY: advice on our own mapping; failure (a kernel without THP) changes nothing.
    unsafe {
        libc::madvise(ptr, MAPPING_LEN, libc::MADV_NOHUGEPAGE)
    };
    if ENTRIES
        .compare_exchange(
            std::ptr::null_mut(),
            ptr.cast(),
            Ordering::Release,
            Ordering::Acquire,
        )
        .is_err()
    {
        // SAFETY: our own mapping, never published.
        unsafe { libc::munmap(ptr, MAPPING_LEN) };
    }
}

/// The table, if made: its entries and its pages' flags.
#[inline]
fn table() -> Option<(&'static [Entry], &'static [AtomicU8])> {
    let ptr = ENTRIES.load(Ordering::Acquire);
    if ptr.is_null() {
        return None;
    }
    let entries = 1usize << BITS;
    // SAFETY: `ptr` is the published mapping of `MAPPING_LEN` bytes, never unmapped,
    // zero-initialised by the kernel (a valid `Entry` and `AtomicU8` are all-zero bytes), and
    // only ever accessed through atomics. The flags follow the entries.
    unsafe {
        let flags = ptr.add(entries).cast::<AtomicU8>();
        Some((
            std::slice::from_raw_parts(ptr, entries),
            std::slice::from_raw_parts(flags, entries / PAGE_ENTRIES),
        ))
    }
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

/// The two places of span `id`. The first keeps the registry's locality: each thread's spans in
/// a region of their own, in the order of the registry's own slots, so the spans one thread has
/// open are neighbouring entries that it alone writes (and its first 1024 open spans touch at
/// most 17 pages); the second is a plain hash.
#[inline]
fn places(id: u64) -> [usize; 2] {
    let mask = (1usize << BITS) - 1;
    let key = id.wrapping_sub(1);
    let addr = key & ((1 << ADDR_BITS) - 1);
    let shard = (key >> ADDR_BITS) & ((1 << TID_BITS) - 1);
    let a = (shard as usize)
        .wrapping_mul(REGION)
        .wrapping_add(addr as usize)
        & mask;
    let b = (id ^ (id >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9) >> (64 - BITS);
    [a, b as usize & mask]
}

/// Adds span `id` of `owner`; `None` when both of its places are taken (or there is no table).
///
/// After taking an entry it reads the page's flag: a page that [`trim`] marked may be given
/// back at any moment, so the entry is let go and the other place tried. (Sequentially
/// consistent on both sides: either `trim` sees this entry taken and keeps the page, or this
/// sees the mark.)
///
/// The calling thread is the span's home (see [`thread_token`]).
pub(crate) fn insert(owner: u32, id: u64, state: SpanState) -> Option<Slot> {
    insert_at_home(owner, id, state, thread_token())
}

/// [`insert`], with `home` the creating thread's token (0: none).
fn insert_at_home(owner: u32, id: u64, state: SpanState, home: u64) -> Option<Slot> {
    let (entries, flags) = table()?;
    for i in places(id) {
        let (e, flag) = (&entries[i], &flags[i / PAGE_ENTRIES]);
        if e.key.load(Ordering::Relaxed) != 0
            || e.key
                .compare_exchange(0, WRITING, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
        {
            continue;
        }
        let f = flag.load(Ordering::SeqCst);
        if f & RECLAIMING != 0 {
            e.key.store(0, Ordering::Release);
            continue;
        }
        if f & TOUCHED == 0 && flag.fetch_or(TOUCHED, Ordering::Relaxed) & TOUCHED == 0 {
            RESIDENT_PAGES.fetch_add(1, Ordering::Relaxed);
        }
        e.owner.store(owner, Ordering::Relaxed);
        e.tag.store(state.tag.get(), Ordering::Relaxed);
        e.parent.store(state.parent.get(), Ordering::Relaxed);
        e.created_ns.store(state.created_ns, Ordering::Relaxed);
        e.busy_home_ns.store(0, Ordering::Relaxed);
        e.busy_away_ns.store(0, Ordering::Relaxed);
        e.errored.store(0, Ordering::Relaxed);
        // Empty: the heap sampler opens the span's instance here at its first sampled
        // allocation (see `SpanState::instance`).
        tracing_prof_alloc::__private::reset_instance_cell(&e.instance);
        e.home.store(home, Ordering::Relaxed);
        e.link.store(state.link);
        e.key.store(id, Ordering::Release);
        return Some(Slot(i as u32));
    }
    None
}

/// The entry of span `id` of `owner`, if it is in the table.
#[inline]
pub(crate) fn find(owner: u32, id: u64) -> Option<(Slot, SpanState)> {
    let (entries, _) = table()?;
    for i in places(id) {
        let e = &entries[i];
        if e.key.load(Ordering::Acquire) == id && e.owner.load(Ordering::Relaxed) == owner {
            let state = SpanState {
                tag: Tag::new(e.tag.load(Ordering::Relaxed)),
                parent: Tag::new(e.parent.load(Ordering::Relaxed)),
                created_ns: e.created_ns.load(Ordering::Relaxed),
                instance: tracing_prof_alloc::__private::lazy_instance_word(&e.instance),
                link: e.link.load(),
            };
            return Some((Slot(i as u32), state));
        }
    }
    None
}

/// Adds busy time to span `id`'s entry at `slot`, from the calling thread.
#[inline]
pub(crate) fn add_busy(slot: Slot, id: u64, ns: u64) {
    add_busy_from(slot, id, ns, thread_token());
}

/// [`add_busy`], from the thread of token `thread` (0 for none: then always the shared counter).
#[inline]
fn add_busy_from(slot: Slot, id: u64, ns: u64, thread: u64) {
    let Some(e) = table().and_then(|(entries, _)| entries.get(slot.0 as usize)) else {
        return;
    };
    // The span cannot close while it is entered, so the entry is still its own. The check
    // keeps most misuses of the raw subscriber API (an exit after the close) from charging
    // another span; one that races with the entry's reuse by another thread's new span may
    // still write this span's total into that span's own counter.
    if e.key.load(Ordering::Acquire) == id {
        if thread != 0 && e.home.load(Ordering::Relaxed) == thread {
            // Only this thread writes this counter: tokens are never shared or reused, and
            // `home` was written before the key was published.
            let home = &e.busy_home_ns;
            home.store(
                home.load(Ordering::Relaxed).wrapping_add(ns),
                Ordering::Relaxed,
            );
        } else {
            e.busy_away_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }
}

/// Sets the trace link of span `id`'s entry at `slot`, once its first enter looked it up.
#[cfg(feature = "opentelemetry")]
pub(crate) fn set_link(slot: Slot, id: u64, link: Link) {
    let Some(e) = table().and_then(|(entries, _)| entries.get(slot.0 as usize)) else {
        return;
    };
    if e.key.load(Ordering::Relaxed) == id {
        e.link.store(link);
    }
}

/// Marks span `id` of `owner` as having recorded an ERROR event; `false` when it is not in
/// the table. Called on ERROR events only.
pub(crate) fn mark_errored(owner: u32, id: u64) -> bool {
    match find(owner, id) {
        Some((slot, _)) => {
            if let Some(e) = table().and_then(|(entries, _)| entries.get(slot.0 as usize))
                && e.key.load(Ordering::Acquire) == id
            {
                e.errored.store(1, Ordering::Relaxed);
            }
            true
        }
        None => false,
    }
}

/// An entry's busy time, both counters.
fn busy_of(e: &Entry) -> u64 {
    e.busy_home_ns
        .load(Ordering::Relaxed)
        .wrapping_add(e.busy_away_ns.load(Ordering::Relaxed))
}

/// Frees span `id`'s entry at `slot`; returns its busy time and whether an ERROR event was
/// recorded in it.
pub(crate) fn remove(slot: Slot, id: u64) -> (u64, bool) {
    let Some(e) = table().and_then(|(entries, _)| entries.get(slot.0 as usize)) else {
        return (0, false);
    };
    if e.key.load(Ordering::Acquire) != id {
        return (0, false);
    }
    let busy = busy_of(e);
    let errored = e.errored.load(Ordering::Relaxed) != 0;
    e.key.store(0, Ordering::Release);
    (busy, errored)
}

/// Gives the pages that hold no open span back to the kernel: for each page a span has
/// touched since it was last given back, marks it, reads its 64 keys, and if all are free gives
/// it back (`MADV_DONTNEED`: it reads as zeros, free entries, from then on) and clears its flag;
/// otherwise just takes the mark off. Runs of free pages go in one `madvise` call. Called by
/// [`capture`](crate::capture), never on an application's span path.
///
/// Returns whether it ran: one trim at a time (captures run on the aggregator and on HTTP
/// threads at once: two could both mark a page, and the second give it back after the first
/// unmarked it and a span moved in), and a trim already running does the work.
pub(crate) fn trim() -> bool {
    if TRIMMING.swap(true, Ordering::Acquire) {
        return false;
    }
    trim_pages();
    TRIMMING.store(false, Ordering::Release);
    true
}

/// Set while a [`trim`] runs.
static TRIMMING: AtomicBool = AtomicBool::new(false);

/// In a child of `fork`, whose parent may have been trimming: no trim runs here now, so the
/// marks it left are taken off (a marked page would stay closed to new spans).
pub(crate) fn after_fork_in_child() {
    if let Some((_, flags)) = table() {
        for f in flags {
            f.fetch_and(!RECLAIMING, Ordering::Relaxed);
        }
    }
    TRIMMING.store(false, Ordering::Relaxed);
}

fn trim_pages() {
    let Some((entries, flags)) = table() else {
        return;
    };
    let base = entries.as_ptr().cast::<u8>().cast_mut();
    let per_system_page = system_page_bytes() / PAGE_BYTES;
    // Pages `first..end` are each marked RECLAIMING and were seen with every key free after the
    // mark: no span holds an entry there, and a span created there from now on lets its entry
    // go on seeing the mark (see `insert`). Zeroed entries are free entries, and other threads
    // reading them meanwhile read 0 either way. Only whole system pages go back: on a kernel
    // with 64 KiB pages, `madvise` would round a 4 KiB range up and zero entries beyond it.
    let give_back = |first: usize, end: usize| {
        let (a, b) = whole_system_pages(first, end, per_system_page);
        if a < b {
            // SAFETY: a range of our own anonymous mapping aligned to the system's pages (the
            // mapping is aligned to them; `a` and `b` are multiples of them, in pages of
            // PAGE_ENTRIES whole entries) whose contents nobody needs (above).
            unsafe {
                libc::madvise(
                    base.add(a * PAGE_BYTES).cast(),
                    (b - a) * PAGE_BYTES,
                    libc::MADV_DONTNEED,
                )
            };
            for f in &flags[a..b] {
                f.fetch_and(!(RECLAIMING | TOUCHED), Ordering::SeqCst);
            }
            RESIDENT_PAGES.fetch_sub(b - a, Ordering::Relaxed);
        }
        // The rest of the run stays: its marks come off, its pages stay touched.
        for (p, f) in flags.iter().enumerate().take(end).skip(first) {
            if !(a..b).contains(&p) {
                f.fetch_and(!RECLAIMING, Ordering::SeqCst);
            }
        }
    };
    let mut run: Option<usize> = None;
    for (p, flag) in flags.iter().enumerate() {
        let free = flag.load(Ordering::Relaxed) & TOUCHED != 0 && {
            flag.fetch_or(RECLAIMING, Ordering::SeqCst);
            let page = &entries[p * PAGE_ENTRIES..(p + 1) * PAGE_ENTRIES];
            let free = page.iter().all(|e| e.key.load(Ordering::SeqCst) == 0);
            if !free {
                flag.fetch_and(!RECLAIMING, Ordering::SeqCst);
            }
            free
        };
        run = match (run, free) {
            (None, true) => Some(p),
            (Some(first), false) => {
                give_back(first, p);
                None
            }
            (run, _) => run,
        };
    }
    if let Some(first) = run {
        give_back(first, flags.len());
    }
}

/// The system's page size in bytes (4 KiB on most x86 and arm64 kernels, 16 or 64 KiB on
/// some arm64 ones), a multiple of [`PAGE_BYTES`]; [`PAGE_BYTES`] if it cannot be read.
fn system_page_bytes() -> usize {
    static CACHED: AtomicUsize = AtomicUsize::new(0);
    let cached = CACHED.load(Ordering::Relaxed);
    if cached != 0 {
        return cached;
    }
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n >= PAGE_BYTES && n % PAGE_BYTES == 0)
        .unwrap_or(PAGE_BYTES);
    CACHED.store(n, Ordering::Relaxed);
    n
}

/// The pages of `first..end` (in [`PAGE_BYTES`] pages) that make whole system pages of
/// `per_system_page` of ours: `a..b`, empty (`a >= b`) when there is none.
fn whole_system_pages(first: usize, end: usize, per_system_page: usize) -> (usize, usize) {
    let n = per_system_page.max(1);
    (first.div_ceil(n) * n, end / n * n)
}

/// Calls `f(tag, created_ns, busy_ns)` for every span open in the table now. Reads only the
/// pages spans have touched since they were last given back, without a lock and without
/// marking anything: a span opening or closing meanwhile may or may not be seen.
pub(crate) fn for_each_open(mut f: impl FnMut(Tag, u64, u64)) {
    let Some((entries, flags)) = table() else {
        return;
    };
    for (p, flag) in flags.iter().enumerate() {
        if flag.load(Ordering::Relaxed) & TOUCHED == 0 {
            continue;
        }
        for e in &entries[p * PAGE_ENTRIES..(p + 1) * PAGE_ENTRIES] {
            let key = e.key.load(Ordering::Acquire);
            if key == 0 || key == WRITING {
                continue;
            }
            let tag = Tag::new(e.tag.load(Ordering::Relaxed));
            let created_ns = e.created_ns.load(Ordering::Relaxed);
            let busy_ns = busy_of(e);
            // Closed (and perhaps taken again) while read: skip rather than mix two spans.
            if e.key.load(Ordering::Acquire) == key {
                f(tag, created_ns, busy_ns);
            }
        }
    }
}

/// Spans created with no room in the table (both places taken, or no table), kept in the
/// registry's extensions instead.
static OUTSIDE: AtomicU64 = AtomicU64::new(0);

/// Counts one span kept outside the table.
pub(crate) fn count_outside() {
    OUTSIDE.fetch_add(1, Ordering::Relaxed);
}

/// Spans created so far that found no room in the table.
pub(crate) fn spans_outside() -> u64 {
    OUTSIDE.load(Ordering::Relaxed)
}

/// Bytes of the table that hold memory now: pages touched by open spans, or by closed ones and
/// not yet given back by [`trim`].
pub(crate) fn resident_bytes() -> usize {
    RESIDENT_PAGES.load(Ordering::Relaxed) * PAGE_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_system_pages_are_given_back() {
        // 4 KiB system pages: every run as it is.
        assert_eq!(whole_system_pages(3, 7, 1), (3, 7));
        // 64 KiB system pages (16 of ours): the aligned middle of a run, or nothing.
        assert_eq!(whole_system_pages(3, 40, 16), (16, 32));
        assert_eq!(whole_system_pages(16, 32, 16), (16, 32));
        let (a, b) = whole_system_pages(3, 20, 16);
        assert!(a >= b, "no whole 64 KiB page in 3..20");
        assert_eq!(system_page_bytes() % PAGE_BYTES, 0);
    }

    /// The tests place entries in chosen places, and `trim` marks pages: one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `state` as `find` gives it back for the span at `slot`: its instance is the entry's
    /// instance cell, which `insert` leaves empty.
    fn as_found(slot: Slot, state: SpanState) -> SpanState {
        let cell = &table().unwrap().0[slot.0 as usize].instance;
        assert_eq!(cell.load(Ordering::Relaxed), 0, "no instance opened yet");
        SpanState {
            instance: tracing_prof_alloc::__private::lazy_instance_word(cell),
            ..state
        }
    }

    #[test]
    fn entries_are_found_by_id_and_owner_only() {
        let _serial = serial();
        let state = SpanState {
            tag: Tag::new(7),
            parent: Tag::new(3),
            created_ns: 99,
            instance: 5,
            link: Default::default(),
        };
        let (a, b) = (new_owner(), new_owner());
        assert!(table().is_some(), "the table could not be reserved here");
        let home = thread_token();
        let slot = insert_at_home(a, 12345, state, home).unwrap();
        assert_eq!(find(a, 12345), Some((slot, as_found(slot, state))));
        assert_eq!(
            find(b, 12345),
            None,
            "another registry's span of the same id"
        );
        assert_eq!(find(a, 12346), None);
        add_busy_from(slot, 12345, 40, home);
        add_busy_from(slot, 12345, 2, home + 1); // another thread's
        add_busy_from(slot, 12345, 1, 0); // a thread without a token
        // The home thread's time in its own counter, every other thread's in the shared one.
        let e = &table().unwrap().0[slot.0 as usize];
        assert_eq!(
            (
                e.busy_home_ns.load(Ordering::Relaxed),
                e.busy_away_ns.load(Ordering::Relaxed)
            ),
            (40, 3)
        );
        assert_eq!(remove(slot, 12345), (43, false));
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

    /// A span entered on its creating thread and on three others at once: the creating thread's
    /// plain stores and the others' atomic adds lose nothing.
    #[test]
    fn busy_time_from_the_creating_thread_and_others_adds_up_exactly() {
        let _serial = serial();
        let owner = new_owner();
        let home = thread_token();
        let id = (300u64 << 38) + 1;
        let slot = insert(owner, id, SpanState::default()).unwrap();
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| {
                    let me = thread_token();
                    assert_ne!(me, home);
                    for _ in 0..100_000 {
                        add_busy(slot, id, 1);
                    }
                });
            }
            for _ in 0..100_000 {
                add_busy(slot, id, 1);
            }
        });
        assert_eq!(remove(slot, id), (400_000, false));
    }

    #[test]
    fn pages_without_open_spans_are_given_back_and_used_again() {
        let _serial = serial();
        let owner = new_owner();
        let state = SpanState {
            tag: Tag::new(9),
            ..SpanState::default()
        };
        // Shard 100's region: 1024 neighbouring entries, 16 pages of their own.
        let ids: Vec<u64> = (0..1024u64).map(|a| (100u64 << 38) + a + 1).collect();
        let before = resident_bytes();
        let slots: Vec<Slot> = ids
            .iter()
            .map(|&id| insert(owner, id, state).unwrap())
            .collect();
        assert!(
            slots
                .iter()
                .zip(&ids)
                .all(|(s, &id)| places(id)[0] == s.0 as usize)
        );
        assert!(resident_bytes() >= before + 16 * 4096);
        while !trim() {}
        assert!(
            ids.iter().all(|&id| find(owner, id).is_some()),
            "a page with open spans was given back"
        );
        for (&s, &id) in slots.iter().zip(&ids) {
            add_busy(s, id, 5);
            assert_eq!(remove(s, id), (5, false));
        }
        let touched = resident_bytes();
        while !trim() {} // a capture elsewhere may be trimming
        assert!(
            resident_bytes() + 16 * 4096 <= touched,
            "pages not given back"
        );
        // Given back pages read as free entries and take spans again.
        let s = insert(owner, ids[7], state).unwrap();
        assert_eq!(find(owner, ids[7]), Some((s, as_found(s, state))));
        remove(s, ids[7]);
    }

    #[test]
    fn a_page_being_given_back_takes_no_span() {
        let _serial = serial();
        let owner = new_owner();
        let (_, flags) = table().unwrap();
        // Shard 200's region; the id's first place is in a page marked by `trim`.
        let id = (200u64 << 38) + 1;
        let [first, second] = places(id);
        let page = &flags[first / PAGE_ENTRIES];
        page.fetch_or(RECLAIMING, Ordering::SeqCst);
        let slot = insert(owner, id, SpanState::default());
        page.fetch_and(!RECLAIMING, Ordering::SeqCst);
        assert_eq!(slot, Some(Slot(second as u32)), "it takes its other place");
        remove(slot.unwrap(), id);
    }

    #[test]
    fn one_trim_at_a_time_and_a_fork_child_clears_marks() {
        let _serial = serial();
        let _ = new_owner();
        TRIMMING.store(true, Ordering::SeqCst);
        assert!(!trim(), "a second trim must not run beside the first");
        let (_, flags) = table().unwrap();
        flags[3].fetch_or(RECLAIMING, Ordering::SeqCst);
        after_fork_in_child();
        assert_eq!(flags[3].load(Ordering::SeqCst) & RECLAIMING, 0);
        assert!(trim());
    }
}
