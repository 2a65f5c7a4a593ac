//! The CPU stack sampler of tracing-prof: which code, under which span, used the CPU.
//!
//! Each thread gets a timer on its **own CPU clock** (`timer_create(CLOCK_THREAD_CPUTIME_ID)`
//! with `SIGEV_THREAD_ID`), so a thread is interrupted after every `1/hz` seconds of CPU time
//! it uses, wherever it runs; a process-wide `setitimer` would undercount beyond a couple of
//! busy threads and interrupt arbitrary threads (golang/go#35057). The SIGPROF handler reads the
//! span path tag the span layer keeps current on the thread (the same one the tagging allocator
//! reads), walks the stack, and appends `(tag, weight, trace link, return addresses)` to the thread's own
//! lock-free ring. A reader ([`drain`]) turns the rings into a profile off the signal path. The
//! tag follows the work, not the thread: an instrumented future polled on several workers is
//! attributed to its span on each of them, across `.await`.
//!
//! This crate holds all of the signal-handler `unsafe` and depends on `libc`, `framehop` (DWARF
//! unwinding that never allocates) and `tracing-prof-alloc` (for the tag) only.
//!
//! # Lifecycle
//! [`start`] installs the handler (once per process, never removed), prepares the unwinder
//! (modules and their `.eh_frame` found off the signal path) and arms the calling thread.
//! Other threads are armed when the profiler first sees them: their first allocation (through
//! the tagging allocator's new-thread hook) or their first span enter ([`ensure_armed`]); they
//! are disarmed when they exit. [`stop`] deletes every timer.
//!
//! # What the handler does
//! See `signal`: no allocation, no lock, and no system call but two `clock_gettime` reads that
//! time the handler itself (served by the vDSO where the clocksource allows);
//! `errno` is saved and restored; a full ring drops the sample and counts it
//! ([`CpuSamplerStats::dropped`]). [`CpuSamplerStats`] gives the handler's mean cost and the mean
//! depth it reached. A timer that expired several
//! times before its signal could be delivered counts once per expiry (the sample's weight).
//!
//! # Limitations
//! - Linux on x86_64 and aarch64 only; elsewhere [`start`] returns
//!   [`StartError::Unsupported`].
//! - Another SIGPROF handler in the process (pprof-rs, pyroscope-rs, your own): [`start`]
//!   refuses with [`StartError::ForeignHandler`] instead of replacing it.
//! - A thread that blocks SIGPROF is not interrupted while it does: the CPU time it used then
//!   is counted, as the weight of one sample, where it unblocks; a thread that blocks it for
//!   good is never sampled ([`CpuSamplerStats::threads_blocking`] counts those seen blocking it
//!   when armed).
//! - Threads the profiler never sees (no allocation through the tagging allocator, no span
//!   entered) are not sampled.
//! - A module unloaded with `dlclose` while sampling runs leaves the unwinder reading its
//!   unmapped tables: do not `dlclose` libraries whose code may be on a sampled stack.
//! - After `fork`, the child has no timers (POSIX timers are not inherited): sampling stops
//!   there until [`start`] is called again in the child.

#![cfg_attr(
    not(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    )),
    allow(unused)
)]

/// The items of the platforms the sampler runs on: Linux on x86_64 and aarch64.
macro_rules! supported {
    ($($item:item)*) => {
        $(
            #[cfg(all(
                target_os = "linux",
                any(target_arch = "x86_64", target_arch = "aarch64")
            ))]
            $item
        )*
    };
}

mod clock;
pub mod disposition;
mod loaded;
mod long_poll;
mod ring;
pub mod trace_link;

supported! {
    mod modules;
    mod signal;
    mod thread;
    mod timer;
    mod unwind;
}

// Elsewhere: the same API, which starts nothing and says so.
#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
mod unsupported;
#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
pub use unsupported::*;

pub use clock::clock_ns;
pub use loaded::{LoadedModule, MAX_MODULES, MAX_SEGMENTS, loaded_modules};
pub use long_poll::watch_long_polls;

/// Frames kept per sample, innermost first; deeper stacks are cut (and counted).
pub const MAX_CPU_FRAMES: usize = 128;

/// How the signal handler walks the stack (on platforms where it runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unwind {
    /// DWARF call frame information (`.eh_frame`), frame pointers where there is none. Works
    /// without frame pointers.
    #[default]
    Dwarf,
    /// Frame pointers only: cheaper, correct only where every function keeps them.
    FramePointers,
}
use std::sync::atomic::{AtomicU32, Ordering};
pub use trace_link::TraceLink;

/// Samples per second of CPU time per thread by default: 100, as Go's.
pub const DEFAULT_HZ: u32 = 100;
/// The highest rate [`start`] accepts: 10 kHz (Linux checks CPU timers on its own clock tick,
/// so rates above the kernel's tick rate arrive as weighted samples anyway).
pub const MAX_HZ: u32 = 10_000;

/// The rate sampling runs at now (0: stopped).
static HZ: AtomicU32 = AtomicU32::new(0);

/// Why sampling did not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// This platform has no per-thread CPU timers we can use.
    Unsupported,
    /// Another SIGPROF handler is installed: another profiler, or the program's own.
    ForeignHandler {
        /// The address of that handler.
        handler: usize,
    },
    /// A rate of 0 or above [`MAX_HZ`].
    Rate(u32),
    /// The operating system refused (installing the handler).
    Os(std::io::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Unsupported => f.write_str("CPU sampling needs Linux on x86_64 or aarch64"),
            StartError::ForeignHandler { handler } => write!(
                f,
                "another SIGPROF handler is installed (at {handler:#x}: another profiler, or the \
                 program's own); tracing-prof does not replace it, so CPU sampling is off"
            ),
            StartError::Rate(hz) => {
                write!(f, "a CPU sampling rate of {hz} Hz is outside 1..={MAX_HZ}")
            }
            StartError::Os(e) => write!(f, "cannot install the SIGPROF handler: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

/// One sample as the handler recorded it.
#[derive(Clone, Copy, Debug)]
pub struct RawSample<'a> {
    /// The thread it was taken on.
    pub tid: i32,
    /// The span path tag current on the thread (a `tracing_prof_alloc::Tag` value).
    pub tag: u32,
    /// Timer expiries it stands for (1, or more when the thread could not take the signal in
    /// time).
    pub weight: u64,
    /// Whether the stack was deeper than [`MAX_CPU_FRAMES`] (its outermost frames are missing).
    pub truncated: bool,
    /// Whether the thread was in a long poll (see [`watch_long_polls`]).
    pub long_poll: bool,
    /// The trace span the thread's work belonged to ([`trace_link::set`]), or
    /// [`TraceLink::NONE`].
    pub link: TraceLink,
    /// Code addresses, innermost first: the interrupted instruction, then return addresses.
    pub ips: &'a [u64],
}

/// Counters about the sampler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CpuSamplerStats {
    /// The rate sampling runs at (0: stopped).
    pub hz: u32,
    /// Samples recorded (weighted), since the process started.
    pub samples: u64,
    /// Samples dropped because a thread's ring was full (weighted).
    pub dropped: u64,
    /// Samples whose stack was cut at [`MAX_CPU_FRAMES`].
    pub truncated: u64,
    /// Handler runs that unwound a stack (each stands for `weight` samples).
    pub handler_runs: u64,
    /// Frames those runs found in all: `frames / handler_runs` is the mean depth reached.
    pub frames: u64,
    /// Nanoseconds those runs took in all, from entering the handler to leaving it (read from
    /// `CLOCK_MONOTONIC`). Wall time: on a host with more runnable threads than cores, a
    /// handler preempted by the scheduler counts the time it waited, so the mean
    /// (`handler_ns / handler_runs`) reads high; [`CpuSamplerStats::handler_ns_quantile`] does not.
    pub handler_ns: u64,
    /// Handler runs by time taken, two buckets per doubling from 256 ns to 16 ms (see
    /// [`CpuSamplerStats::handler_ns_quantile`]).
    pub handler_ns_histogram: [u64; HANDLER_BUCKETS],
    /// Frames the DWARF unwinder found in its rule caches.
    pub unwind_cache_hits: u64,
    /// Frames it had to look up in `.eh_frame` instead (the slow part of a sample).
    pub unwind_cache_misses: u64,
    /// Threads armed (a thread armed again after a restart counts again).
    pub threads_armed: u64,
    /// Threads with a sampler state now.
    pub threads_live: usize,
    /// Threads whose timer could not be created.
    pub arm_failures: u64,
    /// The `errno` of the last failure to arm a thread (0: none).
    pub last_arm_error: i32,
    /// Threads that blocked SIGPROF when they were armed.
    pub threads_blocking: u64,
    /// SIGPROFs that did not come from our timers (ignored).
    pub foreign_signals: u64,
    /// Our signals that arrived after their thread was disarmed (ignored).
    pub late_signals: u64,
}

/// Buckets of [`CpuSamplerStats::handler_ns_histogram`].
pub const HANDLER_BUCKETS: usize = 32;

/// The bucket of a handler run that took `ns`: two per doubling, bucket 0 below 362 ns, the
/// last from 11.9 ms up.
pub(crate) fn handler_bucket(ns: u64) -> usize {
    if ns < 256 {
        return 0;
    }
    let octave = 63 - ns.leading_zeros() as usize; // 8.. for ns >= 256
    let half = ((ns >> (octave - 1)) & 1) as usize; // the bit below the top one
    (2 * (octave - 8) + half).min(HANDLER_BUCKETS - 1)
}

/// The lower bound of bucket `b` in nanoseconds.
fn bucket_floor(b: usize) -> u64 {
    let octave = 8 + b / 2;
    (1u64 << octave) + if b % 2 == 1 { 1u64 << (octave - 1) } else { 0 }
}

impl CpuSamplerStats {
    /// The time within which a fraction `q` (0 to 1) of the handler runs finished, to within
    /// a bucket (about 20%): `handler_ns_quantile(0.5)` is the median cost of one sample.
    /// `None` before any run.
    pub fn handler_ns_quantile(&self, q: f64) -> Option<u64> {
        let total: u64 = self.handler_ns_histogram.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((total as f64) * q.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, &n) in self.handler_ns_histogram.iter().enumerate() {
            seen += n;
            if seen >= rank {
                // The bucket's middle.
                let (lo, hi) = (bucket_floor(b), bucket_floor(b + 1));
                return Some(lo + (hi - lo) / 2);
            }
        }
        None
    }
}

/// The rate sampling runs at (0: stopped).
pub fn hz() -> u32 {
    HZ.load(Ordering::Relaxed)
}

/// Whether sampling runs.
pub fn is_running() -> bool {
    hz() > 0
}

supported! {
    /// The header word of a record: tag, depth, weight (saturating at 16 bits), the truncated flag,
    /// the long-poll flag and whether the body starts with a trace link's three words. Never all ones (the ring's wrap marker): depth is at most 128.
    pub(crate) fn record_header(
        tag: u32,
        depth: usize,
        weight: u64,
        truncated: bool,
        long_poll: bool,
        linked: bool,
    ) -> u64 {
        let depth = depth.min(MAX_CPU_FRAMES) as u64;
        let weight = weight.min(u64::from(u16::MAX));
        u64::from(tag)
            | depth << 32
            | weight << 40
            | u64::from(truncated) << 56
            | u64::from(long_poll) << 57
            | u64::from(linked) << LINKED_BIT
    }

    /// The header bit of a record whose body starts with a trace link.
    const LINKED_BIT: u32 = 58;

    /// The body length of a record from its header.
    pub(crate) fn record_len(header: u64) -> usize {
        ((header >> 32) & 0xff) as usize + 3 * ((header >> LINKED_BIT) & 1) as usize
    }

    mod api {
        use super::*;
        use std::sync::Mutex;

        static STARTING: Mutex<()> = Mutex::new(());

        /// Starts sampling every thread's stack `hz` times per second of its CPU time, walking
        /// stacks as `unwind` says, and arms the calling thread. Idempotent; a second call changes
        /// the rate and the unwinding mode.
        ///
        /// Refuses when another SIGPROF handler is installed ([`StartError::ForeignHandler`]).
        pub fn start(hz: u32, unwind: Unwind) -> Result<(), StartError> {
            if hz == 0 || hz > MAX_HZ {
                return Err(StartError::Rate(hz));
            }
            let _one = STARTING
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            signal::install().map_err(|e| match e {
                signal::InstallError::Foreign(handler) => StartError::ForeignHandler { handler },
                signal::InstallError::Os(e) => StartError::Os(e),
            })?;
            register_fork_handler();
            unwind::prepare();
            unwind::set_mode(unwind);
            modules::refresh();
            thread::disarm_all();
            thread::start_generation(1_000_000_000 / u64::from(hz));
            HZ.store(hz, Ordering::Relaxed);
            thread::ensure_armed();
            Ok(())
        }

        /// Walks the calling thread's own stack with the sampler's unwinder, writing return
        /// addresses into `out`, innermost first (the caller's return address first); returns how
        /// many it wrote. `None` where it cannot: the thread was never armed (its stack's extent is
        /// unknown), or it is exiting. Never allocates, locks or makes a system call.
        ///
        /// For the heap sampler of `tracing-prof-alloc`, whose sampled allocations it walks faster
        /// than the platform unwinder (which also may take the dynamic loader's lock).
        #[inline(never)]
        pub fn walk_own_stack(out: &mut [usize]) -> Option<usize> {
            let ts = thread::LOCAL
                .try_with(|l| l.current.get())
                .unwrap_or(std::ptr::null());
            if ts.is_null() {
                return None;
            }
            // SAFETY: a state from `thread::acquire`, owned by this thread; states are never freed.
            let ts = unsafe { &*ts };
            let hint = ts.tid.load(Ordering::Relaxed).unsigned_abs() as usize;
            let mut ips = [0u64; MAX_CPU_FRAMES];
            let walk = unwind::own_stack(ts, &mut ips, hint);
            // From the third: the first is inside `own_stack`, the second is in this function
            // (neither is ever inlined), the third is where this function was called from.
            let found = ips.get(2..walk.depth).unwrap_or_default();
            if found.is_empty() {
                return None;
            }
            let n = found.len().min(out.len());
            for (o, &ip) in out.iter_mut().zip(found) {
                *o = ip as usize;
            }
            Some(n)
        }

        /// Stops sampling: deletes every thread's timer. The handler stays installed (a signal
        /// already queued is ignored). Samples still in the rings can be drained.
        pub fn stop() {
            let _one = STARTING
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            HZ.store(0, Ordering::Relaxed);
            thread::disarm_all();
        }

        /// Arms the calling thread if sampling runs and it is not armed yet: one thread-local
        /// read and a compare otherwise. The span layer calls it on enter, the tagging allocator
        /// on a thread's first allocation.
        #[inline]
        pub fn ensure_armed() {
            thread::ensure_armed();
        }

        /// Hands every recorded sample to `f`, oldest first per thread, and frees room in the
        /// rings. One reader at a time: returns `false` at once, reading nothing, when another
        /// reader is draining. Call it often enough that rings do not fill: a thread's ring holds
        /// about 60 samples of 30 frames, 0.6 s of one busy thread at 100 Hz.
        pub fn drain(mut f: impl FnMut(RawSample<'_>)) -> bool {
            thread::drain(|tid, header, body| {
                let (link, ips) = if (header >> LINKED_BIT) & 1 == 1 && body.len() >= 3 {
                    (TraceLink::from_words(body), &body[3..])
                } else {
                    (TraceLink::NONE, body)
                };
                f(RawSample {
                    tid,
                    tag: header as u32,
                    weight: (header >> 40) & 0xffff,
                    truncated: (header >> 56) & 1 == 1,
                    long_poll: (header >> 57) & 1 == 1,
                    link,
                    ips,
                })
            })
        }

        /// Rebuilds the unwinder if libraries were loaded or unloaded since it was built (a cheap
        /// check otherwise). Returns the number of modules with unwind tables.
        pub fn refresh_modules() -> usize {
            modules::refresh()
        }

        /// Whether our SIGPROF handler is still installed. If someone replaced it, stop sampling:
        /// our timers' signals now go to their handler.
        pub fn handler_installed() -> bool {
            signal::still_ours()
        }

        /// Counters about the sampler.
        pub fn stats() -> CpuSamplerStats {
            let t = thread::totals();
            let (unwind_cache_hits, unwind_cache_misses) = unwind::cache_stats();
            CpuSamplerStats {
                unwind_cache_hits,
                unwind_cache_misses,
                hz: hz(),
                samples: t.samples,
                dropped: t.dropped,
                truncated: t.truncated,
                handler_runs: t.handled,
                frames: t.frames,
                handler_ns: t.handler_ns,
                handler_ns_histogram: t.handler_hist,
                threads_live: t.live,
                threads_armed: thread::ARMED.load(Ordering::Relaxed),
                arm_failures: thread::ARM_FAILURES.load(Ordering::Relaxed),
                last_arm_error: thread::LAST_ARM_ERROR.load(Ordering::Relaxed),
                threads_blocking: thread::BLOCKED.load(Ordering::Relaxed),
                foreign_signals: signal::FOREIGN.load(Ordering::Relaxed),
                late_signals: signal::LATE.load(Ordering::Relaxed),
            }
        }

        fn register_fork_handler() {
            static ONCE: std::sync::Once = std::sync::Once::new();
            extern "C" fn child() {
                HZ.store(0, Ordering::Relaxed);
                thread::after_fork_in_child();
            }
            ONCE.call_once(|| {
                // SAFETY: registers a plain function with no preparation or parent handler; it
                // only stores to atomics, which is what a child of fork may do.
                unsafe { libc::pthread_atfork(None, None, Some(child)) };
            });
        }
    }

    pub use api::*;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handler_time_buckets_and_quantiles() {
        assert_eq!(handler_bucket(0), 0);
        assert_eq!(handler_bucket(300), 0);
        assert_eq!(handler_bucket(384), 1);
        assert_eq!(handler_bucket(512), 2);
        assert_eq!(handler_bucket(1000), 3);
        assert_eq!(handler_bucket(1024), 4);
        assert_eq!(handler_bucket(u64::MAX), HANDLER_BUCKETS - 1);
        for b in 0..HANDLER_BUCKETS - 1 {
            assert_eq!(handler_bucket(bucket_floor(b + 1)), b + 1);
            assert_eq!(handler_bucket(bucket_floor(b + 1) - 1), b);
        }
        let mut s = CpuSamplerStats::default();
        assert_eq!(s.handler_ns_quantile(0.5), None);
        s.handler_ns_histogram[handler_bucket(1_100)] = 90; // 1024..1536
        s.handler_ns_histogram[handler_bucket(20_000)] = 10; // 16384..24576
        assert_eq!(s.handler_ns_quantile(0.5), Some(1280));
        assert_eq!(s.handler_ns_quantile(0.9), Some(1280));
        assert_eq!(s.handler_ns_quantile(0.95), Some(20480));
    }
}
