//! Both Pyroscope APIs, against a local server that decodes what it receives: every profile
//! kind, with the right values, names, labels, tags, auth and tenant.

mod mock_pyroscope;

use mock_pyroscope::{Mock, OK, pprof, sample_types, value};
use prost::Message;
use std::time::Duration;
use tracing_prof::export::pyroscope::push::PushRequest;
use tracing_prof::export::{PyroscopeApi, PyroscopeConfig, PyroscopeExporter};
use tracing_prof::{Profiler, TaggingAllocator};
use tracing_prof_examples::{App, Workload, run};
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: TaggingAllocator<std::alloc::System> = TaggingAllocator::new(std::alloc::System);

const REQUEST: &str = "tracing_prof_examples::request [span]";

#[test]
fn both_apis_receive_every_kind_with_labels_auth_and_tenant() {
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
    rt.block_on(run(
        &app,
        &Workload {
            requests: 300,
            ..Workload::default()
        },
    ));
    guard.flush(Duration::from_secs(30)).unwrap();
    rt.block_on(run(
        &app,
        &Workload {
            requests: 200,
            ..Workload::default()
        },
    ));
    drop(guard); // the final export, pushed before the guard returns
    assert_eq!((push_stats.sent(), push_stats.dropped()), (2, 0));
    assert_eq!((ingest_stats.sent(), ingest_stats.dropped()), (2, 0));

    // v1 push: one request per interval, a series per kind.
    let pushed = push.taken();
    assert_eq!(pushed.len(), 2);
    let mut requests = 0;
    let mut render_samples = 0;
    for r in &pushed {
        assert_eq!(
            (r.method.as_str(), r.target.as_str()),
            ("POST", "/push.v1.PusherService/Push")
        );
        assert_eq!(r.header("content-type"), Some("application/proto"));
        assert_eq!(r.header("authorization"), Some("Basic YWxpY2U6czNjcmV0"));
        assert_eq!(r.header("x-scope-orgid"), Some("team-a"));
        let req = PushRequest::decode(&r.body[..]).unwrap();
        let names: Vec<&str> = req
            .series
            .iter()
            .map(|s| label(&s.labels, "__name__"))
            .collect();
        assert_eq!(names, ["spans", "process_cpu", "memory", "span_memory"]);
        for s in &req.series {
            assert_eq!(label(&s.labels, "service_name"), "shop");
            assert_eq!(
                (label(&s.labels, "env"), label(&s.labels, "region")),
                ("test", "eu")
            );
        }
        let spans = pprof(&req.series[0].samples[0].raw_profile);
        assert_eq!(sample_types(&spans)[..2], ["spans", "wall"]);
        requests += value(&spans, REQUEST, "spans");
        let cpu = pprof(&req.series[1].samples[0].raw_profile);
        assert_eq!(sample_types(&cpu), ["samples", "cpu"]);
        let cpu = tracing_prof::Profile::decode(&req.series[1].samples[0].raw_profile).unwrap();
        render_samples += cpu
            .samples
            .iter()
            .filter(|s| {
                let names: Vec<String> = s.stack.iter().map(|f| f.display_name().into()).collect();
                names.starts_with(&[
                    REQUEST.to_owned(),
                    "tracing_prof_examples::render [span]".to_owned(),
                    "tracing_prof_examples::render".to_owned(),
                ])
            })
            .map(|s| s.values[0])
            .sum::<i64>();
        let memory = pprof(&req.series[2].samples[0].raw_profile);
        assert_eq!(
            sample_types(&memory),
            [
                "alloc_objects",
                "alloc_space",
                "inuse_objects",
                "inuse_space"
            ]
        );
        let exact = pprof(&req.series[3].samples[0].raw_profile);
        assert_eq!(sample_types(&exact), sample_types(&memory));
        assert!(
            value(
                &exact,
                "tracing_prof_examples::render [span]",
                "alloc_space"
            ) > 0
        );
    }
    assert_eq!(
        requests, 500,
        "each push holds its own interval: together, every request once"
    );
    // process_cpu holds the CPU stacks: the example's CPU-heavy function under its spans.
    assert!(
        render_samples > 0,
        "no CPU sample of render under request -> render"
    );

    // /ingest: one request per kind per interval.
    let ingested = ingest.taken();
    assert_eq!(ingested.len(), 8);
    let mut requests = 0;
    for r in &ingested {
        assert!(r.target.starts_with("/ingest?"), "{}", r.target);
        assert_eq!(r.header("authorization"), Some("Bearer tok3n"));
        assert_eq!(r.header("x-scope-orgid"), None);
        assert_eq!(r.query("name").as_deref(), Some("shop{env=test}"));
        assert_eq!(r.query("format").as_deref(), Some("pprof"));
        let (from, until): (u64, u64) = (
            r.query("from").unwrap().parse().unwrap(),
            r.query("until").unwrap().parse().unwrap(),
        );
        assert!(
            from <= until && until > 1_700_000_000 && until < 10_000_000_000,
            "seconds: {from}..{until}"
        );
        let config = String::from_utf8(r.form_field("sample_type_config").unwrap()).unwrap();
        assert!(
            config.starts_with('{') && config.contains("\"units\""),
            "{config}"
        );
        let p = pprof(&r.form_field("profile").expect("a profile part"));
        if sample_types(&p)[0] == "spans" {
            requests += value(&p, REQUEST, "spans");
        } else if sample_types(&p).iter().any(|t| t == "inuse_space") {
            assert!(
                config.contains("\"inuse_space\":{\"units\":\"bytes\",\"aggregation\":\"average\""),
                "{config}"
            );
        }
    }
    assert_eq!(requests, 500);
}

fn label<'a>(
    labels: &'a [tracing_prof::export::pyroscope::push::LabelPair],
    name: &str,
) -> &'a str {
    labels
        .iter()
        .find(|l| l.name == name)
        .map_or("", |l| l.value.as_str())
}
