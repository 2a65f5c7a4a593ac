//! A real Prometheus (Debian's `prometheus`, which CI installs) scrapes the example service's
//! `/metrics` every second: `promtool check metrics` is clean on the exposition, the span
//! metrics arrive under their names (a slow-span threshold's count what the buckets above it
//! hold), `histogram_quantile` over the scraped buckets is the linear interpolation the docs
//! describe and within a bucket of the spans profile's p99, exemplars are stored with their
//! trace and span ids inside their buckets, each trace id one the example's OpenTelemetry SDK
//! exported, and every PromQL query of docs/metrics.md answers.

use crate::running;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A GET of `path` on `host` (`127.0.0.1:PORT`), with `accept`: the status line and the body.
fn get(host: &str, path: &str, accept: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (head.to_owned(), body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

/// `s` percent-encoded for a URL's query.
fn encode_query(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `query` over Prometheus's HTTP API at `time`: the result vector.
fn query(prometheus: &str, query: &str, time: f64) -> Vec<serde_json::Value> {
    let encoded = encode_query(query);
    let (head, body) = get(
        prometheus,
        &format!("/api/v1/query?query={encoded}&time={time}"),
        "application/json",
    );
    assert!(head.contains(" 200 "), "{query}: {head}\n{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

fn value(v: &serde_json::Value) -> f64 {
    v["value"][1].as_str().unwrap().parse().unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn prometheus_scrapes_the_span_metrics() {
    let _serial = crate::serial();
    if !tracing_prof_test_support::have(
        "prometheus",
        "--version",
        "prometheus",
        "the scrape of /metrics by a real Prometheus",
    ) {
        return;
    }
    // With the example's OpenTelemetry layer: its requests are linked to traces, and the
    // trace ids its SDK exported are written at its end.
    let ids = tempfile::NamedTempFile::new().unwrap();
    let (mut service, base) = running::start(
        60,
        &[
            ("TRACING_PROF_SLOW_SPAN", "request -> render:1ms"),
            ("SERVICE_OTEL", "1"),
            ("SERVICE_OTEL_TRACE_IDS", ids.path().to_str().unwrap()),
        ],
    );
    let host = base
        .trim_start_matches("http://")
        .trim_end_matches("/debug/pprof")
        .to_owned();
    // The exposition itself: OpenMetrics when asked, Prometheus text otherwise; promtool
    // reads the latter.
    let (head, open_metrics) = get(&host, "/metrics", "application/openmetrics-text");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(open_metrics.ends_with("# EOF\n"), "{open_metrics}");
    let (_, text) = get(&host, "/metrics", "text/plain");
    tracing_prof_test_support::promtool_check_metrics(&text);

    // Prometheus, scraping it every second.
    let work = tempfile::Builder::new()
        .prefix("tracing-prof-prometheus-")
        .tempdir()
        .unwrap();
    let config = work.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  \
             - job_name: example\n    static_configs:\n      - targets: ['{host}']\n"
        ),
    )
    .unwrap();
    let prometheus_addr = format!("127.0.0.1:{}", free_port());
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _prometheus = Kill(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                work.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={prometheus_addr}"))
            .arg("--enable-feature=exemplar-storage")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    let render = "span_path=\"request -> render\"";
    let deadline = Instant::now() + Duration::from_secs(60);
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    // Three scrapes' worth of the render path's spans.
    let scraped = loop {
        let ready = std::net::TcpStream::connect(&prometheus_addr).is_ok()
            && query(
                &prometheus_addr,
                &format!("count_over_time(tracing_prof_spans_total{{{render}}}[1m])"),
                now(),
            )
            .first()
            .is_some_and(|v| value(v) >= 3.0);
        if ready {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        scraped,
        "Prometheus never scraped three samples of the render path"
    );
    let t = now();
    let spans = value(
        &query(
            &prometheus_addr,
            &format!("tracing_prof_spans_total{{{render}}}"),
            t,
        )[0],
    );
    assert!(spans > 0.0);
    for family in [
        "tracing_prof_span_errors_total",
        "tracing_prof_span_busy_seconds_total",
        "tracing_prof_span_cpu_seconds_total",
        "tracing_prof_span_allocated_bytes_total",
        "tracing_prof_span_inuse_bytes",
        "tracing_prof_exports_total",
    ] {
        assert!(
            !query(&prometheus_addr, family, t).is_empty(),
            "{family} was not scraped"
        );
    }
    // The p99 Prometheus computes, and ours from the same scraped buckets.
    let p99 = value(
        &query(
            &prometheus_addr,
            &format!(
                "histogram_quantile(0.99, tracing_prof_span_duration_seconds_bucket{{{render}}})"
            ),
            t,
        )[0],
    );
    let mut buckets: Vec<(f64, f64)> = query(
        &prometheus_addr,
        &format!("tracing_prof_span_duration_seconds_bucket{{{render}}}"),
        t,
    )
    .iter()
    .map(|v| {
        let le = v["metric"]["le"].as_str().unwrap();
        (le.parse::<f64>().unwrap_or(f64::INFINITY), value(v))
    })
    .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(buckets.len(), 72, "71 bounds and +Inf");
    let total = buckets.last().unwrap().1;
    let rank = 0.99 * total;
    let i = buckets.iter().position(|b| b.1 >= rank).unwrap();
    let (lo, below) = if i == 0 { (0.0, 0.0) } else { buckets[i - 1] };
    let ours = lo + (buckets[i].0 - lo) * (rank - below) / (buckets[i].1 - below);
    assert!(
        (p99 - ours).abs() <= 1e-9 * ours,
        "histogram_quantile {p99} against ours {ours} from {buckets:?}"
    );
    // The slow spans: those of the same scrape's buckets above 1 ms.
    let slow = query(
        &prometheus_addr,
        &format!("tracing_prof_span_slow_total{{{render}}}"),
        t,
    );
    assert_eq!(slow[0]["metric"]["threshold"], "0.001");
    let at_1ms = buckets.iter().find(|b| b.0 == 0.001).unwrap().1;
    assert_eq!(value(&slow[0]), total - at_1ms, "{buckets:?}");
    // Exemplars, stored by Prometheus (--enable-feature=exemplar-storage): trace and span ids
    // of the example's OpenTelemetry spans, each inside its bucket.
    let encoded = encode_query(&format!(
        "tracing_prof_span_duration_seconds_bucket{{{render}}}"
    ));
    let (head, body) = get(
        &prometheus_addr,
        &format!(
            "/api/v1/query_exemplars?query={encoded}&start={}&end={}",
            t - 120.0,
            t + 1.0
        ),
        "application/json",
    );
    assert!(head.contains(" 200 "), "{head}\n{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let series = answer["data"].as_array().cloned().unwrap_or_default();
    let mut traces = std::collections::HashSet::new();
    for s in &series {
        // The bucket of the series: its bound, and the bound below it.
        let le: f64 = s["seriesLabels"]["le"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap_or(f64::INFINITY);
        let i = buckets.iter().position(|b| b.0 == le).unwrap();
        let below = if i == 0 { 0.0 } else { buckets[i - 1].0 };
        for e in s["exemplars"].as_array().into_iter().flatten() {
            let hex = |key: &str, len: usize| {
                let v = e["labels"][key].as_str().unwrap_or("");
                v.len() == len && v.bytes().all(|b| b.is_ascii_hexdigit())
            };
            assert!(hex("trace_id", 32) && hex("span_id", 16), "{e}");
            let v: f64 = e["value"].as_str().unwrap().parse().unwrap();
            assert!(v <= le && v > below, "{e} in the bucket ({below}, {le}]");
            traces.insert(e["labels"]["trace_id"].as_str().unwrap().to_owned());
        }
    }
    assert!(!traces.is_empty(), "no exemplars stored: {body}");
    // Every query of docs/metrics.md, as written, answers something.
    let doc = tracing_prof_test_support::documentation();
    let block = doc
        .split("```promql\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a promql block in docs/metrics.md");
    let queries: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(queries.len(), 5, "{block}");
    for q in queries {
        let answer = query(&prometheus_addr, q, t);
        assert!(!answer.is_empty(), "{q}: no answer");
    }
    // The spans profile, fetched now, carries the same distribution (a second later: a few
    // more spans): its p99 is within a bucket (26%) of Prometheus's.
    let profile = {
        let mut s = std::net::TcpStream::connect(&host).unwrap();
        write!(
            s,
            "GET /debug/pprof/spans HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        tracing_prof::model::Profile::decode(&raw[at..]).unwrap()
    };
    let k = profile.sample_type_index("durations").unwrap();
    let mut durations = [0u64; tracing_prof::model::DURATION_BUCKETS];
    for sample in profile.samples.iter().filter(|s| {
        s.values[k] > 0 && s.label("span_path").is_none() && {
            let names: Vec<&str> = s.stack.iter().map(|f| &*f.function).collect();
            names.len() == 2 && names[1].ends_with("render")
        }
    }) {
        let le = sample
            .labels
            .iter()
            .find_map(|l| match (l.key.as_str(), &l.value) {
                ("duration_le", tracing_prof::model::LabelValue::Num { value, .. }) => Some(*value),
                _ => None,
            })
            .unwrap();
        let i = tracing_prof::model::DURATION_BOUNDS_NS
            .iter()
            .position(|&b| b as i64 == le)
            .unwrap_or(tracing_prof::model::DURATION_BUCKETS - 1);
        durations[i] += sample.values[k] as u64;
    }
    let profile_p99 = tracing_prof::model::duration_quantile(&durations, 0.99)
        .expect("render's spans") as f64
        / 1e9;
    assert!(
        (p99 - profile_p99).abs() <= 0.26 * profile_p99,
        "Prometheus's p99 {p99} s against the spans profile's {profile_p99} s"
    );
    // The example's render takes milliseconds on any machine.
    assert!((1e-4..1.0).contains(&p99), "p99 of render: {p99} s");

    // Stopped as Kubernetes stops it, the example ends its run and writes the trace ids its
    // OpenTelemetry SDK exported: every trace id Prometheus stored is one of them.
    let pid = libc::pid_t::try_from(service.0.id()).unwrap();
    // SAFETY: kill(2) with the pid of our own child, not yet waited for.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = service.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the example did not end on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "ends its run on SIGTERM: {status:?}");
    let exported: std::collections::HashSet<String> = std::fs::read_to_string(ids.path())
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(exported.len() > 100, "{} trace ids", exported.len());
    for t in &traces {
        assert!(
            exported.contains(t),
            "exemplar trace {t} was not exported by the SDK"
        );
    }
    drop(service);
}
