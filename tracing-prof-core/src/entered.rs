//! The spans entered on this thread, innermost last: what exit needs to measure and restore.
//!
//! Busy and CPU time are recorded as *self* time, the way pprof expects sample values: when a
//! span exits, its whole interval is subtracted from the enclosing frame on this thread if that
//! frame is its parent path, so `-top`'s flat column is the span's own time and `cum` sums the
//! subtree without counting anything twice. A child that runs elsewhere (a spawned task) never
//! ran inside the parent's interval and is not subtracted.
//!
//! A fixed-size array in a thread-local, so enter and exit never allocate; a frame is a few
//! words (the CPU clock readings of exact CPU time sit in an array of their own, touched only
//! then). Deeper nesting than [`MAX_DEPTH`] still switches allocation tags correctly (for LIFO
//! nesting) but is not timed.

use crate::clock::{Clock, CpuSample};
use crate::span_index::{self, SpanState};
use crate::span_times::{self, Writer};
use crate::trace_link::{self, Link};
use std::cell::RefCell;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing_prof_alloc::__private::set_current_span;
use tracing_prof_alloc::Tag;
use tracing_prof_thread::ThreadRecord;

/// Entered spans tracked per thread.
pub const MAX_DEPTH: usize = 64;

/// Sentinel slot of a frame whose busy time goes to its span's extensions.
const NO_SLOT: u32 = u32::MAX;

/// Where an entered span's busy time accrues.
pub(crate) enum Home {
    /// Its entry of the span index (the common case).
    Index(span_index::Slot),
    /// A counter in its extensions (a span the span index had no room for).
    Extensions(Arc<AtomicU64>),
}

/// One entered span: plain data in one cache line, copied out on exit.
#[derive(Clone, Copy)]
#[repr(align(64))]
struct Entered {
    id: u64,
    /// The span-instance word current with this span (see `set_current_span`), and the one
    /// before it, restored on exit.
    instance: u64,
    prev_instance: u64,
    start_ns: u64,
    /// Time of child spans' intervals nested in this one, to subtract from it.
    child_busy_ns: u64,
    tag: Tag,
    parent: Tag,
    prev_tag: Tag,
    /// The span's entry in the span index, or [`NO_SLOT`] (its busy time then goes to
    /// `Stack::extensions` at the same depth).
    slot: u32,
    /// Already entered further down this stack: the outer interval measures it.
    reentry: bool,
    /// Whether entering it changed the thread's trace link (the one before is then in
    /// `Stack::links` at the same depth); without the `opentelemetry` feature, never.
    link_changed: bool,
}

/// The CPU clock readings of a frame, with exact CPU time only.
#[derive(Clone, Copy, Default)]
struct Cpu {
    start: CpuSample,
    children: CpuSample,
}

struct Stack {
    frames: [Entered; MAX_DEPTH],
    cpu: [Cpu; MAX_DEPTH],
    /// The thread's trace link before each frame that changed it was entered, restored on its
    /// exit (an array of zero-sized values without the `opentelemetry` feature; apart from the
    /// frames, which stay one cache line each with it).
    links: [Link; MAX_DEPTH],
    /// Where the busy time of a frame outside the span index goes, at the frame's depth.
    extensions: [Option<Arc<AtomicU64>>; MAX_DEPTH],
    len: usize,
    /// Entries beyond MAX_DEPTH, not timed.
    untracked: usize,
    /// Where this thread shows which path it is in (its record, see `in_flight`).
    now: Option<&'static ThreadRecord>,
    /// Where this thread's span times go (kept with its record, see `span_times`); `None`:
    /// the shared table.
    times: Option<&'static span_times::Table>,
    /// Whether the record and the table were asked for already (there may be none).
    attached: bool,
    /// Whether the thread entered a span already.
    asked: bool,
    /// Whether this thread is an async runtime's worker (see `long_poll`).
    worker: bool,
}

/// Stops this thread's publishing to its record when the thread exits: the record is given
/// back right after (its destructor was registered before this one, when the record was
/// claimed), and a span entered by a later destructor must not write into a record that
/// another thread may take. A thread-local of its own, touched once (on the first enter or
/// close), so that the stack itself has no destructor: it is a plain thread-local access on
/// every enter and exit, and keeps working while other thread-locals are destroyed. (What the
/// stack holds at thread exit is not dropped: the extension counters of spans still entered
/// then, 24 bytes each, are leaked.)
struct Unlist;

impl Drop for Unlist {
    fn drop(&mut self) {
        let _ = STACK.try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut() {
                // Later span times of this thread go to the shared table: the record's table
                // goes with the record to the next thread that takes it.
                s.times = None;
                if let Some(record) = s.now.take() {
                    record.set_listed(false);
                }
            }
        });
    }
}

const EMPTY: Entered = Entered {
    id: 0,
    instance: 0,
    prev_instance: 0,
    start_ns: 0,
    child_busy_ns: 0,
    tag: Tag::NO_SPAN,
    parent: Tag::NO_SPAN,
    prev_tag: Tag::NO_SPAN,
    slot: NO_SLOT,
    reentry: false,
    link_changed: false,
};

const NO_CPU: Cpu = Cpu {
    start: CpuSample {
        total_ns: 0,
        user_ns: 0,
        sys_ns: 0,
    },
    children: CpuSample {
        total_ns: 0,
        user_ns: 0,
        sys_ns: 0,
    },
};

thread_local! {
    static STACK: RefCell<ManuallyDrop<Stack>> = const {
        RefCell::new(ManuallyDrop::new(Stack {
            frames: [EMPTY; MAX_DEPTH],
            cpu: [NO_CPU; MAX_DEPTH],
            links: [trace_link::UNRESOLVED; MAX_DEPTH],
            extensions: [const { None }; MAX_DEPTH],
            len: 0,
            untracked: 0,
            now: None,
            times: None,
            attached: false,
            asked: false,
            worker: false,
        }))
    };
    static UNLIST: Unlist = const { Unlist };
}

/// This thread's stack, for the rest of the thread's life.
///
/// Reached through a pointer rather than inside a `try_with` closure: the enter and exit paths
/// then compile into one function, without a closure's captures stored by the caller and read
/// back, wider, by an outlined `try_with` (a store-forwarding stall measured at about a third
/// of the enter path's samples).
#[inline(always)]
fn stack() -> Option<&'static RefCell<ManuallyDrop<Stack>>> {
    STACK
        .try_with(|s| {
            let s: *const RefCell<ManuallyDrop<Stack>> = s;
            // SAFETY: the thread-local is const-initialised and has no destructor (the stack
            // is `ManuallyDrop`), so its storage is never torn down while this thread runs:
            // the reference is valid for the rest of the thread. It cannot reach another
            // thread: `&RefCell` is not `Send`.
            unsafe { &*s }
        })
        .ok()
}

/// The thread's first enter or close: its record and its table of span times.
#[cold]
#[inline(never)]
fn attach(s: &mut Stack) {
    s.attached = true;
    // Asked before `UNLIST` is registered, so that the record's own destructor runs after it.
    s.now = tracing_prof_thread::current();
    s.times = s.now.and_then(span_times::table_of);
    if s.now.is_some() {
        let _ = UNLIST.try_with(|_| ());
    }
}

/// The thread's first enter: listed in its record, and whether it is a runtime worker.
#[cold]
#[inline(never)]
fn first_enter(s: &mut Stack) {
    s.asked = true;
    if !s.attached {
        attach(s);
    }
    if let Some(record) = s.now {
        // The name now, as the thread entered its first span (it may have been renamed since
        // its record was claimed, at its first allocation).
        record.refresh_name();
        record.publish(Tag::NO_SPAN.get(), 0);
        record.set_listed(true);
    }
    s.worker = s.now.is_some_and(crate::long_poll::is_worker);
}

/// Span `id` with `state` is entered on this thread.
///
/// Always inlined: `on_enter` calls it from two places (the span index and the span's
/// extensions), and as a call of its own it saved and restored six registers on every enter
/// (14 instructions an enter+exit under callgrind, 0.5 ns).
#[inline(always)]
pub(crate) fn enter(id: u64, state: SpanState, home: Home, clock: &impl Clock, cpu: bool) {
    // The tag is switched only where the exit can restore it: on a tracked frame, or as an
    // untracked level that exit restores from the frame below.
    let Some(Ok(mut guard)) = stack().map(RefCell::try_borrow_mut) else {
        return;
    };
    let s = &mut **guard;
    // SAFETY: the span's instance word (see `SpanState::instance`): an eager id, or an index
    // entry's cell, which is never unmapped and only ever accessed atomically, so that it
    // stays valid however long the word stays current (even past the span's close, as a
    // leaked enter guard leaves it: the closed cell then opens nothing).
    let (prev_tag, prev_instance) = unsafe { set_current_span(state.tag, state.instance) };
    let len = s.len;
    if len == 0 {
        // A thread's outermost span: make sure the CPU sampler covers it.
        tracing_prof_cpu::ensure_armed();
        if !s.asked {
            first_enter(s);
        }
    }
    if len == MAX_DEPTH {
        s.untracked += 1;
        if let Some(n) = s.now {
            n.publish(state.tag.get(), 0);
        }
        return;
    }
    let reentry = s.frames[..len].iter().any(|e| e.id == id);
    if cpu {
        s.cpu[len] = Cpu {
            start: if reentry {
                CpuSample::default()
            } else {
                clock.thread_cpu()
            },
            children: CpuSample::default(),
        };
    }
    let slot = match home {
        Home::Index(slot) => slot.index(),
        Home::Extensions(b) => {
            s.extensions[len] = Some(b);
            NO_SLOT
        }
    };
    let start_ns = if reentry { 0 } else { clock.now_ns() };
    // After the tag (see `exit`).
    let link_changed = trace_link::switch(state.link, &mut s.links[len]);
    s.frames[len] = Entered {
        id,
        instance: state.instance,
        prev_instance,
        start_ns,
        child_busy_ns: 0,
        tag: state.tag,
        parent: state.parent,
        prev_tag,
        slot,
        reentry,
        link_changed,
    };
    s.len = len + 1;
    if let Some(n) = s.now {
        n.publish(state.tag.get(), start_ns);
    }
    if s.worker && clock.is_monotonic() {
        tracing_prof_alloc::__private::set_stretch_start(start_ns);
    }
}

/// Span `id` is exited on this thread.
#[inline]
pub(crate) fn exit(id: u64, clock: &impl Clock, cpu: bool) {
    let Some(Ok(mut guard)) = stack().map(RefCell::try_borrow_mut) else {
        return;
    };
    let s = &mut **guard;
    if s.untracked > 0 {
        s.untracked -= 1;
        let below = s.frames[..s.len].last().map(|e| (e.tag, e.instance));
        let (tag, instance) = below.unwrap_or((Tag::NO_SPAN, 0));
        // SAFETY: a word `enter` made current before (see there), or none.
        unsafe { set_current_span(tag, instance) };
        if let Some(n) = s.now {
            n.publish(tag.get(), 0);
        }
        return;
    }
    let len = s.len;
    let Some(pos) = s.frames[..len].iter().rposition(|e| e.id == id) else {
        return; // exit without a matching enter on this thread: nothing to measure
    };
    let e = s.frames[pos];
    // Read only with exact CPU time: its array is a cache line apart from the frames.
    let cpu_frame = if cpu { s.cpu[pos] } else { NO_CPU };
    let extensions = if e.slot == NO_SLOT {
        s.extensions[pos].take()
    } else {
        None
    };
    // One clock read per exit, as before; a re-entry's exit measures nothing and reads none.
    let now_ns = if e.reentry { 0 } else { clock.now_ns() };
    if pos + 1 == len {
        // The link goes back before the tag, as enter set it after: a sample taken in between
        // is the span's, unlinked, never the code outside's, linked.
        if e.link_changed {
            trace_link::set_current(s.links[pos]);
        }
        // SAFETY: the word current before this span's enter, which `enter` made current
        // (see there), or none.
        unsafe { set_current_span(e.prev_tag, e.prev_instance) };
        if let Some(n) = s.now {
            n.publish(e.prev_tag.get(), now_ns);
        }
        if s.worker && clock.is_monotonic() {
            // The span below resumes: a new stretch (none outside every span).
            tracing_prof_alloc::__private::set_stretch_start(if pos > 0 { now_ns } else { 0 });
        }
    } else {
        out_of_order(s, pos, len, &e);
    }
    s.len = len - 1;
    if e.reentry {
        return;
    }
    let busy = now_ns.saturating_sub(e.start_ns);
    let used = if cpu {
        clock.thread_cpu().since(cpu_frame.start)
    } else {
        CpuSample::default()
    };
    if let Some(i) = pos.checked_sub(1)
        && s.frames[i].tag == e.parent
    {
        s.frames[i].child_busy_ns += busy;
        if cpu {
            s.cpu[i].children.add(used);
        }
    }
    match extensions {
        Some(b) => {
            b.fetch_add(busy, Ordering::Relaxed);
        }
        None => span_index::add_busy(span_index::Slot::at(e.slot), e.id, busy),
    }
    // The span's own time: a child span's interval counts for the child.
    let own_busy = busy.saturating_sub(e.child_busy_ns);
    if s.worker {
        crate::runtime::RUNTIME.long_polls.exited(e.tag, own_busy);
    }
    let times = Writer::own(s.times);
    if cpu {
        let own = used.since(cpu_frame.children);
        times.interval(e.tag, own_busy, own.total_ns, own.user_ns, own.sys_ns);
    } else {
        times.interval(e.tag, own_busy, 0, 0, 0);
    }
}

/// A span of path `tag` closed on this thread after `wall_ns`, of which `idle_ns` not entered.
#[inline]
pub(crate) fn closed(tag: Tag, wall_ns: u64, idle_ns: u64, errored: bool) {
    let times = match stack().map(RefCell::try_borrow_mut) {
        Some(Ok(mut guard)) => {
            let s = &mut **guard;
            if !s.attached {
                attach(s);
            }
            Writer::own(s.times)
        }
        // TLS torn down, or a close from inside enter or exit: the shared table.
        _ => span_times::shared(),
    };
    times.closed(tag, wall_ns, idle_ns, errored);
}

/// Exit of the frame at `pos` below the top (`len` frames): the frames above move down one, and
/// the one entered right after it now restores to what it would have restored.
#[cold]
#[inline(never)]
fn out_of_order(s: &mut Stack, pos: usize, len: usize, e: &Entered) {
    let prev_link = s.links[pos];
    s.frames[pos..len].rotate_left(1);
    s.cpu[pos..len].rotate_left(1);
    s.links[pos..len].rotate_left(1);
    s.extensions[pos..len].rotate_left(1);
    let next = &mut s.frames[pos];
    next.prev_tag = e.prev_tag;
    next.prev_instance = e.prev_instance;
    if e.link_changed {
        // The next one now restores what this one would have (if it changed nothing itself,
        // its link was this one's).
        next.link_changed = true;
        s.links[pos] = prev_link;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        static NOW: Cell<u64> = const { Cell::new(1_000) };
    }

    /// A clock this thread moves by hand.
    struct Manual;

    impl Clock for Manual {
        fn now_ns(&self) -> u64 {
            NOW.with(Cell::get)
        }
        fn thread_cpu(&self) -> CpuSample {
            CpuSample::default()
        }
    }

    fn advance(ns: u64) {
        NOW.with(|n| n.set(n.get() + ns));
    }

    fn state(tag: u32, parent: u32) -> SpanState {
        SpanState {
            tag: Tag::new(tag),
            parent: Tag::new(parent),
            created_ns: 0,
            instance: 0,
            link: Default::default(),
        }
    }

    #[test]
    fn spans_outside_the_index_keep_their_busy_time_in_their_extensions() {
        let (outer, inner) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        enter(
            1,
            state(500, 0),
            Home::Extensions(outer.clone()),
            &Manual,
            false,
        );
        advance(100);
        enter(
            2,
            state(501, 500),
            Home::Extensions(inner.clone()),
            &Manual,
            false,
        );
        advance(40);
        // Out of order: the outer one exits first; the inner one's counter moves down with it.
        exit(1, &Manual, false);
        advance(7);
        exit(2, &Manual, false);
        assert_eq!(outer.load(Ordering::Relaxed), 140);
        assert_eq!(inner.load(Ordering::Relaxed), 47);
        // Each counter is let go once its span exits.
        assert_eq!(
            (Arc::strong_count(&outer), Arc::strong_count(&inner)),
            (1, 1)
        );
        assert_eq!(tracing_prof_alloc::current_tag(), Tag::NO_SPAN);
    }

    /// Entering makes a span's link current; exits restore the one before, out of order too.
    #[cfg(feature = "opentelemetry")]
    #[test]
    fn links_are_restored_on_exit_in_and_out_of_order() {
        use tracing_prof_cpu::{TraceLink, trace_link::current};
        let link = |n: u64| TraceLink {
            trace_id: u128::from(n) << 64 | 9,
            span_id: n,
        };
        let linked = |tag, parent, n| SpanState {
            link: link(n),
            ..state(tag, parent)
        };
        let home = || Home::Index(span_index::Slot::at(NO_SLOT));
        enter(
            11,
            linked(600, 0, 1),
            Home::Index(span_index::Slot::at(NO_SLOT)),
            &Manual,
            false,
        );
        enter(
            12,
            linked(601, 600, 2),
            Home::Index(span_index::Slot::at(NO_SLOT)),
            &Manual,
            false,
        );
        enter(
            13,
            linked(602, 601, 3),
            Home::Index(span_index::Slot::at(NO_SLOT)),
            &Manual,
            false,
        );
        assert_eq!(current(), link(3));
        exit(13, &Manual, false);
        assert_eq!(current(), link(2));
        enter(
            14,
            linked(603, 601, 4),
            Home::Index(span_index::Slot::at(NO_SLOT)),
            &Manual,
            false,
        );
        // The middle one exits first: the innermost stays current, and its exit restores what
        // the middle one would have restored.
        exit(12, &Manual, false);
        assert_eq!(current(), link(4));
        exit(14, &Manual, false);
        assert_eq!(current(), link(1));
        exit(11, &Manual, false);
        assert_eq!(current(), TraceLink::NONE);

        // A child with its parent's link changes nothing on enter; when the parent exits
        // first, the child's exit restores what the parent would have.
        enter(21, linked(610, 0, 1), home(), &Manual, false);
        enter(22, linked(611, 610, 2), home(), &Manual, false);
        enter(23, linked(612, 611, 2), home(), &Manual, false);
        exit(22, &Manual, false);
        assert_eq!(current(), link(2));
        exit(23, &Manual, false);
        assert_eq!(current(), link(1));
        exit(21, &Manual, false);
        assert_eq!(current(), TraceLink::NONE);
    }
}
