//! What a real Pyroscope server does with a request, written from its source: grafana/pyroscope at
//! [`COMMIT`] (2026-08-21). Each rule names the file it comes from. Requests are decoded with
//! Pyroscope's own `.proto` files (`pyroscope_proto/`, see its README), not with tracing-prof's
//! structs, and nothing here knows what tracing-prof chose to send.

use super::Request;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, Value};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The Pyroscope commit these rules were read from.
pub const COMMIT: &str = "3fe6a457a32004efc46da819cbc114472d07415e";

/// A request the server would refuse: the HTTP status and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status it answers.
    pub status: u16,
    /// The body it answers, the reason.
    pub reason: String,
}

fn refuse<T>(status: u16, reason: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal {
        status,
        reason: reason.into(),
    })
}

/// One profile series as the distributor sees it after parsing: labels and a decoded pprof.
#[derive(Debug, Clone)]
pub struct SeriesIn {
    /// The series labels.
    pub labels: Vec<(String, String)>,
    /// Its profile, decoded.
    pub profile: Pprof,
}

/// The parts of a pprof the server looks at, resolved through its string table.
#[derive(Debug, Clone)]
pub struct Pprof {
    /// `(type, unit)` per sample type.
    pub sample_types: Vec<(String, String)>,
    /// `(type, unit)` of the period, if any.
    pub period_type: Option<(String, String)>,
    /// The profile's `time_nanos`.
    pub time_nanos: i64,
    /// Per sample: function names leaf first, and values.
    pub samples: Vec<(Vec<String>, Vec<i64>)>,
    /// Per sample: its string labels (key, value), in the sample's order.
    pub sample_labels: Vec<Vec<(String, String)>>,
}

/// The defaults of `pkg/validation/limits.go` (`RegisterFlags`).
pub mod limits {
    use std::time::Duration;
    /// `validation.max-length-label-name`
    pub const MAX_LABEL_NAME_LENGTH: usize = 1024;
    /// `validation.max-length-label-value`
    pub const MAX_LABEL_VALUE_LENGTH: usize = 2048;
    /// `validation.max-label-names-per-series`
    pub const MAX_LABEL_NAMES_PER_SERIES: usize = 30;
    /// `validation.max-profile-size-bytes` (uncompressed)
    pub const MAX_PROFILE_SIZE_BYTES: usize = 4 * 1024 * 1024;
    /// `validation.max-profile-stacktrace-samples`
    pub const MAX_PROFILE_STACKTRACE_SAMPLES: usize = 16000;
    /// `validation.max-profile-stacktrace-sample-labels`
    pub const MAX_PROFILE_STACKTRACE_SAMPLE_LABELS: usize = 100;
    /// `validation.reject-newer-than`
    pub const REJECT_NEWER_THAN: Duration = Duration::from_secs(600);
    /// `validation.reject-older-than`
    pub const REJECT_OLDER_THAN: Duration = Duration::from_secs(3600);
}

fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/pyroscope_proto");
        let files = protox::compile(["push/v1/push.proto", "google/v1/profile.proto"], [dir])
            .expect("Pyroscope's .proto files compile");
        DescriptorPool::from_file_descriptor_set(files).expect("a descriptor pool")
    })
}

fn message(name: &str) -> MessageDescriptor {
    pool()
        .get_message_by_name(name)
        .unwrap_or_else(|| panic!("{name} in Pyroscope's .proto files"))
}

fn field(m: &DynamicMessage, name: &str) -> Value {
    m.get_field_by_name(name)
        .unwrap_or_else(|| panic!("field {name}"))
        .into_owned()
}
fn messages(m: &DynamicMessage, name: &str) -> Vec<DynamicMessage> {
    match field(m, name) {
        Value::List(l) => l
            .into_iter()
            .filter_map(|v| v.as_message().cloned())
            .collect(),
        _ => Vec::new(),
    }
}
fn int(m: &DynamicMessage, name: &str) -> i64 {
    match field(m, name) {
        Value::I64(v) => v,
        Value::U64(v) => v as i64,
        Value::I32(v) => i64::from(v),
        other => panic!("{name} is not an integer: {other:?}"),
    }
}
fn ints(m: &DynamicMessage, name: &str) -> Vec<i64> {
    match field(m, name) {
        Value::List(l) => l
            .iter()
            .map(|v| match v {
                Value::I64(v) => *v,
                Value::U64(v) => *v as i64,
                other => panic!("{name}: {other:?}"),
            })
            .collect(),
        other => panic!("{name} is not a list: {other:?}"),
    }
}
fn string(m: &DynamicMessage, name: &str) -> String {
    field(m, name).as_str().unwrap_or_default().to_owned()
}

/// `POST /push.v1.PusherService/Push` (Connect, `api/push/v1/push.proto`): the series of the
/// request, or why the server refuses it.
pub fn push(r: &Request, now: SystemTime) -> Result<Vec<SeriesIn>, Refusal> {
    // Connect's unary protocol: `application/proto` for a binary body (`connectrpc.com/connect`,
    // the server's RPC framework, `pkg/api/api.go` mounts the handler).
    if r.method != "POST" {
        return refuse(405, "Connect unary calls are POST");
    }
    match r.header("content-type") {
        Some("application/proto") => {}
        other => {
            return refuse(
                415,
                format!("content type {other:?}: not application/proto"),
            );
        }
    }
    let req = DynamicMessage::decode(message("push.v1.PushRequest"), &r.body[..])
        .or_else(|e| refuse(400, format!("PushRequest: {e}")))?;
    let mut out = Vec::new();
    // pkg/distributor/distributor.go, Push: each sample of each series is one profile.
    for series in messages(&req, "series") {
        let labels: Vec<(String, String)> = messages(&series, "labels")
            .iter()
            .map(|l| (string(l, "name"), string(l, "value")))
            .collect();
        for sample in messages(&series, "samples") {
            let raw = match field(&sample, "raw_profile") {
                Value::Bytes(b) => b.to_vec(),
                _ => Vec::new(),
            };
            let profile = raw_from_bytes(&raw)?;
            out.push(SeriesIn {
                labels: labels.clone(),
                profile,
            });
        }
    }
    if out.is_empty() {
        // distributor.go, PushBatch: noNewProfilesReceivedError.
        return refuse(400, "no profiles received");
    }
    for s in &mut out {
        distributor_checks(s, now)?;
    }
    Ok(out)
}

/// `pkg/pprof/pprof.go`, `RawFromBytesWithLimit`: gunzip (or take as is) within the size limit,
/// then decode a `google.v1.Profile`; then `pkg/validation/validate.go`, `ValidateProfile`
/// for what needs the string table.
fn raw_from_bytes(raw: &[u8]) -> Result<Pprof, Refusal> {
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(raw)
            .take(limits::MAX_PROFILE_SIZE_BYTES as u64 + 1)
            .read_to_end(&mut out)
            .or_else(|e| refuse(400, format!("gzip: {e}")))?;
        out
    } else {
        raw.to_vec()
    };
    if bytes.len() > limits::MAX_PROFILE_SIZE_BYTES {
        return refuse(400, "uncompressed profile payload size exceeds limit");
    }
    let p = DynamicMessage::decode(message("google.v1.Profile"), &bytes[..])
        .or_else(|e| refuse(400, format!("pprof: {e}")))?;
    validate_profile(&p)
}

/// `pkg/validation/validate.go`, `ValidateProfile` and `validateStringTableAccess`, except the
/// time window (in [`distributor_checks`]).
fn validate_profile(p: &DynamicMessage) -> Result<Pprof, Refusal> {
    let malformed = |why: &str| refuse(400, format!("malformed profile: {why}"));
    let strings: Vec<String> = match field(p, "string_table") {
        Value::List(l) => l
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_owned())
            .collect(),
        _ => Vec::new(),
    };
    let sample_types = messages(p, "sample_type");
    if sample_types.is_empty() {
        return malformed("empty profile");
    }
    let samples = messages(p, "sample");
    if samples.len() > limits::MAX_PROFILE_STACKTRACE_SAMPLES {
        return refuse(
            400,
            format!(
                "exceeds the samples count limit (max_profile_stacktrace_samples, actual: {}, limit: {})",
                samples.len(),
                limits::MAX_PROFILE_STACKTRACE_SAMPLES
            ),
        );
    }
    for s in &samples {
        if messages(s, "label").len() > limits::MAX_PROFILE_STACKTRACE_SAMPLE_LABELS {
            return refuse(400, "exceeds the sample labels limit");
        }
    }
    let locations = messages(p, "location");
    let functions = messages(p, "function");
    if locations.iter().any(|l| int(l, "id") == 0) {
        return malformed("location id is 0");
    }
    if functions.iter().any(|f| int(f, "id") == 0) {
        return malformed("function id is 0");
    }
    for s in &samples {
        if ints(s, "value").len() != sample_types.len() {
            return malformed("sample value length mismatch");
        }
    }
    if strings.first().is_none_or(|s| !s.is_empty()) {
        return malformed("string 0 should be empty string");
    }
    let in_range = |i: i64| usize::try_from(i).is_ok_and(|i| i < strings.len());
    for t in &sample_types {
        if !in_range(int(t, "type")) {
            return malformed("sample type type string index out of range");
        }
    }
    for s in &samples {
        for l in messages(s, "label") {
            if !in_range(int(&l, "str")) || !in_range(int(&l, "key")) {
                return malformed("sample label string index out of range");
            }
        }
    }
    for f in &functions {
        for name in ["name", "system_name", "filename"] {
            if !in_range(int(f, name)) {
                return malformed("function string index out of range");
            }
        }
    }
    for m in messages(p, "mapping") {
        for name in ["filename", "build_id"] {
            if !in_range(int(&m, name)) {
                return malformed("mapping string index out of range");
            }
        }
    }
    let text = |i: i64| strings[usize::try_from(i).unwrap_or(0).min(strings.len() - 1)].clone();
    let sample_types: Vec<(String, String)> = sample_types
        .iter()
        .map(|t| (text(int(t, "type")), text(int(t, "unit"))))
        .collect();
    if sample_types.iter().any(|(t, _)| t.contains('-')) {
        return malformed("sample type contains -");
    }
    // Strings are valid UTF-8: the decoder refused the profile otherwise.
    let function_name: HashMap<i64, String> = functions
        .iter()
        .map(|f| (int(f, "id"), text(int(f, "name"))))
        .collect();
    let location_names: HashMap<i64, Vec<String>> = locations
        .iter()
        .map(|l| {
            let names = messages(l, "line")
                .iter()
                .map(|line| {
                    function_name
                        .get(&int(line, "function_id"))
                        .cloned()
                        .unwrap_or_default()
                })
                .collect();
            (int(l, "id"), names)
        })
        .collect();
    let period_type = field(p, "period_type")
        .as_message()
        .filter(|_| p.has_field_by_name("period_type"))
        .map(|t| (text(int(t, "type")), text(int(t, "unit"))));
    Ok(Pprof {
        sample_types,
        period_type,
        time_nanos: int(p, "time_nanos"),
        samples: samples
            .iter()
            .map(|s| {
                let stack = ints(s, "location_id")
                    .iter()
                    .flat_map(|id| location_names.get(id).cloned().unwrap_or_default())
                    .collect();
                (stack, ints(s, "value"))
            })
            .collect(),
        sample_labels: samples
            .iter()
            .map(|s| {
                messages(s, "label")
                    .iter()
                    .filter(|l| int(l, "str") > 0)
                    .map(|l| (text(int(l, "key")), text(int(l, "str"))))
                    .collect()
            })
            .collect(),
    })
}

/// What `PushBatch` checks of each series (`pkg/distributor/distributor.go`):
/// `validation.ValidateLabels` and the ingestion window of `ValidateProfile`
/// (`pkg/validation/validate.go`).
fn distributor_checks(s: &mut SeriesIn, now: SystemTime) -> Result<(), Refusal> {
    validate_labels(&mut s.labels)?;
    if s.profile.time_nanos > 0 {
        let t = UNIX_EPOCH + Duration::from_nanos(s.profile.time_nanos as u64);
        let from = now - limits::REJECT_OLDER_THAN;
        let to = now + limits::REJECT_NEWER_THAN;
        if !(t > from && t < to) {
            return refuse(
                400,
                format!("profile is outside of ingestion window (profile timestamp: {t:?})"),
            );
        }
    }
    Ok(())
}

/// `pkg/validation/validate.go`, `ValidateLabels`, with the default
/// `validation.disable-label-sanitization=true` (names are then checked as UTF-8).
pub fn validate_labels(ls: &mut [(String, String)]) -> Result<(), Refusal> {
    if ls.is_empty() {
        return refuse(400, "at least one label pair is required per profile");
    }
    ls.sort();
    if ls.len() > limits::MAX_LABEL_NAMES_PER_SERIES {
        return refuse(
            400,
            format!(
                "profile series has {} label names; limit {}",
                ls.len(),
                limits::MAX_LABEL_NAMES_PER_SERIES
            ),
        );
    }
    let get = |n: &str| {
        ls.iter()
            .find(|(k, _)| k == n)
            .map_or("", |(_, v)| v.as_str())
    };
    // model.UTF8Validation.IsValidMetricName: not empty (and UTF-8, as every Rust string).
    if get("__name__").is_empty() {
        return refuse(400, "invalid metric name");
    }
    if get("service_name").is_empty() {
        return refuse(400, "service name is not provided");
    }
    let mut last = "";
    for (name, value) in ls.iter() {
        if name.len() > limits::MAX_LABEL_NAME_LENGTH {
            return refuse(400, format!("label name too long: {name}"));
        }
        if value.len() > limits::MAX_LABEL_VALUE_LENGTH {
            return refuse(400, format!("label value too long: {value}"));
        }
        if name.is_empty() {
            return refuse(400, "invalid label name ''");
        }
        if name == last {
            return refuse(400, format!("duplicate label name: {name}"));
        }
        last = name;
    }
    Ok(())
}

/// `POST /ingest` (`pkg/ingester/pyroscope/ingest_handler.go`), for a pprof: the series the
/// server makes of it (`pkg/og/convert/pprof/profile.go`, `ParseToPprof`), checked as
/// [`push`] checks its series.
pub fn ingest(r: &Request, now: SystemTime) -> Result<Vec<SeriesIn>, Refusal> {
    // parseInputMetadataFromRequest: the name is a label set (api/model/labelset).
    let name = r.query("name").unwrap_or_default();
    let (app, tags) = parse_label_set(&name).or_else(|why| refuse(400, why))?;
    for key in ["from", "until"] {
        if let Some(t) = r.query(key) {
            // pkg/og/util/attime: digits only, seconds unless 13, 16 or 19 digits long.
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return refuse(400, format!("{key}={t:?} is not a Unix time"));
            }
            if t.len() == 8 {
                return refuse(
                    400,
                    format!("{key}={t:?} would be read as a date, YYYYMMDD"),
                );
            }
        }
    }
    let spy = r.query("spyName").unwrap_or_else(|| "unknown".into());
    // readInputRawDataFromRequest: the first matching case wins.
    let format = r.query("format").unwrap_or_default();
    let content_type = r.header("content-type").unwrap_or_default().to_owned();
    let pprof_body = match format.as_str() {
        "trie" | "tree" | "lines" | "jfr" | "speedscope" => {
            return refuse(422, format!("format={format}: not a pprof"));
        }
        // The whole body is taken as a pprof, whatever the content type.
        "pprof" => r.body.clone(),
        _ if content_type.contains("multipart/form-data") => {
            let form = multipart_form(&content_type, &r.body).or_else(|why| refuse(422, why))?;
            if form.contains_key("prev_profile") {
                return refuse(422, "unsupported client version (prev_profile)");
            }
            form.get("profile").cloned().unwrap_or_default()
        }
        _ if content_type == "binary/octet-stream+trie"
            || content_type == "binary/octet-stream+tree" =>
        {
            return refuse(422, "not a pprof");
        }
        _ => {
            return refuse(
                422,
                "no format and no multipart form: read as collapsed stacks",
            );
        }
    };
    let sample_type_config = if content_type.contains("multipart/form-data") && format != "pprof" {
        let form = multipart_form(&content_type, &r.body).or_else(|why| refuse(422, why))?;
        match form.get("sample_type_config") {
            Some(json) => Some(
                serde_json::from_slice::<BTreeMap<String, SampleTypeConfig>>(json)
                    .or_else(|e| refuse(422, format!("sample_type_config: {e}")))?,
            ),
            None => None,
        }
    } else {
        None
    };
    if pprof_body.is_empty() {
        return Ok(Vec::new()); // ParseToPprof: an empty profile is skipped, 200
    }
    let mut profile = raw_from_bytes(&pprof_body).map_err(|r| Refusal {
        status: 422,
        reason: r.reason,
    })?;
    // fixTime: a zero or 1970 time becomes `from`.
    if profile.time_nanos < 365 * 86_400 * 1_000_000_000 {
        profile.time_nanos = 0;
    }
    // createLabels
    let mut labels = vec![
        (
            "__name__".to_owned(),
            metric_name(&profile, sample_type_config.as_ref()),
        ),
        ("__delta__".to_owned(), "false".to_owned()),
        ("pyroscope_spy".to_owned(), spy),
    ];
    if !tags.iter().any(|(k, _)| k == "service_name") {
        labels.push(("service_name".to_owned(), app));
    }
    labels.extend(tags.into_iter().filter(|(k, _)| !k.starts_with("__")));
    let mut series = SeriesIn { labels, profile };
    distributor_checks(&mut series, now)?;
    Ok(vec![series])
}

/// `pkg/og/storage/tree/pprof.go`, `SampleTypeConfig` (JSON names).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct SampleTypeConfig {
    /// `units`.
    #[serde(default)]
    pub units: String,
    /// `display-name`.
    #[serde(default, rename = "display-name")]
    pub display_name: String,
    /// `aggregation`.
    #[serde(default)]
    pub aggregation: String,
    /// `cumulative`.
    #[serde(default)]
    pub cumulative: bool,
    /// `sampled`.
    #[serde(default)]
    pub sampled: bool,
}

/// `pkg/og/convert/pprof/profile.go`, `metricName`: the series name `/ingest` derives from the
/// sample types (display names from the request's `sample_type_config`, else the defaults of
/// `pkg/og/storage/tree/pprof.go`).
fn metric_name(p: &Pprof, config: Option<&BTreeMap<String, SampleTypeConfig>>) -> String {
    if p.sample_types.iter().any(|(t, _)| t == "wall") {
        return "wall".into();
    }
    let display = |t: &str| -> String {
        match config {
            Some(c) => c
                .get(t)
                .filter(|c| !c.display_name.is_empty())
                .map_or(t.to_owned(), |c| c.display_name.clone()),
            None => match t {
                "samples" => "cpu".into(),
                "goroutine" => "goroutines".into(),
                "contentions" => "mutex_count".into(),
                "delay" => "mutex_duration".into(),
                _ => t.to_owned(),
            },
        }
    };
    let mut st = String::new();
    for (t, _) in &p.sample_types {
        st = display(t);
        if st.contains("cpu") {
            return "process_cpu".into();
        }
        if st.contains("alloc_") || st.contains("inuse_") || st == "space" || st == "objects" {
            return "memory".into();
        }
        if st.contains("mutex_") {
            return "mutex".into();
        }
        if st.contains("block_") {
            return "block".into();
        }
        if st.contains("goroutines") {
            return "goroutines".into();
        }
    }
    st
}

/// `api/model/labelset/labelset.go`, `Parse`, with `validate.go`: `APP{k=v,...}`.
fn parse_label_set(name: &str) -> Result<(String, Vec<(String, String)>), String> {
    let (app, rest) = name.split_once('{').unwrap_or((name, "}"));
    let app = app.trim();
    if app.is_empty() {
        return Err("service name is required".into());
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    if let Some(c) = app
        .chars()
        .find(|&c| !(allowed(c) || matches!(c, '-' | '/')))
    {
        return Err(format!(
            "invalid service name: {app}: character is not allowed: {c:?}"
        ));
    }
    let body = rest.split('}').next().unwrap_or("");
    let mut tags = Vec::new();
    for pair in body.split(',').filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            continue; // a key without `=` is never stored
        };
        let k = k.trim();
        if k != "__name__" {
            if k.is_empty() {
                return Err("label name is required".into());
            }
            if let Some(c) = k.chars().find(|&c| !allowed(c)) {
                return Err(format!(
                    "invalid label name: {k}: character is not allowed: {c:?}"
                ));
            }
        }
        tags.push((k.to_owned(), v.trim().to_owned()));
    }
    Ok((app.to_owned(), tags))
}

/// Go's `mime/multipart` `ReadForm`, as `loadPprofFromForm` uses it (`pkg/og/util/form`): the
/// boundary from the content type, then the parts by `name`.
fn multipart_form(content_type: &str, body: &[u8]) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let boundary = content_type
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("boundary="))
        .next()
        .ok_or("malformed multipart content type header")?
        .trim_matches('"');
    let delimiter = format!("--{boundary}");
    let text = body;
    let mut parts = BTreeMap::new();
    let mut positions: Vec<usize> = text
        .windows(delimiter.len())
        .enumerate()
        .filter(|(i, w)| *w == delimiter.as_bytes() && (*i == 0 || text[i - 2..*i] == *b"\r\n"))
        .map(|(i, _)| i)
        .collect();
    if positions.first() != Some(&0) {
        return Err("multipart: NextPart: EOF".into());
    }
    let last = *positions.last().unwrap();
    if !text[last + delimiter.len()..].starts_with(b"--") {
        return Err("multipart: no closing delimiter".into());
    }
    positions.dedup();
    for pair in positions.windows(2) {
        let part = &text[pair[0] + delimiter.len()..pair[1]];
        let part = part
            .strip_prefix(b"\r\n")
            .ok_or("multipart: bad delimiter line")?;
        let split = part
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("multipart: part without a header end")?;
        let head = String::from_utf8_lossy(&part[..split]);
        let data = part[split + 4..]
            .strip_suffix(b"\r\n")
            .ok_or("multipart: part not ended by CRLF")?;
        let name = head
            .split("\r\n")
            .find(|l| {
                l.to_ascii_lowercase()
                    .starts_with("content-disposition: form-data")
            })
            .and_then(|l| l.split("name=\"").nth(1))
            .and_then(|n| n.split('"').next())
            .ok_or("multipart: a part without a form-data name")?;
        parts.insert(name.to_owned(), data.to_vec());
    }
    Ok(parts)
}
