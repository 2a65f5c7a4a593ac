//! Encoding a [`Profile`] as pprof `profile.proto`.
//!
//! Each span path becomes one sample whose locations are the path's frames, leaf first. Each span
//! callsite is one `Function` named `target::name` with its file and line, and one `Location`
//! with no address under a single mapping that says the profile is already symbolized, so
//! `go tool pprof` never tries to symbolize it again. Output is deterministic for a given
//! `Profile`: ids are handed out in path order, from 1.

pub mod proto;

use crate::ProfileKind;
use std::collections::HashMap;
use std::io::Write;
use tracing_prof_core::{Frame, PathProfile, Profile};

/// An encoding failure (in practice only gzip over a `Vec` can fail, and it does not).
#[derive(Debug, thiserror::Error)]
#[error("cannot encode the {kind} profile: {source}")]
pub struct EncodeError {
    kind: &'static str,
    #[source]
    source: std::io::Error,
}

/// Sample types of [`ProfileKind::Spans`], in order: `(type, unit)`.
pub const SPAN_SAMPLE_TYPES: [(&str, &str); 7] = [
    ("spans", "count"),
    ("wall", "nanoseconds"),
    ("wall_busy", "nanoseconds"),
    ("wall_idle", "nanoseconds"),
    ("cpu", "nanoseconds"),
    ("cpu_user", "nanoseconds"),
    ("cpu_sys", "nanoseconds"),
];

/// Sample types of the memory kinds, in Go's order and with Go's names.
pub const MEMORY_SAMPLE_TYPES: [(&str, &str); 4] = [
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
];

impl ProfileKind {
    /// `(type, unit)` of each value in this kind's samples.
    pub fn sample_types(self) -> &'static [(&'static str, &'static str)] {
        match self {
            ProfileKind::Spans => &SPAN_SAMPLE_TYPES,
            ProfileKind::Heap | ProfileKind::Allocs => &MEMORY_SAMPLE_TYPES,
        }
    }

    /// The sample type `go tool pprof` shows when none is chosen.
    pub fn default_sample_type(self) -> &'static str {
        match self {
            ProfileKind::Spans => "cpu",
            ProfileKind::Heap => "inuse_space",
            ProfileKind::Allocs => "alloc_space",
        }
    }

    /// The values of one path, one per sample type, in [`ProfileKind::sample_types`] order.
    pub fn values(self, p: &PathProfile) -> Vec<i64> {
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let (t, m) = (&p.time, &p.memory);
        match self {
            ProfileKind::Spans => vec![
                i(t.spans),
                i(t.wall_ns),
                i(t.busy_ns),
                i(t.idle_ns),
                i(t.cpu_ns),
                i(t.cpu_user_ns),
                i(t.cpu_sys_ns),
            ],
            ProfileKind::Heap | ProfileKind::Allocs => vec![
                i(m.alloc_objects),
                i(m.alloc_bytes),
                i(m.inuse_objects),
                i(m.inuse_bytes),
            ],
        }
    }
}

/// Strings interned into `string_table`, whose slot 0 is always `""`.
#[derive(Debug)]
struct StringTable {
    strings: Vec<String>,
    index: HashMap<String, i64>,
}

impl StringTable {
    fn new() -> Self {
        StringTable {
            strings: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// Builds the pprof message of `kind` for `profile` (not yet serialized).
pub fn to_proto(profile: &Profile, kind: ProfileKind) -> proto::Profile {
    let mut strings = StringTable::new();
    let mut out = proto::Profile::default();
    let value_type = |s: &mut StringTable, (t, u): (&str, &str)| proto::ValueType {
        r#type: s.get(t),
        unit: s.get(u),
    };
    out.sample_type = kind
        .sample_types()
        .iter()
        .map(|&vt| value_type(&mut strings, vt))
        .collect();
    out.default_sample_type = strings.get(kind.default_sample_type());
    out.period_type = Some(match kind {
        ProfileKind::Spans => value_type(&mut strings, ("spans", "count")),
        ProfileKind::Heap | ProfileKind::Allocs => value_type(&mut strings, ("space", "bytes")),
    });
    out.period = 1;
    out.mapping = vec![proto::Mapping {
        id: 1,
        has_functions: true,
        has_filenames: true,
        has_line_numbers: true,
        ..Default::default()
    }];
    let mut function_ids: HashMap<&Frame, u64> = HashMap::new();
    for path in &profile.paths {
        let values = kind.values(path);
        if values.iter().all(|&v| v == 0) {
            continue;
        }
        let mut location_id = Vec::with_capacity(path.frames.len());
        for frame in path.frames.iter().rev() {
            let next = function_ids.len() as u64 + 1;
            let id = *function_ids.entry(frame).or_insert_with(|| {
                let name = strings.get(&frame.qualified_name());
                out.function.push(proto::Function {
                    id: next,
                    name,
                    system_name: name,
                    filename: frame.file.map_or(0, |f| strings.get(f)),
                    start_line: frame.line.map_or(0, i64::from),
                });
                out.location.push(proto::Location {
                    id: next,
                    mapping_id: 1,
                    line: vec![proto::Line {
                        function_id: next,
                        line: frame.line.map_or(0, i64::from),
                    }],
                    ..Default::default()
                });
                next
            });
            location_id.push(id);
        }
        let label = if profile.is_suspected_leak(path) {
            vec![proto::Label {
                key: strings.get("leak"),
                str: strings.get("suspected"),
                ..Default::default()
            }]
        } else {
            Vec::new()
        };
        out.sample.push(proto::Sample {
            location_id,
            value: values,
            label,
        });
    }
    for leak in &profile.suspected_leaks {
        let note = format!(
            "tracing-prof: suspected leak: {}: in-use grew in each of the last {} captures, by {} bytes, to {} bytes",
            leak.path, leak.snapshots, leak.growth_bytes, leak.inuse_bytes
        );
        out.comment.push(strings.get(&note));
    }
    if profile.window {
        let note = format!(
            "tracing-prof: window of {:.3} s: counters grew by these values in it; in-use is as of its end",
            profile.duration.as_secs_f64()
        );
        out.comment.push(strings.get(&note));
    }
    if profile.overflowed_spans > 0 {
        let note = format!(
            "tracing-prof: {} spans were counted under (other span paths): raise the span path cap",
            profile.overflowed_spans
        );
        out.comment.push(strings.get(&note));
    }
    // time_nanos is the start of the period the counters cover, as Go's profiles have it.
    let nanos = |d: std::time::Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    let start = profile
        .time
        .checked_sub(profile.duration)
        .unwrap_or(profile.time);
    out.time_nanos = start
        .duration_since(std::time::UNIX_EPOCH)
        .map(nanos)
        .unwrap_or_default();
    out.duration_nanos = nanos(profile.duration);
    out.string_table = strings.strings;
    out
}

/// Serializes the pprof message of `kind` for `profile`, gzip-compressed as `go tool pprof`
/// and every pprof consumer expect on disk and over HTTP.
pub fn encode(profile: &Profile, kind: ProfileKind) -> Result<Vec<u8>, EncodeError> {
    let bytes = prost::Message::encode_to_vec(&to_proto(profile, kind));
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 2 + 64),
        flate2::Compression::default(),
    );
    gz.write_all(&bytes)
        .and_then(|()| gz.finish())
        .map_err(|source| EncodeError {
            kind: kind.name(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use std::time::{Duration, UNIX_EPOCH};
    use tracing_prof_core::{MemoryStats, PathKind, TimeStats};

    fn frame(name: &'static str, line: u32) -> Frame {
        Frame {
            target: "app",
            name,
            file: Some("src/main.rs"),
            line: Some(line),
        }
    }

    fn sample_profile() -> Profile {
        let mut time = TimeStats::default();
        time.spans = 2;
        time.busy_ns = 500;
        let mut memory = MemoryStats::default();
        memory.alloc_bytes = 4096;
        memory.inuse_bytes = 1024;
        memory.alloc_objects = 4;
        memory.inuse_objects = 1;
        let path = |frames: Vec<Frame>| PathProfile {
            kind: PathKind::Span,
            frames,
            time,
            memory,
        };
        Profile {
            time: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            duration: Duration::from_secs(10),
            window: false,
            suspected_leaks: Vec::new(),
            paths: vec![
                path(vec![frame("request", 10)]),
                path(vec![frame("request", 10), frame("query", 20)]),
                PathProfile {
                    kind: PathKind::NoSpan,
                    frames: vec![Frame::synthetic("(no span)")],
                    time: TimeStats::default(),
                    memory,
                },
            ],
            overflowed_spans: 0,
        }
    }

    #[test]
    fn output_is_deterministic() {
        let p = sample_profile();
        for kind in [ProfileKind::Spans, ProfileKind::Heap, ProfileKind::Allocs] {
            assert_eq!(encode(&p, kind).unwrap(), encode(&p, kind).unwrap());
        }
    }

    #[test]
    fn structure_is_what_pprof_requires() {
        let gz = encode(&sample_profile(), ProfileKind::Heap).unwrap();
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut bytes).unwrap();
        let p = proto::Profile::decode(&bytes[..]).unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(s(0), "");
        let types: Vec<_> = p
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(types, MEMORY_SAMPLE_TYPES);
        assert_eq!(s(p.default_sample_type), "inuse_space");
        assert_eq!(
            p.period_type.map(|t| (s(t.r#type), s(t.unit))),
            Some(("space", "bytes"))
        );
        assert!(p.mapping[0].has_functions && p.mapping[0].id == 1);
        // Ids from 1, each callsite once; stacks leaf first.
        let ids: Vec<u64> = p.function.iter().map(|f| f.id).collect();
        assert_eq!(ids, [1, 2, 3]);
        assert_eq!(s(p.function[0].name), "app::request");
        assert_eq!(p.sample[1].location_id, [2, 1]);
        assert!(p.sample.iter().all(|x| x.value.len() == 4));
        assert_eq!(
            (p.time_nanos, p.duration_nanos),
            (1_699_999_990_000_000_000, 10_000_000_000)
        );
        // The spans profile leaves out the path with no time.
        let spans = to_proto(&sample_profile(), ProfileKind::Spans);
        assert_eq!(spans.sample.len(), 2);
    }
}
