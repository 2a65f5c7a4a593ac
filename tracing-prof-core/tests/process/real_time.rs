//! Span time with the real clock, with margins that do not depend on machine load.
//! One test in this binary, so no other test competes for the CPU it measures.

use std::time::{Duration, Instant};
use tracing_prof_core::{Clock, ProfileLayer, SystemClock};
use tracing_subscriber::prelude::*;

#[test]
fn sleeping_spinning_and_waiting_spans() {
    if crate::isolated(module_path!(), "sleeping_spinning_and_waiting_spans") {
        return;
    }
    let subscriber = tracing_subscriber::registry().with(ProfileLayer::new().with_cpu_time(true));
    tracing::subscriber::with_default(subscriber, || {
        tracing::info_span!("rt_sleeps").in_scope(|| std::thread::sleep(Duration::from_millis(50)));

        // Spin until this thread has used 100 ms of CPU, whatever else the machine does.
        tracing::info_span!("rt_spins").in_scope(|| {
            let start = SystemClock::default().thread_cpu().total_ns;
            let mut x = 0u64;
            loop {
                for _ in 0..10_000 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
                if SystemClock::default().thread_cpu().total_ns - start >= 100_000_000 {
                    break;
                }
            }
        });

        let waits = tracing::info_span!("rt_waits");
        let created = Instant::now();
        std::thread::sleep(Duration::from_millis(50));
        waits.in_scope(|| ());
        assert!(created.elapsed() >= Duration::from_millis(50));
    });
    let p = tracing_prof_core::capture(Duration::ZERO);
    let ms = |ns: u64| ns as f64 / 1e6;

    let sleeps = p.path(&["rt_sleeps"]).unwrap().time;
    assert!(
        sleeps.busy_ns >= 50_000_000,
        "busy {} ms",
        ms(sleeps.busy_ns)
    );
    assert!(
        sleeps.cpu_ns < 10_000_000,
        "a sleeping span used {} ms CPU",
        ms(sleeps.cpu_ns)
    );
    assert!(sleeps.wall_ns >= sleeps.busy_ns);

    let spins = p.path(&["rt_spins"]).unwrap().time;
    assert!(spins.cpu_ns >= 100_000_000, "cpu {} ms", ms(spins.cpu_ns));
    // getrusage has microsecond resolution: allow 1 ms of rounding.
    assert!(spins.cpu_ns <= spins.busy_ns + 1_000_000, "{spins:?}");
    assert!(
        spins.cpu_ns * 2 >= spins.busy_ns,
        "CPU is not most of a spinning span's time: {spins:?}"
    );

    let waits = p.path(&["rt_waits"]).unwrap().time;
    assert!(waits.idle_ns >= 50_000_000, "idle {} ms", ms(waits.idle_ns));
    assert!(waits.busy_ns < waits.idle_ns);
    assert_eq!(waits.wall_ns, waits.busy_ns + waits.idle_ns);
}
