//! Span enter+exit, and a span's whole life (create, enter, exit, close), with the profiling
//! layer (the default, which reads no CPU clock; with an exact CPU clock read on every enter and
//! exit, the thread clock and getrusage; for a span's life, also with the heap sampler on, as a
//! built profiler has it) against the registry with a no-op layer. Two more variants say what
//! of the default layer's cost is its clock: the layer with a clock that reads nothing, and,
//! beside enter+exit, two reads of the layer's clock alone. And one that is not ours: the floor
//! of any span-timing layer (`test-support`'s `bench::floor`: per enter and exit a read of our
//! clock, a thread-local frame and the allocation tag switched, nothing more), which says how
//! far above that floor ours is. (A registry with no layer at all
//! never frees a closed span's slot, tokio-rs/tracing#2668: not a baseline to compare with.)
//! Thread scaling is `span_threads`: a global subscriber in a process of its own, as services
//! have it (the scoped dispatchers here count references on one shared word at every span's
//! creation).
//!
//! `cargo bench -p tracing-prof-core --bench span_enter_exit`
//!
//! With `--features opentelemetry` (trace links compiled in), two more comparisons: the same
//! layer in a subscriber with `tracing-opentelemetry` against that subscriber alone, where the
//! span is a local root whose samples are linked (`span/otel_enter_exit`), and a whole request
//! (`span/otel_lifecycle`). Run the bench with and without the feature to read what the
//! feature costs a layer without links.

mod shared {
    pub(crate) mod floor;
}

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::Dispatch;
use tracing_prof_core::{Clock, CpuClock, CpuSample, ProfileLayer, SystemClock};
use tracing_prof_test_support::bench::ab;
use tracing_subscriber::prelude::*;

/// A clock that reads nothing: one load of a word nobody writes. The layer with it does all
/// its work but the clock reads, so its time added over the registry, against the default
/// layer's, is what the clock costs in place (the time-stamp counter is about 10 ns a read on
/// this project's machine).
struct Frozen;

static FROZEN: AtomicU64 = AtomicU64::new(0);

impl Clock for Frozen {
    fn now_ns(&self) -> u64 {
        FROZEN.load(Ordering::Relaxed)
    }
    fn thread_cpu(&self) -> CpuSample {
        CpuSample::default()
    }
}

/// What `n` enters and exits could not do with less: two reads of the layer's clock each.
fn two_clock_reads(n: u64) {
    let clock = SystemClock::default();
    for _ in 0..n {
        black_box(clock.now_ns());
        black_box(clock.now_ns());
    }
}

fn enter_exit(dispatch: &Dispatch, n: u64) {
    tracing::dispatcher::with_default(dispatch, || {
        let span = tracing::info_span!("bench_span");
        for _ in 0..n {
            let _g = black_box(&span).enter();
        }
    });
}

/// [`lifecycle`] with the heap sampler on at its default rate, as a built profiler has it: each
/// span then opens an instance for the sampled memory it holds, and closes it.
fn lifecycle_sampling(dispatch: &Dispatch, n: u64) {
    tracing_prof_alloc::__private::set_sample_rate(tracing_prof_alloc::DEFAULT_SAMPLE_RATE);
    lifecycle(dispatch, n);
    tracing_prof_alloc::__private::set_sample_rate(0);
}

fn lifecycle(dispatch: &Dispatch, n: u64) {
    tracing::dispatcher::with_default(dispatch, || {
        let parent = tracing::info_span!("bench_parent");
        let _p = parent.enter();
        for _ in 0..n {
            tracing::info_span!("bench_child").in_scope(|| black_box(()));
        }
    });
}

/// A subscriber with `tracing-opentelemetry` (an SDK tracer that samples every span and exports
/// nowhere), and `layer` if given.
#[cfg(feature = "opentelemetry")]
fn with_otel(layer: Option<ProfileLayer>) -> Dispatch {
    use opentelemetry::trace::TracerProvider as _;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("bench"));
    Dispatch::new(tracing_subscriber::registry().with(layer).with(otel))
}

fn main() {
    let registry = Dispatch::new(
        tracing_subscriber::registry().with(tracing_subscriber::layer::Identity::new()),
    );
    let wall = Dispatch::new(tracing_subscriber::registry().with(ProfileLayer::new()));
    let floor = Dispatch::new(tracing_subscriber::registry().with(shared::floor::floor_layer()));
    let cpu =
        Dispatch::new(tracing_subscriber::registry().with(ProfileLayer::new().with_cpu_time(true)));
    let frozen =
        Dispatch::new(tracing_subscriber::registry().with(ProfileLayer::new().with_clock(Frozen)));
    let rusage = Dispatch::new(
        tracing_subscriber::registry().with(
            ProfileLayer::new()
                .with_cpu_time(true)
                .with_clock(SystemClock::new(CpuClock::Rusage)),
        ),
    );
    // The registry and the default layer only, for a driver that alternates builds with and
    // without a feature (BENCHMARKS.md, command 9); run only when named.
    if std::env::args().any(|a| a == "span/default_only") {
        ab::compare(
            "span enter+exit: registry alone vs the default layer",
            31,
            vec![
                ab::variant("registry", |n| enter_exit(&registry, n)),
                ab::variant("+ layer (default)", |n| enter_exit(&wall, n)),
            ],
        );
        ab::compare(
            "span create+enter+exit+close inside a parent: registry alone vs the default layer",
            31,
            vec![
                ab::variant("registry", |n| lifecycle(&registry, n)),
                ab::variant("+ layer (default)", |n| lifecycle(&wall, n)),
            ],
        );
    }
    if ab::wanted("span/enter_exit") {
        ab::compare(
            "span enter+exit: registry alone vs with the layer",
            31,
            vec![
                ab::variant("registry", |n| enter_exit(&registry, n)),
                ab::variant("+ layer (default)", |n| enter_exit(&wall, n)),
                ab::variant("+ layer, a clock that reads nothing", |n| {
                    enter_exit(&frozen, n)
                }),
                ab::variant("two clock reads, nothing else", two_clock_reads),
                ab::variant("+ the floor of any span-timing layer", |n| {
                    enter_exit(&floor, n)
                }),
                ab::variant("+ layer, exact CPU (thread clock)", |n| enter_exit(&cpu, n)),
                ab::variant("+ layer, exact CPU (getrusage)", |n| enter_exit(&rusage, n)),
            ],
        );
    }
    if ab::wanted("span/lifecycle") {
        ab::compare(
            "span create+enter+exit+close inside a parent: registry alone vs with the layer",
            31,
            vec![
                ab::variant("registry", |n| lifecycle(&registry, n)),
                ab::variant("+ layer (default)", |n| lifecycle(&wall, n)),
                ab::variant("+ layer, heap sampling at 512 KiB", |n| {
                    lifecycle_sampling(&wall, n)
                }),
                ab::variant("+ layer, a clock that reads nothing", |n| {
                    lifecycle(&frozen, n)
                }),
                ab::variant("+ the floor of any span-timing layer", |n| {
                    lifecycle(&floor, n)
                }),
                ab::variant("+ layer, exact CPU (thread clock)", |n| lifecycle(&cpu, n)),
                ab::variant("+ layer, exact CPU (getrusage)", |n| lifecycle(&rusage, n)),
            ],
        );
    }
    #[cfg(feature = "opentelemetry")]
    {
        let otel = with_otel(None);
        let linked = with_otel(Some(ProfileLayer::new()));
        if ab::wanted("span/otel_enter_exit") {
            ab::compare(
                "span enter+exit of a linked local root: registry and OpenTelemetry layer vs with the layer",
                31,
                vec![
                    ab::variant("registry + otel", |n| enter_exit(&otel, n)),
                    ab::variant("+ layer (default), linked", |n| enter_exit(&linked, n)),
                ],
            );
        }
        if ab::wanted("span/otel_lifecycle") {
            ab::compare(
                "a linked request: a local root created, entered, exited and closed",
                31,
                vec![
                    ab::variant("registry + otel", |n| root_lifecycle(&otel, n)),
                    ab::variant("+ layer (default), linked", |n| root_lifecycle(&linked, n)),
                ],
            );
        }
    }
}

/// `n` local roots, each created, entered, exited and closed.
#[cfg(feature = "opentelemetry")]
fn root_lifecycle(dispatch: &Dispatch, n: u64) {
    tracing::dispatcher::with_default(dispatch, || {
        for _ in 0..n {
            tracing::info_span!("bench_request").in_scope(|| black_box(()));
        }
    });
}
