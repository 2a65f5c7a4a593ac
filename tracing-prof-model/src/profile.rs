//! [`Profile`]: one pprof-shaped profile (sample types, samples with stacks and labels), owned
//! and independent of the wire format. Built from a [`Snapshot`](crate::Snapshot) by
//! [`Snapshot::profile`](crate::Snapshot::profile), or decoded from any pprof file (ours, Go's,
//! pprof-rs's) by [`Profile::decode`].

use crate::snapshot::Binary;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A sample type or a period type: `inuse_space` in `bytes`, `cpu` in `nanoseconds`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SampleType {
    /// The name, e.g. `alloc_space`.
    pub name: String,
    /// The unit, e.g. `bytes`, `nanoseconds`, `count`.
    pub unit: String,
}

impl SampleType {
    /// `name` measured in `unit`.
    pub fn new(name: impl Into<String>, unit: impl Into<String>) -> Self {
        SampleType {
            name: name.into(),
            unit: unit.into(),
        }
    }
}

/// What a frame of a stack stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrameKind {
    /// A span of the span path (or a synthetic frame in its place, like `(no span)`).
    Span,
    /// A function of the code.
    Code,
    /// A thread (the `threads` kind).
    Thread,
}

/// One frame of a sample's stack. Two frames are equal when they stand for the same function
/// or span callsite at the same place: [`Frame::path_name`] is how a span is shown, not what
/// it is (a file of another version may lack it).
#[derive(Clone, Debug)]
pub struct Frame {
    /// What the frame stands for.
    pub kind: FrameKind,
    /// The function name; for span frames `target::name`, without the `[span]` mark that
    /// pprof files carry.
    pub function: Arc<str>,
    /// Source file, when known.
    pub file: Option<Arc<str>>,
    /// Source line, when known.
    pub line: Option<u32>,
    /// Code address, when the file had one.
    pub address: Option<u64>,
    /// For span frames, the name the span goes by in span paths
    /// ([`SpanFrame::path_name`](crate::SpanFrame::path_name)), when the profile says it (ours
    /// keep it as the function's system name); see [`Frame::span_name`].
    pub path_name: Option<Arc<str>>,
}

impl Frame {
    /// The fields that say which frame this is (all but the path name).
    #[allow(
        clippy::type_complexity,
        reason = "a tuple of the fields, for comparisons"
    )]
    fn identity(&self) -> (FrameKind, &str, Option<&str>, Option<u32>, Option<u64>) {
        (
            self.kind,
            &self.function,
            self.file.as_deref(),
            self.line,
            self.address,
        )
    }
}

compared_by_identity!(Frame);

/// The mark that span frames carry after their name in pprof files and flame graphs, so that a
/// span and a function of the same name stay apart.
pub const SPAN_MARK: &str = " [span]";

impl Frame {
    /// A frame of `kind` named `function` at `file:line`.
    pub fn new(
        kind: FrameKind,
        function: impl Into<Arc<str>>,
        file: Option<Arc<str>>,
        line: Option<u32>,
    ) -> Self {
        Frame {
            kind,
            function: function.into(),
            file,
            line,
            address: None,
            path_name: None,
        }
    }

    /// The name a span frame goes by in span paths: its path name when known, else the last
    /// `::` segment of its function (`app::render` → `render`).
    pub fn span_name(&self) -> &str {
        self.path_name
            .as_deref()
            .unwrap_or_else(|| self.function.rsplit("::").next().unwrap_or(&self.function))
    }

    /// The name shown in pprof, flame graphs and tables: span frames carry [`SPAN_MARK`]
    /// (synthetic ones, whose names are in parentheses, need none); code frames go by their
    /// short name ([`short_function_name`](crate::short_function_name)).
    pub fn display_name(&self) -> std::borrow::Cow<'_, str> {
        match self.kind {
            FrameKind::Span if !self.function.starts_with('(') => {
                format!("{}{SPAN_MARK}", self.function).into()
            }
            FrameKind::Code => crate::names::short_function_name(&self.function),
            _ => (*self.function).into(),
        }
    }

    /// The display name and, when known, ` file:line` with the file shortened to its last two
    /// components.
    pub fn display_with_location(&self) -> String {
        let mut s = self.display_name().into_owned();
        if let (Some(file), Some(line)) = (&self.file, self.line) {
            let short: Vec<&str> = file.rsplit('/').take(2).collect();
            let short = if short.len() == 2 {
                format!("{}/{}", short[1], short[0])
            } else {
                short[0].to_owned()
            };
            s.push_str(&format!(" ({short}:{line})"));
        }
        s
    }
}

/// The value of a label.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LabelValue {
    /// A string label, like `span_path=request -> render`.
    Str(String),
    /// A numeric label with an optional unit, like `bytes=4096`.
    Num {
        /// The number.
        value: i64,
        /// Its unit (`bytes`, `nanoseconds`...), if any.
        unit: Option<String>,
    },
}

/// A key and its value, attached to a sample.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Label {
    /// The key.
    pub key: String,
    /// The value.
    pub value: LabelValue,
}

impl Label {
    /// The label, borrowed.
    pub(crate) fn borrowed(&self) -> crate::build::LabelRef<'_> {
        match &self.value {
            LabelValue::Str(v) => crate::build::LabelRef::Str(&self.key, v),
            LabelValue::Num { value, unit } => {
                crate::build::LabelRef::Num(&self.key, *value, unit.as_deref())
            }
        }
    }

    /// A string label.
    pub fn str(key: impl Into<String>, value: impl Into<String>) -> Self {
        Label {
            key: key.into(),
            value: LabelValue::Str(value.into()),
        }
    }

    /// A numeric label.
    pub fn num(key: impl Into<String>, value: i64, unit: Option<&str>) -> Self {
        Label {
            key: key.into(),
            value: LabelValue::Num {
                value,
                unit: unit.map(str::to_owned),
            },
        }
    }

    /// The value as text: the string, or the number with its unit.
    pub fn value_text(&self) -> String {
        match &self.value {
            LabelValue::Str(s) => s.clone(),
            LabelValue::Num { value, unit: None } => value.to_string(),
            LabelValue::Num {
                value,
                unit: Some(u),
            } => format!("{value} {u}"),
        }
    }
}

/// One sample: a stack, one value per sample type, and labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The stack, **root first** (pprof stores it leaf first; encode and decode turn it).
    pub stack: Vec<Frame>,
    /// One value per [`Profile::sample_types`] entry.
    pub values: Vec<i64>,
    /// Labels.
    pub labels: Vec<Label>,
}

impl Sample {
    /// The string value of label `key`, if the sample has one.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.iter().find_map(|l| match &l.value {
            LabelValue::Str(s) if l.key == key => Some(s.as_str()),
            _ => None,
        })
    }

    /// The span frames of the stack, root first.
    pub fn span_frames(&self) -> impl Iterator<Item = &Frame> {
        self.stack.iter().filter(|f| f.kind == FrameKind::Span)
    }

    /// The span path: the span frames' [`Frame::span_name`]s joined by ` -> `; empty when the
    /// stack has no span frame.
    pub fn span_path(&self) -> String {
        let names: Vec<&str> = self.span_frames().map(Frame::span_name).collect();
        names.join(crate::PATH_SEPARATOR)
    }

    /// The innermost code frame, if any.
    pub fn leaf_function(&self) -> Option<&Frame> {
        self.stack.iter().rev().find(|f| f.kind == FrameKind::Code)
    }
}

/// One profile: what a pprof file holds, as owned data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Profile {
    /// What each sample value measures, in order.
    pub sample_types: Vec<SampleType>,
    /// The sample type viewers show when none is chosen; `None`: the last one (pprof's rule).
    pub default_sample_type: Option<String>,
    /// What the sampling period is counted in (`space/bytes`, `cpu/nanoseconds`).
    pub period_type: Option<SampleType>,
    /// The sampling period (1 when values are exact counts).
    pub period: i64,
    /// Start of the period the values cover, when known.
    pub time: Option<SystemTime>,
    /// Length of that period, when the values cover a known window (`None` for cumulative
    /// counters since the process started).
    pub duration: Option<Duration>,
    /// Free-form notes (`go tool pprof -comments`).
    pub comments: Vec<String>,
    /// The samples.
    pub samples: Vec<Sample>,
    /// The program the profile was taken of, when known.
    pub binary: Option<Binary>,
    /// pprof's `drop_frames` regular expression, kept from decoded files.
    pub drop_frames: Option<String>,
    /// pprof's `keep_frames` regular expression, kept from decoded files.
    pub keep_frames: Option<String>,
}

impl Profile {
    /// An empty profile with these sample types.
    pub fn new(sample_types: Vec<SampleType>) -> Self {
        Profile {
            sample_types,
            period: 1,
            ..Profile::default()
        }
    }

    /// The index of the sample type named `name`.
    pub fn sample_type_index(&self, name: &str) -> Option<usize> {
        self.sample_types.iter().position(|t| t.name == name)
    }

    /// The index of the sample type shown by default: `default_sample_type`, else the last.
    pub fn default_index(&self) -> usize {
        self.default_sample_type
            .as_deref()
            .and_then(|n| self.sample_type_index(n))
            .unwrap_or(self.sample_types.len().saturating_sub(1))
    }

    /// The sample type at `index`, or an error naming the known ones.
    pub fn sample_type_named(&self, name: Option<&str>) -> Result<usize, crate::ModelError> {
        match name {
            None => Ok(self.default_index()),
            Some(n) => {
                self.sample_type_index(n)
                    .ok_or_else(|| crate::ModelError::UnknownSampleType {
                        asked: n.to_owned(),
                        known: self
                            .sample_types
                            .iter()
                            .map(|t| t.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    })
            }
        }
    }

    /// The sum of sample type `index` over all samples.
    pub fn total(&self, index: usize) -> i64 {
        self.samples
            .iter()
            .map(|s| s.values.get(index).copied().unwrap_or(0))
            .fold(0i64, i64::saturating_add)
    }

    /// The samples for which `keep` is true, everything else unchanged.
    pub fn filtered(&self, keep: impl Fn(&Sample) -> bool) -> Profile {
        Profile {
            samples: self.samples.iter().filter(|s| keep(s)).cloned().collect(),
            ..self.clone()
        }
    }

    /// Samples with the same stack and labels summed into one, in order of first appearance.
    pub fn merged(&self) -> Profile {
        let mut index: HashMap<(&[Frame], &[Label]), usize> = HashMap::new();
        let mut out: Vec<Sample> = Vec::new();
        for s in &self.samples {
            match index.get(&(s.stack.as_slice(), s.labels.as_slice())) {
                Some(&i) => {
                    for (a, b) in out[i].values.iter_mut().zip(&s.values) {
                        *a = a.saturating_add(*b);
                    }
                }
                None => {
                    index.insert((s.stack.as_slice(), s.labels.as_slice()), out.len());
                    out.push(s.clone());
                }
            }
        }
        Profile {
            samples: out,
            ..self.clone()
        }
    }

    /// Only the sample types named in `names`, in that order; samples left all zero are dropped.
    /// `None` when one of the names is not a sample type of this profile.
    pub fn with_sample_types(&self, names: &[&str]) -> Option<Profile> {
        let columns = names
            .iter()
            .map(|n| self.sample_type_index(n))
            .collect::<Option<Vec<usize>>>()?;
        let samples = self
            .samples
            .iter()
            .filter_map(|s| {
                let values: Vec<i64> = columns
                    .iter()
                    .map(|&c| s.values.get(c).copied().unwrap_or(0))
                    .collect();
                values.iter().any(|&v| v != 0).then(|| Sample {
                    values,
                    ..s.clone()
                })
            })
            .collect();
        let default_sample_type = self
            .default_sample_type
            .clone()
            .filter(|d| names.contains(&d.as_str()));
        Some(Profile {
            sample_types: columns
                .iter()
                .map(|&c| self.sample_types[c].clone())
                .collect(),
            default_sample_type,
            samples,
            ..self.clone()
        })
    }

    /// At most `max` samples (at least 1): the largest by the default sample type stay as they
    /// are, the others are summed into one sample whose only frame is
    /// `(N smaller stacks merged)`, so that the total of every sample type is unchanged.
    /// Returns how many samples were merged (0 when there were at most `max`).
    pub fn keep_largest(&mut self, max: usize) -> usize {
        let max = max.max(1);
        if self.samples.len() <= max {
            return 0;
        }
        let by = self.default_index();
        let weight = |s: &Sample| s.values.get(by).map_or(0, |v| v.unsigned_abs());
        self.samples.sort_by_key(|s| std::cmp::Reverse(weight(s)));
        let rest = self.samples.split_off(max - 1);
        let mut values = vec![0i64; self.sample_types.len()];
        for s in &rest {
            for (a, b) in values.iter_mut().zip(&s.values) {
                *a = a.saturating_add(*b);
            }
        }
        self.samples.push(Sample {
            stack: vec![Frame::new(
                FrameKind::Span,
                format!("({} smaller stacks merged)", rest.len()),
                None,
                None,
            )],
            values,
            labels: Vec::new(),
        });
        rest.len()
    }

    /// `self - base`, sample by sample (same stack and labels), as `go tool pprof -base` does:
    /// what grew is positive, what shrank negative; samples equal in both drop out. Both must
    /// have the same sample types.
    pub fn diff(&self, base: &Profile) -> Result<Profile, crate::ModelError> {
        if self.sample_types != base.sample_types {
            let names = |p: &Profile| {
                p.sample_types
                    .iter()
                    .map(|t| format!("{}/{}", t.name, t.unit))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(crate::ModelError::Incompatible(format!(
                "the profiles have different sample types ({} against {})",
                names(base),
                names(self)
            )));
        }
        let mut negated = base.clone();
        for s in &mut negated.samples {
            for v in &mut s.values {
                *v = v.saturating_neg();
            }
        }
        let mut both = self.clone();
        both.samples.extend(negated.samples);
        let mut out = both.merged();
        out.samples.retain(|s| s.values.iter().any(|&v| v != 0));
        out.duration = None;
        out.comments = vec![format!(
            "tracing-prof: difference: this profile minus a base profile{}",
            match (self.time, base.time) {
                (Some(a), Some(b)) => format!(
                    " taken {:.1} s earlier",
                    a.duration_since(b).unwrap_or_default().as_secs_f64()
                ),
                _ => String::new(),
            }
        )];
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two span callsites of one name in one module and file (two `info_span!("request")`)
    /// keep their own path names through a file: one row each, never merged.
    #[test]
    fn same_name_callsites_in_one_file_stay_apart_through_a_file() {
        let mut p = Profile::new(vec![SampleType::new("spans", "count")]);
        for (line, path_name) in [
            (48, "app::request (main.rs:48)"),
            (61, "app::request (main.rs:61)"),
        ] {
            let mut f = Frame::new(
                FrameKind::Span,
                "app::request",
                Some(Arc::from("src/main.rs")),
                Some(line),
            );
            f.path_name = Some(Arc::from(path_name));
            p.samples.push(Sample {
                stack: vec![f],
                values: vec![line.into()],
                labels: Vec::new(),
            });
        }
        let back = Profile::decode(&p.encode()).unwrap();
        let paths: Vec<String> = back.samples.iter().map(Sample::span_path).collect();
        assert_eq!(
            paths,
            ["app::request (main.rs:48)", "app::request (main.rs:61)"]
        );
    }

    fn profile(values: &[[i64; 2]]) -> Profile {
        let mut p = Profile::new(vec![
            SampleType::new("spans", "count"),
            SampleType::new("cpu", "nanoseconds"),
        ]);
        p.default_sample_type = Some("cpu".into());
        for (i, v) in values.iter().enumerate() {
            p.samples.push(Sample {
                stack: vec![Frame::new(FrameKind::Span, format!("s{i}"), None, None)],
                values: v.to_vec(),
                labels: Vec::new(),
            });
        }
        p
    }

    #[test]
    fn with_sample_types_keeps_the_named_columns_and_drops_empty_samples() {
        let p = profile(&[[3, 0], [0, 7], [1, 2]]);
        let cpu = p.with_sample_types(&["cpu"]).unwrap();
        assert_eq!(cpu.sample_types, [SampleType::new("cpu", "nanoseconds")]);
        assert_eq!(cpu.default_sample_type.as_deref(), Some("cpu"));
        let rows: Vec<(&str, &[i64])> = cpu
            .samples
            .iter()
            .map(|s| (&*s.stack[0].function, s.values.as_slice()))
            .collect();
        assert_eq!(rows, [("s1", &[7][..]), ("s2", &[2][..])]);
        let spans = p.with_sample_types(&["spans"]).unwrap();
        assert_eq!(spans.default_sample_type, None);
        assert_eq!(spans.total(0), 4);
        assert!(p.with_sample_types(&["wall"]).is_none());
    }

    #[test]
    fn keep_largest_merges_the_smallest_and_keeps_every_total() {
        let mut p = profile(&[[1, 5], [1, 50], [1, 1], [2, 20], [1, -30]]);
        assert_eq!(p.keep_largest(10), 0);
        assert_eq!(p.keep_largest(3), 3);
        let rows: Vec<(&str, &[i64])> = p
            .samples
            .iter()
            .map(|s| (&*s.stack[0].function, s.values.as_slice()))
            .collect();
        assert_eq!(
            rows,
            [
                ("s1", &[1, 50][..]),
                ("s4", &[1, -30][..]),
                ("(3 smaller stacks merged)", &[4, 26][..])
            ]
        );
        assert_eq!((p.total(0), p.total(1)), (6, 46));
        assert_eq!(p.keep_largest(0), 3, "one sample stays: all three merged");
        assert_eq!(p.samples.len(), 1);
        assert_eq!((p.total(0), p.total(1)), (6, 46));
    }
}
