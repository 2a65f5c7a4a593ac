//! Thread scaling of span enter+exit and of a span's life, the way a service has them: a global
//! subscriber (`init()`, not a scoped `with_default`, whose dispatcher is reference-counted on
//! every span's creation and serializes threads on that count) and long-lived threads that took
//! their thread ids one after another, as a runtime's workers do.
//!
//! Each subscriber runs in a child process of its own (a process has one global subscriber):
//! `registry` (a registry with a no-op layer) and `layer` (with `ProfileLayer::new()`). In
//! each, a pool of threads (`bench::pool`) is started once, each thread in turn taking its ids
//! (the `tracing` registry's per-thread slots, sharded-slab's shard, ours) by creating and
//! entering spans; then 1, 2, 4, ... of them (up to the CPUs there are, at most 16) run the
//! operation at once, rounds alternating (`bench::ab`), time per operation per thread. With no
//! cache line written by two threads, it stays the 1-thread figure.
//!
//! Each thread count runs twice: on threads whose ids are consecutive (what a runtime's workers
//! have), and on threads whose ids are 4 apart (every fourth thread of the pool). The second
//! shows what sharing a cache line with a neighbour's per-thread data costs: tracing-subscriber
//! keeps each thread's span stack in a slot of about 40 bytes next to the other threads' (the
//! `thread_local` crate's per-thread array), and every enter and exit writes it.
//!
//! `cargo bench -p tracing-prof-core --bench span_threads`
//! (`TRACING_PROF_BENCH_ROUNDS`, default 15; a name filter picks `enter` or `life`).

use std::hint::black_box;
use tracing_prof_core::ProfileLayer;
use tracing_prof_test_support::bench::{ab, pool::Pool};
use tracing_subscriber::prelude::*;

const ENV: &str = "TRACING_PROF_BENCH_CHILD";
/// Ids of the threads that run "4 apart" differ by this much.
const SPREAD: usize = 4;

/// One span, made once, entered and exited `n` times.
fn enter_exit(n: u64) {
    let span = tracing::info_span!("bench_span");
    for _ in 0..n {
        let _g = black_box(&span).enter();
    }
}

/// Inside an entered parent, `n` spans created, entered, exited and closed.
fn life(n: u64) {
    let parent = tracing::info_span!("bench_parent");
    let _p = parent.enter();
    for _ in 0..n {
        tracing::info_span!("bench_child").in_scope(|| black_box(()));
    }
}

/// A pool thread's first spans: where it takes its ids.
fn warm(_: usize) {
    enter_exit(10);
    life(10);
}

fn child(mode: &str) {
    match mode {
        "registry" => tracing_subscriber::registry()
            .with(tracing_subscriber::layer::Identity::new())
            .init(),
        "layer" => tracing_subscriber::registry()
            .with(ProfileLayer::new())
            .init(),
        other => panic!("unknown mode {other}"),
    }
    let rounds = std::env::var("TRACING_PROF_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15usize)
        .max(1);
    let cpus = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(16);
    let pool = Pool::start(cpus * SPREAD, warm);
    for (job, name, what) in [
        (enter_exit as fn(u64), "enter", "enter+exit"),
        (life, "life", "create+enter+exit+close in a parent"),
    ] {
        if !ab::wanted(name) {
            continue;
        }
        let mut variants = vec![ab::variant("1 thread", |n| {
            pool.run(1, 1, job, n);
        })];
        for t in (1..5).map(|i| 1usize << i).filter(|&t| t <= cpus) {
            for (stride, ids) in [(1, "consecutive ids"), (SPREAD, "ids 4 apart")] {
                let pool = &pool;
                variants.push(ab::variant(
                    Box::leak(format!("{t} threads, {ids}").into_boxed_str()),
                    move |n| {
                        pool.run(t, stride, job, n);
                    },
                ));
            }
        }
        ab::compare(
            &format!(
                "span {what} with `{mode}`, on 1..{cpus} threads at once (ns per operation per thread)"
            ),
            rounds,
            variants,
        );
    }
    pool.stop();
}

fn main() {
    if let Ok(mode) = std::env::var(ENV) {
        return child(&mode);
    }
    let exe = std::env::current_exe().expect("the bench's own path");
    for mode in ["registry", "layer"] {
        let status = std::process::Command::new(&exe)
            .args(std::env::args().skip(1))
            .env(ENV, mode)
            .status()
            .expect("run a child");
        assert!(status.success(), "the {mode} child failed: {status}");
    }
}
