//! A Pyroscope server that is healthy (the baseline), down, stalled, then failing with 500: the
//! application and the profiler never wait on it, the queue stays bounded, drops are counted,
//! and it recovers.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tracing_prof_core::Profiler;
use tracing_prof_examples::{App, Workload, run};
use tracing_prof_export::{PyroscopeConfig, PyroscopeExporter};
use tracing_prof_test_support::pyroscope_server::{FAIL_500, Mock, OK, STALL};
use tracing_subscriber::prelude::*;

const QUEUE: usize = 2;

#[test]
fn down_then_stalled_then_failing_never_blocks_and_stays_bounded() {
    if crate::isolated(
        module_path!(),
        "down_then_stalled_then_failing_never_blocks_and_stays_bounded",
    ) {
        return;
    }
    tracing_subscriber::registry()
        .with(tracing_prof_core::ProfileLayer::new())
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let app = App::new(200);
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap()) // closed when `l` drops
    };
    let (healthy, stalled, failing) = (Mock::start(OK), Mock::start(STALL), Mock::start(FAIL_500));
    // The healthy server first: the baseline the outage phases' times are printed against
    // (speed is for benchmarks; what this test asserts is that nothing waits or grows).
    let phases = [
        ("healthy", healthy.url()),
        ("down", down),
        ("stalled", stalled.url()),
        ("500", failing.url()),
    ];
    for (phase, url) in phases {
        let exporter = PyroscopeExporter::start(
            PyroscopeConfig::new(url, "shop")
                .timeout(Duration::from_millis(500))
                .queue_capacity(QUEUE)
                .retries(2, Duration::from_millis(50))
                .flush_timeout(Duration::from_secs(1)),
        )
        .unwrap();
        let stats = exporter.stats();
        let (_layer, guard) = Profiler::builder()
            .interval(Duration::from_secs(3600))
            .sink(exporter)
            .shutdown_timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let start = Instant::now();
        let mut handled = 0;
        for _ in 0..10 {
            // If an export waited on the server, a flush would time out here.
            guard
                .flush(Duration::from_secs(30))
                .expect("the aggregator must not wait on Pyroscope");
            handled += rt
                .block_on(run(
                    &app,
                    &Workload {
                        requests: 100,
                        ..Workload::default()
                    },
                ))
                .handled;
            assert!(
                stats.queued() <= QUEUE as u64,
                "{phase}: queue grew past its bound: {}",
                stats.queued()
            );
        }
        println!(
            "{phase}: 1000 requests and 10 exports in {:?} ({stats:?})",
            start.elapsed()
        );
        assert_eq!(handled, 1_000);
        let t = Instant::now();
        drop(guard);
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{phase}: shutdown waited {:?}",
            t.elapsed()
        );
        if phase == "healthy" {
            assert_eq!(
                (stats.sent(), stats.dropped(), stats.failed_attempts()),
                (11, 0, 0),
                "{stats:?}"
            );
            continue;
        }
        assert_eq!(stats.sent(), 0, "{phase}");
        assert!(
            stats.dropped() >= 8,
            "{phase}: drops must be counted: {stats:?}"
        );
        assert!(stats.failed_attempts() >= 1, "{phase}: {stats:?}");
    }
    // The failing server recovers: the next exporter delivers.
    failing.mode.store(OK, Ordering::SeqCst);
    let exporter = PyroscopeExporter::start(PyroscopeConfig::new(failing.url(), "shop")).unwrap();
    let stats = exporter.stats();
    let (_layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .sink(exporter)
        .build()
        .unwrap();
    guard.flush(Duration::from_secs(30)).unwrap();
    drop(guard);
    assert_eq!((stats.sent(), stats.dropped()), (2, 0), "{stats:?}");
}
