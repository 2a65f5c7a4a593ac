//! Text tables: the top functions or span paths of a profile, and a readable listing of its
//! samples. The same tables serve the `tracing-prof` CLI, the `/debug/pprof` `?debug=1`
//! answers and the example's summary.

use crate::profile::{Frame, LabelValue, Profile};
use crate::{ModelError, units};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

/// What the rows of [`Profile::top`] are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Grouping {
    /// Functions, as `go tool pprof -top` lists them (span frames too, marked `[span]`).
    #[default]
    Function,
    /// Span paths (`request -> render`): flat is the path's own samples, cum includes the
    /// paths below it.
    SpanPath,
}

/// The values of one label key and their totals, as [`Profile::tags`] lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagTable {
    /// The label key (`lifetime`, `thread`, `span_path`, `bytes`).
    pub key: String,
    /// Each value with the sum of the sample type over the samples that carry it, in the
    /// value's natural order: durations (`<1us` .. `>=10s`) shortest first, numbers smallest
    /// first, other text largest total first.
    pub rows: Vec<(String, i64)>,
    /// The sum over all rows.
    pub total: i64,
}

/// One row of [`Profile::top`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopRow {
    /// The function or span path.
    pub name: String,
    /// Where the function is, when known (`file:line` of its first sample).
    pub location: Option<String>,
    /// Value of the samples where it is the leaf (for span paths: the innermost span).
    pub flat: i64,
    /// Value of the samples it is part of.
    pub cum: i64,
}

/// A sample type's unit and the rows of [`Profile::top`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Top {
    /// The sample type the rows measure.
    pub sample_type: String,
    /// Its unit.
    pub unit: String,
    /// The sum over all samples.
    pub total: i64,
    /// Rows, largest flat first (then largest cum, then by name), at most the limit asked.
    pub rows: Vec<TopRow>,
    /// Rows left out by the limit.
    pub omitted: usize,
}

impl Profile {
    /// The latency histogram of each span path from the `durations` samples of a `spans`
    /// profile (numeric label `duration_le`, the bucket's bound), by path name as
    /// [`Grouping::SpanPath`] writes it, in the order first met; empty for other profiles.
    /// Quantiles: [`crate::duration_quantile`].
    pub fn latencies(&self) -> Vec<(String, [u64; crate::DURATION_BUCKETS])> {
        let Some(k) = self.sample_type_index("durations") else {
            return Vec::new();
        };
        let mut out: Vec<(String, [u64; crate::DURATION_BUCKETS])> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        for s in &self.samples {
            let n = s.values.get(k).copied().unwrap_or(0);
            let le = s.labels.iter().find_map(|l| match (&*l.key, &l.value) {
                ("duration_le", LabelValue::Num { value, .. }) => Some(*value),
                _ => None,
            });
            let (Some(le), true) = (le, n > 0) else {
                continue;
            };
            let bucket = crate::DURATION_BOUNDS_NS
                .iter()
                .position(|&b| i64::try_from(b).is_ok_and(|b| b == le))
                .unwrap_or(crate::DURATION_BUCKETS - 1);
            let name = s
                .span_frames()
                .map(|f| f.span_name())
                .collect::<Vec<_>>()
                .join(crate::PATH_SEPARATOR);
            let i = *at.entry(name.clone()).or_insert_with(|| {
                out.push((name, [0; crate::DURATION_BUCKETS]));
                out.len() - 1
            });
            out[i].1[bucket] += u64::try_from(n).unwrap_or(0);
        }
        out
    }

    /// The rows of `go tool pprof -top` (or per span path), for sample type `sample_type`
    /// (default: the profile's default), sorted by flat (by cum when `by_cum`), at most
    /// `limit` rows (0: all).
    pub fn top(
        &self,
        sample_type: Option<&str>,
        grouping: Grouping,
        by_cum: bool,
        limit: usize,
    ) -> Result<Top, ModelError> {
        let index = self.sample_type_named(sample_type)?;
        let mut rows: Vec<TopRow> = Vec::new();
        // One row per name, as pprof's default (function) granularity has it: the same name in
        // two files is one row, located at its first sample.
        let mut at: HashMap<String, usize> = HashMap::new();
        let mut row = |rows: &mut Vec<TopRow>, name: String, frame: Option<&Frame>| -> usize {
            *at.entry(name.clone()).or_insert_with(|| {
                rows.push(TopRow {
                    name,
                    location: frame
                        .and_then(|f| Some(format!("{}:{}", f.file.as_deref()?, f.line?))),
                    flat: 0,
                    cum: 0,
                });
                rows.len() - 1
            })
        };
        for s in &self.samples {
            let v = s.values.get(index).copied().unwrap_or(0);
            if v == 0 {
                continue;
            }
            match grouping {
                Grouping::Function => {
                    let mut seen = HashSet::new();
                    for (i, f) in s.stack.iter().enumerate() {
                        let r = row(&mut rows, f.display_name().into_owned(), Some(f));
                        if seen.insert(r) {
                            rows[r].cum += v;
                        }
                        if i + 1 == s.stack.len() {
                            rows[r].flat += v;
                        }
                    }
                }
                Grouping::SpanPath => {
                    let spans: Vec<&Frame> = s.span_frames().collect();
                    let names: Vec<&str> = spans.iter().map(|f| f.span_name()).collect();
                    if names.is_empty() {
                        let r = row(&mut rows, "(no span path)".to_owned(), None);
                        rows[r].flat += v;
                        rows[r].cum += v;
                        continue;
                    }
                    for depth in 1..=names.len() {
                        let r = row(
                            &mut rows,
                            names[..depth].join(crate::PATH_SEPARATOR),
                            Some(spans[depth - 1]),
                        );
                        rows[r].cum += v;
                        if depth == names.len() {
                            rows[r].flat += v;
                        }
                    }
                }
            }
        }
        rows.retain(|r| r.flat != 0 || r.cum != 0);
        rows.sort_by(|a, b| {
            let (ka, kb) = if by_cum {
                ((a.cum, a.flat), (b.cum, b.flat))
            } else {
                ((a.flat, a.cum), (b.flat, b.cum))
            };
            (kb.0.abs(), kb.1.abs())
                .cmp(&(ka.0.abs(), ka.1.abs()))
                .then_with(|| a.name.cmp(&b.name))
        });
        let omitted = if limit > 0 && rows.len() > limit {
            let n = rows.len() - limit;
            rows.truncate(limit);
            n
        } else {
            0
        };
        let ty = &self.sample_types[index];
        Ok(Top {
            sample_type: ty.name.clone(),
            unit: ty.unit.clone(),
            total: self.total(index),
            rows,
            omitted,
        })
    }

    /// A readable listing of the samples, largest value of `sample_type` first (default: the
    /// profile's default): every value with its unit, the labels, then the stack one frame per
    /// line, innermost first, with file and line. At most `limit` samples (0: all).
    pub fn samples_text(
        &self,
        sample_type: Option<&str>,
        limit: usize,
    ) -> Result<String, ModelError> {
        let index = self.sample_type_named(sample_type)?;
        let merged = self.merged();
        let mut order: Vec<usize> = (0..merged.samples.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(merged.samples[i].values[index].abs()));
        let mut out = String::new();
        let shown = if limit == 0 {
            order.len()
        } else {
            limit.min(order.len())
        };
        for &i in &order[..shown] {
            let s = &merged.samples[i];
            let values: Vec<String> = std::iter::once(index)
                .chain((0..self.sample_types.len()).filter(|&k| k != index))
                .map(|k| {
                    let t = &self.sample_types[k];
                    format!("{} {}", t.name, units::format_value(s.values[k], &t.unit))
                })
                .collect();
            let _ = writeln!(out, "{}", values.join(", "));
            for l in &s.labels {
                let value = match &l.value {
                    LabelValue::Num {
                        value,
                        unit: Some(u),
                    } => units::format_value(*value, u),
                    _ => l.value_text(),
                };
                let _ = writeln!(out, "    [{} = {value}]", l.key);
            }
            for f in s.stack.iter().rev() {
                let _ = writeln!(out, "    {}", f.display_with_location());
            }
            out.push('\n');
        }
        if shown < order.len() {
            let _ = writeln!(out, "... and {} more samples", order.len() - shown);
        }
        Ok(out)
    }
}

/// A label value read as a duration in nanoseconds (`<1us`, `>=10s`, `10ms`), if it is one.
fn as_duration(v: &str) -> Option<f64> {
    let v = v.trim_start_matches(['<', '>', '=']);
    let (num, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit() && c != '.')?);
    let scale = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return None,
    };
    Some(num.parse::<f64>().ok()? * scale)
}

impl Profile {
    /// Per label key, the sum of `sample_type` (default: the profile's default) for each value,
    /// values whose sum is 0 left out: `go tool pprof -tags`, with lifetime buckets and numbers
    /// in their own order rather than by size. Keys sorted by name.
    pub fn tags(&self, sample_type: Option<&str>) -> Result<Vec<TagTable>, ModelError> {
        let index = self.sample_type_named(sample_type)?;
        let mut keys: std::collections::BTreeMap<&str, HashMap<String, (i64, Option<i64>)>> =
            Default::default();
        for s in &self.samples {
            let v = s.values.get(index).copied().unwrap_or(0);
            if v == 0 {
                continue;
            }
            for l in &s.labels {
                let (text, num) = match &l.value {
                    LabelValue::Str(t) => (t.clone(), None),
                    LabelValue::Num { value, unit } => (
                        unit.as_deref()
                            .map_or_else(|| value.to_string(), |u| units::format_value(*value, u)),
                        Some(*value),
                    ),
                };
                let e = keys
                    .entry(&l.key)
                    .or_default()
                    .entry(text)
                    .or_insert((0, num));
                e.0 = e.0.saturating_add(v);
            }
        }
        Ok(keys
            .into_iter()
            .map(|(key, values)| {
                let mut rows: Vec<(String, i64, Option<i64>)> =
                    values.into_iter().map(|(t, (v, n))| (t, v, n)).collect();
                if rows.iter().all(|r| r.2.is_some()) {
                    rows.sort_by_key(|r| r.2);
                } else if rows.iter().all(|r| as_duration(&r.0).is_some()) {
                    rows.sort_by(|a, b| {
                        let (x, y) = (as_duration(&a.0), as_duration(&b.0));
                        x.partial_cmp(&y)
                            .unwrap_or(std::cmp::Ordering::Equal)
                            .then_with(|| a.0.starts_with(">=").cmp(&b.0.starts_with(">=")))
                    });
                } else {
                    rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                }
                let total = rows.iter().map(|r| r.1).fold(0i64, i64::saturating_add);
                TagTable {
                    key: key.to_owned(),
                    rows: rows.into_iter().map(|(t, v, _)| (t, v)).collect(),
                    total,
                }
            })
            .collect())
    }
}

impl TagTable {
    /// As `go tool pprof -tags` prints it: the key and its total, then each value with its
    /// share, in `unit`.
    pub fn render(&self, unit: &str) -> String {
        let mut out = format!(
            " {}: Total {}\n",
            self.key,
            units::format_value(self.total, unit)
        );
        let cells: Vec<String> = self
            .rows
            .iter()
            .map(|r| units::format_value(r.1, unit))
            .collect();
        let w = cells.iter().map(|c| c.chars().count()).max().unwrap_or(0);
        for ((text, v), cell) in self.rows.iter().zip(&cells) {
            let _ = writeln!(
                out,
                "   {cell:>w$} ({:>6}): {text}",
                units::percent(*v, self.total)
            );
        }
        out
    }
}

impl Top {
    /// The rows as an aligned table with a header: flat, flat%, sum%, cum, cum%, name, as
    /// `go tool pprof -top` prints them, values in their units.
    pub fn render(&self, with_locations: bool) -> String {
        self.render_with(with_locations, false)
    }

    /// As [`Top::render`]; with `raw`, values are plain integers in the sample type's unit
    /// (`1700000000` rather than `1.70 s`), for scripts and for comparing with
    /// `go tool pprof -top -unit=ns` or `-unit=B`.
    pub fn render_with(&self, with_locations: bool, raw: bool) -> String {
        let fmt = |v: i64| {
            if raw {
                v.to_string()
            } else {
                units::format_value(v, &self.unit)
            }
        };
        let mut cells: Vec<[String; 5]> = Vec::with_capacity(self.rows.len());
        let mut sum = 0i64;
        for r in &self.rows {
            sum += r.flat;
            cells.push([
                fmt(r.flat),
                units::percent(r.flat, self.total),
                units::percent(sum, self.total),
                fmt(r.cum),
                units::percent(r.cum, self.total),
            ]);
        }
        let header = ["flat", "flat%", "sum%", "cum", "cum%"];
        let width: Vec<usize> = (0..5)
            .map(|c| {
                cells
                    .iter()
                    .map(|r| r[c].chars().count())
                    .chain(std::iter::once(header[c].len()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for (c, h) in header.iter().enumerate() {
            let _ = write!(out, "{h:>w$}  ", w = width[c]);
        }
        out.push_str(
            if self
                .rows
                .iter()
                .any(|r| r.name.contains(crate::PATH_SEPARATOR))
            {
                "span path\n"
            } else {
                "name\n"
            },
        );
        for (r, row) in self.rows.iter().zip(&cells) {
            for (c, cell) in row.iter().enumerate() {
                let _ = write!(out, "{cell:>w$}  ", w = width[c]);
            }
            out.push_str(&r.name);
            if with_locations && let Some(l) = &r.location {
                let _ = write!(out, "  ({l})");
            }
            out.push('\n');
        }
        if self.omitted > 0 {
            let _ = writeln!(out, "... and {} more rows", self.omitted);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::{Frame, FrameKind, Label, Profile, Sample, SampleType};

    #[test]
    fn tags_order_durations_numbers_and_text_naturally_and_skip_zeros() {
        let mut p = Profile::new(vec![SampleType::new("freed_objects", "count")]);
        let sample = |v: i64, labels: Vec<Label>| Sample {
            stack: vec![Frame::new(FrameKind::Code, "f", None, None)],
            values: vec![v],
            labels,
        };
        for (bucket, v) in [
            (">=10s", 1),
            ("<1ms", 50),
            ("<1us", 5),
            ("<10ms", 500),
            ("<1s", 0),
        ] {
            p.samples
                .push(sample(v, vec![Label::str("lifetime", bucket)]));
        }
        p.samples
            .push(sample(7, vec![Label::num("bytes", 4096, Some("bytes"))]));
        p.samples
            .push(sample(9, vec![Label::num("bytes", 512, Some("bytes"))]));
        p.samples.push(sample(3, vec![Label::str("thread", "b")]));
        p.samples.push(sample(8, vec![Label::str("thread", "a")]));
        let tags = p.tags(None).unwrap();
        let rows = |k: &str| -> Vec<(String, i64)> {
            tags.iter().find(|t| t.key == k).unwrap().rows.clone()
        };
        let names = |k: &str| rows(k).into_iter().map(|r| r.0).collect::<Vec<_>>();
        assert_eq!(names("lifetime"), ["<1us", "<1ms", "<10ms", ">=10s"]);
        assert_eq!(names("bytes"), ["512 B", "4.0 KiB"]);
        assert_eq!(rows("thread"), [("a".to_owned(), 8), ("b".to_owned(), 3)]);
        assert_eq!(
            tags.iter().find(|t| t.key == "lifetime").unwrap().total,
            556
        );
    }
}
