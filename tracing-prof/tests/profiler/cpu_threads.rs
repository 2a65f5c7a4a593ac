//! Two threads burning CPU at once: the sampled CPU time of both together is within 10% of
//! what their own CPU clocks say. (A process-wide `setitimer` fails this once several threads
//! are busy: golang/go#35057.)

use std::hint::black_box;
use std::time::Duration;
use tracing_prof::Profiler;
use tracing_prof_test_support as common;
use tracing_subscriber::prelude::*;

use common::thread_cpu_ns;

#[inline(never)]
fn burn(d: Duration) -> u64 {
    let start = thread_cpu_ns();
    let mut x = 1u64;
    while thread_cpu_ns() - start < d.as_nanos() as u64 {
        for _ in 0..20_000 {
            x = black_box(x.wrapping_mul(31).wrapping_add(7));
        }
    }
    x
}

#[test]
fn two_busy_threads_are_both_counted() {
    if crate::isolated(module_path!(), "two_busy_threads_are_both_counted") {
        return;
    }
    // The default rate, 100 Hz.
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    tracing_subscriber::registry().with(layer).init();
    let barrier = std::sync::Barrier::new(2);
    let used: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    tracing::info_span!("ct_burn").in_scope(|| {
                        barrier.wait();
                        let before = thread_cpu_ns();
                        black_box(burn(Duration::from_millis(600)));
                        thread_cpu_ns() - before
                    })
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let sampled = guard.profiler().snapshot().sampled_cpu_ns(&["ct_burn"]);
    eprintln!(
        "used {:.1} ms, sampled {:.1} ms",
        used as f64 / 1e6,
        sampled as f64 / 1e6
    );
    assert!(
        (sampled as f64 - used as f64).abs() <= used as f64 * 0.1,
        "sampled {sampled} ns of {used} ns used by two threads at once"
    );
}
