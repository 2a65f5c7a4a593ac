//! `fork` while the profiler runs.
//!
//! A child of `fork` has one thread, the one that forked, and a copy of every lock as it was: a
//! lock another thread held at that instant stays held forever in the child, and the child's
//! first span on a new path, or its first capture, would wait for it for good. So the profiler
//! registers `pthread_atfork` handlers: before the fork, the forking thread takes every lock of
//! the profiler that a child may need (in the one order any code takes them in: the runtime's,
//! that is the pause switch, the CPU sample store, span paths, label values and thread names;
//! then the heap stacks' code (see `capture`), the symbolizer's modules, names and cache; last,
//! the gate of every profiler handle's own small state, [`ForkSafe`], under which no other lock
//! is ever taken), and after it, parent and child alike release them. A fork therefore waits
//! for a symbolization batch in progress (tens of milliseconds at worst), never the reverse.
//!
//! What a child inherits: the counters as they were (its own allocations and spans are counted
//! on from there), the span paths, and a profiler handle whose `snapshot()` works; not the
//! aggregator thread (no files are written by the child unless it builds a profiler of its
//! own), nor CPU sampling (POSIX timers do not survive `fork`; see `tracing-prof-cpu`).

use crate::runtime::RUNTIME;
use std::cell::RefCell;
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};

/// Held for reading by whoever holds a [`ForkSafe`] lock, for writing by the prepare handler:
/// so no such lock is held by another thread at the fork, however many profilers there are.
static GATE: RwLock<()> = RwLock::new(());

/// A mutex that is never held at a `fork` (a profiler handle's leaks, giants, CPU error). Hold
/// it briefly and take no other lock under it.
#[derive(Debug, Default)]
pub(crate) struct ForkSafe<T>(Mutex<T>);

/// A [`ForkSafe`] lock's guard.
pub(crate) struct ForkSafeGuard<'a, T> {
    inner: MutexGuard<'a, T>,
    _gate: RwLockReadGuard<'static, ()>,
}

impl<T> ForkSafe<T> {
    pub(crate) const fn new(value: T) -> Self {
        Self(Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> ForkSafeGuard<'_, T> {
        let gate = GATE.read().unwrap_or_else(PoisonError::into_inner);
        ForkSafeGuard {
            inner: self.0.lock().unwrap_or_else(PoisonError::into_inner),
            _gate: gate,
        }
    }
}

impl<T> std::ops::Deref for ForkSafeGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> std::ops::DerefMut for ForkSafeGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

thread_local! {
    /// The guards the prepare handler took, on the forking thread.
    static HELD: RefCell<Vec<Box<dyn std::any::Any>>> = const { RefCell::new(Vec::new()) };
}

extern "C" fn prepare() {
    // Only the parent's allocator and malloc locks are free at this point (glibc takes its own
    // after user handlers), so allocating here is fine.
    let mut held: Vec<Box<dyn std::any::Any>> = Vec::with_capacity(16);
    held.extend(RUNTIME.lock_for_fork());
    held.push(crate::capture::lock_for_fork());
    held.extend(crate::symbolize::lock_for_fork());
    held.push(Box::new(
        GATE.write().unwrap_or_else(PoisonError::into_inner),
    ));
    let _ = HELD.try_with(|h| *h.borrow_mut() = held);
}

extern "C" fn release() {
    let _ = HELD.try_with(|h| h.borrow_mut().clear());
}

extern "C" fn release_in_child() {
    // The threads' records first (the other threads' given back, the caller's new id), then
    // what copies from them: the allocator's tables.
    tracing_prof_thread::after_fork_in_child();
    tracing_prof_alloc::__private::after_fork_in_child();
    release();
    crate::running::after_fork_in_child();
    crate::span_index::after_fork_in_child();
}

/// Registers the handlers, once per process.
pub(crate) fn register() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: plain functions with the C ABI that never unwind; they only lock and unlock
        // the profiler's own mutexes on the forking thread.
        unsafe { libc::pthread_atfork(Some(prepare), Some(release), Some(release_in_child)) };
    });
}
