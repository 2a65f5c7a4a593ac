//! The `tracing-subscriber` layer.

use crate::clock::{Clock, SystemClock};
use crate::entered::{self, Home};
use crate::span_index::{self, SpanState};
use crate::trace_link::{self, LinkCell, TraceLinks};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use tracing_core::span::{Attributes, Id};
use tracing_core::{Event, Level, Subscriber};
use tracing_prof_alloc::{Tag, TagGuard};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// What the layer keeps in a span's extensions, for a span the span index had no room for.
#[derive(Debug)]
struct SpanData {
    state: SpanState,
    busy_ns: Arc<AtomicU64>,
    /// The span's trace link, once its first enter looked it up.
    link: LinkCell,
    /// Whether an ERROR event was recorded in it.
    errored: AtomicBool,
}

/// Records, per span path, span counts, wall/busy/idle time and CPU time, and makes the
/// innermost entered span's path current for [`TaggingAllocator`](tracing_prof_alloc::TaggingAllocator).
///
/// Add it to a [`tracing_subscriber::registry()`]. Usually made by
/// [`ProfilerBuilder::build`](crate::ProfilerBuilder::build); `ProfileLayer::new()` gives a layer
/// whose numbers [`capture`](crate::capture) can read without a background thread.
///
/// Per enter: the span's state from the span index (one cache line, found by hashing the span id; a
/// registry lookup only for spans the index had no room for), thread-local writes, one monotonic
/// clock read (the CPU's time-stamp counter where the kernel uses it), and with exact CPU time one
/// per-thread CPU clock read (a system call; see [`CpuClock`](crate::CpuClock)). Per exit the same
/// less the lookup, plus stores to this thread's own counters and to the span's busy time (an
/// atomic add instead when the span was created on another thread). Per creation: the parent's path
/// (the current tag, for a contextual parent), the path interned (a thread-local cache), a clock
/// read and the span's index entry. No allocation, no lock on any of them.
#[derive(Debug)]
pub struct ProfileLayer<C = SystemClock> {
    clock: C,
    cpu_time: bool,
    /// This layer's key in the span index: span ids are unique within one registry only.
    owner: AtomicU32,
    /// Which spans' OpenTelemetry ids label CPU samples (with the `opentelemetry` feature).
    links: TraceLinks,
    /// The subscriber this layer is part of, where the OpenTelemetry layer is found when the
    /// thread's default subscriber is another one (or holds this layer where a downcast does
    /// not reach it: behind `reload::Layer`, or a second instance of this type).
    #[cfg(feature = "opentelemetry")]
    dispatch: std::sync::OnceLock<tracing::dispatcher::WeakDispatch>,
}

impl<C: Clone> Clone for ProfileLayer<C> {
    fn clone(&self) -> Self {
        ProfileLayer {
            clock: self.clock.clone(),
            cpu_time: self.cpu_time,
            owner: AtomicU32::new(span_index::new_owner()),
            links: self.links,
            #[cfg(feature = "opentelemetry")]
            dispatch: std::sync::OnceLock::new(),
        }
    }
}

impl ProfileLayer {
    /// A layer with the real clock, reading no CPU clock on enter and exit (per-span CPU time
    /// comes from the CPU sampler of a [`Profiler`](crate::Profiler)).
    pub fn new() -> Self {
        crate::monotonic::init();
        ProfileLayer {
            clock: SystemClock::default(),
            cpu_time: false,
            owner: AtomicU32::new(span_index::new_owner()),
            links: TraceLinks::default(),
            #[cfg(feature = "opentelemetry")]
            dispatch: std::sync::OnceLock::new(),
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
            owner: self.owner,
            links: self.links,
            #[cfg(feature = "opentelemetry")]
            dispatch: self.dispatch,
        }
    }

    /// Which spans' OpenTelemetry ids label the CPU samples taken in their work (default:
    /// local roots). Has an effect with the `opentelemetry` feature and a
    /// `tracing-opentelemetry` layer in the same subscriber only; see [`TraceLinks`].
    pub fn with_trace_links(mut self, links: TraceLinks) -> Self {
        self.links = links;
        self
    }

    /// Whether span `state` is linked to its own OpenTelemetry span, not its root's.
    #[cfg(feature = "opentelemetry")]
    #[inline(always)]
    fn links_itself(&self, state: &SpanState) -> bool {
        state.link.span_id == 0
            && match self.links {
                TraceLinks::LocalRoots => state.parent == Tag::NO_SPAN,
                TraceLinks::AllSpans => true,
                TraceLinks::Off => false,
            }
    }

    /// `state` with its own link, looked up and kept with `keep` at its first enter when it
    /// [links itself](Self::links_itself); as it is otherwise.
    #[cfg(feature = "opentelemetry")]
    #[inline(always)]
    fn with_own_link(
        &self,
        id: &Id,
        state: SpanState,
        keep: impl FnOnce(trace_link::Link),
    ) -> SpanState {
        if !self.links_itself(&state) {
            return state;
        }
        let link = self.resolve_link(id);
        keep(link);
        SpanState { link, ..state }
    }

    /// Span `id`'s trace link, read from its OpenTelemetry span at its first enter.
    #[cfg(feature = "opentelemetry")]
    #[cold]
    #[inline(never)]
    fn resolve_link(&self, id: &Id) -> trace_link::Link
    where
        C: 'static,
    {
        // The thread's default subscriber is almost always this layer's: read through it
        // when it is. Upgrading the weak handle instead would add to and take from one
        // reference count that every thread writes, on every root span.
        let ours = |d: &tracing::Dispatch| {
            d.downcast_ref::<Self>()
                .is_some_and(|layer| std::ptr::eq(layer, self))
        };
        let by_default =
            tracing::dispatcher::get_default(|d| ours(d).then(|| trace_link::resolve(d, id)));
        if let Some(link) = by_default {
            return link;
        }
        match self.dispatch.get().and_then(|d| d.upgrade()) {
            Some(dispatch) => trace_link::resolve(&dispatch, id),
            None => trace_link::NO_LINK,
        }
    }

    /// The state of span `id` and where its busy time goes: the span index, or the span's
    /// extensions.
    #[inline(always)]
    fn state<S>(&self, id: &Id, ctx: &Context<'_, S>) -> Option<(SpanState, Home)>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let owner = self.owner.load(Ordering::Relaxed);
        match span_index::find(owner, id.into_u64()) {
            Some((slot, state)) => Some((state, Home::Index(slot))),
            None => Self::state_outside(id, ctx),
        }
    }

    /// Marks the span an ERROR `event` was recorded in (its explicit parent, or the current
    /// span), so that its close counts an error for its path.
    #[cold]
    #[inline(never)]
    fn errored<S>(&self, event: &Event<'_>, ctx: &Context<'_, S>)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let Some(span) = ctx.event_span(event) else {
            return;
        };
        let owner = self.owner.load(Ordering::Relaxed);
        if !span_index::mark_errored(owner, span.id().into_u64())
            && let Some(data) = span.extensions().get::<SpanData>()
        {
            data.errored.store(true, Ordering::Relaxed);
        }
    }

    /// Whether an ERROR event was recorded in a span the span index had no room for.
    #[cold]
    #[inline(never)]
    fn errored_outside<S>(id: &Id, ctx: &Context<'_, S>) -> bool
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        ctx.span(id)
            .and_then(|s| {
                s.extensions()
                    .get::<SpanData>()
                    .map(|d| d.errored.load(Ordering::Relaxed))
            })
            .unwrap_or(false)
    }

    /// The state of a span the span index had no room for, from its extensions.
    #[cold]
    #[inline(never)]
    fn state_outside<S>(id: &Id, ctx: &Context<'_, S>) -> Option<(SpanState, Home)>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let span = ctx.span(id)?;
        let ext = span.extensions();
        let data = ext.get::<SpanData>()?;
        let mut state = data.state;
        state.link = data.link.load();
        Some((state, Home::Extensions(Arc::clone(&data.busy_ns))))
    }
}

impl<S, C> Layer<S> for ProfileLayer<C>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    C: Clock,
{
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        // A layer in a new registry: a key of its own in the span index.
        self.owner.store(span_index::new_owner(), Ordering::Relaxed);
        #[cfg(feature = "opentelemetry")]
        crate::exemplars::make_table();
        #[cfg(feature = "opentelemetry")]
        let _ = self.dispatch.set(subscriber.downgrade());
        #[cfg(not(feature = "opentelemetry"))]
        let _ = subscriber;
        crate::runtime::RUNTIME.cpu.set_exact_source(
            match (self.cpu_time, self.clock.splits_cpu()) {
                (false, _) => tracing_prof_model::CpuSource::Off,
                (true, false) => tracing_prof_model::CpuSource::ThreadClock,
                (true, true) => tracing_prof_model::CpuSource::Rusage,
            },
        );
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        // A contextual parent is the innermost span entered on this thread, whose path is the
        // tag current now (read before the profiler's own tag replaces it).
        let current = tracing_prof_alloc::current_tag();
        let _profiler = TagGuard::new(Tag::PROFILER);
        let (parent, inherited) = match attrs.parent() {
            Some(p) => self
                .state(p, &ctx)
                .map_or((Tag::NO_SPAN, trace_link::UNRESOLVED), |(s, _)| {
                    (s.tag, s.link)
                }),
            None if attrs.is_contextual() => (current, trace_link::current()),
            None => (Tag::NO_SPAN, trace_link::UNRESOLVED),
        };
        // A span linked to its local root inherits its parent's link; the others look theirs
        // up at their first enter.
        let link = if parent != Tag::NO_SPAN && self.links == TraceLinks::LocalRoots {
            inherited
        } else {
            trace_link::UNRESOLVED
        };
        let tag = crate::runtime::RUNTIME.intern(parent, attrs);
        let state = SpanState {
            tag,
            parent,
            created_ns: self.clock.now_ns(),
            // In the span index, a span's instance (which serves the heap sampler's
            // "outlived" counts only) is opened at its first sampled allocation.
            instance: 0,
            link,
        };
        let owner = self.owner.load(Ordering::Relaxed);
        if span_index::insert(owner, id.into_u64(), state).is_none()
            && let Some(span) = ctx.span(id)
        {
            span_index::count_outside();
            // Kept in its extensions, where no sampled allocation can reach: one now.
            let instance = if tracing_prof_alloc::__private::sample_rate() > 0 {
                tracing_prof_alloc::__private::open_span_instance()
            } else {
                0
            };
            let instance = tracing_prof_alloc::__private::eager_instance_word(instance);
            span.extensions_mut().insert(SpanData {
                state: SpanState { instance, ..state },
                busy_ns: Arc::new(AtomicU64::new(0)),
                link: LinkCell::new(state.link),
                errored: AtomicBool::new(false),
            });
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let owner = self.owner.load(Ordering::Relaxed);
        // Written out rather than through `state`: the common case stays in registers.
        if let Some((slot, state)) = span_index::find(owner, id.into_u64()) {
            #[cfg(feature = "opentelemetry")]
            let state = self.with_own_link(id, state, |link| {
                span_index::set_link(slot, id.into_u64(), link);
            });
            entered::enter(
                id.into_u64(),
                state,
                Home::Index(slot),
                &self.clock,
                self.cpu_time,
            );
        } else if let Some((state, home)) = Self::state_outside(id, &ctx) {
            #[cfg(feature = "opentelemetry")]
            let state = self.with_own_link(id, state, |link| {
                if let Some(span) = ctx.span(id)
                    && let Some(data) = span.extensions().get::<SpanData>()
                {
                    data.link.store(link);
                }
            });
            entered::enter(id.into_u64(), state, home, &self.clock, self.cpu_time);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        // Events below ERROR cost this comparison.
        if *event.metadata().level() == Level::ERROR {
            self.errored(event, &ctx);
        }
    }

    fn on_exit(&self, id: &Id, _ctx: Context<'_, S>) {
        entered::exit(id.into_u64(), &self.clock, self.cpu_time);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some((state, home)) = self.state(&id, &ctx) else {
            return;
        };
        // Taken before the entry is freed, which a new span may take at once.
        // SAFETY: the span's instance word: its index entry's cell, which stays mapped, or an
        // instance id.
        let instance = unsafe { tracing_prof_alloc::__private::take_instance(state.instance) };
        let (busy, errored) = match home {
            Home::Index(slot) => span_index::remove(slot, id.into_u64()),
            Home::Extensions(b) => (b.load(Ordering::Relaxed), Self::errored_outside(&id, &ctx)),
        };
        if instance != 0 {
            tracing_prof_alloc::__private::close_span_instance(instance, state.tag);
        }
        let now = self.clock.now_ns();
        let wall = now.saturating_sub(state.created_ns);
        entered::closed(state.tag, wall, wall.saturating_sub(busy), errored);
        // A span linked to a trace: an exemplar of its latency bucket, when that one is stale.
        #[cfg(feature = "opentelemetry")]
        if state.link.trace_id != 0 && state.link.span_id != 0 && state.link.span_id != u64::MAX {
            let link = tracing_prof_model::TraceLink {
                trace_id: state.link.trace_id,
                span_id: state.link.span_id,
            };
            let bucket = tracing_prof_model::duration_bucket(wall);
            crate::exemplars::offer(state.tag, bucket, link, now, wall);
        }
    }
}
