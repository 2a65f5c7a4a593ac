//! One record per thread for tracing-prof: who the thread is (its OS id and name) and which span
//! path it is in since when, in one registry that every part of the profiler reads, that reuses
//! the records of exited threads and that a child of `fork` puts right.
//!
//! Each part of the profiler used to keep its own list of threads and read the thread's id
//! itself. Now:
//! - the allocator (`tracing-prof-alloc`) copies the id and name into the counter table a thread
//!   takes on its first allocation, and the name again when the thread exits;
//! - the CPU sampler (`tracing-prof-cpu`) arms each thread's CPU-time timer with the id;
//! - the span layer (`tracing-prof-core`) publishes the span path the thread is in on every
//!   enter and exit ([`ThreadRecord::publish`]), keeps the thread's table of span times with
//!   the record ([`ThreadRecord::set_attachment`]), and its in-flight view lists the threads
//!   that entered spans ([`for_each`]).
//!
//! ```
//! let me = tracing_prof_thread::current().expect("a record");
//! assert_eq!(me.tid(), tracing_prof_thread::os_tid());
//! me.publish(7, 1_000);
//! assert_eq!(me.now(), (7, 1_000));
//! ```
//!
//! # Cost
//! - A thread's first [`current`] claims a record: an exited thread's, or a new one from the
//!   system allocator (never the global allocator: the tagging allocator asks for the record on
//!   a thread's first allocation). It reads the thread's id and name (one `gettid`, one
//!   `prctl(PR_GET_NAME)`) and registers a thread-exit destructor that hands the record back.
//! - Every later [`current`]: one thread-local read and a compare.
//! - [`ThreadRecord::publish`]: two relaxed stores to the record's cache line, which only its
//!   own thread writes (readers only read it).
//! - Memory: a record is one 64-byte cache line, never freed, reused by later threads.
//!
//! # Fork
//! In a child of `fork` only the forking thread runs: [`after_fork_in_child`] hands back every
//! other thread's record and gives the caller's its new id. This crate registers no `atfork`
//! handler of its own (registering one on a thread's first allocation could wait on a lock
//! that a `fork` in progress holds); the profiler's handlers call it, first, from the CPU
//! sampler's and the profiler's child handlers, and a second call in the same child changes
//! nothing.
//!
//! # Limitations
//! - The name is read when the record is claimed and again by [`ThreadRecord::refresh_name`]
//!   (the allocator calls it at thread exit, the layer on a thread's first enter): a thread
//!   renamed in between shows its earlier name until then.
//! - A thread whose first call comes during its own TLS teardown, once thread-exit destructors
//!   can no longer be registered, keeps its record for the process's life.
//! - A process that forks before the profiler registered its handlers (no profiler built, no
//!   CPU sampler started yet) keeps the parent's other records claimed in the child (64 bytes
//!   each, and what is kept with them), and the forking thread's record keeps the parent's id
//!   until a cold path reads it again ([`refresh_tid`]: the CPU sampler does, arming the
//!   thread's timer). The in-flight view leaves out threads that are not in the process.
//! - Thread ids and names are Linux's; elsewhere they read as 0 and empty.

mod registry;

pub use registry::{
    ThreadRecord, after_fork_in_child, current, for_each, for_each_ever, os_tid, refresh_tid,
};
