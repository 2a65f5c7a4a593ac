//! Span metrics for Prometheus: latency, errors, CPU and memory per span path, encoded at
//! scrape time from the profiler's own tables.
//!
//! ```text
//! tracing_prof_span_duration_seconds_bucket{span_path="request -> render",le="0.0025"} 1830
//! tracing_prof_spans_total{span_path="request -> render"} 2000
//! tracing_prof_span_errors_total{span_path="request -> db_query"} 3
//! tracing_prof_span_busy_seconds_total{span_path="request -> render"} 4.71
//! tracing_prof_span_cpu_seconds_total{span_path="request -> render"} 2.90
//! tracing_prof_span_allocated_bytes_total{span_path="request -> render"} 181927936
//! tracing_prof_span_inuse_bytes{span_path="request -> session_store"} 5557248
//! tracing_prof_span_slow_total{span_path="request -> render",threshold="0.05"} 12
//! ```
//!
//! The last is there for the paths given a slow-span threshold ([`SlowSpan`],
//! `TRACING_PROF_SLOW_SPAN`): their spans longer than it, counted from the histogram above the
//! nearest bucket bound (the `threshold` label).
//!
//! Counters and the in-use gauge are there for every span path (the profiles' paths, their
//! cap and `(other span paths)` included); the latency histogram for at most
//! [`DEFAULT_HISTOGRAM_PATHS`] of them, chosen stickily: a path is chosen when its histogram
//! has room, by most spans closed, and stays chosen for the life of the process, so that its
//! series never vanishes between scrapes (which would break `rate()`). The buckets are the
//! profiler's own (ten per decade, see [`DURATION_BOUNDS_NS`]) from 10 µs to 100 s by default:
//! 71 bounds and `+Inf`, so that `histogram_quantile(0.99, ...)` is within about 10% on data
//! spread over a few buckets and at worst a bucket's width (26%).
//!
//! Encoded with the Prometheus project's Rust client, [`prometheus_client`]: OpenMetrics text
//! or the classic Prometheus text, as the scraper asks ([`Format::from_accept`]).

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tracing_prof_core::{SlowSpan, Stats};
use tracing_prof_model::{
    DURATION_BOUNDS_NS, DURATION_BUCKETS, PathProfile, Snapshot, nearest_duration_bound,
    slow_bound, spans_slower_than,
};

/// Span paths with a latency histogram, at most: 20. With the default buckets that is
/// 20 × 74 = 1 480 series (71 bounds, `+Inf`, `_sum`, `_count`); the counters add 5 per
/// path.
pub const DEFAULT_HISTOGRAM_PATHS: usize = 20;
/// The smallest bucket bound exposed by default: 10 µs (shorter spans count in it).
pub const DEFAULT_MIN_BUCKET: Duration = Duration::from_micros(10);
/// The largest bucket bound exposed by default: 100 s (longer spans count in `+Inf`).
pub const DEFAULT_MAX_BUCKET: Duration = Duration::from_secs(100);

/// Span paths with a latency histogram at `/metrics` (a whole number, `0` for none).
pub const ENV_METRICS_HISTOGRAMS: &str = "TRACING_PROF_METRICS_HISTOGRAMS";
/// The latency buckets shown at `/metrics`: `MIN..MAX`, two durations (`10us..100s`).
pub const ENV_METRICS_BUCKETS: &str = "TRACING_PROF_METRICS_BUCKETS";

/// The text format of a scrape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (`application/openmetrics-text`), ending in `# EOF`.
    OpenMetrics,
    /// The Prometheus text format 0.0.4 (`text/plain`).
    Prometheus,
}

impl Format {
    /// The format a scraper's `Accept` header asks for: OpenMetrics when it names
    /// `application/openmetrics-text` (as Prometheus does, first), the Prometheus text format
    /// otherwise.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// Encodes span metrics from snapshots, remembering which span paths have a latency
/// histogram (see the [module docs](self)). One per endpoint; shared by its threads.
#[derive(Debug)]
pub struct SpanMetrics {
    histogram_paths: usize,
    /// Indices into [`DURATION_BOUNDS_NS`] of the first and last bound exposed.
    bounds: (usize, usize),
    /// The span paths given a histogram, in the order they were chosen.
    chosen: Mutex<Vec<String>>,
}

impl Default for SpanMetrics {
    fn default() -> Self {
        SpanMetrics::new()
    }
}

impl SpanMetrics {
    /// Histograms for [`DEFAULT_HISTOGRAM_PATHS`] paths, buckets from
    /// [`DEFAULT_MIN_BUCKET`] to [`DEFAULT_MAX_BUCKET`].
    pub fn new() -> Self {
        SpanMetrics {
            histogram_paths: DEFAULT_HISTOGRAM_PATHS,
            bounds: (
                bound_index(DEFAULT_MIN_BUCKET),
                bound_index(DEFAULT_MAX_BUCKET),
            ),
            chosen: Mutex::new(Vec::new()),
        }
    }

    /// At most `n` span paths get a latency histogram (0: none; counters stay for all).
    pub fn histogram_paths(mut self, n: usize) -> Self {
        self.histogram_paths = n;
        self
    }

    /// The bucket bounds exposed: the profiler's bounds from the one nearest `min` to the one
    /// nearest `max` (1 µs to 800 s; ten per decade).
    pub fn buckets(mut self, min: Duration, max: Duration) -> Self {
        let (a, b) = (bound_index(min), bound_index(max));
        self.bounds = (a.min(b), a.max(b));
        self
    }

    /// The bucket bounds exposed, in seconds (`+Inf` follows them).
    pub fn bucket_bounds(&self) -> Vec<f64> {
        DURATION_BOUNDS_NS[self.bounds.0..=self.bounds.1]
            .iter()
            .map(|&ns| seconds(ns))
            .collect()
    }

    /// The metrics of `snapshot` (its span paths; [`Profiler::paths_snapshot`] reads only
    /// those), the profiler's own health from `stats` when given, and the spans slower than
    /// the `slow` thresholds ([`Profiler::slow_spans`]), in `format`.
    ///
    /// [`Profiler::paths_snapshot`]: tracing_prof_core::Profiler::paths_snapshot
    /// [`Profiler::slow_spans`]: tracing_prof_core::Profiler::slow_spans
    pub fn encode(
        &self,
        snapshot: &Snapshot,
        stats: Option<&Stats>,
        slow: &[SlowSpan],
        format: Format,
    ) -> String {
        let collector = self.collector(snapshot, stats, slow);
        // Exemplars: OpenMetrics only (the Prometheus text format has none).
        let exemplars = match format {
            Format::OpenMetrics => self.exemplars(&collector.paths, &collector.histograms),
            Format::Prometheus => HashMap::new(),
        };
        let mut registry = Registry::default();
        registry.register_collector(Box::new(collector));
        let mut out = String::new();
        // Writing into a String cannot fail, and our collector returns no error of its own.
        let _ = match format {
            Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry),
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
            }
        };
        if !exemplars.is_empty() {
            out = with_exemplars(&out, &exemplars);
        }
        out
    }

    /// One scrape's families: `snapshot`'s paths summed by label, the histogram paths chosen.
    fn collector(
        &self,
        snapshot: &Snapshot,
        stats: Option<&Stats>,
        slow: &[SlowSpan],
    ) -> Collector {
        let rows = rows(&snapshot.paths);
        let histograms = self.choose(&rows);
        let slow = rows
            .iter()
            .filter(|r| r.path.time.spans > 0)
            .filter_map(|r| {
                let t = SlowSpan::for_path(slow, &r.label)?;
                let ns = nanos(t.threshold);
                let count = spans_slower_than(&r.path.time.durations, ns);
                Some((r.label.clone(), seconds(slow_bound(ns)).to_string(), count))
            })
            .collect();
        Collector {
            paths: rows,
            slow,
            histograms,
            bounds: self.bounds,
            stats: stats.map(health),
            process: snapshot.process_memory.clone(),
        }
    }

    /// Registers these metrics, read from `profiler` at each scrape, into an application's own
    /// `prometheus_client` registry, beside its metrics: one `/metrics` for both. The
    /// encoding then reads the span path tables on the thread that encodes the registry (what
    /// [`Profiler::paths_snapshot`](tracing_prof_core::Profiler::paths_snapshot) costs: span
    /// paths × threads, and symbolizing new CPU samples); it counts as the profiler's own.
    ///
    /// Behind the `prometheus-client-registry` feature, because it ties the application to
    /// the `prometheus-client` release we build with (0.26): a registry of another 0.x
    /// release is another type, and the call does not compile. A registry made with a prefix
    /// (`Registry::with_prefix("myapp")`) puts it before our names
    /// (`myapp_tracing_prof_spans_total`). Exemplars are left out: `prometheus_client` takes
    /// them only from its own metric types, so only [`encode`](Self::encode) and the
    /// `/metrics` routes carry them.
    #[cfg(feature = "prometheus-client-registry")]
    pub fn register(self, registry: &mut Registry, profiler: tracing_prof_core::Profiler) {
        registry.register_collector(Box::new(ProfilerCollector {
            metrics: self,
            profiler,
        }));
    }

    /// Per histogram path (by its label as encoded), per exposed bucket, the exemplar text
    /// to append to the bucket's line: ` # {span_id="...",trace_id="..."} SECONDS`.
    fn exemplars(
        &self,
        rows: &[Row],
        histograms: &[String],
    ) -> HashMap<String, Vec<Option<String>>> {
        let (first, last) = self.bounds;
        let mut out = HashMap::new();
        for r in rows.iter().filter(|r| !r.path.exemplars.is_empty()) {
            let (label, p) = (&r.label, &r.path);
            if !histograms.contains(label) {
                continue;
            }
            let mut buckets: Vec<Option<String>> = vec![None; last - first + 2];
            for e in &p.exemplars {
                let i = e.bucket.clamp(first, last + 1) - first;
                buckets[i] = Some(format!(
                    " # {{span_id=\"{}\",trace_id=\"{}\"}} {}",
                    e.link.span_id_hex(),
                    e.link.trace_id_hex(),
                    seconds(e.duration_ns)
                ));
            }
            out.insert(escape_label(label), buckets);
        }
        out
    }

    /// The chosen paths, after choosing more where there is room: paths not chosen yet, by
    /// most spans closed (then by name, for a stable order).
    fn choose(&self, rows: &[Row]) -> Vec<String> {
        let mut chosen = self.chosen.lock().unwrap_or_else(|e| e.into_inner());
        if chosen.len() < self.histogram_paths {
            let mut candidates: Vec<(u64, &str)> = rows
                .iter()
                .filter(|r| r.path.time.spans > 0 && !chosen.contains(&r.label))
                .map(|r| (r.path.time.spans, r.label.as_str()))
                .collect();
            candidates.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
            let room = self.histogram_paths - chosen.len();
            chosen.extend(candidates.into_iter().take(room).map(|(_, l)| l.to_owned()));
        }
        chosen.clone()
    }
}

/// A label value as the text formats escape it (`\\`, `\"`, `\n`).
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `text` (OpenMetrics) with each histogram bucket line of a path in `exemplars` followed by
/// its exemplar: bucket lines come in bound order, the k-th line of a path being its k-th
/// exposed bucket. (`prometheus_client` encodes exemplars only from its own locked metric
/// types, not from a collector's numbers: they are added to its text here.)
fn with_exemplars(text: &str, exemplars: &HashMap<String, Vec<Option<String>>>) -> String {
    const BUCKET: &str = "tracing_prof_span_duration_seconds_bucket{";
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut out = String::with_capacity(text.len() + exemplars.len() * 200);
    for line in text.lines() {
        out.push_str(line);
        if let Some(labels) = line.strip_prefix(BUCKET)
            && let Some((labels, _value)) = labels.rsplit_once("} ")
            && let Some(path) = labels
                .split_once("span_path=\"")
                .and_then(|(_, rest)| rest.strip_suffix('"'))
            && let Some(buckets) = exemplars.get(path)
        {
            let k = seen.entry(path).or_insert(0);
            if let Some(Some(e)) = buckets.get(*k) {
                out.push_str(e);
            }
            *k += 1;
        }
        out.push('\n');
    }
    out
}

/// The index of the bound nearest `d` (on a log scale).
fn bound_index(d: Duration) -> usize {
    nearest_duration_bound(nanos(d))
}

/// `d` in nanoseconds, at most `u64::MAX`.
fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The span paths by label: paths that write the same (one callsite whose span fields became
/// labels, `TRACING_PROF_LABEL_FIELDS`, is a path per value) are summed into one row, in the
/// order first met, so that no two series share their labels.
fn rows(paths: &[PathProfile]) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::with_capacity(paths.len());
    let mut at: HashMap<String, usize> = HashMap::with_capacity(paths.len());
    for p in paths {
        let label = p.display_path();
        match at.get(&label) {
            Some(&i) => {
                let row = &mut rows[i].path;
                row.time.add(&p.time);
                row.memory.add(&p.memory);
                row.exemplars.extend_from_slice(&p.exemplars);
            }
            None => {
                at.insert(label.clone(), rows.len());
                rows.push(Row {
                    label,
                    path: p.clone(),
                });
            }
        }
    }
    rows
}

/// One span path's numbers and its label.
#[derive(Debug)]
struct Row {
    label: String,
    path: PathProfile,
}

/// The profiler's own health, as metrics.
#[derive(Debug)]
struct Health {
    counters: Vec<(&'static str, &'static str, u64)>,
    gauges: Vec<(&'static str, &'static str, u64)>,
}

fn health(s: &Stats) -> Health {
    Health {
        counters: vec![
            (
                "tracing_prof_exports",
                "Profiles exported successfully, summed over sinks.",
                s.exports,
            ),
            (
                "tracing_prof_export_errors",
                "Exports that failed, summed over sinks.",
                s.export_errors,
            ),
            (
                "tracing_prof_overflowed_spans",
                "Spans counted under (other span paths): the span path cap was reached.",
                s.overflowed_spans,
            ),
            (
                "tracing_prof_stack_table_full_samples",
                "Heap samples counted under (stack table full).",
                s.stack_table_full,
            ),
            (
                "tracing_prof_spans_outside_table",
                "Spans that found no room in the span table (kept in the registry's extensions).",
                s.spans_outside_table,
            ),
            (
                "tracing_prof_cpu_samples",
                "CPU samples recorded (weighted).",
                s.cpu.samples,
            ),
            (
                "tracing_prof_cpu_samples_dropped",
                "CPU samples dropped because a thread's ring was full (weighted).",
                s.cpu.dropped,
            ),
        ],
        gauges: vec![
            (
                "tracing_prof_paused",
                "1 while profiling is paused.",
                u64::from(s.paused),
            ),
            (
                "tracing_prof_services_down",
                "Services of the profiler not working now (a /debug/pprof port taken, say).",
                s.services_down as u64,
            ),
            (
                "tracing_prof_span_table_bytes",
                "Memory the span table holds, outside the allocator.",
                s.span_table_bytes as u64,
            ),
            (
                "tracing_prof_cpu_sampling_hz",
                "The rate CPU sampling runs at (0: stopped).",
                u64::from(s.cpu.hz),
            ),
        ],
    }
}

/// One scrape's families, encoded by `prometheus_client` (a collector: no metric objects,
/// nothing locked on any span's path).
#[derive(Debug)]
struct Collector {
    paths: Vec<Row>,
    /// Per path with a slow-span threshold: its label, the bound in seconds, the count.
    slow: Vec<(String, String, u64)>,
    histograms: Vec<String>,
    bounds: (usize, usize),
    stats: Option<Health>,
    process: Option<tracing_prof_model::ProcessMemory>,
}

/// A label set of one span path.
type PathLabel<'a> = [(&'static str, &'a str); 1];

impl Collector {
    fn counter<V: EncodeCounterValue>(
        &self,
        encoder: &mut DescriptorEncoder,
        (name, help, unit): (&str, &str, Option<Unit>),
        value: impl Fn(&PathProfile) -> V,
    ) -> Result<(), std::fmt::Error> {
        let mut family =
            encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
        for row in &self.paths {
            let labels: PathLabel = [("span_path", &row.label)];
            family
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, V, f64>(&value(&row.path), None)?;
        }
        Ok(())
    }

    fn histogram(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "tracing_prof_span_duration",
            "Wall time of each span of the path, from creation to close.",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        let (first, last) = self.bounds;
        for name in &self.histograms {
            let Some(row) = self.paths.iter().find(|r| &r.label == name) else {
                // A chosen path the snapshot no longer has (a window, a reset): nothing
                // counted, all zeros, so that its series stays.
                let labels: PathLabel = [("span_path", name)];
                let buckets = self.buckets(&[0; DURATION_BUCKETS], first, last);
                encode_histogram(family.encode_family(&labels)?, 0.0, 0, &buckets)?;
                continue;
            };
            let t = &row.path.time;
            let labels: PathLabel = [("span_path", &row.label)];
            let buckets = self.buckets(&t.durations, first, last);
            let count = t.durations.iter().sum();
            encode_histogram(
                family.encode_family(&labels)?,
                seconds(t.wall_ns),
                count,
                &buckets,
            )?;
        }
        Ok(())
    }

    /// The exposed buckets (non-cumulative counts, as the encoder takes them): the profiler's
    /// buckets up to bound `first` in the first, each up to `last` in its own, the rest in
    /// `+Inf`.
    fn buckets(&self, d: &[u64; DURATION_BUCKETS], first: usize, last: usize) -> Vec<(f64, u64)> {
        let mut out = Vec::with_capacity(last - first + 2);
        out.push((seconds(DURATION_BOUNDS_NS[first]), d[..=first].iter().sum()));
        for i in first + 1..=last {
            out.push((seconds(DURATION_BOUNDS_NS[i]), d[i]));
        }
        out.push((f64::INFINITY, d[last + 1..].iter().sum()));
        out
    }
}

/// [`SpanMetrics`] in an application's registry: reads the profiler at each scrape.
#[cfg(feature = "prometheus-client-registry")]
#[derive(Debug)]
struct ProfilerCollector {
    metrics: SpanMetrics,
    profiler: tracing_prof_core::Profiler,
}

#[cfg(feature = "prometheus-client-registry")]
impl prometheus_client::collector::Collector for ProfilerCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // The application's thread, encoding its registry: what this allocates counts as the
        // profiler's own.
        let collector = tracing_prof_core::as_profiler(|| {
            let snapshot = self.profiler.paths_snapshot();
            let stats = self.profiler.stats();
            self.metrics
                .collector(&snapshot, Some(&stats), self.profiler.slow_spans())
        });
        tracing_prof_core::as_profiler(|| {
            prometheus_client::collector::Collector::encode(&collector, encoder)
        })
    }
}

fn encode_histogram(
    mut m: MetricEncoder,
    sum: f64,
    count: u64,
    buckets: &[(f64, u64)],
) -> Result<(), std::fmt::Error> {
    m.encode_histogram::<NoLabelSet>(sum, count, buckets, None)
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.histogram(&mut encoder)?;
        let ns = |v: u64| seconds(v);
        self.counter(
            &mut encoder,
            ("tracing_prof_spans", "Spans of the path closed.", None),
            |p| p.time.spans,
        )?;
        self.counter(
            &mut encoder,
            (
                "tracing_prof_span_errors",
                "Spans of the path closed in which an ERROR event was recorded.",
                None,
            ),
            |p| p.time.errors,
        )?;
        self.counter(
            &mut encoder,
            (
                "tracing_prof_span_busy",
                "Time the path's spans were entered, less their child spans (self time).",
                Some(Unit::Seconds),
            ),
            |p| ns(p.time.busy_ns),
        )?;
        self.counter(
            &mut encoder,
            (
                "tracing_prof_span_cpu",
                "CPU time while the path was the innermost entered span (self time).",
                Some(Unit::Seconds),
            ),
            |p| ns(p.time.cpu_ns),
        )?;
        self.counter(
            &mut encoder,
            (
                "tracing_prof_span_allocated",
                "Bytes allocated in the path's spans (requested sizes, exact).",
                Some(Unit::Bytes),
            ),
            |p| p.memory.alloc_bytes,
        )?;
        let mut inuse = encoder.encode_descriptor(
            "tracing_prof_span_inuse",
            "Bytes allocated in the path's spans and not freed yet (exact).",
            Some(&Unit::Bytes),
            MetricType::Gauge,
        )?;
        for row in &self.paths {
            let labels: PathLabel = [("span_path", &row.label)];
            inuse
                .encode_family(&labels)?
                .encode_gauge(&(row.path.memory.inuse_bytes as i64))?;
        }
        if !self.slow.is_empty() {
            let mut family = encoder.encode_descriptor(
                "tracing_prof_span_slow",
                "Spans of the path longer than its slow-span threshold, counted from the \
                 histogram above the nearest bucket bound (the threshold label, in seconds).",
                None,
                MetricType::Counter,
            )?;
            for (path, threshold, count) in &self.slow {
                let labels = [
                    ("span_path", path.as_str()),
                    ("threshold", threshold.as_str()),
                ];
                family
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, u64, f64>(count, None)?;
            }
        }
        if let Some(m) = &self.process {
            let mut gauges = vec![
                (
                    "tracing_prof_process_resident",
                    "Resident set size (/proc/self/smaps_rollup Rss).",
                    m.rss_bytes,
                ),
                (
                    "tracing_prof_process_resident_anonymous",
                    "Resident anonymous memory (heap, stacks, anonymous mappings).",
                    m.anon_bytes,
                ),
                (
                    "tracing_prof_heap_inuse",
                    "The heap in use: blocks handed out by the tagging allocator and not freed \
                     (requested sizes, exact).",
                    m.heap_inuse_bytes,
                ),
            ];
            if let Some(a) = &m.allocator {
                gauges.push((
                    "tracing_prof_allocator_held",
                    "Bytes the wrapped allocator holds from the system (its own report).",
                    a.held_bytes,
                ));
            }
            for (name, help, v) in gauges {
                encoder
                    .encode_descriptor(name, help, Some(&Unit::Bytes), MetricType::Gauge)?
                    .encode_gauge(&(v as i64))?;
            }
        }
        if let Some(h) = &self.stats {
            for &(name, help, v) in &h.counters {
                encoder
                    .encode_descriptor(name, help, None, MetricType::Counter)?
                    .encode_counter::<NoLabelSet, u64, u64>(&v, None)?;
            }
            for &(name, help, v) in &h.gauges {
                encoder
                    .encode_descriptor(name, help, None, MetricType::Gauge)?
                    .encode_gauge(&(v as i64))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
