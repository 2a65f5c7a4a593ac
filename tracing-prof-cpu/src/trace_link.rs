//! The trace span a thread's work belongs to, for samples linked to traces.
//!
//! The span layer (with its `opentelemetry` feature) keeps, per thread, the OpenTelemetry trace
//! and span ids of the local root span whose work runs now, beside the span path tag the
//! allocator keeps. The SIGPROF handler copies them into the sample it records, so that a CPU
//! profile can say which trace each sample belongs to (Pyroscope's `span_id` and `trace_id`
//! labels, OTLP's sample links).
//!
//! Three plain words in a thread-local without a destructor: the handler reads them with no
//! lazy initialization, even during thread exit. The thread that writes them is the only one
//! that reads them (its own signal handler interrupts it between instructions, never in the
//! middle of one), so the only hazard is a signal landing between the three stores: [`set`]
//! clears the span id first and writes it last, so a handler sees either the old link whole,
//! no link, or the new one whole.

use std::cell::Cell;
use std::sync::atomic::{Ordering, compiler_fence};

/// The OpenTelemetry ids of a trace span: a 128-bit trace id and a 64-bit span id, as the
/// big-endian numbers of their W3C bytes (`{:032x}` and `{:016x}` print them as OpenTelemetry
/// does). A span id of 0 is no span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceLink {
    /// The trace id (0: none).
    pub trace_id: u128,
    /// The span id (0: no link).
    pub span_id: u64,
}

impl TraceLink {
    /// No link.
    pub const NONE: TraceLink = TraceLink {
        trace_id: 0,
        span_id: 0,
    };

    /// Whether this names a span.
    #[inline]
    pub fn is_some(&self) -> bool {
        self.span_id != 0
    }

    /// The three words a sample record carries.
    pub(crate) fn to_words(self) -> [u64; 3] {
        [
            self.span_id,
            (self.trace_id >> 64) as u64,
            self.trace_id as u64,
        ]
    }

    /// Back from [`TraceLink::to_words`].
    pub(crate) fn from_words(w: &[u64]) -> TraceLink {
        match w {
            [span, hi, lo, ..] => TraceLink {
                trace_id: (u128::from(*hi) << 64) | u128::from(*lo),
                span_id: *span,
            },
            _ => TraceLink::NONE,
        }
    }
}

struct Words {
    span: Cell<u64>,
    trace_hi: Cell<u64>,
    trace_lo: Cell<u64>,
}

thread_local! {
    static CURRENT: Words = const {
        Words {
            span: Cell::new(0),
            trace_hi: Cell::new(0),
            trace_lo: Cell::new(0),
        }
    };
}

/// Makes `link` the calling thread's current link and returns the one it replaces (`link`
/// itself when the thread's has the same span id: then nothing is written). No allocation, no
/// lock, no system call; during thread-local teardown it does nothing and returns
/// [`TraceLink::NONE`].
#[inline]
pub fn set(link: TraceLink) -> TraceLink {
    CURRENT
        .try_with(|w| {
            let [span, hi, lo] = link.to_words();
            if w.span.get() == span {
                // The same span (or none before and after): nothing to write. Span ids are
                // random 64-bit numbers, unique within a trace and, in practice, beyond it.
                return link;
            }
            let old = TraceLink::from_words(&[w.span.get(), w.trace_hi.get(), w.trace_lo.get()]);
            // The span id goes first and comes back last: a signal in between reads no link
            // rather than a new span id with an old trace id. The fences keep the compiler
            // from reordering the stores around the handler, which runs on this same thread.
            w.span.set(0);
            compiler_fence(Ordering::SeqCst);
            w.trace_hi.set(hi);
            w.trace_lo.set(lo);
            compiler_fence(Ordering::SeqCst);
            w.span.set(span);
            old
        })
        .unwrap_or(TraceLink::NONE)
}

/// The span id of the calling thread's current link (0: none): one thread-local load.
#[inline]
pub fn current_span_id() -> u64 {
    CURRENT.try_with(|w| w.span.get()).unwrap_or(0)
}

/// The calling thread's current link ([`TraceLink::NONE`] when there is none). Safe to call
/// from a signal handler.
#[inline]
pub fn current() -> TraceLink {
    CURRENT
        .try_with(|w| {
            let span = w.span.get();
            if span == 0 {
                return TraceLink::NONE;
            }
            compiler_fence(Ordering::SeqCst);
            TraceLink::from_words(&[span, w.trace_hi.get(), w.trace_lo.get()])
        })
        .unwrap_or(TraceLink::NONE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_returns_the_previous_link_and_words_round_trip() {
        let a = TraceLink {
            trace_id: 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
            span_id: 0x1122_3344_5566_7788,
        };
        assert_eq!(current(), TraceLink::NONE);
        assert_eq!(set(a), TraceLink::NONE);
        assert_eq!(current(), a);
        assert_eq!(TraceLink::from_words(&a.to_words()), a);
        assert_eq!(set(TraceLink::NONE), a);
        assert_eq!(current(), TraceLink::NONE);
        assert_eq!(TraceLink::from_words(&[1, 2]), TraceLink::NONE);
    }
}
