//! [`InFlight`]: what is running at one instant, as Go's goroutine dump shows it for goroutines:
//! per thread, the span path it is in; per span path, its open spans, oldest first (a request
//! stuck for 40 s comes first).

use crate::ModelError;
use crate::profile::{Label, LabelValue, Profile, Sample, SampleType};
use crate::snapshot::{Binary, SpanFrame, display_path, fields_of};
use crate::units::format_nanos;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

const AGE: &str = "age";
const BUSY: &str = "busy";
const THREAD: &str = "thread";
const TID: &str = "tid";
const SINCE: &str = "since";
const UNLISTED: &str = "unlisted";
const NANOSECONDS: &str = "nanoseconds";
/// The labels [`InFlight::profile`] adds; the others are span fields.
const OWN_LABELS: [&str; 6] = [AGE, BUSY, THREAD, TID, SINCE, UNLISTED];

/// Open spans listed per span path, oldest first; the others are counted.
pub const LISTED_PER_PATH: usize = 32;

/// What is running at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InFlight {
    /// When it was read.
    pub time: Option<SystemTime>,
    /// The program, when known (pprof viewers show its name).
    pub binary: Option<Binary>,
    /// The threads that ever entered a span, each with the span path it is in now.
    pub threads: Vec<ThreadNow>,
    /// Every span path with open spans, the path with the oldest first.
    pub paths: Vec<OpenPath>,
    /// Open spans the listing cannot see: those kept outside the span table (see the core's
    /// `Stats::spans_outside_table`), counted since the start, closed or not.
    pub unlisted: u64,
}

/// One thread now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ThreadNow {
    /// OS thread id.
    pub tid: u64,
    /// OS thread name (empty: unknown).
    pub name: String,
    /// The span path it is in, root first; empty: no span entered.
    pub frames: Vec<SpanFrame>,
    /// How long since it entered its innermost span, or left its last span (`None`: unknown).
    pub since: Option<Duration>,
}

/// The open spans of one span path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenPath {
    /// The path, root first.
    pub frames: Vec<SpanFrame>,
    /// Spans of this path open now.
    pub open: u64,
    /// The oldest of them, oldest first: at most [`LISTED_PER_PATH`].
    pub oldest: Vec<OpenSpan>,
}

/// One open span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenSpan {
    /// Time since it was created.
    pub age: Duration,
    /// Time it has been entered, exits so far (a span entered now counts from its last exit).
    pub busy: Duration,
}

impl OpenSpan {
    /// A span open for `age`, entered for `busy` of it.
    pub fn new(age: Duration, busy: Duration) -> Self {
        OpenSpan { age, busy }
    }
}

impl OpenPath {
    /// The open spans of the path `frames`.
    pub fn new(frames: Vec<SpanFrame>, open: u64, oldest: Vec<OpenSpan>) -> Self {
        OpenPath {
            frames,
            open,
            oldest,
        }
    }
}

impl ThreadNow {
    /// Thread `tid` named `name`, in the path `frames` for `since`.
    pub fn new(tid: u64, name: String, frames: Vec<SpanFrame>, since: Option<Duration>) -> Self {
        ThreadNow {
            tid,
            name,
            frames,
            since,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn duration(ns: i64) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

/// The span path of a sample of [`InFlight::profile`]: its span frames, label values other than
/// the listing's own on the innermost.
fn span_frames(s: &Sample) -> Vec<SpanFrame> {
    let mut frames: Vec<SpanFrame> = s
        .span_frames()
        .map(|f| {
            let (target, name) = f.function.rsplit_once("::").unwrap_or(("", &f.function));
            let mut frame = SpanFrame::new(target, name, f.file.as_deref(), f.line);
            frame.path_name = Arc::from(f.span_name());
            frame
        })
        .collect();
    if let Some(last) = frames.last_mut() {
        for l in &s.labels {
            if let (LabelValue::Str(v), false) = (&l.value, OWN_LABELS.contains(&l.key.as_str())) {
                last.fields
                    .push((Arc::from(l.key.as_str()), Arc::from(v.as_str())));
            }
        }
    }
    frames
}

/// A span path as the open-spans listing shows it: `request -> query {table=users}`, the
/// opted-in field values of its spans in braces; `(no span)` for no span at all.
pub fn display_path_with_fields(frames: &[SpanFrame]) -> String {
    if frames.is_empty() {
        "(no span)".to_owned()
    } else {
        format!("{}{}", display_path(frames), fields_of(frames))
    }
}

impl InFlight {
    /// Open spans in all.
    pub fn open(&self) -> u64 {
        self.paths.iter().map(|p| p.open).sum()
    }

    /// Go's goroutine profile, for spans: open spans counted (`open_spans/count`) under
    /// their span path's frames, so `go tool pprof -top` lists the paths with the most spans in
    /// flight. It holds the whole listing, and [`InFlight::from_profile`] reads it back:
    /// - each listed open span is a sample of 1 with labels `age` and `busy` (nanoseconds),
    ///   so `go tool pprof -tags` shows how old they are; the path's unlisted rest is one
    ///   sample without them;
    /// - each thread is a sample of 0 under the path it is in, with labels `thread`, `tid`
    ///   and `since` (nanoseconds, when known);
    /// - spans kept outside the span table are counted in the `unlisted` label of a sample
    ///   of 0 with no frames.
    pub fn profile(&self) -> Profile {
        let mut p = Profile::new(vec![SampleType::new("open_spans", "count")]);
        p.period_type = Some(SampleType::new("open_spans", "count"));
        p.time = self.time;
        p.binary = self.binary.clone();
        p.comments.push(
            "tracing-prof: spans open now, per span path (like Go's goroutine profile)".into(),
        );
        let stack = |frames: &[SpanFrame]| frames.iter().map(crate::build::span_frame).collect();
        for path in &self.paths {
            for s in &path.oldest {
                let mut labels = crate::build::field_labels(&path.frames);
                labels.push(Label::num(AGE, int(nanos(s.age)), Some(NANOSECONDS)));
                labels.push(Label::num(BUSY, int(nanos(s.busy)), Some(NANOSECONDS)));
                p.samples.push(Sample {
                    stack: stack(&path.frames),
                    values: vec![1],
                    labels,
                });
            }
            let rest = path.open.saturating_sub(path.oldest.len() as u64);
            if rest > 0 || path.oldest.is_empty() {
                p.samples.push(Sample {
                    stack: stack(&path.frames),
                    values: vec![int(rest)],
                    labels: crate::build::field_labels(&path.frames),
                });
            }
        }
        for t in &self.threads {
            let mut labels = crate::build::field_labels(&t.frames);
            labels.push(Label::str(THREAD, t.name.clone()));
            labels.push(Label::num(TID, int(t.tid), None));
            if let Some(since) = t.since {
                labels.push(Label::num(SINCE, int(nanos(since)), Some(NANOSECONDS)));
            }
            p.samples.push(Sample {
                stack: stack(&t.frames),
                values: vec![0],
                labels,
            });
        }
        if self.unlisted > 0 {
            p.samples.push(Sample {
                stack: Vec::new(),
                values: vec![0],
                labels: vec![Label::num(UNLISTED, int(self.unlisted), None)],
            });
        }
        p
    }

    /// Reads back what [`InFlight::profile`] wrote (from `/debug/pprof/goroutine`, say). Field
    /// values come back on each path's innermost span.
    ///
    /// # Errors
    /// [`ModelError::NotInFlight`] when `profile` is not an open-spans profile.
    pub fn from_profile(profile: &Profile) -> Result<InFlight, ModelError> {
        if profile.sample_types.len() != 1 || profile.sample_types[0].name != "open_spans" {
            return Err(ModelError::NotInFlight(
                profile
                    .sample_types
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
        let mut out = InFlight {
            time: profile.time,
            binary: profile.binary.clone(),
            ..InFlight::default()
        };
        let mut at: HashMap<Vec<SpanFrame>, usize> = HashMap::new();
        for s in &profile.samples {
            let num = |key: &str| {
                s.labels
                    .iter()
                    .find_map(|l| match (&l.value, l.key == key) {
                        (LabelValue::Num { value, .. }, true) => Some(*value),
                        _ => None,
                    })
            };
            if let Some(n) = num(UNLISTED) {
                out.unlisted += u64::try_from(n).unwrap_or(0);
                continue;
            }
            let frames = span_frames(s);
            if let Some(tid) = num(TID) {
                let since = num(SINCE).map(duration);
                let name = s.label(THREAD).unwrap_or("").to_owned();
                let tid = u64::try_from(tid).unwrap_or(0);
                out.threads.push(ThreadNow::new(tid, name, frames, since));
                continue;
            }
            let (age, busy) = (num(AGE), num(BUSY));
            let i = *at.entry(frames.clone()).or_insert_with(|| {
                out.paths.push(OpenPath::new(frames, 0, Vec::new()));
                out.paths.len() - 1
            });
            let path = &mut out.paths[i];
            path.open += u64::try_from(s.values.first().copied().unwrap_or(0)).unwrap_or(0);
            if let Some(age) = age {
                let busy = busy.map(duration).unwrap_or_default();
                path.oldest.push(OpenSpan::new(duration(age), busy));
            }
        }
        Ok(out)
    }

    /// Text as Go's `?debug=1` and `?debug=2` goroutine dumps are: with `every`, each listed
    /// open span on its own (oldest first); without, one entry per path with its count and the
    /// ages of its oldest spans. Then the threads and the span path each is in.
    pub fn text(&self, every: bool) -> String {
        let mut out = format!("open spans: total {}\n", self.open());
        if self.unlisted > 0 {
            let _ = writeln!(
                out,
                "({} spans since the start were kept outside the span table and are not listed)",
                self.unlisted
            );
        }
        out.push('\n');
        for path in &self.paths {
            if every {
                for s in &path.oldest {
                    let _ = writeln!(
                        out,
                        "span [open {}, busy {}]:\n{}\n",
                        format_nanos(nanos(s.age)),
                        format_nanos(nanos(s.busy)),
                        frames_text(&path.frames)
                    );
                }
                let more = path.open.saturating_sub(path.oldest.len() as u64);
                if more > 0 {
                    let _ = writeln!(
                        out,
                        "... and {more} younger open spans of {}\n",
                        display_path_with_fields(&path.frames)
                    );
                }
            } else {
                let ages: Vec<String> = path
                    .oldest
                    .iter()
                    .take(5)
                    .map(|s| format_nanos(nanos(s.age)))
                    .collect();
                let _ = writeln!(
                    out,
                    "{} open, oldest {}: {}\n{}\n",
                    path.open,
                    ages.join(", "),
                    display_path_with_fields(&path.frames),
                    frames_text(&path.frames)
                );
            }
        }
        let _ = writeln!(out, "threads: {}", self.threads.len());
        for t in &self.threads {
            let since = t
                .since
                .map(|d| format!(" for {}", format_nanos(nanos(d))))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "thread {} [{}]: {}{since}",
                t.tid,
                if t.name.is_empty() { "?" } else { &t.name },
                display_path_with_fields(&t.frames)
            );
        }
        out
    }
}

/// One line per span of `frames`, as Go's dumps list a goroutine's frames: `#\tname\tfile:line`.
fn frames_text(frames: &[SpanFrame]) -> String {
    let lines: Vec<String> = frames
        .iter()
        .rev()
        .map(|f| {
            let place = match (&f.file, f.line) {
                (Some(file), Some(line)) => format!("\t{file}:{line}"),
                (Some(file), None) => format!("\t{file}"),
                _ => String::new(),
            };
            format!(
                "#\t{}{}{place}",
                f.qualified_name(),
                fields_of(std::slice::from_ref(f))
            )
        })
        .collect();
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_flight() -> InFlight {
        let request = SpanFrame::new("app", "request", Some("src/main.rs"), Some(10));
        let mut query = SpanFrame::new("app", "query", Some("src/db.rs"), Some(7));
        query.fields.push(("table".into(), "users".into()));
        InFlight {
            time: None,
            binary: None,
            threads: vec![
                ThreadNow::new(
                    41,
                    "worker-1".into(),
                    vec![request.clone(), query.clone()],
                    Some(Duration::from_millis(3)),
                ),
                ThreadNow::new(42, "worker-2".into(), Vec::new(), None),
            ],
            paths: vec![
                OpenPath::new(
                    vec![request.clone(), query],
                    1,
                    vec![OpenSpan::new(
                        Duration::from_secs(40),
                        Duration::from_secs(2),
                    )],
                ),
                OpenPath::new(
                    vec![request],
                    3,
                    vec![
                        OpenSpan::new(Duration::from_secs(40), Duration::from_millis(5)),
                        OpenSpan::new(Duration::from_millis(20), Duration::ZERO),
                    ],
                ),
            ],
            unlisted: 0,
        }
    }

    #[test]
    fn text_lists_paths_oldest_first_and_each_thread() {
        let text = in_flight().text(false);
        assert_eq!(
            text,
            "open spans: total 4\n\n\
             1 open, oldest 40.00 s: request -> query {table=users}\n\
             #\tapp::query {table=users}\tsrc/db.rs:7\n\
             #\tapp::request\tsrc/main.rs:10\n\n\
             3 open, oldest 40.00 s, 20.0 ms: request\n\
             #\tapp::request\tsrc/main.rs:10\n\n\
             threads: 2\n\
             thread 41 [worker-1]: request -> query {table=users} for 3.0 ms\n\
             thread 42 [worker-2]: (no span)\n"
        );
        let every = in_flight().text(true);
        assert!(
            every.contains(
                "span [open 40.00 s, busy 5.0 ms]:\n#\tapp::request\tsrc/main.rs:10\n\n\
                 span [open 20.0 ms, busy 0 ns]:\n#\tapp::request\tsrc/main.rs:10\n\n\
                 ... and 1 younger open spans of request\n"
            ),
            "{every}"
        );
    }

    #[test]
    fn the_profile_counts_open_spans_per_path_and_reads_back_whole() {
        let mut now = in_flight();
        now.unlisted = 7;
        let p = now.profile();
        assert_eq!(p.total(0), 4);
        let back = Profile::decode(&p.encode()).unwrap();
        let mut per_path: Vec<(String, i64)> = Vec::new();
        for s in &back.samples {
            match per_path.iter_mut().find(|(p, _)| *p == s.span_path()) {
                Some((_, n)) => *n += s.values[0],
                None => per_path.push((s.span_path(), s.values[0])),
            }
        }
        assert_eq!(
            per_path,
            [
                ("request -> query".to_owned(), 1),
                ("request".to_owned(), 3),
                ("".to_owned(), 0),
            ]
        );
        let read = InFlight::from_profile(&back).unwrap();
        assert_eq!(read, now);
        assert_eq!(read.text(true), now.text(true));
        let not = Profile::new(vec![SampleType::new("alloc_space", "bytes")]);
        assert!(matches!(
            InFlight::from_profile(&not),
            Err(ModelError::NotInFlight(t)) if t == "alloc_space"
        ));
    }
}
