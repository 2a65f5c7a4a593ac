//! Polls that block the executor: a handler that blocks a tokio worker for 50 ms (a
//! `std::thread::sleep` inside an async span) is reported as long polls for exactly its span
//! path, through the API, one event and a label in the `spans` profile; a handler that awaits
//! as long, the span around the blocking one, and a span that blocks a thread that is not a
//! worker are not.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tracing::{Instrument, info_span};
use tracing_prof::Profiler;
use tracing_prof::model::ProfileKind;
use tracing_subscriber::prelude::*;

static EVENTS: AtomicU64 = AtomicU64::new(0);

/// Counts the profiler's long-poll events.
struct Events;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Events {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if e.metadata().target() == "tracing_prof::long_poll" {
            EVENTS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[test]
fn a_blocking_handler_is_reported_and_a_polite_one_is_not() {
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    tracing_subscriber::registry()
        .with(layer)
        .with(Events)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for _ in 0..3 {
            tokio::spawn(
                async {
                    async { std::thread::sleep(Duration::from_millis(50)) }
                        .instrument(info_span!("blocking_handler"))
                        .await;
                    async { tokio::time::sleep(Duration::from_millis(50)).await }
                        .instrument(info_span!("polite_handler"))
                        .await;
                }
                .instrument(info_span!("request")),
            )
            .await
            .unwrap();
        }
    });
    // Not a worker: blocking here blocks no executor.
    info_span!("main_thread_work").in_scope(|| std::thread::sleep(Duration::from_millis(50)));

    let profiler = guard.profiler().clone();
    let long = profiler.long_polls();
    let rows: Vec<(&str, u64)> = long.iter().map(|l| (l.path.as_str(), l.count)).collect();
    assert_eq!(rows, [("request -> blocking_handler", 3)], "{long:#?}");
    assert!(long[0].longest >= Duration::from_millis(50));
    assert!(long[0].longest < Duration::from_secs(5));

    // In the spans profile, as a label of that path only.
    let spans = profiler.snapshot().profile(ProfileKind::Spans);
    let labelled: Vec<(String, String)> = spans
        .samples
        .iter()
        .filter_map(|s| {
            s.labels
                .iter()
                .find(|l| l.key == "long_polls")
                .map(|l| (s.span_path(), l.value_text()))
        })
        .collect();
    assert_eq!(
        labelled,
        [("request -> blocking_handler".to_owned(), "3".to_owned())]
    );

    // One event per path, however many exports see it.
    guard.flush(Duration::from_secs(20)).unwrap();
    guard.flush(Duration::from_secs(20)).unwrap();
    assert_eq!(EVENTS.load(Ordering::Relaxed), 1);
    drop(rt);
    drop(guard);
}
