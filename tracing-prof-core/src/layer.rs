//! The `tracing-subscriber` layer.

use crate::clock::{Clock, SystemClock};
use crate::{entered, span_path};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use tracing_core::Subscriber;
use tracing_core::span::{Attributes, Id};
use tracing_prof_alloc::{Tag, TagGuard};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// What the layer knows of a span: copied freely (the per-thread cache, the entered stack).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SpanState {
    /// The interned path of this span.
    pub(crate) tag: Tag,
    /// The interned path of its parent ([`Tag::NO_SPAN`] for a root).
    pub(crate) parent: Tag,
    pub(crate) created_ns: u64,
    /// The allocator's instance for it (0: untracked), where its busy time and the sampled
    /// memory it holds accrue.
    pub(crate) instance: u32,
}

/// What the layer keeps in a span's extensions.
#[derive(Debug)]
struct SpanData {
    state: SpanState,
    /// Busy time of a span without an instance slot (rare: more spans open than slots).
    untracked_busy: Option<Arc<AtomicU64>>,
}

/// Spans this thread created or entered lately, so that entering and closing them needs no
/// registry lookup: a direct-mapped table of `(span id, state)`. An entry is only used while
/// its span instance is still open: a closed span's id may be given to a new span, but the new
/// span gets a new instance, so the old entry no longer matches.
const RECENT_SPANS: usize = 16;

thread_local! {
    static RECENT: [Cell<(u64, SpanState)>; RECENT_SPANS] =
        const { [const { Cell::new((0, SpanState { tag: Tag::NO_SPAN, parent: Tag::NO_SPAN, created_ns: 0, instance: 0 })) }; RECENT_SPANS] };
}

fn recent_slot(id: u64) -> usize {
    (id ^ (id >> 16)) as usize % RECENT_SPANS
}

#[inline]
fn recent(id: u64) -> Option<SpanState> {
    RECENT
        .try_with(|r| r[recent_slot(id)].get())
        .ok()
        .filter(|(i, s)| *i == id && tracing_prof_alloc::is_open(s.instance))
        .map(|(_, s)| s)
}

#[inline]
fn remember(id: u64, state: SpanState) {
    if state.instance != 0 {
        let _ = RECENT.try_with(|r| r[recent_slot(id)].set((id, state)));
    }
}

/// Records, per span path, span counts, wall/busy/idle time and CPU time, and makes the
/// innermost entered span's path current for [`TaggingAllocator`](tracing_prof_alloc::TaggingAllocator).
///
/// Add it to a [`tracing_subscriber::registry()`]. Usually made by
/// [`ProfilerBuilder::build`](crate::ProfilerBuilder::build); `ProfileLayer::new()` gives a layer
/// whose numbers [`Profile::capture`](crate::Profile::capture) can read without a background thread.
///
/// Per enter: the span's state from this thread's recent spans (a span created or entered
/// lately on this thread), else a registry lookup (its lock-free slab and the span's extensions
/// read lock); thread-local writes; one monotonic clock read (the CPU's time-stamp counter where
/// the kernel uses it); with exact CPU time, one per-thread CPU clock read (a system call; see
/// [`CpuClock`](crate::CpuClock)). Per exit the same less the lookup, plus stores to this
/// thread's own counters and one atomic add to the span's busy time. Per creation: the parent's
/// path (the current tag, for a contextual parent), the path interned (a thread-local cache),
/// one allocation (the span's extensions entry). No global lock on any of them.
#[derive(Debug, Clone)]
pub struct ProfileLayer<C = SystemClock> {
    clock: C,
    cpu_time: bool,
}

impl ProfileLayer {
    /// A layer with the real clock, reading no CPU clock on enter and exit (per-span CPU time
    /// comes from the CPU sampler of a [`Profiler`](crate::Profiler)).
    pub fn new() -> Self {
        crate::monotonic::init();
        ProfileLayer {
            clock: SystemClock::default(),
            cpu_time: false,
        }
    }
}

impl Default for ProfileLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> ProfileLayer<C> {
    /// Whether to read the thread's CPU clock on every enter and exit, for exact per-span CPU
    /// time ([`CpuTime::Exact`](crate::CpuTime::Exact)): two system calls per enter..exit
    /// interval.
    pub fn with_cpu_time(mut self, on: bool) -> Self {
        self.cpu_time = on;
        self
    }

    /// Uses `clock` for wall and CPU time (tests use this to make durations exact).
    pub fn with_clock<C2: Clock>(self, clock: C2) -> ProfileLayer<C2> {
        ProfileLayer {
            clock,
            cpu_time: self.cpu_time,
        }
    }

    /// The state of span `id`: from this thread's recent spans, or looked up in the registry
    /// (and remembered), with the shared busy counter of an untracked span.
    #[inline]
    fn state<S>(id: &Id, ctx: &Context<'_, S>) -> Option<(SpanState, Option<Arc<AtomicU64>>)>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        if let Some(state) = recent(id.into_u64()) {
            return Some((state, None));
        }
        let span = ctx.span(id)?;
        let ext = span.extensions();
        let data = ext.get::<SpanData>()?;
        remember(id.into_u64(), data.state);
        Some((data.state, data.untracked_busy.clone()))
    }
}

/// How the most recently installed layer measures CPU time: 0 off, 1 thread clock, 2 a clock
/// that splits user and system time.
static EXACT_CPU: AtomicU8 = AtomicU8::new(0);

/// How CPU time is measured on enter and exit by the layer installed last.
pub(crate) fn exact_cpu_source() -> tracing_prof_model::CpuSource {
    match EXACT_CPU.load(Ordering::Relaxed) {
        1 => tracing_prof_model::CpuSource::ThreadClock,
        2 => tracing_prof_model::CpuSource::Rusage,
        _ => tracing_prof_model::CpuSource::Off,
    }
}

impl<S, C> Layer<S> for ProfileLayer<C>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    C: Clock,
{
    fn on_register_dispatch(&self, _subscriber: &tracing::Dispatch) {
        let mode = match (self.cpu_time, self.clock.splits_cpu()) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => 2,
        };
        EXACT_CPU.store(mode, Ordering::Relaxed);
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        // A contextual parent is the innermost span entered on this thread, whose path is the
        // tag current now (read before the profiler's own tag replaces it).
        let current = tracing_prof_alloc::current_tag();
        let _profiler = TagGuard::new(Tag::PROFILER);
        let parent = match attrs.parent() {
            Some(p) => Self::state(p, &ctx).map_or(Tag::NO_SPAN, |(s, _)| s.tag),
            None if attrs.is_contextual() => current,
            None => Tag::NO_SPAN,
        };
        let tag = span_path::intern(parent, attrs.metadata());
        let instance = tracing_prof_alloc::open_span_instance();
        let state = SpanState {
            tag,
            parent,
            created_ns: self.clock.now_ns(),
            instance,
        };
        let data = SpanData {
            state,
            untracked_busy: (instance == 0).then(|| Arc::new(AtomicU64::new(0))),
        };
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(data);
            remember(id.into_u64(), state);
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some((state, untracked)) = Self::state(id, &ctx) {
            entered::enter(id.into_u64(), state, untracked, &self.clock, self.cpu_time);
        }
    }

    fn on_exit(&self, id: &Id, _ctx: Context<'_, S>) {
        entered::exit(id.into_u64(), &self.clock, self.cpu_time);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some((state, untracked)) = Self::state(&id, &ctx) else {
            return;
        };
        let busy = match untracked {
            Some(b) => b.load(Ordering::Relaxed),
            None => tracing_prof_alloc::close_span_instance(state.instance, state.tag),
        };
        let wall = self.clock.now_ns().saturating_sub(state.created_ns);
        tracing_prof_alloc::record_span_closed(state.tag, wall, wall.saturating_sub(busy));
    }
}
