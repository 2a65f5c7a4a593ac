//! What a `/metrics` scrape costs to encode at 1 024 span paths (the default path cap): every
//! path with counters and a spread of latency buckets, 20 of them with histograms (the
//! default), in the Prometheus text format and in OpenMetrics, against a service with 64 paths.
//! Reading the tables (`Profiler::paths_snapshot`) is not in it.
//!
//! `cargo bench -p tracing-prof-export --bench metrics_scrape`

use std::hint::black_box;
use std::time::{Duration, SystemTime};
use tracing_prof_export::metrics::{Format, SpanMetrics};
use tracing_prof_model::{PathKind, PathProfile, Snapshot, SpanFrame, duration_bucket};
use tracing_prof_test_support::bench::ab;

/// `n` span paths `service -> handler_I`, each with spans spread over about ten buckets.
fn snapshot(n: usize) -> Snapshot {
    let mut s = Snapshot::new(SystemTime::now(), Duration::from_secs(60));
    for i in 0..n {
        let frames = vec![
            SpanFrame::new("app", "service", None, None),
            SpanFrame::new("app", &format!("handler_{i}"), None, None),
        ];
        let mut p = PathProfile::new(PathKind::Span, frames);
        for k in 0..10u64 {
            let ns = 20_000 * (k + 1) * (k + 1) + i as u64;
            p.time.durations[duration_bucket(ns)] += 100 + k;
            p.time.spans += 100 + k;
            p.time.wall_ns += ns * (100 + k);
        }
        p.time.busy_ns = p.time.wall_ns / 2;
        p.time.cpu_ns = p.time.wall_ns / 3;
        p.memory.alloc_bytes = 1 << 20;
        p.memory.inuse_bytes = 4096;
        s.paths.push(p);
    }
    s
}

fn main() {
    let (small, large) = (snapshot(64), snapshot(1024));
    let metrics = SpanMetrics::new();
    let encode = |s: &Snapshot, format| {
        let s = s.clone();
        let m = &metrics;
        move |n: u64| {
            for _ in 0..n {
                black_box(m.encode(&s, None, &[], format).len());
            }
        }
    };
    // The first encode of each chooses the histogram paths: done before timing.
    for s in [&small, &large] {
        black_box(metrics.encode(s, None, &[], Format::Prometheus));
    }
    let bytes = |s: &Snapshot, f| metrics.encode(s, None, &[], f).len();
    println!(
        "bytes per scrape: 64 paths {} (Prometheus text), 1 024 paths {} (Prometheus text), {} (OpenMetrics)",
        bytes(&small, Format::Prometheus),
        bytes(&large, Format::Prometheus),
        bytes(&large, Format::OpenMetrics)
    );
    ab::compare(
        "a /metrics scrape's encoding: 64 span paths against 1 024 (20 with histograms)",
        15,
        vec![
            ab::variant(
                "64 paths, Prometheus text",
                encode(&small, Format::Prometheus),
            ),
            ab::variant(
                "1 024 paths, Prometheus text",
                encode(&large, Format::Prometheus),
            ),
            ab::variant(
                "1 024 paths, OpenMetrics",
                encode(&large, Format::OpenMetrics),
            ),
        ],
    );
}
