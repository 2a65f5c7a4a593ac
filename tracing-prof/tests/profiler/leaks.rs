//! A deliberate leak is reported as a suspected leak within the configured number of captures
//! (API, a log event, the pprof file); a steady working set is not; a leak that stops is no
//! longer suspected. Captures are driven by `flush`, so every step is deterministic.

use tracing_prof_test_support as common;

use std::sync::Mutex;
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing_prof::{FileExporter, Profiler};
use tracing_subscriber::Layer;
use tracing_subscriber::prelude::*;

static LEAKED: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
static EVENTS: Mutex<Vec<(tracing::Level, String)>> = Mutex::new(Vec::new());

/// Records every event's level and message.
struct Events;

impl<S: tracing::Subscriber> Layer<S> for Events {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl Visit for Message {
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut m = Message(String::new());
        event.record(&mut m);
        EVENTS
            .lock()
            .unwrap()
            .push((*event.metadata().level(), m.0));
    }
}

#[test]
fn a_leak_is_suspected_and_a_steady_working_set_is_not() {
    if crate::isolated(
        module_path!(),
        "a_leak_is_suspected_and_a_steady_working_set_is_not",
    ) {
        return;
    }
    const SNAPSHOTS: usize = 4;
    let scratch = common::scratch_dir("leaks");
    let dir = scratch.path().join("profiles");
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .leak_detection(SNAPSHOTS, 8 * 1024)
        .leak_level(tracing::Level::WARN)
        .heap_sampling(1) // every allocation sampled: the leaking code is found too
        .sink(FileExporter::new(&dir).kinds([tracing_prof::ProfileKind::SpanMemory]))
        .build()
        .unwrap();
    tracing_subscriber::registry()
        .with(layer)
        .with(Events)
        .init();
    // The list of leaked blocks grows outside the spans, so that the numbers below are exact.
    LEAKED.lock().unwrap().reserve(16);
    let steady_span = tracing::info_span!("steady");
    let mut ring: Vec<Vec<u8>> =
        steady_span.in_scope(|| (0..16).map(|_| vec![1u8; 4096]).collect());
    let profiler = guard.profiler().clone();
    let leaky = |p: &tracing_prof::Profiler| p.suspected_leaks().iter().any(|l| l.path == "leaky");

    for round in 0..8usize {
        tracing::info_span!("leaky").in_scope(|| LEAKED.lock().unwrap().push(vec![2u8; 4096]));
        // The same working set, replaced: as much freed as allocated.
        steady_span.in_scope(|| {
            for slot in &mut ring {
                *slot = vec![3u8; 4096];
            }
        });
        guard.flush(Duration::from_secs(30)).unwrap();
        // The first capture is the baseline; each later one is a rise.
        assert_eq!(
            leaky(&profiler),
            round >= SNAPSHOTS,
            "after capture {round}"
        );
        assert!(
            profiler
                .suspected_leaks()
                .iter()
                .all(|l| l.path != "steady"),
            "a steady working set is no leak"
        );
    }
    let leak = profiler
        .suspected_leaks()
        .into_iter()
        .find(|l| l.path == "leaky")
        .unwrap();
    assert_eq!(
        (leak.snapshots, leak.growth_bytes, leak.inuse_bytes),
        (7, 7 * 4096, 8 * 4096)
    );
    assert!(
        profiler
            .snapshot()
            .suspected_leaks
            .iter()
            .any(|l| l.path == "leaky")
    );
    // The sampled stack that holds the memory: the closure that pushes into LEAKED.
    let stacks: Vec<_> = profiler
        .suspected_leaks()
        .into_iter()
        .filter(|l| !l.code.is_empty())
        .collect();
    assert_eq!(stacks.len(), 1, "{stacks:?}");
    assert!(
        stacks[0]
            .path
            .starts_with("leaky @ profiler::leaks::a_leak_is_suspected"),
        "{}",
        stacks[0].path
    );
    assert_eq!(
        (stacks[0].growth_bytes, stacks[0].inuse_bytes),
        (7 * 4096, 8 * 4096)
    );

    // One event, at the configured level, naming the path.
    let events: Vec<(tracing::Level, String)> = EVENTS
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, m)| m.contains("suspected memory leak"))
        .cloned()
        .collect();
    assert_eq!(events.len(), 2, "the path and its stack: {events:?}");
    let events: Vec<_> = events
        .into_iter()
        .filter(|(_, m)| m.contains("`leaky`"))
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, tracing::Level::WARN);
    assert!(
        events[0].1.contains("`leaky`") && events[0].1.contains("4 captures"),
        "{}",
        events[0].1
    );

    // The pprof file says so, for go tool pprof users.
    if common::have_go() {
        // The newest capture of the interval's files (the heap's peak, written beside them,
        // is a snapshot of its own moment).
        let newest = std::fs::read_dir(dir.join("captures"))
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| !p.to_string_lossy().contains("_peak."))
            .max()
            .unwrap();
        let comments = common::pprof(&["-comments"], &newest);
        assert!(comments.contains("suspected leak: leaky"), "{comments}");
        let tags = common::pprof(&["-tags"], &newest);
        assert!(
            tags.contains("leak") && tags.contains("suspected"),
            "{tags}"
        );
    }

    // The leak stops. A suspected leak stays suspected while the last 4 captures still rose in
    // one (a sampled estimate stands still between samples; a slow leak rises every other
    // capture), then not.
    for (capture, suspected) in [(1, true), (2, true), (3, true), (4, false)] {
        guard.flush(Duration::from_secs(30)).unwrap();
        assert_eq!(
            leaky(&profiler),
            suspected,
            "capture {capture} after the leak stopped"
        );
    }
    drop(guard);
}
