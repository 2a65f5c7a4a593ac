//! Instructions per span enter+exit, counted by valgrind's callgrind (repeatable on a shared,
//! noisy machine, unlike times): run it with 0 and with N enter+exit pairs and divide the
//! difference by N. With `registry` (a no-op layer), `layer` (the profiling layer) or `labels`
//! (the layer of a profiler with the span field `route` as a label: no sampling, no export
//! during the run) or `floor` (not ours: the least a span-timing layer does, `test-support`'s
//! `bench::floor`) as the second argument; with `life` as the third, each of the N is a span's
//! whole life inside an entered parent (created, entered, exited, closed) instead of an
//! enter+exit, and with `labels` each has a `route` among 8 values.
//!
//! ```text
//! cargo bench -p tracing-prof-core --bench span_instructions --no-run   # add --features opentelemetry for the other build
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/deps/span_instructions-* 100000 layer
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/deps/span_instructions-* 100000 layer life
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/deps/span_instructions-* 20000 labels life
//! ```

mod shared {
    pub(crate) mod floor;
}

use std::hint::black_box;
use tracing_subscriber::prelude::*;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let mode = args.next();
    let labeled = mode.as_deref() == Some("labels");
    let _profiler;
    let dispatch = match mode.as_deref() {
        Some("labels") => {
            let (layer, guard) = tracing_prof_core::Profiler::builder()
                .span_field_labels(["route"])
                .heap_sampling(0)
                .cpu_sampling(0)
                .interval(std::time::Duration::from_secs(3600))
                .build()
                .expect("a profiler");
            _profiler = guard;
            tracing::Dispatch::new(tracing_subscriber::registry().with(layer))
        }
        Some("floor") => tracing::Dispatch::new(
            tracing_subscriber::registry().with(shared::floor::floor_layer()),
        ),
        Some("layer") => tracing::Dispatch::new(
            tracing_subscriber::registry().with(tracing_prof_core::ProfileLayer::new()),
        ),
        _ => tracing::Dispatch::new(
            tracing_subscriber::registry().with(tracing_subscriber::layer::Identity::new()),
        ),
    };
    let life = args.next().as_deref() == Some("life");
    tracing::dispatcher::with_default(&dispatch, || {
        let span = tracing::info_span!("bench_span");
        if life {
            let _parent = span.enter();
            // Warm: the child's span path is interned by the first one.
            for _ in 0..1000 {
                let _g = black_box(tracing::info_span!("child")).entered();
            }
            if labeled {
                // Warm: every value and label set is learnt by the first ones.
                for i in 0..1000u64 {
                    let _g = black_box(tracing::info_span!("child", route = i % 8)).entered();
                }
                for i in 0..n {
                    let _g = black_box(tracing::info_span!("child", route = i % 8)).entered();
                }
                return;
            }
            for _ in 0..n {
                let _g = black_box(tracing::info_span!("child")).entered();
            }
            return;
        }
        // Warm: the first enter lists the thread in its record and looks the span up.
        for _ in 0..1000 {
            let _g = black_box(&span).enter();
        }
        for _ in 0..n {
            let _g = black_box(&span).enter();
        }
    });
}
