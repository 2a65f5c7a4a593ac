//! A stand-in OTLP profiles receiver: answers `POST /v1development/profiles` as an OpenTelemetry
//! Collector and Grafana Pyroscope would, by their own rules, and says what Pyroscope would
//! store. Every rule names the file of the receiver it comes from:
//!
//! - the Collector at `open-telemetry/opentelemetry-collector` `934999fb` (v0.159.0):
//!   `receiver/otlpreceiver/otlphttp.go` (method, content type), `config/confighttp/
//!   compression.go` and `server.go` (encodings, the 20 MiB body limit), the request parsed
//!   by its generated code (here: the official `.proto` files of `../otel_proto`, decoded with
//!   no field unknown to them);
//! - Pyroscope at `grafana/pyroscope` `3fe6a457`: `pkg/ingester/otlp/ingest_handler.go`
//!   (`NewOTLPIngestHandler`, `handleHTTPRequest`, `export`: content types, answers, series
//!   labels), `pkg/ingester/otlp/convert.go` (`ConvertOtelToGoogle`, `newProfileBuilder`,
//!   `convertSampleBack`, `convertSampleAttributesToLabelsBack`: indices, profile types,
//!   values, links), `pkg/validation/validate.go` (`ValidateLabels`, `ValidateProfile`) with
//!   the defaults of `pkg/validation/limits.go`.
//!
//! A request passes when both would take it, and when what profiles.proto says MUST hold and
//! neither checks holds too (every table starts with its zero value; no sample repeats an
//! attribute key); the answer is the first refusal, with the status that receiver gives
//! (Pyroscope answers `500` to what its conversion refuses, `400` to what validation refuses;
//! the specification's rules are refused with `400`).

use crate::stub_server::{Answer, Request, StubServer};
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development as otlp;
use prost::Message as _;
use prost_reflect::ReflectMessage as _;
use std::collections::{BTreeMap, VecDeque};
use std::io::Read as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The path both receivers take profiles at.
pub const PATH: &str = "/v1development/profiles";

/// Why a receiver refused a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `collector`, `pyroscope`, or `spec` (profiles.proto's rules).
    pub by: &'static str,
    /// The HTTP status it answers.
    pub status: u16,
    /// Its reason.
    pub reason: String,
}

/// One series Pyroscope would store, with what a request brought to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Series {
    /// `__name__:type:unit:period_type:period_unit` (`pkg/phlaredb/labels/labels.go`).
    pub profile_type: String,
    /// The series labels, `__name__` and `service_name` among them.
    pub labels: BTreeMap<String, String>,
    /// The sum of the values as Pyroscope stores them (CPU samples times the period).
    pub total: i64,
    /// Samples of the series.
    pub samples: usize,
    /// What each value was multiplied by to store it (a CPU sample's period, else 1).
    pub scale: i64,
    /// Per linked span (`span_id` label, 16 hex digits): its trace id (32) and its total.
    pub spans: BTreeMap<String, (String, i64)>,
    /// Per stack (function names, root first): its total.
    pub stacks: BTreeMap<Vec<String>, i64>,
}

/// The series a request brought, or the refusal.
pub type Verdict = Result<Vec<Series>, Refusal>;

/// The receiver; see the module docs.
#[derive(Debug)]
pub struct OtlpReceiver {
    server: StubServer,
    verdicts: Arc<Mutex<Vec<Verdict>>>,
    script: Arc<Mutex<VecDeque<Answer>>>,
}

impl OtlpReceiver {
    /// Listens on a free port of 127.0.0.1.
    pub fn start() -> Self {
        let verdicts = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Mutex<VecDeque<Answer>>> = Arc::new(Mutex::new(VecDeque::new()));
        let (v, s) = (Arc::clone(&verdicts), Arc::clone(&script));
        let server = StubServer::start(move |request| {
            if let Some(answer) = s.lock().unwrap().pop_front() {
                return Some(answer);
            }
            let verdict = judge(request, SystemTime::now());
            let answer = match &verdict {
                // An empty `ExportProfilesServiceResponse`: no bytes (both receivers).
                Ok(_) => Answer {
                    status: 200,
                    headers: vec![("Content-Type".into(), "application/x-protobuf".into())],
                    body: Vec::new(),
                },
                Err(r) => Answer::text(r.status, r.reason.clone()),
            };
            v.lock().unwrap().push(verdict);
            Some(answer)
        });
        OtlpReceiver {
            server,
            verdicts,
            script,
        }
    }

    /// The base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The next requests get these answers instead of the rules' (an outage, a throttle).
    pub fn answer_next(&self, answers: impl IntoIterator<Item = Answer>) {
        self.script.lock().unwrap().extend(answers);
    }

    /// Every request so far.
    pub fn taken(&self) -> Vec<Request> {
        self.server.taken()
    }

    /// The verdicts on the requests the rules answered, in order.
    pub fn verdicts(&self) -> Vec<Verdict> {
        self.verdicts.lock().unwrap().clone()
    }
}

fn refuse<T>(by: &'static str, status: u16, reason: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal {
        by,
        status,
        reason: reason.into(),
    })
}

/// The Collector's `defaultMaxRequestBodySize` (`config/confighttp/server.go`).
const COLLECTOR_MAX_BODY: usize = 20 << 20;

/// Both receivers' verdict on `r`, at time `now`.
pub fn judge(r: &Request, now: SystemTime) -> Verdict {
    let body = collector_reads(r)?;
    let request = ExportProfilesServiceRequest::decode(&*body)
        .or_else(|e| refuse("collector", 400, format!("proto: {e}")))?;
    pyroscope_takes(r, &request, now)
}

/// The Collector's HTTP rules, and the body decoded by the official `.proto` files.
fn collector_reads(r: &Request) -> Result<Vec<u8>, Refusal> {
    // otlphttp.go: POST only; the profiles route.
    if r.method != "POST" {
        return refuse(
            "collector",
            405,
            "405 method not allowed, supported: [POST]",
        );
    }
    if r.path() != PATH {
        return refuse("collector", 404, "404 page not found");
    }
    // otlphttp.go `readContentType`: the media type, parameters allowed.
    let media = r
        .header("content-type")
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim();
    if media != "application/x-protobuf" && media != "application/json" {
        return refuse(
            "collector",
            415,
            "415 unsupported media type, supported: [application/json, application/x-protobuf]",
        );
    }
    if media == "application/json" {
        return refuse("collector", 400, "this stand-in reads protobuf only");
    }
    // compression.go: the encodings it knows, matched exactly.
    let body = match r.header("content-encoding").unwrap_or("") {
        "" => r.body.clone(),
        "gzip" => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&r.body[..])
                .take(COLLECTOR_MAX_BODY as u64 + 1)
                .read_to_end(&mut out)
                .or_else(|e| refuse("collector", 400, format!("gzip: {e}")))?;
            out
        }
        other => {
            return refuse(
                "collector",
                400,
                format!("unsupported Content-Encoding: {other}"),
            );
        }
    };
    if body.len() > COLLECTOR_MAX_BODY {
        return refuse("collector", 400, "request body too large");
    }
    let message = official_request()
        .and_then(|d| prost_reflect::DynamicMessage::decode(d, &*body).map_err(|e| e.to_string()))
        .or_else(|e| {
            refuse(
                "collector",
                400,
                format!("not an ExportProfilesServiceRequest: {e}"),
            )
        })?;
    if let Some(path) = unknown_field(&message) {
        return refuse(
            "collector",
            400,
            format!("a field the official .proto files do not have: {path}"),
        );
    }
    Ok(body)
}

/// `ExportProfilesServiceRequest` from the official `.proto` files of `otel_proto/`.
fn official_request() -> Result<prost_reflect::MessageDescriptor, String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/otel_proto");
    let files = protox::compile(
        ["opentelemetry/proto/collector/profiles/v1development/profiles_service.proto"],
        [dir],
    )
    .map_err(|e| e.to_string())?;
    let pool = prost_reflect::DescriptorPool::from_file_descriptor_set(files)
        .map_err(|e| e.to_string())?;
    pool.get_message_by_name(
        "opentelemetry.proto.collector.profiles.v1development.ExportProfilesServiceRequest",
    )
    .ok_or_else(|| "no ExportProfilesServiceRequest".into())
}

/// The path of the first field the descriptors did not know, anywhere in `m`.
fn unknown_field(m: &prost_reflect::DynamicMessage) -> Option<String> {
    use prost_reflect::Value;
    if let Some(u) = m.unknown_fields().next() {
        return Some(format!("{}.#{}", m.descriptor().full_name(), u.number()));
    }
    for (_, value) in m.fields() {
        let found = match value {
            Value::Message(inner) => unknown_field(inner),
            Value::List(items) => items
                .iter()
                .find_map(|v| v.as_message().and_then(unknown_field)),
            _ => None,
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// Pyroscope's defaults (`pkg/validation/limits.go`).
const MAX_LABEL_NAMES: usize = 30;
const MAX_SAMPLES: usize = 16_000;
const REJECT_OLDER: Duration = Duration::from_secs(3600);
const REJECT_NEWER: Duration = Duration::from_secs(600);

/// The first value of an attribute as Pyroscope reads one (`stringValueFromAnyValue`): a string
/// or an integer, else nothing.
fn label_value(v: Option<&AnyValue>) -> Option<String> {
    match v?.value.as_ref()? {
        any_value::Value::StringValue(s) if !s.is_empty() => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        _ => None,
    }
}

/// `at()` of `convert.go`: an index in range, or the conversion's error (`500`).
fn at<'a, T>(table: &'a [T], index: i32, what: &str) -> Result<&'a T, Refusal> {
    usize::try_from(index)
        .ok()
        .and_then(|i| table.get(i))
        .map_or_else(
            || {
                refuse(
                    "pyroscope",
                    500,
                    format!("failed to convert otel profile: invalid {what} index: {index}"),
                )
            },
            Ok,
        )
}

/// What profiles.proto says MUST hold and neither receiver checks: every table of the
/// dictionary starts with its zero value (the link's with zero bytes of either length), and no
/// sample repeats an attribute key. Refused as `400`, by "spec".
fn spec_holds(
    d: &otlp::ProfilesDictionary,
    request: &ExportProfilesServiceRequest,
) -> Result<(), Refusal> {
    let zero_link = |l: &otlp::Link| {
        l.trace_id.iter().chain(&l.span_id).all(|&b| b == 0)
            && [0, 16].contains(&l.trace_id.len())
            && [0, 8].contains(&l.span_id.len())
    };
    let first_is_zero = d.mapping_table.first() == Some(&otlp::Mapping::default())
        && d.location_table.first() == Some(&otlp::Location::default())
        && d.function_table.first() == Some(&otlp::Function::default())
        && d.link_table.first().is_some_and(zero_link)
        && d.string_table.first().is_some_and(String::is_empty)
        && d.attribute_table.first() == Some(&otlp::KeyValueAndUnit::default())
        && d.stack_table.first() == Some(&otlp::Stack::default());
    if !first_is_zero {
        return refuse(
            "spec",
            400,
            "a dictionary table does not start with its zero value",
        );
    }
    let samples = request
        .resource_profiles
        .iter()
        .flat_map(|rp| &rp.scope_profiles)
        .flat_map(|sp| &sp.profiles)
        .flat_map(|p| &p.samples);
    for sample in samples {
        let mut keys: Vec<i32> = sample
            .attribute_indices
            .iter()
            .filter_map(|&a| d.attribute_table.get(usize::try_from(a).ok()?))
            .map(|kv| kv.key_strindex)
            .collect();
        let n = keys.len();
        keys.sort_unstable();
        keys.dedup();
        if keys.len() != n {
            return refuse("spec", 400, "a sample repeats an attribute key");
        }
    }
    Ok(())
}

/// Pyroscope's handling of a decoded request: the series it stores.
fn pyroscope_takes(
    r: &Request,
    request: &ExportProfilesServiceRequest,
    now: SystemTime,
) -> Verdict {
    // ingest_handler.go `NewOTLPIngestHandler`: three content types, matched exactly.
    let ct = r.header("content-type").unwrap_or("");
    if ![
        "application/json",
        "application/x-protobuf",
        "application/protobuf",
    ]
    .contains(&ct)
    {
        return refuse("pyroscope", 415, format!("Unsupported Content-Type: {ct}"));
    }
    // `export`: a dictionary and resource profiles, or a gRPC error that the HTTP handler
    // answers with 500.
    let Some(d) = &request.dictionary else {
        return refuse("pyroscope", 500, "missing profile metadata dictionary");
    };
    if request.resource_profiles.is_empty() {
        return refuse("pyroscope", 500, "missing resource profiles");
    }
    spec_holds(d, request)?;
    let s = |i: i32| at(&d.string_table, i, "string").map(String::as_str);
    let mut out = Vec::new();
    for rp in &request.resource_profiles {
        let resource: &[KeyValue] = rp.resource.as_ref().map_or(&[], |r| &r.attributes);
        for sp in &rp.scope_profiles {
            let scope: &[KeyValue] = sp.scope.as_ref().map_or(&[], |s| &s.attributes);
            for p in &sp.profiles {
                if p.samples.is_empty() {
                    continue;
                }
                // convert.go `newProfileBuilder`: the profile type.
                let Some(st) = &p.sample_type else {
                    return refuse("pyroscope", 500, "sample type is missing");
                };
                let (mut ty, mut unit) = (
                    s(st.type_strindex)?.to_owned(),
                    s(st.unit_strindex)?.to_owned(),
                );
                let (period_type, period_unit) = match &p.period_type {
                    Some(pt) if p.period != 0 => (
                        s(pt.type_strindex)?.to_owned(),
                        s(pt.unit_strindex)?.to_owned(),
                    ),
                    _ => (String::new(), String::new()),
                };
                let key = format!("{ty}:{unit}:{period_type}:{period_unit}");
                let (name, scale) = if key == "samples:count:cpu:nanoseconds" {
                    ty = "cpu".into();
                    unit = "nanoseconds".into();
                    ("process_cpu".to_owned(), p.period)
                } else {
                    (period_type.clone(), 1)
                };
                // validate.go: `__name__` must be a valid name (not empty); no `-` in a type.
                if name.is_empty() {
                    return refuse("pyroscope", 400, "invalid metric name");
                }
                if ty.contains('-') {
                    return refuse("pyroscope", 400, "sample type contains -");
                }
                if p.samples.len() > MAX_SAMPLES {
                    return refuse("pyroscope", 400, "exceeds the samples count limit");
                }
                let time = UNIX_EPOCH + Duration::from_nanos(p.time_unix_nano);
                if p.time_unix_nano != 0 && (time + REJECT_OLDER < now || time > now + REJECT_NEWER)
                {
                    return refuse("pyroscope", 400, "not_in_ingestion_window");
                }
                // ingest_handler.go `export`: `__name__`, then resource and scope attributes
                // (first of a key wins), then `service_name`.
                let mut labels: BTreeMap<String, String> = BTreeMap::new();
                labels.insert("__delta__".into(), "false".into());
                labels.insert("__otel__".into(), "true".into());
                labels.insert("__name__".into(), name.clone());
                for kv in resource.iter().chain(scope) {
                    if let Some(v) = label_value(kv.value.as_ref()) {
                        labels.entry(kv.key.clone()).or_insert(v);
                    }
                }
                // `getServiceNameFromAttributes`.
                let attribute = |key: &str| {
                    resource
                        .iter()
                        .find(|kv| kv.key == key)
                        .and_then(|kv| label_value(kv.value.as_ref()))
                };
                let service = attribute("service.name").unwrap_or_else(|| {
                    match attribute("process.executable.name") {
                        Some(exe) => format!("unknown_service:{exe}"),
                        None => "unknown_service".into(),
                    }
                });
                labels.insert("service_name".into(), service);
                let profile_type = format!("{name}:{ty}:{unit}:{period_type}:{period_unit}");
                let mut by_labels: BTreeMap<BTreeMap<String, String>, Series> = BTreeMap::new();
                for sample in &p.samples {
                    // `convertSampleBack`: one value with a period; none only with timestamps.
                    let value = match (sample.values.as_slice(), sample.timestamps_unix_nano.len())
                    {
                        ([], 0) => return refuse("pyroscope", 500, "sample value is required"),
                        ([], n) => n as i64,
                        ([v], _) => *v,
                        (more, _) if !period_type.is_empty() => {
                            return refuse(
                                "pyroscope",
                                500,
                                format!("sample values length mismatch {} 1", more.len()),
                            );
                        }
                        _ => return refuse("pyroscope", 400, "sample value length mismatch"),
                    };
                    let stack = at(&d.stack_table, sample.stack_index, "stack")?;
                    // Leaf first on the wire, and within a location its inlined functions
                    // first, its caller last (profiles.proto, `Location.lines`).
                    let mut names = Vec::new();
                    for &l in &stack.location_indices {
                        let location = at(&d.location_table, l, "location")?;
                        let mapping = at(&d.mapping_table, location.mapping_index, "mapping")?;
                        s(mapping.filename_strindex)?;
                        for line in &location.lines {
                            let f = at(&d.function_table, line.function_index, "function")?;
                            s(f.system_name_strindex)?;
                            s(f.filename_strindex)?;
                            names.push(s(f.name_strindex)?.to_owned());
                        }
                    }
                    names.reverse(); // root first
                    // `convertSampleAttributesToLabelsBack`: string and integer attributes
                    // become labels (`service.name` splits instead); a link, `span_id` and
                    // `trace_id` (only of 16 bytes).
                    let mut sample_labels = labels.clone();
                    for &a in &sample.attribute_indices {
                        let kv = at(&d.attribute_table, a, "attribute")?;
                        let key = s(kv.key_strindex)?;
                        if key == "service.name" {
                            return refuse(
                                "pyroscope",
                                400,
                                "this stand-in does not split by service.name",
                            );
                        }
                        if let Some(v) = label_value(kv.value.as_ref()) {
                            // pprof_split.go `addSampleLabelsToLabelsBuilder`: series labels win.
                            sample_labels.entry(key.to_owned()).or_insert(v);
                        }
                    }
                    if sample_labels.len() > MAX_LABEL_NAMES {
                        return refuse("pyroscope", 400, "profile series has too many labels");
                    }
                    let link = if sample.link_index != 0 {
                        let l: &otlp::Link = at(&d.link_table, sample.link_index, "link")?;
                        let hex =
                            |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
                        Some((
                            hex(&l.span_id),
                            (l.trace_id.len() == 16).then(|| hex(&l.trace_id)),
                        ))
                    } else {
                        None
                    };
                    let series = by_labels
                        .entry(sample_labels.clone())
                        .or_insert_with(|| Series {
                            profile_type: profile_type.clone(),
                            labels: sample_labels,
                            scale,
                            ..Series::default()
                        });
                    let value = value.saturating_mul(scale);
                    series.total += value;
                    series.samples += 1;
                    *series.stacks.entry(names).or_default() += value;
                    if let Some((span, trace)) = link {
                        let e = series
                            .spans
                            .entry(span)
                            .or_insert((trace.unwrap_or_default(), 0));
                        e.1 += value;
                    }
                }
                out.extend(by_labels.into_values());
            }
        }
    }
    Ok(out)
}
