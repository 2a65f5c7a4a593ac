//! Span enter+exit, and a span's whole life (create, enter, exit, close), with the profiling
//! layer (wall time only; wall + CPU time with the thread CPU clock, the default; and with
//! getrusage) against the registry alone.
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
    let registry = Dispatch::new(tracing_subscriber::registry());
    let wall = Dispatch::new(
        tracing_subscriber::registry().with(ProfileLayer::new().with_cpu_time(false)),
    );
    let cpu = Dispatch::new(tracing_subscriber::registry().with(ProfileLayer::new()));
    let rusage = Dispatch::new(
        tracing_subscriber::registry()
            .with(ProfileLayer::new().with_clock(SystemClock::new(CpuClock::Rusage))),
    );
    if ab::wanted("span/enter_exit") {
        ab::compare(
            "span enter+exit: registry alone vs with the layer",
            31,
            vec![
                ab::variant("registry", |n| enter_exit(&registry, n)),
                ab::variant("+ layer, wall", |n| enter_exit(&wall, n)),
                ab::variant("+ layer, wall+CPU (thread clock)", |n| enter_exit(&cpu, n)),
                ab::variant("+ layer, wall+CPU (getrusage)", |n| enter_exit(&rusage, n)),
            ],
        );
    }
    if ab::wanted("span/lifecycle") {
        ab::compare(
            "span create+enter+exit+close inside a parent: registry alone vs with the layer",
            31,
            vec![
                ab::variant("registry", |n| lifecycle(&registry, n)),
                ab::variant("+ layer, wall", |n| lifecycle(&wall, n)),
                ab::variant("+ layer, wall+CPU (thread clock)", |n| lifecycle(&cpu, n)),
                ab::variant("+ layer, wall+CPU (getrusage)", |n| lifecycle(&rusage, n)),
            ],
        );
    }
}
