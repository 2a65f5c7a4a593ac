//! The records, their list, and how a thread takes one and gives it back.
//!
//! Every record ever made is on an append-only list (a lock-free stack of never-freed records):
//! readers walk it without a lock, and a thread claims a free record with a compare-and-swap of
//! its `owned` flag, or pushes a new one. The calling thread's record is in [`LOCAL`], a
//! constant-initialised thread-local without a destructor, so that it can be read at any time,
//! during TLS teardown included; a second, zero-sized thread-local ([`RELEASE_ON_EXIT`]) carries
//! the destructor that gives the record back.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// One thread's record: one cache line, written by its thread (and by [`after_fork_in_child`]
/// in a child of `fork`), read by anyone.
#[derive(Debug)]
#[repr(align(64))]
pub struct ThreadRecord {
    /// Next record on [`RECORDS`]; written once before the record is published.
    next: *const ThreadRecord,
    /// Whether a live thread owns this record.
    owned: AtomicBool,
    /// Whether the owner asked to be listed (the span layer: once it entered a span).
    listed: AtomicBool,
    /// What [`ThreadRecord::publish`] last stored.
    tag: AtomicU32,
    since_ns: AtomicU64,
    /// The owner's OS thread id (0: unknown).
    tid: AtomicU64,
    /// Its OS thread name: up to 15 bytes, NUL-padded, in two little-endian words.
    name: [AtomicU64; 2],
    /// What the span layer keeps with the record (see [`ThreadRecord::attachment`]).
    attachment: AtomicPtr<()>,
}

const _: () = assert!(size_of::<ThreadRecord>() == 64);

// SAFETY: every field is an atomic except `next`, which is written once before the record is
// published through RECORDS (release) and only read after (acquire).
unsafe impl Sync for ThreadRecord {}

impl ThreadRecord {
    /// The owner's OS thread id (Linux `gettid`), read when it claimed the record and again in a
    /// child of `fork`; 0 where unknown.
    pub fn tid(&self) -> u64 {
        self.tid.load(Ordering::Relaxed)
    }

    /// The owner's OS thread name as last read: up to 15 bytes, NUL-padded.
    pub fn name_bytes(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.name[0].load(Ordering::Relaxed).to_le_bytes());
        out[8..].copy_from_slice(&self.name[1].load(Ordering::Relaxed).to_le_bytes());
        out
    }

    /// [`ThreadRecord::name_bytes`] as text, without the padding.
    pub fn name(&self) -> String {
        let b = self.name_bytes();
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    }

    /// Reads the calling thread's OS name again into its record (one `prctl`). Only the
    /// record's own thread may call it: another thread would store its own name.
    pub fn refresh_name(&self) {
        let b = os_name();
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        self.name[0].store(word(&b[..8]), Ordering::Relaxed);
        self.name[1].store(word(&b[8..]), Ordering::Relaxed);
    }

    /// The owner is in `tag` since `since_ns` (the span layer's path tag and monotonic time):
    /// two relaxed stores. Never allocates, locks or panics.
    #[inline]
    pub fn publish(&self, tag: u32, since_ns: u64) {
        self.tag.store(tag, Ordering::Relaxed);
        self.since_ns.store(since_ns, Ordering::Relaxed);
    }

    /// What [`ThreadRecord::publish`] last stored: (tag, since_ns); (0, 0) on a fresh record.
    pub fn now(&self) -> (u32, u64) {
        (
            self.tag.load(Ordering::Relaxed),
            self.since_ns.load(Ordering::Relaxed),
        )
    }

    /// The pointer that the span layer keeps with the record (its table of span times), or
    /// null: see [`ThreadRecord::set_attachment`].
    pub fn attachment(&self) -> *mut () {
        self.attachment.load(Ordering::Acquire)
    }

    /// Keeps `p` with the record, if nothing is kept there yet; otherwise returns what is. What
    /// is kept stays with the record when the thread exits, and the next thread that takes the
    /// record finds it there, so that what it counted is still summed ([`for_each_ever`]).
    /// This crate never reads through it.
    ///
    /// # Safety
    /// Every pointer ever kept in any record of the process must point to a value of one type,
    /// that of the one user of attachments (the span layer of `tracing-prof-core`, which keeps
    /// its `span_times::Table` there), valid for the rest of the process, so that whoever reads
    /// [`ThreadRecord::attachment`] may dereference it as that type.
    pub unsafe fn set_attachment(&self, p: *mut ()) -> Result<(), *mut ()> {
        self.attachment
            .compare_exchange(ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
    }

    /// Marks the owner as one to list, or not (the span layer: from its first enter on).
    pub fn set_listed(&self, listed: bool) {
        self.listed.store(listed, Ordering::Release);
    }

    /// Whether a live thread owns the record and asked to be listed.
    pub fn is_listed(&self) -> bool {
        self.owned.load(Ordering::Acquire) && self.listed.load(Ordering::Acquire)
    }

    /// Starts the record afresh for the calling thread.
    fn reset_for_caller(&self) {
        self.tid.store(gettid(), Ordering::Relaxed);
        self.refresh_name();
        self.publish(0, 0);
        self.listed.store(false, Ordering::Relaxed);
    }

    /// Hands the record back: the next new thread may take it.
    fn give_back(&self) {
        self.listed.store(false, Ordering::Relaxed);
        self.publish(0, 0);
        self.owned.store(false, Ordering::Release);
    }
}

/// Head of the append-only list of every record ever made.
static RECORDS: AtomicPtr<ThreadRecord> = AtomicPtr::new(ptr::null_mut());

/// The calling thread's side.
struct Local {
    /// Its record; null before the first claim, after it was given back, or when none could be
    /// had.
    record: Cell<*const ThreadRecord>,
    /// Set while a claim runs (registering the exit destructor may allocate, and an allocation
    /// asks for the record) and once the record was given back at thread exit: no claim then.
    no_claim: Cell<bool>,
}

thread_local! {
    /// Constant-initialised and without a destructor: readable for the thread's whole life.
    static LOCAL: Local = const {
        Local {
            record: Cell::new(ptr::null()),
            no_claim: Cell::new(false),
        }
    };
    static RELEASE_ON_EXIT: ReleaseOnExit = const { ReleaseOnExit };
}

/// Gives the thread's record back when the thread exits.
///
/// Every user of a record asks for it before it registers destructors of its own, so that this
/// one, registered first, runs after theirs (thread-exit destructors run in the reverse order of
/// registration): a user's own destructor still finds the record.
struct ReleaseOnExit;

impl Drop for ReleaseOnExit {
    fn drop(&mut self) {
        let _ = LOCAL.try_with(|l| {
            l.no_claim.set(true);
            let r = l.record.replace(ptr::null());
            if !r.is_null() {
                // SAFETY: a record from `claim`: published on RECORDS, never freed.
                unsafe { &*r }.give_back();
            }
        });
    }
}

/// The calling thread's record: claimed on its first call (see the crate docs for the cost),
/// then one thread-local read. `None` when the system allocator refused a new record, during a
/// claim (from an allocation the claim itself makes) and after the record was given back at
/// thread exit.
#[inline]
pub fn current() -> Option<&'static ThreadRecord> {
    let r = LOCAL.try_with(|l| l.record.get()).ok()?;
    if r.is_null() {
        return claim();
    }
    // SAFETY: a record from `claim`: published on RECORDS, never freed, owned by this thread
    // until its exit destructor clears LOCAL first.
    Some(unsafe { &*r })
}

/// The calling thread's OS id: its record's, or read now when it has none.
pub fn os_tid() -> u64 {
    current().map_or_else(gettid, ThreadRecord::tid)
}

/// Reads the calling thread's OS id again (one `gettid`) into its record, if it has one (it
/// never claims one), and returns it. For the cold paths that must not trust an id read before
/// a `fork` that no handler saw (a record claimed in the parent, a fork before any profiler
/// registered its handlers): arming a CPU timer, and the fork handlers themselves.
/// Async-signal-safe.
pub fn refresh_tid() -> u64 {
    let tid = gettid();
    let own = LOCAL.try_with(|l| l.record.get()).unwrap_or(ptr::null());
    if !own.is_null() {
        // SAFETY: a record from `claim`, never freed; this thread owns it.
        unsafe { &*own }.tid.store(tid, Ordering::Relaxed);
    }
    tid
}

/// Calls `f` with every record a live thread owns now (listed or not), newest first. Never
/// locks; a thread that starts or exits meanwhile may or may not be seen.
pub fn for_each(mut f: impl FnMut(&'static ThreadRecord)) {
    for_each_ever(|r| {
        if r.owned.load(Ordering::Acquire) {
            f(r);
        }
    });
}

/// In a child of `fork`: only the calling thread exists, so every other record is given back,
/// and the caller's (if it has one) takes the caller's new id. Only stores and one `gettid`:
/// async-signal-safe, as a child of a multi-threaded `fork` requires. Running it again in the
/// same child changes nothing.
pub fn after_fork_in_child() {
    let own = LOCAL.try_with(|l| l.record.get()).unwrap_or(ptr::null());
    for_each_ever(|r| {
        if !ptr::eq(r, own) && r.owned.load(Ordering::Relaxed) {
            r.give_back();
        }
    });
    if !own.is_null() {
        refresh_tid();
    }
}

/// Calls `f` with every record ever made, owned now or not (for summing what their
/// attachments counted), newest first. Never locks.
pub fn for_each_ever(mut f: impl FnMut(&'static ThreadRecord)) {
    let mut cursor = RECORDS.load(Ordering::Acquire).cast_const();
    while !cursor.is_null() {
        // SAFETY: every pointer on RECORDS is a published, never-freed record.
        let r: &'static ThreadRecord = unsafe { &*cursor };
        f(r);
        cursor = r.next;
    }
}

#[cold]
#[inline(never)]
fn claim() -> Option<&'static ThreadRecord> {
    LOCAL
        .try_with(|l| {
            if l.no_claim.get() {
                return None;
            }
            l.no_claim.set(true);
            let r = adopt_free().or_else(new_record);
            if let Some(r) = r {
                r.reset_for_caller();
                // Set before the destructor is registered: an allocation made by registering
                // it finds the record.
                l.record.set(r);
                // Registers the destructor that gives the record back (glibc's
                // `__cxa_thread_atexit_impl`). If TLS teardown has begun this fails, and the
                // record stays claimed for good.
                let _ = RELEASE_ON_EXIT.try_with(|_| ());
            }
            l.no_claim.set(false);
            r
        })
        .ok()
        .flatten()
}

/// A record an exited thread gave back, now the caller's.
fn adopt_free() -> Option<&'static ThreadRecord> {
    let mut found = None;
    for_each_ever(|r| {
        if found.is_none()
            && !r.owned.load(Ordering::Relaxed)
            && r.owned
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            found = Some(r);
        }
    });
    found
}

/// A new record, owned by the caller and on the list; `None` when the system allocator refuses.
fn new_record() -> Option<&'static ThreadRecord> {
    let layout = Layout::new::<ThreadRecord>();
    // SAFETY: the layout has a non-zero size. An all-zero ThreadRecord is valid: atomics at 0,
    // `owned` false, `next` null.
    let raw = unsafe { System.alloc_zeroed(layout) }.cast::<ThreadRecord>();
    if raw.is_null() {
        return None;
    }
    // SAFETY: `raw` is a fresh, zeroed, aligned ThreadRecord that nobody else sees yet.
    let r = unsafe { &mut *raw };
    *r.owned.get_mut() = true;
    let mut head = RECORDS.load(Ordering::Relaxed);
    loop {
        r.next = head;
        match RECORDS.compare_exchange_weak(head, raw, Ordering::Release, Ordering::Relaxed) {
            // SAFETY: published, and never freed from now on.
            Ok(_) => return Some(unsafe { &*raw }),
            Err(actual) => head = actual,
        }
    }
}

/// The calling thread's OS id (0 where there is none to read).
fn gettid() -> u64 {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        // SAFETY: gettid takes no arguments, cannot fail and touches no memory of ours.
        u64::try_from(unsafe { libc::syscall(libc::SYS_gettid) }).unwrap_or(0)
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        0
    }
}

/// The calling thread's OS name, NUL-padded (all zero where there is none to read).
fn os_name() -> [u8; 16] {
    let mut buf = [0u8; 16];
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included, into the buffer given.
        if unsafe { libc::prctl(libc::PR_GET_NAME, buf.as_mut_ptr()) } != 0 {
            buf = [0; 16];
        }
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    fn owned_count() -> usize {
        let mut n = 0;
        for_each(|_| n += 1);
        n
    }

    #[test]
    fn a_thread_gets_its_own_id_and_name_and_keeps_its_record() {
        let h = std::thread::Builder::new()
            .name("rec-named".into())
            .spawn(|| {
                let r = current().unwrap();
                assert!(ptr::eq(r, current().unwrap()));
                (r.tid(), gettid(), r.name())
            })
            .unwrap();
        let (tid, os, name) = h.join().unwrap();
        assert_eq!(tid, os);
        assert_ne!(tid, 0);
        assert_eq!(name, "rec-named");
    }

    #[test]
    fn records_of_exited_threads_are_given_back_and_taken_again() {
        // Eight threads hold a record at once, then exit; eight more do the same. The second
        // eight find the first eight's records free (other tests' threads may take some too,
        // so the list grows by at most what those take).
        let round = || {
            let barrier = Arc::new(Barrier::new(8));
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let b = Arc::clone(&barrier);
                    std::thread::spawn(move || {
                        let r = current().unwrap();
                        r.set_listed(true);
                        r.publish(3, 9);
                        b.wait();
                        r as *const ThreadRecord as usize
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect::<Vec<_>>()
        };
        let first = round();
        let mut made = 0;
        for_each_ever(|_| made += 1);
        let second = round();
        let mut made_after = 0;
        for_each_ever(|_| made_after += 1);
        assert!(
            second.iter().any(|r| first.contains(r)),
            "no record was reused: {first:?} {second:?}"
        );
        assert!(made_after < made + 8, "{made} -> {made_after} records");
        // A given-back record reads as fresh: not listed, nothing published.
        for_each_ever(|r| {
            if !r.owned.load(Ordering::Acquire) {
                assert!(!r.is_listed());
                assert_eq!(r.now(), (0, 0));
            }
        });
        // The test's own thread, once it asks, holds one.
        let me = current().unwrap();
        let mut mine = false;
        for_each(|r| mine |= ptr::eq(r, me));
        assert!(mine && owned_count() >= 1);
    }
}
