//! Every sink's failures are visible in one call: a Pyroscope push that fails after `export`
//! queued it (a server that refuses connections) shows in `sink_stats()`, beside the file
//! exporter's counters and a failing sink's last error. Before, `stats()` counted the queued push
//! as a successful export and nothing else said otherwise.

use std::time::{Duration, Instant};
use tracing_prof::{FileExporter, Profiler, PyroscopeConfig, PyroscopeExporter};
use tracing_subscriber::prelude::*;

/// A sink that fails with the same error every time.
struct Refuses;

impl tracing_prof::Sink for Refuses {
    fn name(&self) -> &str {
        "refuses"
    }
    fn export(&mut self, _: &tracing_prof::Snapshot) -> Result<(), tracing_prof::core::SinkError> {
        Err("no room".into())
    }
}

#[test]
fn one_call_shows_every_sink() {
    if crate::isolated(module_path!(), "one_call_shows_every_sink") {
        return;
    }
    // A port nothing listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("tracing-prof-sinkstats-{}", std::process::id()));
    let pyroscope = PyroscopeExporter::start(
        PyroscopeConfig::new(format!("http://127.0.0.1:{port}"), "sinkstats")
            .retries(0, Duration::from_millis(100))
            .flush_timeout(Duration::from_millis(200)),
    )
    .unwrap();
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .sink(FileExporter::new(&dir))
        .sink(pyroscope)
        .sink(Refuses)
        .build()
        .unwrap();
    // One span, so that the push has a profile to carry (an empty one is not sent).
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || tracing::info_span!("work").in_scope(|| {}));
    guard.flush(Duration::from_secs(20)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let stats = loop {
        let stats = guard.profiler().sink_stats();
        let pushed = stats[1].delivery.unwrap();
        if pushed.dropped > 0 || Instant::now() > deadline {
            break stats;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let names: Vec<&str> = stats.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["pprof files", "pyroscope", "refuses"]);
    assert_eq!((stats[0].exports, stats[0].export_errors), (1, 0));
    assert_eq!(stats[0].delivery, None);
    // Queued: a successful export; refused by the network: failed and dropped.
    assert_eq!((stats[1].exports, stats[1].export_errors), (1, 0));
    let pushed = stats[1].delivery.unwrap();
    assert_eq!(
        (
            pushed.delivered,
            pushed.failed_attempts,
            pushed.dropped,
            pushed.queued
        ),
        (0, 1, 1, 0),
        "{pushed:?}"
    );
    assert_eq!((stats[2].exports, stats[2].export_errors), (0, 1));
    assert_eq!(stats[2].last_error.as_deref(), Some("no room"));
    let totals = guard.profiler().stats();
    assert_eq!((totals.exports, totals.export_errors), (2, 1));
    drop(guard);
    let _ = std::fs::remove_dir_all(&dir);
}
