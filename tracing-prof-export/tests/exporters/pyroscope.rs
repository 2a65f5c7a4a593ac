//! Both Pyroscope APIs against a local server that answers by the rules of a real one
//! (`tracing_prof_test_support::pyroscope_server`, each rule citing the Pyroscope file it comes
//! from), with the example's workload in this process: every request passes every check, the
//! series arrive under profile types the Pyroscope UI knows or with the units it shows right,
//! nothing is counted twice, and Pyroscope 1.x's delta logic, replayed on what we push, keeps
//! every allocation number. And the rules themselves refuse what Pyroscope refuses.
//!
//! The example service pushing through both APIs, as a user runs it, is tested in
//! `as-user/tests/pyroscope.rs`.

use std::time::{Duration, SystemTime};
use tracing_prof_core::Profiler;
use tracing_prof_examples::{App, Workload, run};
use tracing_prof_export::{PyroscopeApi, PyroscopeConfig, PyroscopeExporter};
use tracing_prof_test_support::pyroscope_server::rules::{self, Refusal, SeriesIn};
use tracing_prof_test_support::pyroscope_server::storage::Ingester1x;
use tracing_prof_test_support::pyroscope_server::{
    Mock, OK, Request, check_types_and_duplicates, group_by_interval, label, stored_spans,
};
use tracing_subscriber::prelude::*;

const REQUEST: &str = "tracing_prof_examples::request [span]";

#[test]
fn both_apis_pass_every_rule_of_a_real_server() {
    if crate::isolated(module_path!(), "both_apis_pass_every_rule_of_a_real_server") {
        return;
    }
    let (push, ingest) = (Mock::start(OK), Mock::start(OK));
    let pusher = PyroscopeExporter::start(
        PyroscopeConfig::new(push.url(), "shop")
            .basic_auth("alice", "s3cret")
            .tenant("team-a")
            .tag("env", "test")
            .tag("region", "eu"),
    )
    .unwrap();
    let ingester = PyroscopeExporter::start(
        PyroscopeConfig::new(ingest.url(), "shop")
            .api(PyroscopeApi::Ingest)
            .bearer_token("tok3n")
            .tenant("team-b")
            .tag("env", "test"),
    )
    .unwrap();
    let (push_stats, ingest_stats) = (pusher.stats(), ingester.stats());
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .sink(pusher)
        .sink(ingester)
        .build()
        .unwrap();
    tracing_subscriber::registry().with(layer).init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let app = App::new(200);
    for requests in [300, 200, 100] {
        rt.block_on(run(
            &app,
            &Workload {
                requests,
                ..Workload::default()
            },
        ));
        guard.flush(Duration::from_secs(30)).unwrap();
    }
    drop(guard); // a last, nearly empty, export
    assert_eq!((push_stats.sent(), push_stats.dropped()), (4, 0));
    assert_eq!(
        (ingest_stats.sent(), ingest_stats.failed_attempts()),
        (4, 0)
    );

    // v1 push: every request accepted; headers as Pyroscope's clients send them.
    for r in push.taken() {
        assert_eq!(r.header("authorization"), Some("Basic YWxpY2U6czNjcmV0"));
        assert_eq!(r.header("x-scope-orgid"), Some("team-a"));
    }
    let pushed = push.accepted();
    assert_eq!(pushed.len(), 4);
    let types = check_types_and_duplicates(&pushed);
    assert_eq!(
        types.into_iter().collect::<Vec<_>>(),
        [
            "memory:alloc_objects:count:space:bytes",
            "memory:alloc_space:bytes:space:bytes",
            "memory:inuse_objects:count:space:bytes",
            "memory:inuse_space:bytes:space:bytes",
            "memory_peak:inuse_objects:count:space:bytes",
            "memory_peak:inuse_space:bytes:space:bytes",
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "process_cpu:samples:count:cpu:nanoseconds",
            "span_memory:alloc_objects:count:space:bytes",
            "span_memory:alloc_space:bytes:space:bytes",
            "span_memory:inuse_objects:count:space:bytes",
            "span_memory:inuse_space:bytes:space:bytes",
            "span_memory_peak:inuse_objects:count:space:bytes",
            "span_memory_peak:inuse_space:bytes:space:bytes",
            "spans:spans:count:spans:count",
        ]
    );
    // The heap's peak goes once, in the push of the window in which it was read: each one
    // pushed is higher than the one before.
    let peaks: Vec<i64> = pushed
        .iter()
        .flatten()
        .filter(|s| label(&s.labels, "__name__") == "span_memory_peak")
        .map(|s| s.profile.samples.iter().map(|(_, v)| v[1]).sum())
        .collect();
    assert!(
        !peaks.is_empty() && peaks.windows(2).all(|w| w[0] < w[1]),
        "{peaks:?}"
    );
    let mut store = Ingester1x::default();
    let mut no_delta_label = Ingester1x::default();
    for s in pushed.iter().flatten() {
        assert_eq!(label(&s.labels, "service_name"), "shop");
        assert_eq!(
            (label(&s.labels, "env"), label(&s.labels, "region")),
            ("test", "eu")
        );
        store.ingest(s);
        let mut without = s.clone();
        without.labels.retain(|(k, _)| k != "__delta__");
        no_delta_label.ingest(&without);
    }
    // Each push holds its own interval: together, every request once.
    let requests = stored_spans(&store, REQUEST);
    assert_eq!(requests, 600);
    // Allocation numbers survive Pyroscope 1.x: what is stored is what was sent.
    let sent: i64 = pushed
        .iter()
        .flatten()
        .filter(|s| label(&s.labels, "__name__") == "memory")
        .map(|s| {
            let col = s
                .profile
                .sample_types
                .iter()
                .position(|(t, _)| t == "alloc_space");
            s.profile
                .samples
                .iter()
                .map(|(_, v)| v[col.unwrap()])
                .sum::<i64>()
        })
        .sum();
    let alloc_space = "memory:alloc_space:bytes:space:bytes";
    assert!(sent > 0);
    assert_eq!(store.total(alloc_space), sent);
    // The replay has teeth: without `__delta__="false"` 1.x keeps almost nothing of it.
    assert!(
        no_delta_label.total(alloc_space) < sent / 2,
        "{} of {sent}",
        no_delta_label.total(alloc_space)
    );
    // The two memory series measure the same allocations: span_memory exactly, memory by
    // sampling (about a hundred samples here, so a wide bound: one run was 26% off).
    let exact = store.total("span_memory:alloc_space:bytes:space:bytes");
    assert!(
        (sent as f64 / exact as f64 - 1.0).abs() < 0.5,
        "sampled {sent} against exact {exact}"
    );
    let cpu = store.total("process_cpu:cpu:nanoseconds:cpu:nanoseconds");
    assert!(cpu > 0, "CPU samples were pushed");

    // /ingest: one request per series per interval; accepted, named from the sample types.
    for r in ingest.taken() {
        assert_eq!(r.header("authorization"), Some("Bearer tok3n"));
        assert_eq!(r.header("x-scope-orgid"), Some("team-b"));
        assert_eq!(r.query("name").as_deref(), Some("shop{env=test}"));
    }
    let ingested = ingest.accepted();
    let per_interval = group_by_interval(&ingest.taken(), &ingested);
    assert_eq!(per_interval.len(), 4);
    let types = check_types_and_duplicates(&per_interval);
    assert_eq!(
        types.into_iter().collect::<Vec<_>>(),
        [
            "memory:alloc_objects:count:space:bytes",
            "memory:alloc_space:bytes:space:bytes",
            "memory:inuse_objects:count:space:bytes",
            "memory:inuse_space:bytes:space:bytes",
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "process_cpu:samples:count:cpu:nanoseconds",
            "spans:spans:count:spans:count",
        ],
        "span_memory and the peak would land in `memory` through /ingest: they are not sent there"
    );
    let mut store = Ingester1x::default();
    for s in per_interval.iter().flatten() {
        assert_eq!(label(&s.labels, "service_name"), "shop");
        assert_eq!(label(&s.labels, "pyroscope_spy"), "tracing-prof");
        store.ingest(s);
    }
    let requests = stored_spans(&store, REQUEST);
    assert_eq!(requests, 600);
}

/// The rules refuse what a real server refuses: each case fails as Pyroscope says it does.
#[test]
fn the_rules_refuse_what_pyroscope_refuses() {
    if crate::isolated(module_path!(), "the_rules_refuse_what_pyroscope_refuses") {
        return;
    }
    use tracing_prof_model::{Frame, FrameKind, Profile, Sample, SampleType};
    let now = SystemTime::now();
    let pprof = |samples: usize, time: SystemTime| {
        let mut p = Profile::new(vec![SampleType::new("spans", "count")]);
        p.time = Some(time);
        for i in 0..samples {
            p.samples.push(Sample {
                stack: vec![Frame::new(FrameKind::Code, format!("f{i}"), None, None)],
                values: vec![1],
                labels: Vec::new(),
            });
        }
        p.encode()
    };
    fn labels<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut l = vec![("__name__", "spans"), ("service_name", "shop")];
        l.extend_from_slice(extra);
        l
    }
    let push = |labels: &[(&str, &str)], profile: Vec<u8>| {
        use prost::Message as _;
        use tracing_prof_export::__private::push as p;
        let body = p::PushRequest {
            series: vec![p::RawProfileSeries {
                labels: labels
                    .iter()
                    .map(|(k, v)| p::LabelPair {
                        name: (*k).into(),
                        value: (*v).into(),
                    })
                    .collect(),
                samples: vec![p::RawSample {
                    raw_profile: profile,
                    id: String::new(),
                }],
            }],
        }
        .encode_to_vec();
        rules::push(
            &Request {
                method: "POST".into(),
                target: "/push.v1.PusherService/Push".into(),
                headers: vec![("Content-Type".into(), "application/proto".into())],
                body,
            },
            now,
        )
    };
    let status = |r: Result<Vec<SeriesIn>, Refusal>| r.map(|_| 200).unwrap_or_else(|r| r.status);
    assert_eq!(status(push(&labels(&[]), pprof(3, now))), 200);
    assert_eq!(status(push(&labels(&[]), pprof(16_000, now))), 200);
    assert_eq!(status(push(&labels(&[]), pprof(16_001, now))), 400);
    let hour_ago = now - Duration::from_secs(3601);
    assert_eq!(status(push(&labels(&[]), pprof(3, hour_ago))), 400);
    let ahead = now + Duration::from_secs(601);
    assert_eq!(status(push(&labels(&[]), pprof(3, ahead))), 400);
    assert_eq!(
        status(push(&labels(&[("env", "a"), ("env", "b")]), pprof(3, now))),
        400
    );
    assert_eq!(status(push(&[("__name__", "spans")], pprof(3, now))), 400);
    let many: Vec<(String, String)> = (0..29).map(|i| (format!("t{i}"), "v".into())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(
        status(push(&labels(&many), pprof(3, now))),
        400,
        "31 label names"
    );
    assert_eq!(
        status(push(&labels(&many[..28]), pprof(3, now))),
        200,
        "30 label names"
    );
    let long = "v".repeat(2049);
    assert_eq!(status(push(&labels(&[("env", &long)]), pprof(3, now))), 400);

    // /ingest with `format=pprof` reads the body as a raw pprof: a multipart body fails.
    let boundary = "b0undary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"profile\"; filename=\"p\"\r\n\r\n"
    )
    .into_bytes();
    body.extend(pprof(3, now));
    body.extend(format!("\r\n--{boundary}--\r\n").bytes());
    let ingest = |target: &str| {
        rules::ingest(
            &Request {
                method: "POST".into(),
                target: target.into(),
                headers: vec![(
                    "Content-Type".into(),
                    format!("multipart/form-data; boundary={boundary}"),
                )],
                body: body.clone(),
            },
            now,
        )
    };
    assert_eq!(status(ingest("/ingest?name=shop&format=pprof")), 422);
    let ok = ingest("/ingest?name=shop%7Benv%3Dprod%7D").unwrap();
    assert_eq!(label(&ok[0].labels, "__name__"), "spans");
    assert_eq!(label(&ok[0].labels, "env"), "prod");
    assert_eq!(
        status(ingest("/ingest?name=shop+api")),
        400,
        "a space in the name"
    );
}
