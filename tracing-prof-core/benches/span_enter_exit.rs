//! Span enter+exit, and a span's whole life (create, enter, exit, close), with the profiling
//! layer (the default, which reads no CPU clock; with an exact CPU clock read on every enter and
//! exit, the thread clock and getrusage) against the registry with a no-op layer. (A registry
//! with no layer at all never frees a closed span's slot, tokio-rs/tracing#2668: not a
//! baseline to compare with.)
//!
//! `cargo bench -p tracing-prof-core --bench span_enter_exit`

#[path = "../../benches/ab.rs"]
mod ab;

use std::hint::black_box;
use tracing::Dispatch;
use tracing_prof_core::{CpuClock, ProfileLayer, SystemClock};
use tracing_subscriber::prelude::*;

fn enter_exit(dispatch: &Dispatch, n: u64) {
    tracing::dispatcher::with_default(dispatch, || {
        let span = tracing::info_span!("bench_span");
        for _ in 0..n {
            let _g = black_box(&span).enter();
        }
    });
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

fn main() {
    let registry = Dispatch::new(
        tracing_subscriber::registry().with(tracing_subscriber::layer::Identity::new()),
    );
    let wall = Dispatch::new(tracing_subscriber::registry().with(ProfileLayer::new()));
    let cpu =
        Dispatch::new(tracing_subscriber::registry().with(ProfileLayer::new().with_cpu_time(true)));
    let rusage = Dispatch::new(
        tracing_subscriber::registry().with(
            ProfileLayer::new()
                .with_cpu_time(true)
                .with_clock(SystemClock::new(CpuClock::Rusage)),
        ),
    );
    if ab::wanted("span/enter_exit") {
        ab::compare(
            "span enter+exit: registry alone vs with the layer",
            31,
            vec![
                ab::variant("registry", |n| enter_exit(&registry, n)),
                ab::variant("+ layer (default)", |n| enter_exit(&wall, n)),
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
                ab::variant("+ layer, exact CPU (thread clock)", |n| lifecycle(&cpu, n)),
                ab::variant("+ layer, exact CPU (getrusage)", |n| lifecycle(&rusage, n)),
            ],
        );
    }
}
