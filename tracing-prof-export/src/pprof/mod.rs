//! Encoding a [`Profile`] as pprof `profile.proto`.
//!
//! Span frames: each span callsite is one `Function` named `target::name` with its file and
//! line. Code frames (sampled stacks): one `Function` per function name and file, one
//! `Location` per function and line; inlined functions are frames of their own. Locations have
//! no address and sit under a single mapping that says the profile is already symbolized, so
//! `go tool pprof` never tries to symbolize it again. Stacks are leaf first: code frames, then
//! the span path from its innermost span to its root. Output is deterministic for a given
//! `Profile`: ids are handed out in order of first use, from 1.
//!
//! | kind | samples | sample types | default |
//! |------|---------|--------------|---------|
//! | `spans` | span paths | `spans/count`, `wall`, `wall_busy`, `wall_idle`, `cpu`, `cpu_user`, `cpu_sys` (nanoseconds) | `cpu` |
//! | `heap` | sampled code stacks under span paths (exact span paths when sampling is off) | `alloc_objects/count`, `alloc_space/bytes`, `inuse_objects/count`, `inuse_space/bytes` | `inuse_space` |
//! | `allocs` | as `heap` | as `heap` | `alloc_space` |
//! | `span_memory` | span paths, exact | as `heap` | `inuse_space` |
//! | `lifetimes` | sampled stacks, one sample per lifetime bucket (label `lifetime`); span paths for what outlived its span | `freed_objects/count`, `freed_space/bytes`, `temporary_objects/count`, `temporary_space/bytes`, `outlived_objects/count`, `outlived_space/bytes` | `temporary_space` |
//! | `threads` | one per thread (label `thread`, numeric label `tid`), exact | as `heap` | `inuse_space` |
//!
//! The sampled kinds are Go's heap profile exactly: period type `space/bytes`, period = the
//! sampling rate, values scaled to unbiased estimates, numeric label `bytes` (the mean sampled
//! size).

pub mod proto;

use crate::ProfileKind;
use std::collections::HashMap;
use std::io::Write;
use tracing_prof_core::{
    CodeFrame, Frame, LIFETIME_BUCKET_NAMES, MemoryStats, PathProfile, Profile,
};

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

/// Sample types of [`ProfileKind::Lifetimes`].
pub const LIFETIME_SAMPLE_TYPES: [(&str, &str); 6] = [
    ("freed_objects", "count"),
    ("freed_space", "bytes"),
    ("temporary_objects", "count"),
    ("temporary_space", "bytes"),
    ("outlived_objects", "count"),
    ("outlived_space", "bytes"),
];

impl ProfileKind {
    /// `(type, unit)` of each value in this kind's samples.
    pub fn sample_types(self) -> &'static [(&'static str, &'static str)] {
        match self {
            ProfileKind::Spans => &SPAN_SAMPLE_TYPES,
            ProfileKind::Heap
            | ProfileKind::Allocs
            | ProfileKind::SpanMemory
            | ProfileKind::Threads => &MEMORY_SAMPLE_TYPES,
            ProfileKind::Lifetimes => &LIFETIME_SAMPLE_TYPES,
        }
    }

    /// The sample type `go tool pprof` shows when none is chosen.
    pub fn default_sample_type(self) -> &'static str {
        match self {
            ProfileKind::Spans => "cpu",
            ProfileKind::Heap | ProfileKind::SpanMemory | ProfileKind::Threads => "inuse_space",
            ProfileKind::Allocs => "alloc_space",
            ProfileKind::Lifetimes => "temporary_space",
        }
    }

    /// Whether this kind shows sampled code stacks for `profile` (else exact span paths).
    pub fn is_sampled(self, profile: &Profile) -> bool {
        match self {
            ProfileKind::Heap | ProfileKind::Allocs => profile.sample_rate > 0,
            ProfileKind::Lifetimes => true,
            _ => false,
        }
    }

    /// The values of one span path, one per sample type, in [`ProfileKind::sample_types`]
    /// order (the memory kinds show the exact counters).
    pub fn values(self, p: &PathProfile) -> Vec<i64> {
        let t = &p.time;
        match self {
            ProfileKind::Spans => [
                t.spans,
                t.wall_ns,
                t.busy_ns,
                t.idle_ns,
                t.cpu_ns,
                t.cpu_user_ns,
                t.cpu_sys_ns,
            ]
            .map(int)
            .to_vec(),
            ProfileKind::Lifetimes => vec![0, 0, 0, 0, int(p.outlived.0), int(p.outlived.1)],
            _ => memory_values(&p.memory),
        }
    }
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn memory_values(m: &MemoryStats) -> Vec<i64> {
    [
        m.alloc_objects,
        m.alloc_bytes,
        m.inuse_objects,
        m.inuse_bytes,
    ]
    .map(int)
    .to_vec()
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

/// Functions and locations, each made once.
#[derive(Default)]
struct Locations {
    functions: HashMap<(String, Option<String>), u64>,
    locations: HashMap<(u64, i64), u64>,
}

impl Locations {
    fn get(
        &mut self,
        out: &mut proto::Profile,
        strings: &mut StringTable,
        name: &str,
        file: Option<&str>,
        line: Option<u32>,
    ) -> u64 {
        let next_fn = out.function.len() as u64 + 1;
        let function_id = *self
            .functions
            .entry((name.to_owned(), file.map(str::to_owned)))
            .or_insert_with(|| {
                let name = strings.get(name);
                out.function.push(proto::Function {
                    id: next_fn,
                    name,
                    system_name: name,
                    filename: file.map_or(0, |f| strings.get(f)),
                    start_line: 0,
                });
                next_fn
            });
        let line = line.map_or(0, i64::from);
        let next_loc = out.location.len() as u64 + 1;
        *self
            .locations
            .entry((function_id, line))
            .or_insert_with(|| {
                out.location.push(proto::Location {
                    id: next_loc,
                    mapping_id: 1,
                    line: vec![proto::Line { function_id, line }],
                    ..Default::default()
                });
                next_loc
            })
    }

    fn span(&mut self, out: &mut proto::Profile, s: &mut StringTable, f: &Frame) -> u64 {
        self.get(out, s, &f.qualified_name(), f.file, f.line)
    }

    fn code(&mut self, out: &mut proto::Profile, s: &mut StringTable, f: &CodeFrame) -> u64 {
        self.get(out, s, &f.function, f.file.as_deref(), f.line)
    }

    /// Leaf first: `code` (root first) reversed, then `frames` (root first) reversed.
    fn stack(
        &mut self,
        out: &mut proto::Profile,
        s: &mut StringTable,
        frames: &[Frame],
        code: &[CodeFrame],
    ) -> Vec<u64> {
        let mut ids: Vec<u64> = code.iter().rev().map(|f| self.code(out, s, f)).collect();
        ids.extend(frames.iter().rev().map(|f| self.span(out, s, f)));
        ids
    }
}

fn str_label(s: &mut StringTable, key: &str, value: &str) -> proto::Label {
    proto::Label {
        key: s.get(key),
        str: s.get(value),
        ..Default::default()
    }
}

fn num_label(s: &mut StringTable, key: &str, num: u64, unit: &str) -> proto::Label {
    proto::Label {
        key: s.get(key),
        num: int(num),
        num_unit: if unit.is_empty() { 0 } else { s.get(unit) },
        ..Default::default()
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
    let sampled = kind.is_sampled(profile);
    out.period_type = Some(match kind {
        ProfileKind::Spans => value_type(&mut strings, ("spans", "count")),
        _ => value_type(&mut strings, ("space", "bytes")),
    });
    out.period = if sampled {
        int(profile.sample_rate.max(1))
    } else {
        1
    };
    out.mapping = vec![proto::Mapping {
        id: 1,
        has_functions: true,
        has_filenames: true,
        has_line_numbers: true,
        has_inline_frames: true,
        ..Default::default()
    }];
    let mut locations = Locations::default();
    match kind {
        ProfileKind::Threads => thread_samples(profile, &mut out, &mut strings, &mut locations),
        ProfileKind::Lifetimes => lifetime_samples(profile, &mut out, &mut strings, &mut locations),
        _ if sampled => stack_samples(profile, &mut out, &mut strings, &mut locations),
        _ => path_samples(profile, kind, &mut out, &mut strings, &mut locations),
    }
    comments(profile, kind, &mut out, &mut strings);
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

fn leak_labels(s: &mut StringTable, suspected: bool) -> Vec<proto::Label> {
    if suspected {
        vec![str_label(s, "leak", "suspected")]
    } else {
        Vec::new()
    }
}

/// One sample per span path, exact counters.
fn path_samples(
    profile: &Profile,
    kind: ProfileKind,
    out: &mut proto::Profile,
    strings: &mut StringTable,
    locations: &mut Locations,
) {
    for path in &profile.paths {
        let value = kind.values(path);
        if value.iter().all(|&v| v == 0) {
            continue;
        }
        let location_id = locations.stack(out, strings, &path.frames, &[]);
        let label = leak_labels(strings, profile.is_suspected_leak(path));
        out.sample.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }
}

/// Go's heap profile: one sample per sampled code stack under its span path.
fn stack_samples(
    profile: &Profile,
    out: &mut proto::Profile,
    strings: &mut StringTable,
    locations: &mut Locations,
) {
    for stack in &profile.stacks {
        let value = memory_values(&stack.memory);
        if value.iter().all(|&v| v == 0) {
            continue;
        }
        let location_id = locations.stack(out, strings, &stack.frames, &stack.code);
        let suspected = profile.is_suspected_stack_leak(stack)
            || profile.is_suspected_path(stack.kind, &stack.frames);
        let mut label = vec![num_label(strings, "bytes", stack.mean_size(), "bytes")];
        label.extend(leak_labels(strings, suspected));
        out.sample.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }
}

/// Frees of sampled allocations per stack and lifetime bucket; temporaries in a sample of
/// their own per stack (label `lifetime=temporary`), so that each sample type sums right; and
/// per span path what outlived its span (label `lifetime=outlived span`).
fn lifetime_samples(
    profile: &Profile,
    out: &mut proto::Profile,
    strings: &mut StringTable,
    locations: &mut Locations,
) {
    for stack in &profile.stacks {
        let l = &stack.lifetimes;
        if l.freed() == 0 {
            continue;
        }
        let location_id = locations.stack(out, strings, &stack.frames, &stack.code);
        for (k, name) in LIFETIME_BUCKET_NAMES.iter().enumerate() {
            if l.freed_objects[k] == 0 && l.freed_bytes[k] == 0 {
                continue;
            }
            out.sample.push(proto::Sample {
                location_id: location_id.clone(),
                value: vec![int(l.freed_objects[k]), int(l.freed_bytes[k]), 0, 0, 0, 0],
                label: vec![str_label(strings, "lifetime", name)],
            });
        }
        if l.temporary_objects > 0 {
            out.sample.push(proto::Sample {
                location_id,
                value: vec![0, 0, int(l.temporary_objects), int(l.temporary_bytes), 0, 0],
                label: vec![str_label(strings, "lifetime", "temporary")],
            });
        }
    }
    // What outlived the span that allocated it, per span path.
    for path in profile.paths.iter().filter(|p| p.outlived.0 > 0) {
        let location_id = locations.stack(out, strings, &path.frames, &[]);
        out.sample.push(proto::Sample {
            location_id,
            value: ProfileKind::Lifetimes.values(path),
            label: vec![str_label(strings, "lifetime", "outlived span")],
        });
    }
}

/// One sample per thread, its name as the only frame.
fn thread_samples(
    profile: &Profile,
    out: &mut proto::Profile,
    strings: &mut StringTable,
    locations: &mut Locations,
) {
    for t in &profile.threads {
        let value = memory_values(&t.memory);
        if value.iter().all(|&v| v == 0) {
            continue;
        }
        // The table index keeps threads of one name (a pool's workers) apart.
        let function = format!("thread {} [{}]", t.name, t.index);
        let location_id = vec![locations.get(out, strings, &function, None, None)];
        let label = vec![
            str_label(strings, "thread", &t.name),
            num_label(strings, "tid", t.tid, ""),
        ];
        out.sample.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }
}

fn comments(
    profile: &Profile,
    kind: ProfileKind,
    out: &mut proto::Profile,
    strings: &mut StringTable,
) {
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
    if kind.is_sampled(profile)
        && let Some(full) = profile.stacks.iter().find(|s| {
            s.code
                .first()
                .is_some_and(|f| &*f.function == tracing_prof_core::TABLE_FULL_FRAME)
        })
    {
        let note = format!(
            "tracing-prof: {} samples found the stack table full and are counted under {}",
            full.samples,
            tracing_prof_core::TABLE_FULL_FRAME
        );
        out.comment.push(strings.get(&note));
    }
    if kind.is_sampled(profile) {
        let note = format!(
            "tracing-prof: sampled: a sample point every {} bytes allocated on average; values are unbiased estimates (each sample stands for the points it covered)",
            profile.sample_rate
        );
        out.comment.push(strings.get(&note));
    }
    if kind == ProfileKind::Lifetimes {
        let note = format!(
            "tracing-prof: temporary = freed within {:?} of allocation",
            profile.temporary_threshold
        );
        out.comment.push(strings.get(&note));
    }
}

/// The function name of each location of `p`, by location id (`?` for a location without
/// lines), for readers of our own messages: text tables and folded stacks.
pub(crate) fn location_names(p: &proto::Profile) -> HashMap<u64, &str> {
    let string = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let function: HashMap<u64, &str> = p.function.iter().map(|f| (f.id, string(f.name))).collect();
    p.location
        .iter()
        .map(|l| {
            let name = l
                .line
                .first()
                .and_then(|line| function.get(&line.function_id))
                .copied()
                .unwrap_or("?");
            (l.id, name)
        })
        .collect()
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
            outlived: (0, 0),
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
                    outlived: (0, 0),
                },
            ],
            overflowed_spans: 0,
            sample_rate: 0,
            temporary_threshold: Duration::from_millis(1),
            stacks: Vec::new(),
            threads: Vec::new(),
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
