//! The `tracing-subscriber` layer.

use crate::clock::{Clock, SystemClock};
use crate::{entered, span_path};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use tracing_core::Subscriber;
use tracing_core::span::{Attributes, Id};
use tracing_prof_alloc::{Tag, TagGuard};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// What the layer keeps per span instance, in the span's extensions.
#[derive(Debug)]
pub(crate) struct SpanState {
    /// The interned path of this span.
    pub(crate) tag: Tag,
    /// The interned path of its parent ([`Tag::NO_SPAN`] for a root).
    pub(crate) parent: Tag,
    pub(crate) created_ns: u64,
    /// Sum of this span's enter..exit intervals, for its idle time at close.
    pub(crate) busy_ns: AtomicU64,
    /// The allocator's instance for it (0: untracked), to count what outlives it.
    pub(crate) instance: u32,
}

/// Records, per span path, span counts, wall/busy/idle time and CPU time, and makes the
/// innermost entered span's path current for [`TaggingAllocator`](tracing_prof_alloc::TaggingAllocator).
///
/// Add it to a [`tracing_subscriber::registry()`]. Usually made by
/// [`ProfilerBuilder::build`](crate::ProfilerBuilder::build); `ProfileLayer::new()` gives a layer
/// whose numbers [`Profile::capture`](crate::Profile::capture) can read without a background thread.
///
/// Per enter: a span lookup (the registry's lock-free slab and the span's extensions read lock,
/// uncontended unless another layer writes that span's extensions at the same instant), one
/// reference count increment, two thread-local writes, one monotonic clock read, and with CPU
/// time on one per-thread CPU clock read (a syscall; see [`CpuClock`](crate::CpuClock)). Per exit the same less the lookup, plus four
/// stores to this thread's own counters. No allocation, no global lock.
#[derive(Debug, Clone)]
pub struct ProfileLayer<C = SystemClock> {
    clock: C,
    cpu_time: bool,
}

impl ProfileLayer {
    /// A layer with the real clock, reading no CPU clock on enter and exit (per-span CPU time
    /// comes from the CPU sampler of a [`Profiler`](crate::Profiler)).
    pub fn new() -> Self {
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

    fn state<S>(id: &Id, ctx: &Context<'_, S>) -> Option<Arc<SpanState>>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let span = ctx.span(id)?;
        let ext = span.extensions();
        ext.get::<Arc<SpanState>>().cloned()
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
        let _profiler = TagGuard::new(Tag::PROFILER);
        let Some(span) = ctx.span(id) else { return };
        let parent = span
            .parent()
            .and_then(|p| p.extensions().get::<Arc<SpanState>>().map(|s| s.tag))
            .unwrap_or(Tag::NO_SPAN);
        let tag = span_path::intern(parent, attrs.metadata());
        let state = SpanState {
            tag,
            parent,
            created_ns: self.clock.now_ns(),
            busy_ns: AtomicU64::new(0),
            instance: tracing_prof_alloc::open_span_instance(),
        };
        span.extensions_mut().insert(Arc::new(state));
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(state) = Self::state(id, &ctx) {
            entered::enter(id.into_u64(), state, &self.clock, self.cpu_time);
        }
    }

    fn on_exit(&self, id: &Id, _ctx: Context<'_, S>) {
        entered::exit(id.into_u64(), &self.clock, self.cpu_time);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(state) = Self::state(&id, &ctx) else {
            return;
        };
        let wall = self.clock.now_ns().saturating_sub(state.created_ns);
        let idle = wall.saturating_sub(state.busy_ns.load(Ordering::Relaxed));
        tracing_prof_alloc::record_span_closed(state.tag, wall, idle);
        tracing_prof_alloc::close_span_instance(state.instance, state.tag);
    }
}
