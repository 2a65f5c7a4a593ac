//! Span time with a fake clock: every number exact.

use std::sync::atomic::{AtomicU64, Ordering};
use tracing_prof_core::{Clock, CpuSample, ProfileLayer};
use tracing_prof_model::Snapshot;
use tracing_subscriber::prelude::*;

static NOW: AtomicU64 = AtomicU64::new(1_000);
static CPU_USER: AtomicU64 = AtomicU64::new(0);
static CPU_SYS: AtomicU64 = AtomicU64::new(0);

static FIRST: std::sync::Mutex<Option<Snapshot>> = std::sync::Mutex::new(None);

struct FakeClock;

impl Clock for FakeClock {
    fn now_ns(&self) -> u64 {
        NOW.load(Ordering::SeqCst)
    }
    fn thread_cpu(&self) -> CpuSample {
        let (user_ns, sys_ns) = (
            CPU_USER.load(Ordering::SeqCst),
            CPU_SYS.load(Ordering::SeqCst),
        );
        CpuSample {
            total_ns: user_ns + sys_ns,
            user_ns,
            sys_ns,
        }
    }
}

fn advance(wall: u64, user: u64, sys: u64) {
    NOW.fetch_add(wall, Ordering::SeqCst);
    CPU_USER.fetch_add(user, Ordering::SeqCst);
    CPU_SYS.fetch_add(sys, Ordering::SeqCst);
}

#[test]
fn busy_idle_wall_and_cpu_are_exact() {
    if crate::isolated(module_path!(), "busy_idle_wall_and_cpu_are_exact") {
        return;
    }
    let layer = ProfileLayer::new()
        .with_cpu_time(true)
        .with_clock(FakeClock);
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
        for round in 0..2 {
            if round == 1 {
                *FIRST.lock().unwrap() = Some(tracing_prof_core::capture(
                    std::time::Duration::from_secs(1),
                ));
            }
            let root = tracing::info_span!("exact_root");
            advance(500, 0, 0); // idle
            {
                let _e = root.enter();
                advance(200, 150, 10); // busy
                let child = tracing::info_span!("exact_child");
                {
                    let _c = child.enter();
                    advance(100, 80, 5);
                    // Re-entering an entered span on the same thread must not count twice.
                    let _again = root.enter();
                    advance(40, 30, 0);
                }
                advance(60, 20, 0); // root busy, child idle
                drop(child);
            }
            advance(300, 0, 0); // idle
            // A child entered while its parent is not (like a spawned task): not subtracted.
            tracing::info_span!(parent: &root, "exact_spawned").in_scope(|| advance(70, 60, 0));
            root.in_scope(|| advance(1_000, 900, 100));
        }
        // Intervals of every length: 999 ns, 1 µs, 15 ms, 2 s and 20 s of own time, and one
        // of 150 ns around a 1 s child (its own length leaves the child out).
        let polled = tracing::info_span!("exact_polled");
        for ns in [999, 1_000, 15_000_000, 2_000_000_000, 20_000_000_000] {
            polled.in_scope(|| advance(ns, 0, 0));
        }
        polled.in_scope(|| {
            advance(100, 0, 0);
            tracing::info_span!("exact_polled_child").in_scope(|| advance(1_000_000_000, 0, 0));
            advance(50, 0, 0);
        });
        // Exits out of order: `a` exits while `b`, entered inside it, is still entered. `a`'s
        // interval ends there (150 ns, `b` not yet done, so nothing of it is subtracted); `b`
        // keeps running (80 ns) and then restores what `a` would have restored.
        let a = tracing::info_span!("exact_unordered_a");
        let b = tracing::info_span!("exact_unordered_b");
        let none = tracing_prof_alloc::current_tag();
        let ga = a.enter();
        advance(100, 0, 0);
        let gb = b.enter();
        let b_tag = tracing_prof_alloc::current_tag();
        advance(50, 0, 0);
        drop(ga);
        assert_eq!(tracing_prof_alloc::current_tag(), b_tag, "b stays current");
        advance(30, 0, 0);
        drop(gb);
        assert_eq!(
            tracing_prof_alloc::current_tag(),
            none,
            "a's previous tag is back"
        );
    });
    let p = tracing_prof_core::capture(std::time::Duration::ZERO);
    let busy = |path: &[&str]| p.path(path).map(|p| p.time.busy_ns);
    assert_eq!(busy(&["exact_unordered_a"]), Some(150));
    assert_eq!(busy(&["exact_unordered_b"]), Some(80));
    let root = p.path(&["exact_root"]).expect("root path");
    let child = p.path(&["exact_root", "exact_child"]).expect("child path");
    // Per root: created, +500 idle, +400 busy (200+100+40+60), +370 idle, +1000 busy: wall 2270,
    // busy 1400 (so idle 870). Self time leaves out the child's nested interval (140 busy,
    // 110 user, 5 sys): busy 1260, user 280 - 110 + 900, sys 15 - 5 + 100.
    let t = root.time;
    assert_eq!(
        (t.spans, t.wall_ns, t.busy_ns, t.idle_ns),
        (2, 2 * 2_270, 2 * 1_260, 2 * 870)
    );
    assert_eq!(
        (t.cpu_ns, t.cpu_user_ns, t.cpu_sys_ns),
        (2 * 1_180, 2 * 1_070, 2 * 110)
    );
    // Per child: created, busy 140 (100 + 40 while root re-entered inside it), idle 60.
    let t = child.time;
    assert_eq!(
        (t.spans, t.wall_ns, t.busy_ns, t.idle_ns),
        (2, 2 * 200, 2 * 140, 2 * 60)
    );
    assert_eq!(
        (t.cpu_ns, t.cpu_user_ns, t.cpu_sys_ns),
        (2 * 115, 2 * 110, 2 * 5)
    );
    let t = p
        .path(&["exact_root", "exact_spawned"])
        .expect("spawned path")
        .time;
    assert_eq!(
        (t.spans, t.wall_ns, t.busy_ns, t.idle_ns, t.cpu_user_ns),
        (2, 140, 140, 0, 120)
    );
    // Each interval in its length's bucket (<1us, <10us, ..., >=10s), own time.
    assert_eq!(
        root.time.intervals,
        [2, 2, 0, 0, 0, 0, 0, 0, 0],
        "260 ns and 1 µs, twice"
    );
    assert_eq!(child.time.intervals, [2, 0, 0, 0, 0, 0, 0, 0, 0]);
    let polled = p.path(&["exact_polled"]).expect("polled path").time;
    assert_eq!(polled.intervals, [2, 1, 0, 0, 0, 1, 0, 1, 1]);
    let polled_child = p
        .path(&["exact_polled", "exact_polled_child"])
        .unwrap()
        .time;
    assert_eq!(polled_child.intervals, [0, 0, 0, 0, 0, 0, 0, 1, 0]);
    // In the spans profile: `intervals` samples labelled by bucket, read back by go tool pprof
    // as any label (`-sample_index=intervals -tags`).
    let spans = p.profile(tracing_prof_model::ProfileKind::Spans);
    let i = spans.sample_type_index("intervals").unwrap();
    let mut buckets: Vec<(String, i64)> = spans
        .samples
        .iter()
        .filter(|s| s.span_path() == "exact_polled" && s.values[i] > 0)
        .map(|s| (s.label("interval").unwrap().to_owned(), s.values[i]))
        .collect();
    buckets.sort();
    let expected: Vec<(String, i64)> = [
        ("<100ms", 1),
        ("<10s", 1),
        ("<10us", 1),
        ("<1us", 2),
        (">=10s", 1),
    ]
    .map(|(b, n)| (b.to_owned(), n))
    .to_vec();
    assert_eq!(buckets, expected);
    assert!(
        spans
            .samples
            .iter()
            .filter(|s| s.label("interval").is_some())
            .all(|s| s.values.iter().filter(|&&v| v != 0).count() == 1),
        "interval samples count intervals only"
    );

    // Cumulative (pprof's cum): root's inclusive time plus the spawned child's.
    let (cum, _) = p.cumulative(root);
    assert_eq!(
        (cum.busy_ns, cum.cpu_user_ns, cum.cpu_sys_ns),
        (2 * 1_470, 2 * 1_240, 2 * 115)
    );

    // The window over the second round holds exactly one round's numbers.
    let first = FIRST.lock().unwrap().take().unwrap();
    let mut later = p.clone();
    later.duration = std::time::Duration::from_secs(3);
    let w = later.window_since(&first);
    assert!(w.window && w.duration == std::time::Duration::from_secs(2));
    let t = w.path(&["exact_root"]).unwrap().time;
    assert_eq!(
        (t.spans, t.wall_ns, t.busy_ns, t.idle_ns, t.cpu_user_ns),
        (1, 2_270, 1_260, 870, 1_070)
    );
    assert_eq!(
        w.path(&["exact_root", "exact_child"]).unwrap().time.busy_ns,
        140
    );
}

/// The latency clock: a clock of its own, so that the test above, running beside this one,
/// never moves it.
static LATENCY_NOW: AtomicU64 = AtomicU64::new(1_000);

struct LatencyClock;

impl Clock for LatencyClock {
    fn now_ns(&self) -> u64 {
        LATENCY_NOW.load(Ordering::SeqCst)
    }
    fn thread_cpu(&self) -> CpuSample {
        CpuSample::default()
    }
}

/// Known span durations land in the documented buckets (the first bound at least the
/// duration), and ERROR events are counted once per span, on the span they were recorded in
/// (its explicit parent, or the current span), never below ERROR.
#[test]
fn durations_land_in_their_buckets_and_errors_on_their_span() {
    if crate::isolated(
        module_path!(),
        "durations_land_in_their_buckets_and_errors_on_their_span",
    ) {
        return;
    }
    use tracing_prof_model::{DURATION_BOUNDS_NS, DURATION_BUCKETS};
    let layer = ProfileLayer::new().with_clock(LatencyClock);
    let wait = |ns: u64| LATENCY_NOW.fetch_add(ns, Ordering::SeqCst);
    // Wall times (creation to close), in ns: 999, exactly 1 µs, 1 µs + 1 ns, 1.1 ms (twice),
    // exactly 2.5 ms, 3 s, and 2 hours (past the last bound).
    let lengths = [
        999,
        1_000,
        1_001,
        1_100_000,
        1_100_000,
        2_500_000,
        3_000_000_000,
        7_200_000_000_000,
    ];
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
        for (i, &ns) in lengths.iter().enumerate() {
            let span = tracing::info_span!("latency_request");
            span.in_scope(|| {
                wait(ns / 2);
                if i == 3 {
                    // Two ERROR events in one span: one errored span.
                    tracing::error!("failed");
                    tracing::error!("failed again");
                }
                if i == 4 {
                    tracing::warn!("only a warning");
                    // Recorded in the child, which is the current span then: the child's.
                    tracing::info_span!("latency_child").in_scope(|| tracing::error!("x"));
                }
            });
            wait(ns - ns / 2);
            if i == 5 {
                // Outside the span, with the span as its explicit parent: the span's.
                tracing::error!(parent: &span, "late");
            }
        }
        // An ERROR event in no span: counted nowhere.
        tracing::error!("in no span");
    });
    let p = tracing_prof_core::capture(std::time::Duration::from_secs(1));
    let t = p.path(&["latency_request"]).expect("the path").time;
    let mut expected = [0u64; DURATION_BUCKETS];
    for (bucket, n) in [(0, 2), (1, 1), (31, 2), (34, 1), (65, 1), (90, 1)] {
        expected[bucket] = n;
    }
    assert_eq!(t.durations, expected);
    // The documented bounds: 1 µs, 1.25 µs, 1.25 ms, 2.5 ms, 3.15 s.
    assert_eq!(
        [0, 1, 31, 34, 65].map(|i| DURATION_BOUNDS_NS[i]),
        [1_000, 1_250, 1_250_000, 2_500_000, 3_150_000_000]
    );
    assert_eq!((t.spans, t.errors), (8, 2));
    assert_eq!(t.wall_ns, lengths.iter().sum::<u64>());
    let child = p.path(&["latency_request", "latency_child"]).unwrap().time;
    assert_eq!((child.spans, child.errors), (1, 1));
    assert_eq!(
        child.durations[0], 1,
        "a child of no length: the first bucket"
    );
    // The spans profile carries the histogram: per bucket a sample holding only `durations`,
    // labelled with the bucket's bound (the last, past every bound, i64::MAX).
    let spans = p.profile(tracing_prof_model::ProfileKind::Spans);
    let k = spans
        .sample_type_index("durations")
        .expect("a durations sample type");
    let mut by_bound: Vec<(i64, i64)> = spans
        .samples
        .iter()
        .filter(|s| {
            s.values[k] > 0 && s.stack.len() == 1 && s.stack[0].function.contains("latency_request")
        })
        .map(|s| {
            let le = s
                .labels
                .iter()
                .find(|l| l.key == "duration_le")
                .map(|l| match l.value {
                    tracing_prof_model::LabelValue::Num { value, .. } => value,
                    _ => panic!("duration_le is numeric"),
                });
            assert_eq!(
                s.values.iter().filter(|&&v| v != 0).count(),
                1,
                "durations only"
            );
            (le.expect("a duration_le label"), s.values[k])
        })
        .collect();
    by_bound.sort();
    // And the errors, on the path's own sample.
    let e = spans
        .sample_type_index("errors")
        .expect("an errors sample type");
    let errors: i64 = spans
        .samples
        .iter()
        .filter(|s| s.stack.len() == 1 && s.stack[0].function.contains("latency_request"))
        .map(|s| s.values[e])
        .sum();
    assert_eq!(errors, 2);
    assert_eq!(
        by_bound,
        [
            (1_000, 2),
            (1_250, 1),
            (1_250_000, 2),
            (2_500_000, 1),
            (3_150_000_000, 1),
            (i64::MAX, 1),
        ]
    );
}
