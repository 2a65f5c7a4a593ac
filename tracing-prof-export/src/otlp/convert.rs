//! A window's profiles as one `ExportProfilesServiceRequest`, built from opentelemetry-proto's
//! generated types: one OTLP profile per sample type, all sharing the request's dictionary.
//!
//! Each profile is converted from the pprof message the files and Pyroscope get, so the three
//! show the same frames: span frames are frames (`request [span]` under the mapping `[spans]`),
//! code frames sit under the program's mapping (with its GNU build id as the attribute
//! `process.executable.build_id.gnu`). A sample's pprof labels become its attributes
//! (`span_path`, your span fields, `long_poll`...; a number keeps its unit), but for
//! `span_id` and `trace_id`, which become the sample's [`Link`](otlp::Link) to the trace.
//!
//! The rules kept, from the receivers' own code (see the module docs of [`super`]): every
//! table starts with its zero value, every index is in range, every profile has a sample type,
//! a period type and a non-zero period, every sample one value, no string, attribute or sample
//! is sent twice, and a sample's zero values are left out.

use crate::pushed::Pushed;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, any_value};
use opentelemetry_proto::tonic::profiles::v1development as otlp;
use std::collections::HashMap;
use tracing_prof_core::AttributeValue;
use tracing_prof_model::pprof::proto;

/// The attribute of a mapping that names its GNU build id (the semantic conventions'
/// `process.executable.build_id.gnu`; Pyroscope reads it back as the pprof build id, in
/// `pkg/ingester/otlp/convert.go`).
pub(super) const BUILD_ID_ATTRIBUTE: &str = "process.executable.build_id.gnu";

/// A location's identity: its mapping, address and lines (function, line).
type LocationKey = (i32, u64, Vec<(i32, i64)>);

/// The request's shared tables, each entry made once; index 0 of every table is its zero
/// value, as the profiles data model requires.
struct Dictionary {
    out: otlp::ProfilesDictionary,
    strings: HashMap<String, i32>,
    mappings: HashMap<(u64, u64, u64, i32, Option<i32>), i32>,
    functions: HashMap<(i32, i32, i32, i64), i32>,
    locations: HashMap<LocationKey, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    /// By key and string value (both indices of the string table).
    attributes: HashMap<(i32, i32), i32>,
    links: HashMap<(u128, u64), i32>,
}

/// A table's next index (tables hold far fewer than 2^31 entries: a window's profiles are
/// kept within Pyroscope's limits first).
fn next<T>(table: &[T]) -> i32 {
    i32::try_from(table.len()).unwrap_or(i32::MAX)
}

impl Dictionary {
    fn new() -> Self {
        Dictionary {
            out: otlp::ProfilesDictionary {
                mapping_table: vec![otlp::Mapping::default()],
                location_table: vec![otlp::Location::default()],
                function_table: vec![otlp::Function::default()],
                // The zero link with ids of their lengths, as profiles.proto advises for codecs
                // that expect 16 and 8 bytes.
                link_table: vec![otlp::Link {
                    trace_id: vec![0; 16],
                    span_id: vec![0; 8],
                }],
                string_table: vec![String::new()],
                attribute_table: vec![otlp::KeyValueAndUnit::default()],
                stack_table: vec![otlp::Stack::default()],
            },
            strings: HashMap::from([(String::new(), 0)]),
            mappings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            stacks: HashMap::new(),
            attributes: HashMap::new(),
            links: HashMap::new(),
        }
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = next(&self.out.string_table);
        self.out.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    /// The attribute `key` = `value` (a string; no unit).
    fn attribute(&mut self, key: &str, value: &str) -> i32 {
        let key = self.string(key);
        let value_index = self.string(value);
        let table = &mut self.out.attribute_table;
        *self
            .attributes
            .entry((key, value_index))
            .or_insert_with(|| {
                let i = next(table);
                table.push(otlp::KeyValueAndUnit {
                    key_strindex: key,
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(value.to_owned())),
                    }),
                    unit_strindex: 0,
                });
                i
            })
    }

    fn link(&mut self, trace_id: u128, span_id: u64) -> i32 {
        let table = &mut self.out.link_table;
        *self.links.entry((trace_id, span_id)).or_insert_with(|| {
            let i = next(table);
            table.push(otlp::Link {
                trace_id: trace_id.to_be_bytes().to_vec(),
                span_id: span_id.to_be_bytes().to_vec(),
            });
            i
        })
    }
}

/// Adds `p`'s mappings, functions and locations to `d`; returns its location ids as indices of
/// the dictionary's location table.
fn add_tables(d: &mut Dictionary, p: &proto::Profile) -> HashMap<u64, i32> {
    let s = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let mut mappings: HashMap<u64, i32> = HashMap::new();
    for m in &p.mapping {
        let filename = d.string(s(m.filename));
        let build_id = (m.build_id != 0).then(|| d.attribute(BUILD_ID_ATTRIBUTE, s(m.build_id)));
        let key = (
            m.memory_start,
            m.memory_limit,
            m.file_offset,
            filename,
            build_id,
        );
        let table = &mut d.out.mapping_table;
        let index = *d.mappings.entry(key).or_insert_with(|| {
            let i = next(table);
            table.push(otlp::Mapping {
                memory_start: m.memory_start,
                memory_limit: m.memory_limit,
                file_offset: m.file_offset,
                filename_strindex: filename,
                attribute_indices: build_id.into_iter().collect(),
            });
            i
        });
        mappings.insert(m.id, index);
    }
    let mut functions: HashMap<u64, i32> = HashMap::new();
    for f in &p.function {
        let key = (
            d.string(s(f.name)),
            d.string(s(f.system_name)),
            d.string(s(f.filename)),
            f.start_line,
        );
        let table = &mut d.out.function_table;
        let index = *d.functions.entry(key).or_insert_with(|| {
            let i = next(table);
            table.push(otlp::Function {
                name_strindex: key.0,
                system_name_strindex: key.1,
                filename_strindex: key.2,
                start_line: key.3,
            });
            i
        });
        functions.insert(f.id, index);
    }
    let mut locations: HashMap<u64, i32> = HashMap::new();
    for l in &p.location {
        let mapping = mappings.get(&l.mapping_id).copied().unwrap_or(0);
        let lines: Vec<(i32, i64)> = l
            .line
            .iter()
            .map(|line| {
                let function = functions.get(&line.function_id).copied().unwrap_or(0);
                (function, line.line)
            })
            .collect();
        let table = &mut d.out.location_table;
        let index = *d
            .locations
            .entry((mapping, l.address, lines.clone()))
            .or_insert_with(|| {
                let i = next(table);
                table.push(otlp::Location {
                    mapping_index: mapping,
                    address: l.address,
                    lines: lines
                        .iter()
                        .map(|&(function_index, line)| otlp::Line {
                            function_index,
                            line,
                            column: 0,
                        })
                        .collect(),
                    attribute_indices: Vec::new(),
                });
                i
            });
        locations.insert(l.id, index);
    }
    locations
}

/// A sample's stack, attributes and link, as dictionary indices.
struct Where {
    stack: i32,
    attributes: Vec<i32>,
    link: i32,
}

fn sample_where(
    d: &mut Dictionary,
    locations: &HashMap<u64, i32>,
    p: &proto::Profile,
    s: &proto::Sample,
) -> Where {
    let text = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let stack: Vec<i32> = s
        .location_id
        .iter()
        .filter_map(|id| locations.get(id).copied())
        .collect();
    let table = &mut d.out.stack_table;
    let stack = *d.stacks.entry(stack).or_insert_with_key(|stack| {
        let i = next(table);
        table.push(otlp::Stack {
            location_indices: stack.clone(),
        });
        i
    });
    let (mut span_id, mut trace_id) = (None, None);
    let mut attributes = Vec::new();
    for l in &s.label {
        let key = text(l.key);
        match key {
            "span_id" => span_id = u64::from_str_radix(text(l.str), 16).ok(),
            "trace_id" => trace_id = u128::from_str_radix(text(l.str), 16).ok(),
            _ if l.str != 0 => {
                attributes.push(d.attribute(key, text(l.str)));
            }
            // A number (a heap sample's mean size in `bytes`, `long_polls`, `tid`): left
            // out, as Pyroscope's push API leaves it out of series labels; its OTLP
            // ingestion would make every value a series of its own (`convert.go`,
            // `convertSampleAttributesToLabelsBack`, takes integers as label values).
            _ => {}
        }
    }
    let link = match (trace_id, span_id) {
        (Some(t), Some(s)) if s != 0 => d.link(t, s),
        _ => 0,
    };
    Where {
        stack,
        attributes,
        link,
    }
}

/// The OTLP profiles of one pushed profile: one per sample type sent (for sampled CPU, the
/// sample count only: its CPU time is the count times the period), each with the period type
/// named after the series (`cpu`, `memory`, `span_memory`, `spans`) in the pprof period's unit.
/// Every sample has one value; samples with the same stack, attributes and link are one.
fn profiles_of(d: &mut Dictionary, pushed: &Pushed) -> Vec<otlp::Profile> {
    let p = &pushed.message;
    let text = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let locations = add_tables(d, p);
    let wheres: Vec<Where> = p
        .sample
        .iter()
        .map(|s| sample_where(d, &locations, p, s))
        .collect();
    let series = match pushed.name {
        "process_cpu" => "cpu",
        name => name,
    };
    let period_unit = p.period_type.as_ref().map_or("count", |t| text(t.unit));
    let period_type = otlp::ValueType {
        type_strindex: d.string(series),
        unit_strindex: d.string(period_unit),
    };
    let cpu = pushed.name == "process_cpu";
    let sampled_cpu = cpu && pushed.sample_types.iter().any(|t| t.name == "samples");
    let mut out = Vec::new();
    for (index, t) in pushed.sample_types.iter().enumerate() {
        if sampled_cpu && t.name != "samples" {
            continue;
        }
        // CPU time measured by the clock (sampling off) goes as a count of nanoseconds, one
        // nanosecond of CPU a period: Pyroscope stores it as `process_cpu` as it does sampled
        // CPU, and a reader of OTLP reads it as what it is.
        let (ty, unit) = if cpu && !sampled_cpu {
            ("samples", "count")
        } else {
            (t.name.as_str(), t.unit.as_str())
        };
        // Samples that only numeric labels told apart are one here: summed.
        let mut samples: Vec<otlp::Sample> = Vec::new();
        let mut seen: HashMap<(i32, &[i32], i32), usize> = HashMap::new();
        for (s, w) in p.sample.iter().zip(&wheres) {
            let value = s.value.get(index).copied().unwrap_or(0);
            if value == 0 {
                continue;
            }
            match seen.entry((w.stack, &w.attributes, w.link)) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    let v = &mut samples[*e.get()].values[0];
                    *v = v.saturating_add(value);
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(samples.len());
                    samples.push(otlp::Sample {
                        stack_index: w.stack,
                        attribute_indices: w.attributes.clone(),
                        link_index: w.link,
                        values: vec![value],
                        timestamps_unix_nano: Vec::new(),
                    });
                }
            }
        }
        if samples.is_empty() {
            continue;
        }
        out.push(otlp::Profile {
            sample_type: Some(otlp::ValueType {
                type_strindex: d.string(ty),
                unit_strindex: d.string(unit),
            }),
            samples,
            time_unix_nano: u64::try_from(p.time_nanos).unwrap_or(0),
            duration_nano: u64::try_from(p.duration_nanos).unwrap_or(0),
            period_type: Some(period_type),
            period: p.period.max(1),
            ..Default::default()
        });
    }
    out
}

/// The request for `pushed`, sent as `resource` by the `tracing-prof` scope; `None` when no
/// profile has a sample (a receiver should get no empty envelope).
pub(super) fn request(
    pushed: &[Pushed],
    resource: &[(String, AttributeValue)],
) -> Option<ExportProfilesServiceRequest> {
    let mut d = Dictionary::new();
    let profiles: Vec<otlp::Profile> = pushed.iter().flat_map(|p| profiles_of(&mut d, p)).collect();
    if profiles.is_empty() {
        return None;
    }
    let resource = tracing_prof_core::__private::resource_message(resource);
    Some(ExportProfilesServiceRequest {
        resource_profiles: vec![otlp::ResourceProfiles {
            resource: Some(resource),
            scope_profiles: vec![otlp::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "tracing-prof".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(d.out),
    })
}
