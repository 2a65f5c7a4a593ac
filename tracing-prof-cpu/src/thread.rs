//! Per-thread sampler state: the thread's ring, its timer and its stack's extent.
//!
//! A thread is *armed* by itself, off the signal path, the first time the profiler sees it
//! after sampling starts (its first allocation, its first span enter, or the start call): it
//! takes a [`ThreadSampler`] (a free one, or a new one from the system allocator; they are
//! never freed), records the top of its stack, and creates its CPU-time timer. At thread exit
//! a TLS destructor deletes the timer and hands the state back; the reader drains what is left
//! in its ring before anyone reuses it.
//!
//! What the signal handler touches: the constant-initialized, destructor-free thread-local
//! [`LOCAL`] (a plain TLS read, usable even during TLS teardown), and the thread's own
//! [`ThreadSampler`], whose ring and counters only it writes.

use crate::ring::Ring;
use crate::timer::{self, TimerId};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, Ordering,
};

const FREE: u8 = 0;
const OWNED: u8 = 1;
/// The owner exited; the ring may still hold records.
const EXITED: u8 = 2;

pub(crate) struct ThreadSampler {
    /// Next state in [`THREADS`]; written once before publication.
    next: *const ThreadSampler,
    state: AtomicU8,
    pub(crate) tid: AtomicI32,
    /// Kernel timer id + 1; 0: none.
    timer: AtomicI64,
    /// Top (highest address) of the owner's stack; 0: unknown.
    pub(crate) stack_top: AtomicU64,
    /// Bottom (lowest address) of the owner's stack; 0: unknown.
    pub(crate) stack_bottom: AtomicU64,
    /// Written by the owner's signal handler only (single writer: load + store).
    pub(crate) samples: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) truncated: AtomicU64,
    /// Handler runs that unwound a stack, the frames they found and the nanoseconds they took.
    pub(crate) handled: AtomicU64,
    pub(crate) frames: AtomicU64,
    pub(crate) handler_ns: AtomicU64,
    /// Handler runs by time taken (see [`crate::handler_bucket`]).
    pub(crate) handler_hist: [AtomicU64; crate::HANDLER_BUCKETS],
    pub(crate) ring: Ring,
}

// SAFETY: every field is an atomic except `next`, which is written once before the state is
// published through THREADS (release) and only read after (acquire).
unsafe impl Sync for ThreadSampler {}

/// Head of the append-only list of every state ever made.
static THREADS: AtomicPtr<ThreadSampler> = AtomicPtr::new(ptr::null_mut());

/// Sampling generation: 0 while stopped; a thread armed for an older one arms again.
pub(crate) static GENERATION: AtomicU32 = AtomicU32::new(0);
static NEXT_GENERATION: AtomicU32 = AtomicU32::new(1);
/// Sampling period in nanoseconds of CPU time.
pub(crate) static PERIOD_NS: AtomicU64 = AtomicU64::new(10_000_000);

pub(crate) static ARMED: AtomicU64 = AtomicU64::new(0);
pub(crate) static ARM_FAILURES: AtomicU64 = AtomicU64::new(0);
pub(crate) static LAST_ARM_ERROR: AtomicI32 = AtomicI32::new(0);
pub(crate) static BLOCKED: AtomicU64 = AtomicU64::new(0);

/// What the handler and the arming code keep per thread. No destructor: readable at any time,
/// TLS teardown included.
pub(crate) struct Local {
    pub(crate) current: Cell<*const ThreadSampler>,
    generation: Cell<u32>,
    exiting: Cell<bool>,
}

thread_local! {
    pub(crate) static LOCAL: Local = const {
        Local {
            current: Cell::new(ptr::null()),
            generation: Cell::new(0),
            exiting: Cell::new(false),
        }
    };
    static DISARM_ON_EXIT: DisarmOnExit = const { DisarmOnExit };
}

/// Arms the calling thread if sampling runs and it is not armed for this generation yet: one
/// thread-local read and one compare when it is.
#[inline]
pub(crate) fn ensure_armed() {
    let generation = GENERATION.load(Ordering::Relaxed);
    if generation == 0 {
        return;
    }
    let _ = LOCAL.try_with(|l| {
        if l.generation.get() != generation {
            arm(l, generation);
        }
    });
}

#[cold]
#[inline(never)]
fn arm(l: &Local, generation: u32) {
    if l.exiting.get() {
        return;
    }
    // Set first: a failure is counted once, not retried on every enter.
    l.generation.set(generation);
    let mut ts = l.current.get();
    if ts.is_null() {
        ts = acquire();
        if ts.is_null() {
            fail(libc::ENOMEM);
            return;
        }
        // SAFETY: `acquire` returns a published, never-freed state that this thread owns now.
        let s = unsafe { &*ts };
        s.tid.store(own_tid(), Ordering::Relaxed);
        let (bottom, top) = stack_extent();
        s.stack_bottom.store(bottom, Ordering::Relaxed);
        s.stack_top.store(top, Ordering::Relaxed);
        // Registers the destructor that disarms at exit (glibc's `__cxa_thread_atexit_impl`).
        let _ = DISARM_ON_EXIT.try_with(|_| ());
        if signal_blocked() {
            BLOCKED.fetch_add(1, Ordering::Relaxed);
        }
        // Published last: the handler sees a fully set-up state or none.
        l.current.set(ts);
    }
    // SAFETY: as above.
    let s = unsafe { &*ts };
    let period = PERIOD_NS.load(Ordering::Relaxed);
    let tid = s.tid.load(Ordering::Relaxed);
    match timer::arm(tid, period, first_expiry(tid, period)) {
        Ok(t) => {
            let old = s.timer.swap(i64::from(t.0) + 1, Ordering::SeqCst);
            delete_stored(old);
            // `stop` may have run meanwhile and missed this timer: whoever swaps it out
            // deletes it.
            if GENERATION.load(Ordering::SeqCst) != generation {
                delete_stored(s.timer.swap(0, Ordering::SeqCst));
            } else {
                ARMED.fetch_add(1, Ordering::Relaxed);
            }
        }
        Err(e) => fail(e),
    }
}

fn fail(errno: i32) {
    ARM_FAILURES.fetch_add(1, Ordering::Relaxed);
    LAST_ARM_ERROR.store(errno, Ordering::Relaxed);
}

fn delete_stored(stored: i64) {
    if stored != 0 {
        timer::delete(TimerId((stored - 1) as i32));
    }
}

/// A random first expiry in `(0, period]`, so that threads started together do not tick in
/// step (as Go does).
fn first_expiry(tid: i32, period: u64) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec; on failure it stays zero.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let mut z = (ts.tv_nsec as u64) ^ ((tid as u64) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    z % period.max(1) + 1
}

/// The lowest and highest addresses of the calling thread's stack (0, 0: unknown).
fn stack_extent() -> (u64, u64) {
    // SAFETY: an all-zero pthread_attr_t is a valid argument for pthread_getattr_np to fill.
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    // SAFETY: pthread_getattr_np fills `attr` for the calling thread (for the main thread glibc
    // reads /proc/self/maps, with its own `malloc`); destroyed below when it succeeded.
    if unsafe { libc::pthread_getattr_np(libc::pthread_self(), &mut attr) } != 0 {
        return (0, 0);
    }
    let mut addr: *mut libc::c_void = ptr::null_mut();
    let mut size: libc::size_t = 0;
    // SAFETY: `attr` was filled by pthread_getattr_np; the out-pointers are valid.
    let ok = unsafe { libc::pthread_attr_getstack(&attr, &mut addr, &mut size) } == 0;
    // SAFETY: `attr` was initialised by pthread_getattr_np.
    unsafe { libc::pthread_attr_destroy(&mut attr) };
    if ok {
        (addr as u64, (addr as u64).saturating_add(size as u64))
    } else {
        (0, 0)
    }
}

/// Whether the calling thread blocks SIGPROF (it is then not sampled until it unblocks).
fn signal_blocked() -> bool {
    // SAFETY: an all-zero sigset_t is valid storage for pthread_sigmask to fill.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: querying the mask only (`set` is null), into a valid sigset_t.
    let ok = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, ptr::null(), &mut set) } == 0;
    // SAFETY: `set` was filled by pthread_sigmask.
    ok && unsafe { libc::sigismember(&set, libc::SIGPROF) } == 1
}

/// A free state to reuse, or a new one; null when the system allocator refuses.
fn acquire() -> *const ThreadSampler {
    let mut cursor = THREADS.load(Ordering::Acquire).cast_const();
    while !cursor.is_null() {
        // SAFETY: every pointer in THREADS is a published, never-freed state.
        let s = unsafe { &*cursor };
        if s.state
            .compare_exchange(FREE, OWNED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return cursor;
        }
        cursor = s.next;
    }
    let layout = Layout::new::<ThreadSampler>();
    // SAFETY: non-zero size. An all-zero ThreadSampler is valid: atomics at 0 (state FREE, no
    // timer, an empty ring), `next` null.
    let raw = unsafe { System.alloc_zeroed(layout) }.cast::<ThreadSampler>();
    if raw.is_null() {
        return ptr::null();
    }
    // SAFETY: fresh, zeroed, aligned, and seen by nobody else yet.
    let s = unsafe { &mut *raw };
    *s.state.get_mut() = OWNED;
    let mut head = THREADS.load(Ordering::Relaxed);
    loop {
        s.next = head;
        match THREADS.compare_exchange_weak(head, raw, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return raw,
            Err(actual) => head = actual,
        }
    }
}

/// Disarms the thread at exit and hands its state back.
struct DisarmOnExit;

impl Drop for DisarmOnExit {
    fn drop(&mut self) {
        let _ = LOCAL.try_with(|l| {
            l.exiting.set(true);
            // The handler stops using the state first; a signal already queued is counted as
            // late.
            let ts = l.current.replace(ptr::null());
            if ts.is_null() {
                return;
            }
            // SAFETY: a state from `acquire`; states are never freed.
            let s = unsafe { &*ts };
            delete_stored(s.timer.swap(0, Ordering::SeqCst));
            s.state.store(EXITED, Ordering::Release);
        });
    }
}

/// Every state ever made.
pub(crate) fn each(mut f: impl FnMut(&'static ThreadSampler)) {
    let mut cursor = THREADS.load(Ordering::Acquire).cast_const();
    while !cursor.is_null() {
        // SAFETY: every pointer in THREADS is a published, never-freed state.
        let s: &'static ThreadSampler = unsafe { &*cursor };
        f(s);
        cursor = s.next;
    }
}

/// Starts a new generation: every thread arms again when next seen.
pub(crate) fn start_generation(period_ns: u64) {
    PERIOD_NS.store(period_ns, Ordering::Relaxed);
    let mut g = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
    if g == 0 {
        g = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
    }
    GENERATION.store(g, Ordering::SeqCst);
}

/// Deletes every thread's timer; threads stay registered.
pub(crate) fn disarm_all() {
    GENERATION.store(0, Ordering::SeqCst);
    each(|s| delete_stored(s.timer.swap(0, Ordering::SeqCst)));
}

/// Held while a reader drains the rings: one reader at a time, never waited for.
static DRAINING: AtomicBool = AtomicBool::new(false);

/// Reads every record in every ring. Returns false without reading when another reader is at
/// it.
pub(crate) fn drain(mut f: impl FnMut(i32, u64, &[u64])) -> bool {
    if DRAINING.swap(true, Ordering::Acquire) {
        return false;
    }
    each(|s| {
        let state = s.state.load(Ordering::Acquire);
        if state == FREE {
            return;
        }
        let tid = s.tid.load(Ordering::Relaxed);
        s.ring
            .drain(crate::record_len, |header, body| f(tid, header, body));
        if state == EXITED && s.ring.is_empty() {
            let _ = s
                .state
                .compare_exchange(EXITED, FREE, Ordering::AcqRel, Ordering::Relaxed);
        }
    });
    DRAINING.store(false, Ordering::Release);
    true
}

/// The calling thread's OS id, read again (its record may have been claimed before a `fork`
/// that no handler saw), and stored into its record (`tracing-prof-thread`) if it has one.
fn own_tid() -> i32 {
    i32::try_from(tracing_prof_thread::refresh_tid()).unwrap_or(0)
}

/// After `fork`, in the child: the only thread left is the one that forked, so no reader can
/// be holding the drain flag; the child has no timers (POSIX timers are not inherited); the
/// states of the parent's other threads are their exited threads' (drained, then reused), and
/// the forking thread's takes its new id, which its timer must name when sampling starts again.
/// Only stores and one `gettid`.
pub(crate) fn after_fork_in_child() {
    tracing_prof_thread::after_fork_in_child();
    DRAINING.store(false, Ordering::Release);
    GENERATION.store(0, Ordering::SeqCst);
    let own = LOCAL.try_with(|l| l.current.get()).unwrap_or(ptr::null());
    each(|s| {
        s.timer.store(0, Ordering::SeqCst);
        if ptr::eq(s, own) {
            s.tid.store(own_tid(), Ordering::Relaxed);
        } else if s.state.load(Ordering::Relaxed) == OWNED {
            s.state.store(EXITED, Ordering::Release);
        }
    });
}

/// Sums of the per-thread counters, and the number of threads owning a state now.
#[derive(Default)]
pub(crate) struct Totals {
    pub(crate) samples: u64,
    pub(crate) dropped: u64,
    pub(crate) truncated: u64,
    pub(crate) handled: u64,
    pub(crate) frames: u64,
    pub(crate) handler_ns: u64,
    pub(crate) handler_hist: [u64; crate::HANDLER_BUCKETS],
    pub(crate) live: usize,
}

pub(crate) fn totals() -> Totals {
    let mut t = Totals::default();
    each(|s| {
        t.samples += s.samples.load(Ordering::Relaxed);
        t.dropped += s.dropped.load(Ordering::Relaxed);
        t.truncated += s.truncated.load(Ordering::Relaxed);
        t.handled += s.handled.load(Ordering::Relaxed);
        t.frames += s.frames.load(Ordering::Relaxed);
        t.handler_ns += s.handler_ns.load(Ordering::Relaxed);
        for (sum, b) in t.handler_hist.iter_mut().zip(&s.handler_hist) {
            *sum += b.load(Ordering::Relaxed);
        }
        if s.state.load(Ordering::Relaxed) == OWNED {
            t.live += 1;
        }
    });
    t
}
