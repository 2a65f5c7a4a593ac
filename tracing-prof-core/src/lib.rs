//! The span layer, collection, the CPU sample store and the aggregator of tracing-prof.
//!
//! - [`ProfileLayer`]: a `tracing-subscriber` layer that records, per span *path* (the chain of
//!   callsites from the root span), span count and wall/busy/idle time, and makes the
//!   innermost entered span's path current for the tagging allocator of `tracing-prof-alloc`
//!   and the CPU sampler of `tracing-prof-cpu`.
//! - [`capture`]: what is known at one instant, as a [`Snapshot`] of the profile model
//!   (`tracing-prof-model`), which knows nothing of how it was captured.
//! - [`Profiler`] / [`ProfilerBuilder`] / [`ProfilerGuard`]: a named background thread that
//!   captures a snapshot every interval and at shutdown and hands it to [`Sink`]s.
//!
//! # How time is counted
//! Like `tracing_subscriber::fmt`'s span timings: `busy` accrues over each enter..exit interval on
//! the thread that ran it (an instrumented future polled on several worker threads adds each
//! poll once); a span entered again while already entered on the same thread is not counted
//! twice. `wall` is creation to close, `idle` is `wall - busy` of each closed span. CPU time
//! comes from the CPU samples by default ([`CpuTime::Sampled`]); with [`CpuTime::Exact`] it is
//! a per-thread CPU clock's delta over each interval: `CLOCK_THREAD_CPUTIME_ID` by default
//! (exact), or `getrusage(RUSAGE_THREAD)` (user and system apart, inexact per interval); see
//! [`CpuClock`] for which to pick.
//!
//! # How memory is counted
//! By the allocator, per path tag, exactly; see `tracing-prof-alloc`. Without the tagging
//! allocator installed, memory numbers stay zero and time is still measured. The allocator's
//! heap sampler adds sampled code stacks, which [`capture`] symbolizes (see
//! [`StackProfile`], [`CodeFrame`]) with their lifetimes, and the memory per thread
//! ([`ThreadProfile`]).
//!
//! # Limitations
//! - Time of a span is reported when it closes (`spans`, `wall`, `idle`) and when it exits
//!   (`busy`, CPU): a span that stays entered forever reports no time.
//! - Nesting deeper than [`MAX_DEPTH`] entered spans per thread is not timed.
//! - At most [`MAX_SPAN_PATHS`] distinct paths; beyond the configured cap, paths are lumped into
//!   `(other span paths)` and counted in [`Stats::overflowed_spans`].
//! - CPU time is Linux-only (zero elsewhere).

// The model's types that the docs above name.
#[cfg(doc)]
use tracing_prof_model::{CodeFrame, Snapshot, StackProfile, ThreadProfile};

mod binary;
mod budget;
mod capture;
mod cgroup;
mod clock;
pub mod config;
mod cpu;
mod entered;
#[cfg(feature = "opentelemetry")]
mod exemplars;
mod flight;
mod fork;
mod in_flight;
mod incident;
pub mod labels;
mod layer;
mod leak;
mod long_poll;
mod monotonic;
mod otel_resource;
mod peak;
#[cfg(feature = "opentelemetry")]
pub mod process_context;
mod process_memory;
mod profiler;
mod running;
mod runtime;
mod span_index;
mod span_path;
mod span_times;
mod symbolize;
mod terminate;
mod threads;
mod trace_link;
mod user_signal;

pub use budget::{AllocationSite, Budget, BudgetError, BudgetReport};
pub use capture::{capture, capture_paths};
pub use clock::{Clock, CpuClock, CpuSample, SystemClock};
pub use config::{Config, ConfigError, CpuTime, SlowSpan, ToggleSignal, Unwind, UserSignal};
pub use entered::MAX_DEPTH;
pub use flight::{DEFAULT_FLIGHT_BYTES, DEFAULT_FLIGHT_LENGTH, FlightFile};
pub use layer::ProfileLayer;
pub use otel_resource::{AttributeValue, resource_from_env};
pub use peak::DEFAULT_PEAK_EVERY;
pub use process_memory::{AllocatorStats, GlibcMalloc};
pub use profiler::{
    BuildError, Delivery, DeliveryProbe, FlushTimeout, GiantReport, Incident, LongPolls, Profiler,
    ProfilerBuilder, ProfilerGuard, ServiceStatus, Sink, SinkError, SinkStats, Stats,
};
pub use span_path::MAX_SPAN_PATHS;
pub use trace_link::TraceLinks;
pub use tracing_prof_cpu::CpuSamplerStats;

/// What `tracing-prof-export` needs of this crate beyond the API: reading a variable as the
/// settings do, and the OpenTelemetry resource's encodings; and the symbolizer, for its
/// benchmark against other symbolizers. Public because it lives in another
/// crate; no promise is made about it.
#[doc(hidden)]
pub mod __private {
    pub use crate::config::env::env_var;
    pub use crate::config::parse::{parse_bool, parse_duration};
    pub use crate::otel_resource::key_values;
    #[cfg(feature = "otel-proto")]
    pub use crate::otel_resource::resource_message;
    pub use crate::symbolize::resolve_uncached;
}

/// Marks the calling thread as one of the profiler's own for the rest of its life: what it
/// allocates, and the CPU samples taken on it, are counted under `(tracing-prof)`, never under
/// a user's span. Threads started with [`spawn_profiler_thread`] are marked already.
pub fn mark_profiler_thread() {
    tracing_prof_alloc::__private::set_current_tag(tracing_prof_alloc::Tag::PROFILER);
}

/// Starts a thread named `name` that runs `f` as the profiler's own work (see
/// [`mark_profiler_thread`]), from its first allocation. For the threads that sinks and
/// servers start: the Pyroscope sender, `/debug/pprof`'s listener and connections.
///
/// Keep `name` to 15 bytes: the kernel keeps no more of a thread's name, so a longer one is cut
/// in `top -H`, `perf` and the thread names of this profiler's own profiles (ours are
/// `tprof-http`, `tprof-http-work`, `tprof-pyroscope`, ...; the aggregator is `tracing-prof`).
pub fn spawn_profiler_thread<F, T>(name: &str, f: F) -> std::io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            mark_profiler_thread();
            f()
        })
}

/// Runs `f` as the profiler's own work on the calling thread, then gives the thread back its
/// span path: what `f` allocates, and the CPU samples taken in it, count under
/// `(tracing-prof)`. For work the profiler does on a thread it does not own, such as answering
/// `/debug/pprof` on an application's runtime.
pub fn as_profiler<T>(f: impl FnOnce() -> T) -> T {
    let _own = tracing_prof_alloc::TagGuard::new(tracing_prof_alloc::Tag::PROFILER);
    f()
}
