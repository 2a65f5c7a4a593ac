//! What a real Pyroscope server keeps and shows of the series it accepted (see `rules.rs` for
//! what it accepts), written from its source at [`COMMIT`](super::rules::COMMIT): the 1.x
//! ingester's stored profiles and delta logic, the UI's profile types and units, and span
//! profiles. Each item names the file it comes from.

use super::rules::{Pprof, SeriesIn};
use std::collections::{BTreeMap, HashMap};

/// One stored profile of one series (one sample type), as the ingester keeps it.
#[derive(Debug, Clone)]
pub struct Stored {
    /// `name:type:unit:period_type:period_unit` (`pkg/phlaredb/labels/labels.go`,
    /// `CreateProfileLabels`).
    pub profile_type: String,
    /// The series labels, `__delta__` removed.
    pub labels: Vec<(String, String)>,
    /// The profile's `time_nanos`.
    pub time_nanos: i64,
    /// Values per stack (function names, leaf first), after delta computation.
    pub values: BTreeMap<Vec<String>, i64>,
}

impl Stored {
    /// Every stack's value, summed.
    pub fn total(&self) -> i64 {
        self.values.values().sum()
    }
    /// The value of label `name` (empty if it has none).
    pub fn label(&self, name: &str) -> &str {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v)
    }
}

/// Pyroscope 1.x's ingester (`pkg/phlaredb/head.go`, `Ingest`; `pkg/phlaredb/delta.go`): one
/// stored profile per sample type; `memory` `alloc_objects`/`alloc_space` become deltas against
/// the highest value seen per stack unless the series says `__delta__="false"`. The first
/// profile of such a series stores nothing, and a value lower than before (a "reset") drops the
/// profile.
#[derive(Debug, Default)]
pub struct Ingester1x {
    highest: HashMap<String, BTreeMap<Vec<String>, i64>>,
    /// What it stored, in order.
    pub stored: Vec<Stored>,
}

impl Ingester1x {
    /// Stores `s` as the ingester would.
    pub fn ingest(&mut self, s: &SeriesIn) {
        let delta = s
            .labels
            .iter()
            .find(|(k, _)| k == "__delta__")
            .is_none_or(|(_, v)| v != "false");
        let labels: Vec<(String, String)> = s
            .labels
            .iter()
            .filter(|(k, _)| k != "__delta__")
            .cloned()
            .collect();
        let name = labels
            .iter()
            .find(|(k, _)| k == "__name__")
            .map_or("", |(_, v)| v.as_str())
            .to_owned();
        let (period_type, period_unit) = s.profile.period_type.clone().unwrap_or_default();
        for (i, (ty, unit)) in s.profile.sample_types.iter().enumerate() {
            let profile_type = format!("{name}:{ty}:{unit}:{period_type}:{period_unit}");
            let mut values: BTreeMap<Vec<String>, i64> = BTreeMap::new();
            for (stack, v) in &s.profile.samples {
                *values.entry(stack.clone()).or_default() += v[i];
            }
            values.retain(|_, v| *v != 0);
            if delta && name == "memory" && (ty == "alloc_objects" || ty == "alloc_space") {
                let key = format!("{labels:?}{profile_type}");
                match self.highest.get_mut(&key) {
                    None => {
                        self.highest.insert(key, values.clone());
                        values.clear();
                    }
                    Some(highest) => {
                        let mut reset = false;
                        for (stack, v) in values.iter_mut() {
                            match highest.get(stack).copied() {
                                Some(h) if h <= *v => {
                                    highest.insert(stack.clone(), *v);
                                    *v -= h;
                                }
                                Some(_) => reset = true,
                                None => {
                                    highest.insert(stack.clone(), *v);
                                }
                            }
                        }
                        if reset {
                            *highest = values.clone();
                            values.clear();
                        }
                    }
                }
            }
            self.stored.push(Stored {
                profile_type,
                labels: labels.clone(),
                time_nanos: s.profile.time_nanos,
                values,
            });
        }
    }

    /// The sum of every stored profile of `profile_type`.
    pub fn total(&self, profile_type: &str) -> i64 {
        self.stored
            .iter()
            .filter(|s| s.profile_type == profile_type)
            .map(Stored::total)
            .sum()
    }
}

/// The profile types of Pyroscope's UI registry (`ui/src/api/profileTypes.json`) with the unit
/// it shows them in.
pub const UI_REGISTRY: [(&str, &str); 29] = [
    ("block:contentions:count:contentions:count", "short"),
    ("block:delay:nanoseconds:contentions:count", "ns"),
    ("goroutine:goroutine:count:goroutine:count", "short"),
    ("goroutines:goroutine:count:goroutine:count", "short"),
    ("memory:alloc_in_new_tlab_bytes:bytes::", "bytes"),
    ("memory:alloc_in_new_tlab_objects:count::", "short"),
    ("memory:alloc_objects:count:space:bytes", "short"),
    ("memory:alloc_space:bytes:space:bytes", "bytes"),
    ("memory:inuse_objects:count:space:bytes", "short"),
    ("memory:inuse_space:bytes:space:bytes", "bytes"),
    ("mutex:contentions:count:contentions:count", "short"),
    ("mutex:delay:nanoseconds:contentions:count", "ns"),
    ("process_cpu:alloc_samples:count:cpu:nanoseconds", "short"),
    ("process_cpu:alloc_size:bytes:cpu:nanoseconds", "bytes"),
    ("process_cpu:cpu:nanoseconds:cpu:nanoseconds", "ns"),
    ("process_cpu:exception:count:cpu:nanoseconds", "short"),
    ("process_cpu:lock_count:count:cpu:nanoseconds", "short"),
    ("process_cpu:lock_time:nanoseconds:cpu:nanoseconds", "ns"),
    ("process_cpu:samples:count::milliseconds", "short"),
    ("process_cpu:samples:count:cpu:nanoseconds", "short"),
    ("process_cpu:cpu_samples:count:cpu:nanoseconds", "short"),
    ("alloc:alloc_samples:count:cpu:nanoseconds", "short"),
    ("alloc:alloc_size:bytes:cpu:nanoseconds", "bytes"),
    ("exception:exception:count:cpu:nanoseconds", "short"),
    ("heap:inuse_objects:count:cpu:nanoseconds", "short"),
    ("heap:inuse_space:bytes:cpu:nanoseconds", "bytes"),
    ("lock:lock_count:count:cpu:nanoseconds", "short"),
    ("lock:lock_time:nanoseconds:cpu:nanoseconds", "ns"),
    (
        "thread_lifetime:thread_lifetime_timeline:nanoseconds:cpu:nanoseconds",
        "ns",
    ),
];

/// The unit the UI formats a profile type's values in: `ui/src/api/client.ts`
/// (`profileTypeUnit`: the registry's, else the third part of the ID) then
/// `ui/src/components/FlameGraph.tsx` (`toGrafanaUnit`: `ns`, `bytes`, else `short`).
pub fn ui_unit(profile_type: &str) -> &'static str {
    let unit = UI_REGISTRY
        .iter()
        .find(|(id, _)| *id == profile_type)
        .map(|(_, unit)| *unit)
        .unwrap_or_else(|| {
            let parts: Vec<&str> = profile_type.split(':').collect();
            if parts.len() == 5 {
                match parts[2] {
                    "ns" => "ns",
                    "bytes" => "bytes",
                    _ => "short",
                }
            } else {
                "short"
            }
        });
    match unit {
        "ns" => "ns",
        "bytes" => "bytes",
        _ => "short",
    }
}

/// The UI unit a pprof sample unit must be shown in to be read right.
pub fn ui_unit_for(sample_unit: &str) -> &'static str {
    match sample_unit {
        "nanoseconds" => "ns",
        "bytes" => "bytes",
        _ => "short",
    }
}

/// A span profile as Pyroscope stores it: the samples of one span, kept apart from the
/// series' aggregates and found by the span's id (Grafana's "profiles for this span").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpanProfile {
    /// The trace id the samples named: 32 hex digits, or all zeroes when absent or invalid.
    pub trace_id: [u8; 16],
    /// Values per sample type, summed over the span's samples.
    pub values: BTreeMap<String, i64>,
}

/// The span profiles in one profile, by span id as Pyroscope decodes it, and which sample
/// labels are series labels.
///
/// - `pkg/model/pprofsplit/pprof_split.go`, `VisitSampleSeries`: a `profile_id` label is
///   renamed `span_id`; samples are grouped by their labels *without* `trace_id` and
///   `span_id`, which never become series labels; and (`sampleKeyFromSample`) samples of one
///   stack with different span or trace ids are not merged.
/// - `pkg/pprof/pprof.go`, `ProfileSpans`/`decodeSpanID`: a sample's span id is its `span_id`
///   label if that is exactly 16 hex digits (decoded, then read as a little-endian `uint64`),
///   else 0: no span. `ProfileTraceIDs`/`traceIDFromLabels`: exactly 32 hex digits, else zero.
/// - `pkg/phlaredb/symdb/dedup_slice.go`, `WriteProfileSymbols`: each sample is stored with
///   those two ids; label strings are then zeroed (`ZeroLabelStrings`).
pub fn span_profiles(p: &Pprof) -> BTreeMap<u64, SpanProfile> {
    let mut out: BTreeMap<u64, SpanProfile> = BTreeMap::new();
    for ((_, values), labels) in p.samples.iter().zip(&p.sample_labels) {
        let get = |name: &str| {
            labels
                .iter()
                .find(|(k, _)| k == name || (name == "span_id" && k == "profile_id"))
                .map(|(_, v)| v.as_str())
        };
        let span = get("span_id")
            .filter(|s| s.len() == 16)
            .and_then(hex_bytes::<8>)
            .map_or(0, u64::from_le_bytes);
        if span == 0 {
            continue;
        }
        let trace = get("trace_id")
            .filter(|s| s.len() == 32)
            .and_then(hex_bytes::<16>)
            .unwrap_or_default();
        let entry = out.entry(span).or_default();
        entry.trace_id = trace;
        for ((ty, _), v) in p.sample_types.iter().zip(values) {
            *entry.values.entry(ty.clone()).or_default() += v;
        }
    }
    out
}

/// The series labels a sample adds (`pprof_split.go`, `addSampleLabelsToLabelsBuilder`, with
/// `trace_id` and `span_id` left out by `GroupSamplesWithoutLabels`).
pub fn series_labels_of(sample_labels: &[(String, String)]) -> Vec<(String, String)> {
    sample_labels
        .iter()
        .filter(|(k, _)| k != "span_id" && k != "trace_id" && k != "profile_id")
        .cloned()
        .collect()
}

/// Go's `hex.Decode` into `N` bytes: `None` on a character that is not a hex digit.
fn hex_bytes<const N: usize>(s: &str) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    let digits = s.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    for (o, pair) in out.iter_mut().zip(digits.chunks(2)) {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        *o = (hi * 16 + lo) as u8;
    }
    Some(out)
}
