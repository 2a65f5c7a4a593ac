use tracing_subscriber::prelude::*;
fn main() {
    let d = tracing::Dispatch::new(tracing_subscriber::registry().with(tracing_prof_core::ProfileLayer::new()));
    tracing::dispatcher::with_default(&d, || {
        let span = tracing::info_span!("bench_span");
        let mode = std::env::args().nth(1).unwrap_or_default();
        let t = std::time::Instant::now();
        let n = 20_000_000u64;
        if mode == "life" {
            let parent = tracing::info_span!("p"); let _p = parent.enter();
            for _ in 0..n/10 { tracing::info_span!("c").in_scope(|| std::hint::black_box(())); }
        } else {
            for _ in 0..n { let _g = std::hint::black_box(&span).enter(); }
        }
        eprintln!("{:.1} ns/op", t.elapsed().as_nanos() as f64 / n as f64);
    });
}
