//! pprof `profile.proto` both ways: [`Profile::encode`] and [`Profile::decode`].
//!
//! Encoding: code frames sit under mapping 1, which names the program (`File:` and `Build ID:`
//! in `go tool pprof`) and says the profile is already symbolized, so pprof never tries to
//! symbolize it again. Span frames sit under a mapping named `[spans]` and carry the
//! [`SPAN_MARK`] after their name (`app::render [span]`), so a span and a
//! function of the same name stay apart in `-top` while `-focus=render` still finds both;
//! thread frames sit under `[threads]`. One `Function` per name and file, one `Location` per
//! function, line and address; ids are handed out in order of first use, from 1, so output is
//! deterministic. Stacks are stored leaf first, as pprof requires.
//!
//! Decoding takes gzip'd or raw bytes of any valid pprof file (ours, Go's, pprof-rs's) and
//! checks everything `go tool pprof` checks: string 0 is empty, there are sample types, every
//! sample has one value per sample type, ids are non-zero, unique and resolve, string indices
//! are in range. Input is bounded: at most [`MAX_DECODED_BYTES`] once decompressed (a gzip
//! bomb stops there) and [`MAX_DECODED_FRAMES`] frames in all samples together. Nothing panics on bad
//! input: every problem is a [`DecodeError`].

pub mod proto;
mod stream;

pub(crate) use stream::Encoder;

use crate::build::LabelRef;
use crate::profile::{Frame, FrameKind, Label, LabelValue, Profile, SPAN_MARK, Sample, SampleType};
use crate::snapshot::Binary;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// The largest profile [`Profile::decode`] accepts once decompressed: 256 MiB.
pub const MAX_DECODED_BYTES: u64 = 256 << 20;
/// The most frames [`Profile::decode`] builds over all samples together: 4 million.
pub const MAX_DECODED_FRAMES: usize = 4 << 20;

/// Mapping filename of span frames.
const SPANS_MAPPING: &str = "[spans]";
/// Mapping filename of thread frames.
const THREADS_MAPPING: &str = "[threads]";

/// Why bytes could not be read as a pprof profile.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Empty input.
    #[error("the input is empty, not a pprof profile")]
    Empty,
    /// The gzip stream is broken or truncated.
    #[error("the gzip data is corrupt or truncated: {0}")]
    Gzip(#[source] std::io::Error),
    /// Larger than [`MAX_DECODED_BYTES`] once decompressed.
    #[error("the profile is larger than {} MiB once decompressed (a gzip bomb, or not a profile)", MAX_DECODED_BYTES >> 20)]
    TooLarge,
    /// The protobuf message does not parse.
    #[error("not a pprof profile: {0}")]
    Protobuf(#[from] prost::DecodeError),
    /// The message parses but breaks a rule of `profile.proto`.
    #[error("invalid pprof profile: {0}")]
    Invalid(String),
}

fn invalid(msg: impl Into<String>) -> DecodeError {
    DecodeError::Invalid(msg.into())
}

/// The encoder's lookup tables: foldhash, not SipHash (every frame of every sample is looked
/// up; SipHash over names and files was a measurable part of the profiler's own thread). Only
/// looked up, never iterated: the output's order is the order things were first met.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Strings interned into `string_table`, whose slot 0 is always `""`. Each is stored once: the
/// index finds a string's slot by hashing the string in it.
struct StringTable {
    strings: Vec<String>,
    index: hashbrown::HashTable<usize>,
    hasher: foldhash::fast::RandomState,
}

impl StringTable {
    fn new() -> Self {
        let mut t = StringTable {
            strings: Vec::new(),
            index: hashbrown::HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
        };
        t.get("");
        t
    }

    fn get(&mut self, s: &str) -> i64 {
        let hash = self.hasher.hash_one(s);
        let strings = &self.strings;
        if let Some(&i) = self.index.find(hash, |&i| strings[i] == s) {
            return i as i64;
        }
        let i = self.strings.len();
        self.strings.push(s.to_owned());
        let (strings, hasher) = (&self.strings, &self.hasher);
        self.index
            .insert_unique(hash, i, |&i| hasher.hash_one(&*strings[i]));
        i as i64
    }
}

/// A function's display name (its index in the string table), full name, file and (span
/// frames) path name.
type FunctionKeys = Map<(i64, Arc<str>, Option<Arc<str>>, Option<Arc<str>>), u64>;

/// A frame met before in this encoding, by where its strings live: kind, the addresses of its
/// names and file (0 for none), line, address. Every frame looked up during one encoding is
/// borrowed from data that outlives it, so an address stands for one string throughout; a
/// frame met again under other copies of equal strings only misses this cache, and
/// [`Tables::new_location`] finds its location by content.
type FrameKey = (FrameKind, [usize; 4], u32, u64);

/// The address of a string, for a [`FrameKey`].
fn addr(s: Option<&Arc<str>>) -> usize {
    s.map_or(0, |s| Arc::as_ptr(s).cast::<u8>() as usize)
}

/// Mappings, functions and locations, each made once.
struct Tables {
    strings: StringTable,
    mappings: Vec<proto::Mapping>,
    spans_mapping: Option<u64>,
    threads_mapping: Option<u64>,
    /// By display name, full name, file and path name: two functions one short name stands
    /// for stay two, and so do two span callsites of one name in one file.
    functions: FunctionKeys,
    locations: Map<(u64, u64, i64, u64), u64>,
    /// The location of each frame seen: a frame met again (every sample repeats its callers')
    /// costs a lookup of a few words and no allocation; its display name is made once.
    frames: Map<FrameKey, u64>,
    out_functions: Vec<proto::Function>,
    out_locations: Vec<proto::Location>,
}

impl Tables {
    fn new(binary: Option<&Binary>) -> Self {
        let mut strings = StringTable::new();
        let main = proto::Mapping {
            id: 1,
            filename: binary.map_or(0, |b| strings.get(&b.path)),
            build_id: binary
                .and_then(|b| b.build_id.as_deref())
                .map_or(0, |id| strings.get(id)),
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
            ..Default::default()
        };
        Tables {
            strings,
            mappings: vec![main],
            spans_mapping: None,
            threads_mapping: None,
            functions: Map::default(),
            frames: Map::default(),
            locations: Map::default(),
            out_functions: Vec::new(),
            out_locations: Vec::new(),
        }
    }

    fn mapping(&mut self, kind: FrameKind) -> u64 {
        let (slot, name) = match kind {
            FrameKind::Code => return 1,
            FrameKind::Span => (&mut self.spans_mapping, SPANS_MAPPING),
            FrameKind::Thread => (&mut self.threads_mapping, THREADS_MAPPING),
        };
        if let Some(id) = *slot {
            return id;
        }
        let id = self.mappings.len() as u64 + 1;
        *slot = Some(id);
        let filename = self.strings.get(name);
        self.mappings.push(proto::Mapping {
            id,
            filename,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            ..Default::default()
        });
        id
    }

    /// The location of the frame `key` stands for, made by `frame` the first time.
    fn location(&mut self, key: FrameKey, frame: impl FnOnce() -> Frame) -> u64 {
        if let Some(&id) = self.frames.get(&key) {
            return id;
        }
        let id = self.new_location(&frame());
        self.frames.insert(key, id);
        id
    }

    /// The location of a frame of a [`Profile`], which outlives the encoding.
    fn frame_location(&mut self, f: &Frame) -> u64 {
        let key = (
            f.kind,
            [
                addr(Some(&f.function)),
                addr(f.file.as_ref()),
                addr(f.path_name.as_ref()),
                0,
            ],
            f.line.unwrap_or(0),
            f.address.unwrap_or(0),
        );
        self.location(key, || f.clone())
    }

    /// The location of a frame not seen yet (it may still share its function and line with
    /// one that was).
    fn new_location(&mut self, f: &Frame) -> u64 {
        let mapping_id = self.mapping(f.kind);
        let name = f.display_name();
        let name_index = self.strings.get(&name);
        let next_fn = self.out_functions.len() as u64 + 1;
        let key = (
            name_index,
            f.function.clone(),
            f.file.clone(),
            f.path_name.clone(),
        );
        let function_id = match self.functions.get(&key) {
            Some(&id) => id,
            None => {
                // The full name as the system name; pprof shortens a name that equals its
                // system name as if it were C++ (see `crate::names`), so a name with brackets
                // that needs no shortening goes without one.
                let system_name = if f.kind == FrameKind::Code && *f.function != *name {
                    self.strings.get(&f.function)
                } else if let (FrameKind::Span, Some(path_name)) = (f.kind, &f.path_name) {
                    // A span frame's system name is the name it goes by in span paths.
                    self.strings.get(path_name)
                } else if name.contains(['<', '(']) {
                    0
                } else {
                    name_index
                };
                let filename = f.file.as_deref().map_or(0, |file| self.strings.get(file));
                self.out_functions.push(proto::Function {
                    id: next_fn,
                    name: name_index,
                    system_name,
                    filename,
                    start_line: 0,
                });
                self.functions.insert(key, next_fn);
                next_fn
            }
        };
        let line = f.line.map_or(0, i64::from);
        let address = f.address.unwrap_or(0);
        let key = (mapping_id, function_id, line, address);
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let id = self.out_locations.len() as u64 + 1;
        self.out_locations.push(proto::Location {
            id,
            mapping_id,
            address,
            line: vec![proto::Line { function_id, line }],
            is_folded: false,
        });
        self.locations.insert(key, id);
        id
    }
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// The sample types of `header`, their strings interned first as in every profile we write.
fn sample_types(t: &mut Tables, header: &Profile) -> Vec<proto::ValueType> {
    header
        .sample_types
        .iter()
        .map(|v| value_type(&mut t.strings, v))
        .collect()
}

fn value_type(s: &mut StringTable, v: &SampleType) -> proto::ValueType {
    proto::ValueType {
        r#type: s.get(&v.name),
        unit: s.get(&v.unit),
    }
}

/// A sample's labels.
fn labels<'a>(
    t: &mut Tables,
    labels: impl Iterator<Item = LabelRef<'a>>,
    out: &mut Vec<proto::Label>,
) {
    out.extend(labels.map(|l| match l {
        LabelRef::Str(key, value) => proto::Label {
            key: t.strings.get(key),
            str: t.strings.get(value),
            ..Default::default()
        },
        LabelRef::Num(key, num, unit) => proto::Label {
            key: t.strings.get(key),
            num,
            num_unit: unit.map_or(0, |u| t.strings.get(u)),
            ..Default::default()
        },
    }));
}

/// Everything of `header` but its sample types and samples, and the tables the samples
/// filled, into `out`.
fn finish(mut t: Tables, header: &Profile, out: &mut proto::Profile) {
    out.period_type = header
        .period_type
        .as_ref()
        .map(|v| value_type(&mut t.strings, v));
    out.period = header.period;
    out.time_nanos = header
        .time
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, nanos);
    out.duration_nanos = header.duration.map_or(0, nanos);
    out.comment = header.comments.iter().map(|c| t.strings.get(c)).collect();
    out.default_sample_type = header
        .default_sample_type
        .as_deref()
        .map_or(0, |d| t.strings.get(d));
    out.drop_frames = header
        .drop_frames
        .as_deref()
        .map_or(0, |d| t.strings.get(d));
    out.keep_frames = header
        .keep_frames
        .as_deref()
        .map_or(0, |d| t.strings.get(d));
    out.mapping = t.mappings;
    out.function = t.out_functions;
    out.location = t.out_locations;
    out.string_table = t.strings.strings;
}

impl Profile {
    /// The pprof message (not yet serialized).
    pub fn to_proto(&self) -> proto::Profile {
        let mut t = Tables::new(self.binary.as_ref());
        let mut out = proto::Profile {
            sample_type: sample_types(&mut t, self),
            ..Default::default()
        };
        for s in &self.samples {
            let location_id = s.stack.iter().rev().map(|f| t.frame_location(f)).collect();
            let mut label = Vec::with_capacity(s.labels.len());
            labels(&mut t, s.labels.iter().map(Label::borrowed), &mut label);
            out.sample.push(proto::Sample {
                location_id,
                value: s.values.clone(),
                label,
            });
        }
        finish(t, self, &mut out);
        out
    }

    /// Serialized and gzip-compressed, as `go tool pprof` and every pprof consumer expect on
    /// disk and over HTTP.
    pub fn encode(&self) -> Vec<u8> {
        gzip(&self.to_proto())
    }

    /// Reads a pprof profile from gzip'd or raw bytes; see the module docs for what is checked.
    pub fn decode(bytes: &[u8]) -> Result<Profile, DecodeError> {
        if bytes.is_empty() {
            return Err(DecodeError::Empty);
        }
        let raw = gunzip(bytes)?;
        let message: proto::Profile = prost::Message::decode(&raw[..])?;
        Profile::from_proto(&message)
    }

    /// Checks and converts a pprof message; see the module docs.
    pub fn from_proto(p: &proto::Profile) -> Result<Profile, DecodeError> {
        let strings = &p.string_table;
        if strings.first().is_none_or(|s| !s.is_empty()) {
            return Err(invalid("string_table[0] must be the empty string"));
        }
        let string = |i: i64, what: &str| -> Result<&str, DecodeError> {
            usize::try_from(i)
                .ok()
                .and_then(|i| strings.get(i))
                .map(String::as_str)
                .ok_or_else(|| invalid(format!("{what} refers to string {i}, beyond the table")))
        };
        let opt_string = |i: i64, what: &str| -> Result<Option<String>, DecodeError> {
            Ok(Some(string(i, what)?)
                .filter(|s| !s.is_empty())
                .map(str::to_owned))
        };
        if p.sample_type.is_empty() {
            return Err(invalid("it has no sample types"));
        }
        let sample_types = p
            .sample_type
            .iter()
            .map(|v| {
                Ok(SampleType::new(
                    string(v.r#type, "a sample type")?,
                    string(v.unit, "a sample unit")?,
                ))
            })
            .collect::<Result<Vec<_>, DecodeError>>()?;

        let mut mappings: HashMap<u64, &proto::Mapping> = HashMap::new();
        for m in &p.mapping {
            if m.id == 0 || mappings.insert(m.id, m).is_some() {
                return Err(invalid(format!("mapping id {} is zero or repeated", m.id)));
            }
        }
        // Per function id: the frame's name, its file, and the system name as written.
        type Function<'a> = (Arc<str>, Option<Arc<str>>, &'a str);
        let mut functions: HashMap<u64, Function<'_>> = HashMap::new();
        for f in &p.function {
            // Our files name a Rust function by its short name and keep the full one as the
            // system name (see `crate::names`): the full one is the frame's.
            let short = string(f.name, "a function name")?;
            let system = string(f.system_name, "a function system name")?;
            let name: Arc<str> = Arc::from(
                if short.is_empty()
                    || (!system.is_empty()
                        && system != short
                        && crate::names::short_function_name(system) == short)
                {
                    system
                } else {
                    short
                },
            );
            let file = opt_string(f.filename, "a function file")?.map(Arc::from);
            if f.id == 0 || functions.insert(f.id, (name, file, system)).is_some() {
                return Err(invalid(format!("function id {} is zero or repeated", f.id)));
            }
        }
        // Each location as frames root first (its lines are innermost first).
        let mut locations: HashMap<u64, Vec<Frame>> = HashMap::new();
        for l in &p.location {
            let kind = match l.mapping_id {
                0 => FrameKind::Code,
                id => {
                    let m = mappings.get(&id).ok_or_else(|| {
                        invalid(format!("location {} refers to unknown mapping {id}", l.id))
                    })?;
                    match string(m.filename, "a mapping file")? {
                        SPANS_MAPPING => FrameKind::Span,
                        THREADS_MAPPING => FrameKind::Thread,
                        _ => FrameKind::Code,
                    }
                }
            };
            let address = (l.address != 0).then_some(l.address);
            let mut frames = Vec::with_capacity(l.line.len().max(1));
            for line in l.line.iter().rev() {
                let (name, file, system) = functions.get(&line.function_id).ok_or_else(|| {
                    invalid(format!(
                        "location {} refers to unknown function {}",
                        l.id, line.function_id
                    ))
                })?;
                let (name, path_name) = match kind {
                    // Ours keep the span's path name as the system name.
                    FrameKind::Span => (
                        name.strip_suffix(SPAN_MARK)
                            .map_or_else(|| name.clone(), Arc::from),
                        (!system.is_empty() && *system != &**name).then(|| Arc::from(*system)),
                    ),
                    _ => (name.clone(), None),
                };
                frames.push(Frame {
                    kind,
                    function: name,
                    file: file.clone(),
                    line: u32::try_from(line.line).ok().filter(|&n| n > 0),
                    address,
                    path_name,
                });
            }
            if frames.is_empty() {
                frames.push(Frame {
                    kind,
                    function: Arc::from(format!("0x{:x}", l.address)),
                    file: None,
                    line: None,
                    address,
                    path_name: None,
                });
            }
            if l.id == 0 || locations.insert(l.id, frames).is_some() {
                return Err(invalid(format!("location id {} is zero or repeated", l.id)));
            }
        }

        let mut total_frames = 0usize;
        let mut samples = Vec::with_capacity(p.sample.len());
        for (n, s) in p.sample.iter().enumerate() {
            if s.value.len() != sample_types.len() {
                return Err(invalid(format!(
                    "sample {n} has {} values for {} sample types",
                    s.value.len(),
                    sample_types.len()
                )));
            }
            let mut stack = Vec::new();
            for id in s.location_id.iter().rev() {
                let frames = locations.get(id).ok_or_else(|| {
                    invalid(format!("sample {n} refers to unknown location {id}"))
                })?;
                total_frames += frames.len();
                if total_frames > MAX_DECODED_FRAMES {
                    return Err(invalid(format!(
                        "more than {MAX_DECODED_FRAMES} frames over all samples"
                    )));
                }
                stack.extend(frames.iter().cloned());
            }
            let labels = s
                .label
                .iter()
                .map(|l| {
                    let key = string(l.key, "a label key")?.to_owned();
                    let value = if l.str != 0 {
                        LabelValue::Str(string(l.str, "a label value")?.to_owned())
                    } else {
                        LabelValue::Num {
                            value: l.num,
                            unit: opt_string(l.num_unit, "a label unit")?,
                        }
                    };
                    Ok(Label { key, value })
                })
                .collect::<Result<Vec<_>, DecodeError>>()?;
            samples.push(Sample {
                stack,
                values: s.value.clone(),
                labels,
            });
        }
        let binary = p.mapping.iter().find_map(|m| {
            let file = strings.get(usize::try_from(m.filename).ok()?)?;
            (!file.is_empty() && !file.starts_with('[')).then(|| {
                let build_id = usize::try_from(m.build_id)
                    .ok()
                    .and_then(|i| strings.get(i))
                    .filter(|b| !b.is_empty())
                    .cloned();
                Binary::new(file.clone(), build_id)
            })
        });
        let period_type = p
            .period_type
            .as_ref()
            .map(|v| -> Result<SampleType, DecodeError> {
                Ok(SampleType::new(
                    string(v.r#type, "the period type")?,
                    string(v.unit, "the period unit")?,
                ))
            })
            .transpose()?;
        let comments = p
            .comment
            .iter()
            .map(|&c| string(c, "a comment").map(str::to_owned))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Profile {
            sample_types,
            default_sample_type: opt_string(p.default_sample_type, "the default sample type")?,
            period_type,
            period: p.period,
            time: (p.time_nanos > 0)
                .then(|| UNIX_EPOCH + Duration::from_nanos(p.time_nanos.unsigned_abs())),
            duration: (p.duration_nanos > 0)
                .then(|| Duration::from_nanos(p.duration_nanos.unsigned_abs())),
            comments,
            samples,
            binary,
            drop_frames: opt_string(p.drop_frames, "drop_frames")?,
            keep_frames: opt_string(p.keep_frames, "keep_frames")?,
        })
    }
}

/// `bytes` decompressed when gzip'd, as they are otherwise, at most [`MAX_DECODED_BYTES`].
pub(crate) fn gunzip(bytes: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, DecodeError> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes)
            .take(MAX_DECODED_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(DecodeError::Gzip)?;
        if out.len() as u64 > MAX_DECODED_BYTES {
            return Err(DecodeError::TooLarge);
        }
        Ok(out.into())
    } else if bytes.len() as u64 > MAX_DECODED_BYTES {
        Err(DecodeError::TooLarge)
    } else {
        Ok(bytes.into())
    }
}

/// `message` serialized and gzip-compressed.
pub(crate) fn gzip_message(message: &impl prost::Message) -> Vec<u8> {
    let bytes = message.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 2 + 64),
        flate2::Compression::default(),
    );
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(&bytes);
    gz.finish().unwrap_or_default()
}

/// A pprof message serialized and gzip-compressed, as [`Profile::encode`] writes it; for a caller
/// that looked at the message first (its [`prost::Message::encoded_len`], say).
pub fn gzip(message: &proto::Profile) -> Vec<u8> {
    gzip_message(message)
}
