//! CPU samples linked to OpenTelemetry spans (the `opentelemetry` feature).
//!
//! With `tracing-opentelemetry` in the subscriber, every `tracing` span has an OpenTelemetry
//! span with W3C ids. A local root span (one without a `tracing` parent: a request, a job) gets
//! its ids read at its first enter; its descendants inherit them when they are created, so a
//! task spawned under the request carries them too. Entering a span makes its link the
//! thread's current one (beside the span path tag), exiting restores the one before, and the
//! CPU sampler copies the current link into every sample. The OpenTelemetry span gets the
//! attribute `pyroscope.profile.id` (its own span id), which is how Grafana knows that a
//! span has a profile.
//!
//! Without the feature, [`Link`] is a zero-sized type and every step above compiles to
//! nothing: enter and exit cost what they cost before.

/// Which spans' ids label CPU samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TraceLinks {
    /// Local root spans (no `tracing` parent): one link per request, as Pyroscope's Go, Java
    /// and .NET integrations do. A child span's samples count for its root.
    #[default]
    LocalRoots,
    /// Every span: a sample names the innermost span whose work ran. One distinct label value
    /// per span instead of per request (Pyroscope keeps a sample per stack and span), and the
    /// OpenTelemetry context is read once per span rather than per request.
    AllSpans,
    /// No links: samples carry no span ids, and spans get no attribute.
    Off,
}

#[cfg(feature = "opentelemetry")]
pub(crate) use on::*;

#[cfg(not(feature = "opentelemetry"))]
pub(crate) use off::*;

#[cfg(feature = "opentelemetry")]
mod on {
    use std::sync::atomic::{AtomicU64, Ordering};
    use tracing_prof_cpu::TraceLink;

    /// A span's link: its trace span's ids; [`UNRESOLVED`] before its first enter looked.
    pub(crate) type Link = TraceLink;

    /// Not looked up yet.
    pub(crate) const UNRESOLVED: Link = TraceLink::NONE;
    /// Looked up, and there is none (no OpenTelemetry layer, or a span not sampled): a span id
    /// no OpenTelemetry span has (all ones), never made a thread's current link.
    pub(crate) const NO_LINK: Link = TraceLink {
        trace_id: 0,
        span_id: u64::MAX,
    };

    /// A link stored where other threads read it (the span index, a span's extensions):
    /// the trace id first, the span id last (release); read span id first (acquire). A cell
    /// goes from [`UNRESOLVED`] to its link once (a second resolution stores the same), so a
    /// reader sees either no span id yet or the whole link.
    #[derive(Debug, Default)]
    pub(crate) struct LinkCell {
        /// Written last.
        span: AtomicU64,
        trace_hi: AtomicU64,
        trace_lo: AtomicU64,
    }

    impl LinkCell {
        /// A cell holding `link`.
        pub(crate) fn new(link: Link) -> LinkCell {
            let cell = LinkCell::default();
            cell.store(link);
            cell
        }

        pub(crate) fn store(&self, link: Link) {
            self.trace_hi
                .store((link.trace_id >> 64) as u64, Ordering::Relaxed);
            self.trace_lo.store(link.trace_id as u64, Ordering::Relaxed);
            self.span.store(link.span_id, Ordering::Release);
        }

        #[inline(always)]
        pub(crate) fn load(&self) -> Link {
            let span_id = self.span.load(Ordering::Acquire);
            if span_id == 0 || span_id == u64::MAX {
                // Not looked up, or none: the trace words (on the entry's second cache line)
                // are not read.
                return TraceLink {
                    trace_id: 0,
                    span_id,
                };
            }
            let trace_id = (u128::from(self.trace_hi.load(Ordering::Relaxed)) << 64)
                | u128::from(self.trace_lo.load(Ordering::Relaxed));
            TraceLink { trace_id, span_id }
        }
    }

    /// `link` as a thread's current link: [`NO_LINK`] is none there.
    #[inline(always)]
    fn on_thread(link: Link) -> Link {
        if link.span_id == NO_LINK.span_id {
            TraceLink::NONE
        } else {
            link
        }
    }

    /// Makes `link` the thread's current one for the CPU sampler ([`NO_LINK`]: none);
    /// returns the one before.
    #[inline(always)]
    pub(crate) fn set_current(link: Link) -> Link {
        tracing_prof_cpu::trace_link::set(on_thread(link))
    }

    /// Makes `link` the thread's current one if it is not already; then writes the one before
    /// into `prev` and returns true. The common case, the same span (or none before and
    /// after), is one thread-local load and a compare.
    #[inline(always)]
    pub(crate) fn switch(link: Link, prev: &mut Link) -> bool {
        let link = on_thread(link);
        if tracing_prof_cpu::trace_link::current_span_id() == link.span_id {
            return false;
        }
        *prev = tracing_prof_cpu::trace_link::set(link);
        true
    }

    /// The link a span created now inherits from the thread (its contextual parent's).
    #[inline(always)]
    pub(crate) fn current() -> Link {
        let link = tracing_prof_cpu::trace_link::current();
        if link.is_some() { link } else { NO_LINK }
    }

    /// The OpenTelemetry ids of span `id` of `dispatch`'s subscriber, activating its
    /// OpenTelemetry span if it was not yet; sets `pyroscope.profile.id` on it. [`NO_LINK`]
    /// when the subscriber has no OpenTelemetry layer or the span is not sampled (its ids
    /// would name nothing a backend keeps).
    ///
    /// Allocates (the OpenTelemetry context is cloned) and takes the span's extensions lock:
    /// once per span that is linked, at its first enter, never while the layer holds a lock.
    /// It may run inside `tracing::dispatcher::get_default` (see the layer's `resolve_link`):
    /// where a scoped default subscriber was ever set, an event emitted in here (an
    /// OpenTelemetry SDK's own log) then goes nowhere.
    #[cold]
    #[inline(never)]
    pub(crate) fn resolve(dispatch: &tracing::Dispatch, id: &tracing_core::span::Id) -> Link {
        use opentelemetry::trace::TraceContextExt;
        let Some(cx) = tracing_opentelemetry::get_otel_context(id, dispatch) else {
            return NO_LINK;
        };
        let span = cx.span();
        let sc = span.span_context();
        if !sc.is_valid() || !sc.is_sampled() {
            return NO_LINK;
        }
        let link = TraceLink {
            trace_id: u128::from_be_bytes(sc.trace_id().to_bytes()),
            span_id: u64::from_be_bytes(sc.span_id().to_bytes()),
        };
        span.set_attribute(opentelemetry::KeyValue::new(
            "pyroscope.profile.id",
            format!("{:016x}", link.span_id),
        ));
        link
    }
}

#[cfg(not(feature = "opentelemetry"))]
mod off {
    /// Nothing, without the `opentelemetry` feature.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub(crate) struct Link;

    pub(crate) const UNRESOLVED: Link = Link;
    #[allow(dead_code, reason = "named by code compiled with the feature only")]
    pub(crate) const NO_LINK: Link = Link;

    #[derive(Debug, Default)]
    pub(crate) struct LinkCell;

    impl LinkCell {
        pub(crate) fn new(_link: Link) -> LinkCell {
            LinkCell
        }
        #[inline(always)]
        pub(crate) fn store(&self, _link: Link) {}
        #[inline(always)]
        pub(crate) fn load(&self) -> Link {
            Link
        }
    }

    #[inline(always)]
    pub(crate) fn set_current(_link: Link) -> Link {
        Link
    }

    #[inline(always)]
    pub(crate) fn switch(_link: Link, _prev: &mut Link) -> bool {
        false
    }

    #[inline(always)]
    pub(crate) fn current() -> Link {
        Link
    }
}
