//! CPU samples linked to OpenTelemetry spans, with the real OpenTelemetry SDK
//! (`opentelemetry_sdk`'s in-memory span exporter) and `tracing-opentelemetry`.
//!
//! Each request is an instrumented future that burns CPU, is parked at an `.await`, and is
//! finished on another thread (as a tokio worker steals a woken task); it also hands a child
//! future, instrumented with a span created inside the request, to a third thread that never
//! enters the request's span. Code outside every span burns CPU meanwhile. Then:
//! - every local root span that was exported carries `pyroscope.profile.id`, its own span id;
//! - the span ids and trace ids on the samples are exactly those of the exported root spans,
//!   and each request's samples carry its own on all three threads;
//! - no sample of the code outside the spans carries one;
//! - `go tool pprof` finds each request's samples by its `span_id` label;
//! - with `TraceLinks::AllSpans`, a child span's samples carry the child's own span id.

use tracing_prof_test_support as common;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tracing::Instrument;
use tracing_prof::model::{CpuStack, Snapshot};
use tracing_prof::{ProfileKind, Profiler, TaggingAllocator, TraceLinks};
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: TaggingAllocator<std::alloc::System> = TaggingAllocator::new(std::alloc::System);

const REQUESTS: u64 = 4;
/// CPU each burn uses: 40 samples at 1 kHz.
const BURN_NS: u64 = 40_000_000;

/// Burns `ns` of CPU; `seed` keeps the callers' code apart (identical functions are folded
/// into one by the linker, and would share a name).
#[inline(always)]
fn burn(ns: u64, seed: u64) -> u64 {
    let start = common::thread_cpu_ns();
    let mut x = seed;
    while common::thread_cpu_ns() - start < ns {
        for _ in 0..10_000 {
            x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(3));
        }
    }
    x
}

#[inline(never)]
fn burn_before_hop() -> u64 {
    black_box(burn(BURN_NS, 11))
}

#[inline(never)]
fn burn_after_hop() -> u64 {
    black_box(burn(BURN_NS, 12))
}

#[inline(never)]
fn burn_in_spawned_part() -> u64 {
    black_box(burn(BURN_NS, 13))
}

#[inline(never)]
fn burn_in_query() -> u64 {
    black_box(burn(BURN_NS, 14))
}

#[inline(never)]
fn burn_outside() -> u64 {
    black_box(burn(BURN_NS, 15))
}

/// Pending once, then ready: where a request is parked and moved to another thread.
struct Park(bool);

impl Future for Park {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if std::mem::replace(&mut self.0, true) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Polls `task` once on the calling thread; whether it finished.
fn poll_once(task: &mut Task) -> bool {
    task.as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_ready()
}

/// One request: work, a park, more work (on whichever thread polls it next), and a child
/// future (instrumented with a span made here, in the request) sent out through `spawned`.
async fn request(spawned: std::sync::mpsc::Sender<Task>) {
    burn_before_hop();
    let part: Task = Box::pin(
        async {
            burn_in_spawned_part();
        }
        .instrument(tracing::info_span!("spawned_part")),
    );
    spawned.send(part).unwrap();
    Park(false).await;
    burn_after_hop();
    async {
        burn_in_query();
    }
    .instrument(tracing::info_span!("db_query"))
    .await;
}

/// Runs `REQUESTS` requests as described in the module docs under `dispatch`, with code
/// outside any span burning CPU on a fourth thread meanwhile.
fn run_requests(dispatch: &tracing::Dispatch) {
    let (to_b, on_b) = std::sync::mpsc::channel::<Task>();
    let (to_c, on_c) = std::sync::mpsc::channel::<Task>();
    // Every thread has the subscriber as its default, as a runtime's workers have the global
    // one: spans made there (the query) are recorded.
    let d = dispatch.clone();
    let b = std::thread::spawn(move || {
        tracing::dispatcher::with_default(&d, || {
            for mut t in on_b {
                assert!(poll_once(&mut t), "a request finishes on its second poll");
            }
        })
    });
    let d = dispatch.clone();
    let c = std::thread::spawn(move || {
        tracing::dispatcher::with_default(&d, || {
            for mut t in on_c {
                assert!(poll_once(&mut t));
            }
        })
    });
    let outside = std::thread::spawn(burn_outside);
    tracing::dispatcher::with_default(dispatch, || {
        for i in 0..REQUESTS {
            let mut t: Task =
                Box::pin(request(to_c.clone()).instrument(tracing::info_span!("request", i)));
            assert!(!poll_once(&mut t), "a request parks once");
            to_b.send(t).unwrap();
        }
    });
    drop((to_b, to_c));
    b.join().unwrap();
    c.join().unwrap();
    outside.join().unwrap();
}

/// What the in-memory exporter got: span id → (trace id, name, parent span id, attribute
/// `pyroscope.profile.id`).
type Exported = BTreeMap<u64, (u128, String, u64, Option<String>)>;

fn exported(exporter: &InMemorySpanExporter) -> Exported {
    exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .map(|s| {
            let id = u64::from_be_bytes(s.span_context.span_id().to_bytes());
            let trace = u128::from_be_bytes(s.span_context.trace_id().to_bytes());
            let parent = u64::from_be_bytes(s.parent_span_id.to_bytes());
            let attr = s
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == "pyroscope.profile.id")
                .map(|kv| kv.value.as_str().into_owned());
            (id, (trace, s.name.into_owned(), parent, attr))
        })
        .collect()
}

/// Linked samples per (span id, innermost code function of ours), and every link's trace id.
fn linked(
    snapshot: &Snapshot,
    burns: &[&str],
) -> (BTreeMap<(u64, String), u64>, BTreeMap<u64, u128>) {
    let mut per = BTreeMap::new();
    let mut traces = BTreeMap::new();
    for s in &snapshot.cpu_stacks {
        let Some(burn) = burn_of(s, burns) else {
            continue;
        };
        for l in &s.links {
            *per.entry((l.link.span_id, burn.to_owned())).or_insert(0) += l.samples;
            traces.insert(l.link.span_id, l.link.trace_id);
        }
    }
    (per, traces)
}

/// Which of `burns` the stack's code is in.
fn burn_of<'a>(s: &CpuStack, burns: &[&'a str]) -> Option<&'a str> {
    burns.iter().copied().find(|b| {
        s.code
            .iter()
            .any(|f| f.function.ends_with(&format!("trace_links::{b}")))
    })
}

/// Samples of stacks in `burn`: (all, linked).
fn samples_in(snapshot: &Snapshot, burn: &str) -> (u64, u64) {
    snapshot
        .cpu_stacks
        .iter()
        .filter(|s| burn_of(s, &[burn]).is_some())
        .fold((0, 0), |(all, linked), s| {
            (all + s.samples, linked + s.samples - s.unlinked_samples())
        })
}

fn otel_subscriber(
    layer: tracing_prof::ProfileLayer,
) -> (tracing::Dispatch, InMemorySpanExporter, SdkTracerProvider) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("trace_links"));
    let subscriber = tracing_subscriber::registry().with(layer).with(otel);
    (tracing::Dispatch::new(subscriber), exporter, provider)
}

#[test]
fn cpu_samples_carry_the_span_ids_of_their_requests() {
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .cpu_sampling(1000)
        .heap_sampling(0)
        .build()
        .unwrap();
    assert_eq!(guard.profiler().cpu_error(), None);
    let (dispatch, exporter, provider) = otel_subscriber(layer);
    run_requests(&dispatch);
    provider.force_flush().unwrap();
    let spans = exported(&exporter);
    let snapshot = guard.profiler().snapshot();

    // Local roots: the requests, each with its own id as `pyroscope.profile.id`; their
    // children without it.
    let roots: BTreeMap<u64, u128> = spans
        .iter()
        .filter(|(_, (_, name, _, _))| name == "request")
        .map(|(&id, &(trace, _, _, _))| (id, trace))
        .collect();
    assert_eq!(roots.len() as u64, REQUESTS, "{spans:#?}");
    for (id, (_, name, parent, attr)) in &spans {
        if name == "request" {
            assert_eq!(*parent, 0, "a request is a root");
            assert_eq!(attr.as_deref(), Some(&*format!("{id:016x}")), "{name}");
        } else {
            assert!(roots.contains_key(parent), "{name} is a request's child");
            assert_eq!(attr, &None, "{name} is no local root");
        }
    }

    let burns = [
        "burn_before_hop",
        "burn_after_hop",
        "burn_in_spawned_part",
        "burn_in_query",
    ];
    let (per, traces) = linked(&snapshot, &burns);
    // Exactly the roots' ids, with their trace ids.
    assert_eq!(traces, roots, "links on samples vs exported root spans");
    // Each request's own samples carry its id on all three threads, in its child spans too.
    for id in roots.keys() {
        for burn in burns {
            let n = per.get(&(*id, burn.to_owned())).copied().unwrap_or(0);
            assert!(
                n > 0,
                "request {id:016x} has no linked sample in {burn}: {per:?}"
            );
        }
    }
    // Nearly every sample of request work is linked: a sample that lands between a span's
    // tag and its link being set (a few instructions) counts unlinked.
    for burn in burns {
        let (all, with_link) = samples_in(&snapshot, burn);
        assert!(all >= 20, "{burn}: {all} samples");
        assert!(
            with_link * 100 >= all * 95,
            "{burn}: {with_link} of {all} linked"
        );
    }
    // Nothing leaks to the code outside.
    let (all, with_link) = samples_in(&snapshot, "burn_outside");
    assert!(all >= 20, "burn_outside: {all} samples");
    assert_eq!(with_link, 0, "samples outside every span carry a span id");
    assert_eq!(guard.profiler().stats().cpu_links_let_go, 0);

    if common::have_go() {
        // pprof selects a request's samples by its label, and counts what the snapshot did.
        let file = common::write_profile(&snapshot, ProfileKind::Cpu, "trace_links_cpu");
        for id in roots.keys() {
            let total: u64 = snapshot
                .cpu_stacks
                .iter()
                .flat_map(|s| &s.links)
                .filter(|l| l.link.span_id == *id)
                .map(|l| l.samples)
                .sum();
            // Anchored: pprof reads a bare value of digits then letters (`262240223407258e`)
            // as a number with a unit (`tagFilterRangeRx` in its `driver_focus.go`), which
            // matches no string label; `^...$` is always a regular expression to it.
            let focus = format!("-tagfocus=span_id=^{id:016x}$");
            let text = common::pprof(&["-top", "-sample_index=samples", &focus], &file);
            let shown = text
                .lines()
                .find_map(|l| {
                    let rest = l.strip_prefix("Showing nodes accounting for ")?;
                    rest.split(',').next()?.parse::<u64>().ok()
                })
                .unwrap_or_else(|| panic!("no total in:\n{text}"));
            assert_eq!(shown, total, "{focus}:\n{text}");
        }
    }

    // Every span linked to itself: the query's samples carry the query's id.
    let layer = tracing_prof::ProfileLayer::new().with_trace_links(TraceLinks::AllSpans);
    let (dispatch, exporter, provider) = otel_subscriber(layer);
    run_requests(&dispatch);
    provider.force_flush().unwrap();
    let spans2 = exported(&exporter);
    let window = guard.profiler().snapshot().window_since(&snapshot);
    let (per, traces) = linked(&window, &burns);
    for (&(id, ref burn), n) in &per {
        let (trace, name, _, attr) = &spans2[&id];
        assert_eq!(traces[&id], *trace);
        assert_eq!(attr.as_deref(), Some(&*format!("{id:016x}")), "{name}");
        let expected = match burn.as_str() {
            "burn_in_query" => "db_query",
            "burn_in_spawned_part" => "spawned_part",
            _ => "request",
        };
        assert_eq!(
            name, expected,
            "{n} samples of {burn} linked to a {name} span"
        );
    }
    let queries = spans2.values().filter(|s| s.1 == "db_query").count() as u64;
    let linked_queries: BTreeSet<u64> = per
        .keys()
        .filter(|(_, b)| b == "burn_in_query")
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(linked_queries.len() as u64, queries);
    assert_eq!(queries, REQUESTS);
    drop(guard);
}

/// A root span entered where its subscriber is not the thread's default (another one is, or
/// none) is linked all the same: the layer reads the OpenTelemetry span through the
/// subscriber it belongs to, not through the default, which it uses only when it is its own.
#[test]
fn a_root_entered_under_another_default_subscriber_is_linked() {
    let (dispatch, exporter, provider) = otel_subscriber(tracing_prof::ProfileLayer::new());
    let (under_other, under_none, under_own) = tracing::dispatcher::with_default(&dispatch, || {
        (
            tracing::info_span!("under_other"),
            tracing::info_span!("under_none"),
            tracing::info_span!("under_own"),
        )
    });
    let other = tracing::Dispatch::new(tracing_subscriber::registry());
    tracing::dispatcher::with_default(&other, || drop(under_other.enter()));
    std::thread::spawn(move || drop(under_none.enter()))
        .join()
        .unwrap();
    tracing::dispatcher::with_default(&dispatch, || drop(under_own.enter()));
    drop((under_other, under_own));
    provider.force_flush().unwrap();
    let spans = exported(&exporter);
    let names: BTreeSet<&str> = spans.values().map(|s| s.1.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["under_none", "under_other", "under_own"])
    );
    for (id, (_, name, parent, attr)) in &spans {
        assert_eq!(*parent, 0, "{name} is a root");
        assert_eq!(attr.as_deref(), Some(&*format!("{id:016x}")), "{name}");
    }
}

/// Latency exemplars: a linked span's close leaves, in its path's bucket, the trace of that
/// span (a child's, its local root's), with its duration, for `/metrics` to show.
#[test]
fn latency_exemplars_name_the_exported_traces() {
    let (dispatch, exporter, provider) = otel_subscriber(tracing_prof::ProfileLayer::new());
    tracing::dispatcher::with_default(&dispatch, || {
        for _ in 0..3 {
            tracing::info_span!("exemplar_request").in_scope(|| {
                std::thread::sleep(Duration::from_millis(2));
                tracing::info_span!("exemplar_child").in_scope(|| black_box(1));
            });
        }
    });
    provider.force_flush().unwrap();
    let spans = exported(&exporter);
    let snapshot = tracing_prof::core::capture_paths(Duration::from_secs(1));
    let path = |names: &[&str]| {
        snapshot
            .path(names)
            .unwrap_or_else(|| panic!("no {names:?}"))
            .clone()
    };
    let root = path(&["exemplar_request"]);
    assert!(!root.exemplars.is_empty(), "no exemplar: {root:?}");
    for e in &root.exemplars {
        let (trace, name, _, _) = &spans[&e.link.span_id];
        assert_eq!(
            (name.as_str(), *trace),
            ("exemplar_request", e.link.trace_id)
        );
        assert!(e.duration_ns >= 2_000_000, "{e:?}");
        assert_eq!(
            e.bucket,
            tracing_prof::model::duration_bucket(e.duration_ns)
        );
        assert!(root.time.durations[e.bucket] > 0);
    }
    let child = path(&["exemplar_request", "exemplar_child"]);
    for e in &child.exemplars {
        assert_eq!(
            spans[&e.link.span_id].1, "exemplar_request",
            "the root's link"
        );
    }
    assert!(!child.exemplars.is_empty());
}
