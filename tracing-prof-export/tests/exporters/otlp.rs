//! OTLP profiles, sent to a stand-in receiver that answers by the OpenTelemetry Collector's and
//! Grafana Pyroscope's own rules and decodes every request with the official `.proto` files
//! (`tracing_prof_test_support::otlp_receiver`): each kind arrives with the numbers of the
//! snapshot it came from, under the series names the module docs promise; exact memory and
//! span counts are the workload's; links become span profiles; failures are retried only when
//! OTLP says they may be, as long as `Retry-After` asks, and a partial success is never retried.

use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesPartialSuccess, ExportProfilesServiceResponse,
};
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};
use tracing_prof_core::Sink;
use tracing_prof_export::PushStats;
use tracing_prof_export::otlp::{OtlpConfig, OtlpExporter};
use tracing_prof_model::{LabelValue, Profile, ProfileKind, Snapshot};
use tracing_prof_test_support::otlp_receiver::{OtlpReceiver, Series, Verdict};
use tracing_prof_test_support::stub_server::Answer;
use tracing_prof_test_support::thread_cpu_ns;
use tracing_subscriber::prelude::*;

/// Labels the receiver adds to every series: not the sample's.
const SERIES_LABELS: [&str; 8] = [
    "__delta__",
    "__otel__",
    "__name__",
    "service_name",
    "service.name",
    "process.pid",
    "telemetry.sdk.name",
    "telemetry.sdk.language",
];

fn exporter(receiver: &OtlpReceiver) -> OtlpExporter {
    let config = OtlpConfig::with_base_url(&receiver.url())
        .header("X-Scope-OrgID", "tenant-1")
        .retries(3, Duration::from_millis(50))
        .resource(vec![(
            "service.name".into(),
            tracing_prof_core::AttributeValue::Str("otlp-test".into()),
        )]);
    OtlpExporter::start(config).unwrap()
}

/// Waits until `n` requests were answered by the rules.
fn verdicts(receiver: &OtlpReceiver, n: usize) -> Vec<Verdict> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = receiver.verdicts();
        if v.len() >= n || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[inline(never)]
fn burn(d: Duration) {
    let start = thread_cpu_ns();
    let mut x = 0u64;
    while thread_cpu_ns() - start < d.as_nanos() as u64 {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
    }
}

/// What Pyroscope should store of `p`'s sample type `index` under `name` and `period_type`:
/// per sample labels (but the links), the total.
fn expected(
    p: &Profile,
    index: usize,
    series: &str,
    period_type: &str,
    scale: i64,
) -> BTreeMap<(String, BTreeMap<String, String>), i64> {
    let t = &p.sample_types[index];
    let (name, ty, unit) = match (series, t.name.as_str()) {
        ("process_cpu", "samples") => ("process_cpu", "cpu", "nanoseconds"),
        _ => (series, t.name.as_str(), t.unit.as_str()),
    };
    let id = format!("{name}:{ty}:{unit}:{period_type}");
    let mut out = BTreeMap::new();
    for s in &p.samples {
        let value = s.values[index] * scale;
        if value == 0 {
            continue;
        }
        // String labels but the links; numeric ones are not sent; the span path on every
        // sample under a span (module docs).
        let mut labels: BTreeMap<String, String> = s
            .labels
            .iter()
            .filter(|l| l.key != "span_id" && l.key != "trace_id")
            .filter_map(|l| match &l.value {
                LabelValue::Str(v) => Some((l.key.clone(), v.clone())),
                LabelValue::Num { .. } => None,
            })
            .collect();
        if !s.span_path().is_empty() {
            labels.entry("span_path".into()).or_insert(s.span_path());
        }
        *out.entry((id.clone(), labels)).or_default() += value;
    }
    out
}

/// The stored series as (profile type, the sample's own labels) → total.
fn stored(series: &[Series]) -> BTreeMap<(String, BTreeMap<String, String>), i64> {
    let mut out = BTreeMap::new();
    for s in series {
        let labels = s
            .labels
            .iter()
            .filter(|(k, _)| !SERIES_LABELS.contains(&k.as_str()) && !k.starts_with("telemetry."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        *out.entry((s.profile_type.clone(), labels)).or_default() += s.total;
    }
    out
}

#[test]
fn every_kind_arrives_with_the_snapshots_numbers() {
    if crate::isolated(
        module_path!(),
        "every_kind_arrives_with_the_snapshots_numbers",
    ) {
        return;
    }
    let (layer, guard) = tracing_prof_core::Profiler::builder()
        .interval(Duration::from_secs(3600))
        .heap_sampling(1)
        .cpu_sampling(1000)
        .build()
        .unwrap();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    tracing::dispatcher::with_default(&dispatch, || {
        for _ in 0..5 {
            tracing::info_span!("otlp_request").in_scope(|| {
                for _ in 0..2 {
                    tracing::info_span!("otlp_query").in_scope(|| {
                        std::hint::black_box(vec![7u8; 1000]);
                        burn(Duration::from_millis(20));
                    });
                }
            });
        }
    });
    let mut snapshot = guard.profiler().snapshot();
    // As an export carries it: the heap at its peak, here the same memory.
    let peak = snapshot.clone();
    snapshot.heap_peak = Some(std::sync::Arc::new(peak.clone()));
    let receiver = OtlpReceiver::start();
    let mut exporter = exporter(&receiver);
    let stats = exporter.stats();
    exporter.export(&snapshot).unwrap();
    let verdict = verdicts(&receiver, 1).remove(0);
    let series = verdict.unwrap_or_else(|r| panic!("refused: {r:?}"));
    // The receiver judged the request before the sender thread read the answer and counted it.
    wait_until("the push counted", || stats_of(&stats) == (1, 0, 0));

    // The request as sent: OTLP/HTTP, gzip, our header.
    let request = &receiver.taken()[0];
    assert_eq!(request.header("content-encoding"), Some("gzip"));
    assert_eq!(request.header("x-scope-orgid"), Some("tenant-1"));

    // Every series of every kind, with the snapshot's totals.
    let mut want = BTreeMap::new();
    let cpu = snapshot.profile(ProfileKind::Cpu);
    assert!(cpu.total(0) > 50, "CPU samples: {}", cpu.total(0));
    want.extend(expected(
        &cpu,
        0,
        "process_cpu",
        "cpu:nanoseconds",
        cpu.period,
    ));
    for (kind, series, period_type) in [
        (ProfileKind::Heap, "memory", "memory:bytes"),
        (ProfileKind::SpanMemory, "span_memory", "span_memory:bytes"),
        (ProfileKind::Spans, "spans", "spans:count"),
    ] {
        // Every sample type of the kind (for spans: counts, wall, busy, idle, CPU...).
        let p = snapshot.profile(kind);
        for i in 0..p.sample_types.len() {
            for (k, v) in expected(&p, i, series, period_type, 1) {
                *want.entry(k).or_default() += v;
            }
        }
    }
    // The peak: memory in use, and exact memory per span path in use, as they were.
    for (kind, series, period_type) in [
        (ProfileKind::Heap, "memory_peak", "memory_peak:bytes"),
        (
            ProfileKind::SpanMemory,
            "span_memory_peak",
            "span_memory_peak:bytes",
        ),
    ] {
        let p = peak.profile(kind);
        for ty in ["inuse_objects", "inuse_space"] {
            let i = p.sample_type_index(ty).unwrap();
            for (k, v) in expected(&p, i, series, period_type, 1) {
                *want.entry(k).or_default() += v;
            }
        }
    }
    let got = stored(&series);
    let differ: Vec<_> = got
        .keys()
        .chain(want.keys())
        .filter(|k| got.get(*k) != want.get(*k))
        .map(|k| (k, got.get(k), want.get(k)))
        .collect();
    assert!(differ.is_empty(), "stored, expected: {differ:#?}");

    // Exact: the workload's span counts and memory, as Pyroscope stores them (under span
    // frames: these kinds have no code frames, and no `span_path` label).
    let total = |ty: &str, path: &[&str]| {
        series
            .iter()
            .filter(|s| s.profile_type == ty)
            .flat_map(|s| &s.stacks)
            .filter(|(stack, _)| {
                let names: Vec<&str> = stack
                    .iter()
                    .map(|f| {
                        let f = f.strip_suffix(" [span]").unwrap_or(f);
                        f.rsplit("::").next().unwrap_or(f)
                    })
                    .collect();
                names == path
            })
            .map(|(_, v)| v)
            .sum::<i64>()
    };
    let (request, query) = (["otlp_request"], ["otlp_request", "otlp_query"]);
    assert_eq!(total("spans:spans:count:spans:count", &request), 5);
    assert_eq!(total("spans:spans:count:spans:count", &query), 10);
    assert_eq!(
        total("span_memory:alloc_space:bytes:span_memory:bytes", &query),
        10_000
    );
    assert_eq!(
        total("span_memory:alloc_objects:count:span_memory:bytes", &query),
        10
    );
    // The resource: the service's name is Pyroscope's `service_name`.
    assert!(
        series
            .iter()
            .all(|s| s.labels["service_name"] == "otlp-test")
    );
    // Span frames are frames: the burner under both spans.
    let under_query = series
        .iter()
        .filter(|s| s.profile_type.starts_with("process_cpu:"))
        .flat_map(|s| &s.stacks)
        .filter(|(stack, _)| {
            stack.iter().any(|f| f.ends_with("::otlp_request [span]"))
                && stack.iter().any(|f| f.ends_with("::otlp_query [span]"))
                && stack.iter().any(|f| f.ends_with("burn"))
        })
        .map(|(_, v)| v)
        .sum::<i64>();
    assert!(under_query > 0, "{series:#?}");
    drop(guard);
}

/// (sent, failed attempts, dropped).
fn stats_of(s: &PushStats) -> (u64, u64, u64) {
    (s.sent(), s.failed_attempts(), s.dropped())
}

/// A snapshot of `n` CPU stacks, stack `i` sampled `i + 1` times, with links on the first.
fn cpu_window(n: u64, links: &[(u128, u64, u64)]) -> Snapshot {
    cpu_round(n, links, 1)
}

/// As [`cpu_window`], with every count times `round`: the exporter sends what grew since the
/// snapshot before, so each round must grow.
fn cpu_round(n: u64, links: &[(u128, u64, u64)], round: u64) -> Snapshot {
    use tracing_prof_model::{
        CodeFrame, CpuSource, CpuStack, LinkedSamples, PathKind, SpanFrame, TraceLink,
    };
    let mut w = Snapshot::new(SystemTime::now(), Duration::from_secs(10));
    w.cpu = CpuSource::Sampled { hz: 100 };
    let span = vec![SpanFrame::new("app", "request", None, None)];
    for i in 0..n {
        let mut s = CpuStack::new(
            PathKind::Span,
            span.clone(),
            vec![CodeFrame::named(&format!("f{i}"))],
        );
        s.samples = (i + 1) * round;
        s.cpu_ns = (i + 1) * 10_000_000 * round;
        w.cpu_stacks.push(s);
    }
    let first = &mut w.cpu_stacks[0];
    first.samples += links.iter().map(|l| l.2).sum::<u64>();
    first.links = links
        .iter()
        .map(|&(trace_id, span_id, samples)| LinkedSamples {
            link: TraceLink { trace_id, span_id },
            samples,
        })
        .collect();
    w
}

#[test]
fn linked_samples_become_span_profiles() {
    if crate::isolated(module_path!(), "linked_samples_become_span_profiles") {
        return;
    }
    let receiver = OtlpReceiver::start();
    let mut exporter = exporter(&receiver);
    let trace = 0x0af7651916cd43dd8448eb211c80319c_u128;
    exporter
        .export(&cpu_window(
            3,
            &[
                (trace, 0xb7ad6b7169203331, 4),
                (trace, 0x00f067aa0ba902b7, 2),
            ],
        ))
        .unwrap();
    let series = verdicts(&receiver, 1).remove(0).unwrap();
    let cpu: Vec<&Series> = series
        .iter()
        .filter(|s| s.profile_type == "process_cpu:cpu:nanoseconds:cpu:nanoseconds")
        .collect();
    // 10 ms a sample (100 Hz): 1 + 2 + 3 unlinked samples, and 6 linked ones.
    assert_eq!(cpu.iter().map(|s| s.total).sum::<i64>(), 12 * 10_000_000);
    let spans: BTreeMap<&str, (&str, i64)> = cpu
        .iter()
        .flat_map(|s| &s.spans)
        .map(|(span, (t, v))| (span.as_str(), (t.as_str(), *v)))
        .collect();
    let trace_hex = "0af7651916cd43dd8448eb211c80319c";
    assert_eq!(
        spans,
        BTreeMap::from([
            ("00f067aa0ba902b7", (trace_hex, 20_000_000)),
            ("b7ad6b7169203331", (trace_hex, 40_000_000)),
        ])
    );
    // No link label becomes a series label.
    assert!(cpu.iter().all(|s| !s.labels.contains_key("span_id")));
}

#[test]
fn only_what_otlp_calls_retryable_is_retried() {
    if crate::isolated(module_path!(), "only_what_otlp_calls_retryable_is_retried") {
        return;
    }
    let receiver = OtlpReceiver::start();
    let mut exporter = exporter(&receiver);
    let stats = exporter.stats();
    let mut round = 0;
    let mut window = || {
        round += 1;
        cpu_round(2, &[], round)
    };

    // 503 asking for a second: retried after it, then delivered.
    receiver.answer_next([Answer {
        status: 503,
        headers: vec![("Retry-After".into(), "1".into())],
        body: b"unavailable".to_vec(),
    }]);
    let start = Instant::now();
    exporter.export(&window()).unwrap();
    wait_until("the retry", || stats.sent() == 1);
    assert!(
        start.elapsed() >= Duration::from_millis(950),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(stats_of(&stats), (1, 1, 0));
    assert!(verdicts(&receiver, 1)[0].is_ok());

    // 429 without Retry-After: retried with backoff.
    receiver.answer_next([Answer::text(429, "slow down")]);
    exporter.export(&window()).unwrap();
    wait_until("the second", || stats.sent() == 2);
    assert_eq!(stats_of(&stats), (2, 2, 0));

    // 400 and 500: bad data, never retried.
    for (dropped, status) in [(1, 400), (2, 500)] {
        let taken = receiver.taken().len();
        receiver.answer_next([Answer::text(status, "no")]);
        exporter.export(&window()).unwrap();
        wait_until("the refusal", || stats.dropped() == dropped);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            receiver.taken().len(),
            taken + 1,
            "not retried after {status}"
        );
    }
    assert_eq!(stats_of(&stats), (2, 4, 2));

    // A partial success that rejected profiles: data lost, said, not retried.
    let body = prost::Message::encode_to_vec(&ExportProfilesServiceResponse {
        partial_success: Some(ExportProfilesPartialSuccess {
            rejected_profiles: 2,
            error_message: "too old".into(),
        }),
    });
    let taken = receiver.taken().len();
    receiver.answer_next([Answer {
        status: 200,
        headers: vec![("Content-Type".into(), "application/x-protobuf".into())],
        body,
    }]);
    exporter.export(&window()).unwrap();
    wait_until("the partial success", || stats.dropped() == 3);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(receiver.taken().len(), taken + 1);
    assert_eq!(stats_of(&stats), (2, 5, 3));
}

#[test]
fn an_empty_window_sends_nothing() {
    if crate::isolated(module_path!(), "an_empty_window_sends_nothing") {
        return;
    }
    let receiver = OtlpReceiver::start();
    let mut exporter = exporter(&receiver);
    let mut w = Snapshot::new(SystemTime::now(), Duration::from_secs(10));
    w.window = true;
    exporter.export(&w).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(receiver.taken().is_empty());
}

/// The stand-in has the receivers' teeth: what they refuse, it refuses, with their status.
#[test]
fn the_stand_in_refuses_what_the_receivers_refuse() {
    if crate::isolated(
        module_path!(),
        "the_stand_in_refuses_what_the_receivers_refuse",
    ) {
        return;
    }
    use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
    use opentelemetry_proto::tonic::profiles::v1development as otlp;
    use tracing_prof_test_support::otlp_receiver::{PATH, judge};
    use tracing_prof_test_support::stub_server::Request;
    let post = |content_type: &str, body: Vec<u8>| Request {
        method: "POST".into(),
        target: PATH.into(),
        headers: vec![("Content-Type".into(), content_type.into())],
        body,
    };
    let pb = "application/x-protobuf";
    let status = |r: Request| {
        judge(&r, SystemTime::now())
            .map(|_| 200)
            .unwrap_or_else(|r| r.status)
    };
    // A valid request with one sample, changed one way at a time.
    let good = || {
        let s = |n: &str| n.to_owned();
        let dictionary = otlp::ProfilesDictionary {
            mapping_table: vec![otlp::Mapping::default()],
            location_table: vec![otlp::Location::default()],
            function_table: vec![otlp::Function::default()],
            link_table: vec![otlp::Link::default()],
            string_table: vec![s(""), s("samples"), s("count"), s("cpu"), s("nanoseconds")],
            attribute_table: vec![otlp::KeyValueAndUnit::default()],
            stack_table: vec![otlp::Stack::default()],
        };
        let profile = otlp::Profile {
            sample_type: Some(otlp::ValueType {
                type_strindex: 1,
                unit_strindex: 2,
            }),
            period_type: Some(otlp::ValueType {
                type_strindex: 3,
                unit_strindex: 4,
            }),
            period: 10,
            samples: vec![otlp::Sample {
                values: vec![3],
                ..Default::default()
            }],
            ..Default::default()
        };
        ExportProfilesServiceRequest {
            resource_profiles: vec![otlp::ResourceProfiles {
                scope_profiles: vec![otlp::ScopeProfiles {
                    profiles: vec![profile],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            dictionary: Some(dictionary),
        }
    };
    let bytes = |r: &ExportProfilesServiceRequest| prost::Message::encode_to_vec(r);
    assert_eq!(status(post(pb, bytes(&good()))), 200);
    // ingest_handler.go: exact content types; the Collector takes a parameter, Pyroscope not.
    assert_eq!(
        status(post(
            "application/x-protobuf; charset=utf-8",
            bytes(&good())
        )),
        415
    );
    assert_eq!(status(post("text/plain", bytes(&good()))), 415);
    assert_eq!(status(post(pb, b"\xff\xff".to_vec())), 400);
    let mut r = good();
    r.dictionary = None;
    assert_eq!(status(post(pb, bytes(&r))), 500, "no dictionary");
    let mut r = good();
    r.resource_profiles.clear();
    assert_eq!(status(post(pb, bytes(&r))), 500, "no resource profiles");
    fn profile(r: &mut ExportProfilesServiceRequest) -> &mut otlp::Profile {
        &mut r.resource_profiles[0].scope_profiles[0].profiles[0]
    }
    let mut r = good();
    profile(&mut r).samples[0].stack_index = 9;
    assert_eq!(status(post(pb, bytes(&r))), 500, "stack index out of range");
    let mut r = good();
    profile(&mut r).samples[0].values = vec![1, 2];
    assert_eq!(status(post(pb, bytes(&r))), 500, "two values");
    let mut r = good();
    profile(&mut r).period = 0;
    profile(&mut r).sample_type.as_mut().unwrap().type_strindex = 3;
    assert_eq!(status(post(pb, bytes(&r))), 400, "no period: no name");
    let mut r = good();
    profile(&mut r).time_unix_nano = 1;
    assert_eq!(
        status(post(pb, bytes(&r))),
        400,
        "outside the ingestion window"
    );
    let mut r = good();
    let d = r.dictionary.as_mut().unwrap();
    d.location_table.push(otlp::Location {
        mapping_index: 5,
        ..Default::default()
    });
    d.stack_table.push(otlp::Stack {
        location_indices: vec![1],
    });
    profile(&mut r).samples[0].stack_index = 1;
    assert_eq!(
        status(post(pb, bytes(&r))),
        500,
        "mapping index out of range"
    );
    // profiles.proto's MUSTs, which neither receiver checks.
    let mut r = good();
    r.dictionary.as_mut().unwrap().mapping_table.clear();
    assert_eq!(status(post(pb, bytes(&r))), 400, "no zero mapping first");
    let mut r = good();
    let d = r.dictionary.as_mut().unwrap();
    d.string_table.push("k".into());
    for v in ["a", "b"] {
        d.attribute_table.push(otlp::KeyValueAndUnit {
            key_strindex: 5,
            value: Some(opentelemetry_proto::tonic::common::v1::AnyValue {
                value: Some(
                    opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(v.into()),
                ),
            }),
            unit_strindex: 0,
        });
    }
    profile(&mut r).samples[0].attribute_indices = vec![1, 2];
    assert_eq!(status(post(pb, bytes(&r))), 400, "a key twice on a sample");
}
