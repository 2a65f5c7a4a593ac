//! The spans entered on this thread, innermost last: what exit needs to measure and restore.
//!
//! Busy and CPU time are recorded as *self* time, the way pprof expects sample values: when a
//! span exits, its whole interval is subtracted from the enclosing frame on this thread if that
//! frame is its parent path, so `-top`'s flat column is the span's own time and `cum` sums the
//! subtree without counting anything twice. A child that runs elsewhere (a spawned task) never
//! ran inside the parent's interval and is not subtracted.
//!
//! A fixed-size array in a thread-local, so enter and exit never allocate. Deeper nesting than
//! [`MAX_DEPTH`] still switches allocation tags correctly (for LIFO nesting) but is not timed.

use crate::clock::{Clock, CpuSample};
use crate::layer::SpanState;
use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing_prof_alloc::{Tag, set_current_span};

/// Entered spans tracked per thread.
pub const MAX_DEPTH: usize = 64;

struct Entered {
    id: u64,
    state: SpanState,
    /// Where the busy time of a span without an instance slot goes.
    untracked_busy: Option<Arc<AtomicU64>>,
    /// Tag and span instance current before this span was entered, restored on exit.
    prev: (Tag, u32),
    start_ns: u64,
    start_cpu: CpuSample,
    /// Already entered further down this stack: the outer interval measures it.
    reentry: bool,
    /// Time of child spans' intervals nested in this one, to subtract from it.
    child_busy_ns: u64,
    child_cpu: CpuSample,
}

struct Stack {
    frames: [Option<Entered>; MAX_DEPTH],
    len: usize,
    /// Entries beyond MAX_DEPTH, not timed.
    untracked: usize,
}

thread_local! {
    static STACK: RefCell<Stack> = const {
        RefCell::new(Stack { frames: [const { None }; MAX_DEPTH], len: 0, untracked: 0 })
    };
}

/// Span `id` with `state` is entered on this thread.
#[inline]
pub(crate) fn enter(
    id: u64,
    state: SpanState,
    untracked_busy: Option<Arc<AtomicU64>>,
    clock: &impl Clock,
    cpu: bool,
) {
    // The tag is switched only where the exit can restore it: on a tracked frame, or as an
    // untracked level that exit restores from the frame below.
    let _ = STACK.try_with(|s| {
        let Ok(mut s) = s.try_borrow_mut() else {
            return;
        };
        let prev = set_current_span(state.tag, state.instance);
        if s.len == 0 {
            // A thread's outermost span: make sure the CPU sampler covers it.
            tracing_prof_cpu::ensure_armed();
        }
        if s.len == MAX_DEPTH {
            s.untracked += 1;
            return;
        }
        let reentry = s.frames[..s.len].iter().flatten().any(|e| e.id == id);
        let start_cpu = if cpu && !reentry {
            clock.thread_cpu()
        } else {
            CpuSample::default()
        };
        let len = s.len;
        s.frames[len] = Some(Entered {
            id,
            state,
            untracked_busy,
            prev,
            start_ns: if reentry { 0 } else { clock.now_ns() },
            start_cpu,
            reentry,
            child_busy_ns: 0,
            child_cpu: CpuSample::default(),
        });
        s.len += 1;
    });
}

/// Span `id` is exited on this thread.
#[inline]
pub(crate) fn exit(id: u64, clock: &impl Clock, cpu: bool) {
    let _ = STACK.try_with(|s| {
        let Ok(mut s) = s.try_borrow_mut() else {
            return;
        };
        if s.untracked > 0 {
            s.untracked -= 1;
            let below = s.frames[..s.len]
                .last()
                .and_then(|e| e.as_ref())
                .map(|e| (e.state.tag, e.state.instance));
            let (tag, instance) = below.unwrap_or((Tag::NO_SPAN, 0));
            set_current_span(tag, instance);
            return;
        }
        let len = s.len;
        let Some(pos) = s.frames[..len]
            .iter()
            .rposition(|e| e.as_ref().is_some_and(|e| e.id == id))
        else {
            return; // exit without a matching enter on this thread: nothing to measure
        };
        let Some(e) = s.frames[pos].take() else {
            return;
        };
        if pos + 1 == len {
            set_current_span(e.prev.0, e.prev.1);
        } else {
            // Out-of-order exit: the span entered right after this one now restores to what
            // this one would have restored.
            s.frames[pos..len].rotate_left(1);
            if let Some(next) = s.frames[pos].as_mut() {
                next.prev = e.prev;
            }
        }
        s.len -= 1;
        if e.reentry {
            return;
        }
        let busy = clock.now_ns().saturating_sub(e.start_ns);
        let used = if cpu {
            clock.thread_cpu().since(e.start_cpu)
        } else {
            CpuSample::default()
        };
        if let Some(Some(below)) = pos.checked_sub(1).map(|i| s.frames[i].as_mut())
            && below.state.tag == e.state.parent
        {
            below.child_busy_ns += busy;
            below.child_cpu.add(used);
        }
        drop(s);
        if !tracing_prof_alloc::add_busy(e.state.instance, busy)
            && let Some(b) = &e.untracked_busy
        {
            b.fetch_add(busy, Ordering::Relaxed);
        }
        let own = used.since(e.child_cpu);
        tracing_prof_alloc::record_interval(
            e.state.tag,
            busy.saturating_sub(e.child_busy_ns),
            own.total_ns,
            own.user_ns,
            own.sys_ns,
        );
    });
}
