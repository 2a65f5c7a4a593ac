//! The drill-downs' code stacks: the heaviest stacks of a span path over the table's window,
//! and the function that blocked in its long polls.

use super::{History, merged, path_name, seconds};
use std::collections::HashMap;
use tracing_prof_model::{FrameKind, Profile, ProfileKind, Sample};

/// Whether a code frame is the application's own: not the standard library's, not
/// `tracing`'s or the profiler's machinery, not a C library's (no Rust path).
fn is_application(function: &str) -> bool {
    const NOT: [&str; 8] = [
        "std::",
        "core::",
        "alloc::",
        "__rustc::",
        "tracing::",
        "tracing_core::",
        "tracing_subscriber::",
        "tracing_prof",
    ];
    let name = function.trim_start_matches('<');
    name.contains("::") && !NOT.iter().any(|p| name.starts_with(p))
}

/// The function that blocked in `path`'s long polls: of the CPU samples taken in them (in the
/// path itself: a child span's long polls are its own), the innermost frame of the crate the
/// span belongs to (its target's first segment), else of the application's code, the one with
/// the most CPU, with `file:line`. A sample in the profiler's own `on_close`, in
/// `std::thread::sleep` or in a library the code called is charged to the code that called it.
pub(super) fn blocker(p: &Profile, path: &str) -> Option<String> {
    let k = p.sample_type_index("cpu")?;
    let mut by_frame: HashMap<String, i64> = HashMap::new();
    for s in p
        .samples
        .iter()
        .filter(|s| in_long_poll(s) && s.values[k] > 0 && path_name(s) == path)
    {
        let code: Vec<&tracing_prof_model::Frame> = s
            .stack
            .iter()
            .rev()
            .filter(|f| f.kind == FrameKind::Code)
            .collect();
        let Some(&leaf) = code.first() else { continue };
        // The span's crate: `app` of the innermost span frame `app::handlers::get`.
        let krate = s
            .span_frames()
            .last()
            .and_then(|f| f.function.split("::").next())
            .filter(|k| !k.is_empty() && !k.starts_with('('))
            .map(|k| format!("{k}::"));
        let own = |f: &&&tracing_prof_model::Frame| {
            krate
                .as_deref()
                .is_some_and(|k| f.function.trim_start_matches('<').starts_with(k))
        };
        let frame = code
            .iter()
            .find(own)
            .or_else(|| code.iter().find(|f| is_application(&f.function)))
            .copied()
            .unwrap_or(leaf);
        *by_frame.entry(frame.display_with_location()).or_default() += s.values[k];
    }
    by_frame
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
        .map(|(f, _)| f)
}

/// Whether a CPU sample was taken in a long poll.
pub(crate) fn in_long_poll(s: &Sample) -> bool {
    s.label("long_poll") == Some("true")
}

/// One code stack of a drill-down: its share and its code frames, innermost first.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Stack {
    /// Value per second in the sample type's unit (CPU: cores; memory: bytes).
    pub(crate) rate: f64,
    /// The sample points the value stands on (value over the sampling period): an estimate's
    /// relative error is about `1 / sqrt(points)`. 0 where the profile says no period.
    pub(crate) points: u64,
    /// Code frames, innermost first, with `file:line` where known.
    pub(crate) frames: Vec<String>,
}

/// The profiles of one kind over the table's window at a cursor, merged once for every
/// [`Window::stacks`] asked of them.
#[derive(Debug)]
pub(crate) struct Window {
    profile: Profile,
    secs: f64,
}

impl Window {
    /// The `kind` profiles of the frames the tables at `cursor` sum; `None` when none has one.
    pub(crate) fn of(history: &History, cursor: usize, kind: ProfileKind) -> Option<Window> {
        let frames = history.table(cursor);
        Some(Window {
            profile: merged(&frames, kind)?,
            secs: seconds(&frames),
        })
    }

    /// Where the CPU samples of `path`'s own long polls caught the application (see
    /// [`blocker`]).
    pub(crate) fn blocker(&self, path: &str) -> Option<String> {
        blocker(&self.profile, path)
    }

    /// The heaviest code stacks (sample type `sample_type`) under span path `path` (the path
    /// itself and the paths below it) among the samples `keep` keeps, at most `limit`; `None`
    /// when the profile has no such sample type.
    pub(crate) fn stacks(
        &self,
        sample_type: &str,
        path: &str,
        limit: usize,
        keep: impl Fn(&Sample) -> bool,
    ) -> Option<Vec<Stack>> {
        stacks(&self.profile, self.secs, sample_type, path, limit, keep)
    }
}

fn stacks(
    p: &Profile,
    secs: f64,
    sample_type: &str,
    path: &str,
    limit: usize,
    keep: impl Fn(&Sample) -> bool,
) -> Option<Vec<Stack>> {
    let k = p.sample_type_index(sample_type)?;
    let below = format!("{path} -> ");
    // Samples of one code stack differ in labels (heap samples carry their mean size): one
    // entry per code stack as shown.
    let mut by_stack: HashMap<Vec<String>, i64> = HashMap::new();
    for s in &p.samples {
        let name = path_name(s);
        if s.values[k] <= 0 || (name != path && !name.starts_with(&below)) || !keep(s) {
            continue;
        }
        let code: Vec<String> = s
            .stack
            .iter()
            .rev()
            .filter(|f| f.kind == FrameKind::Code)
            .map(|f| f.display_with_location())
            .collect();
        if !code.is_empty() {
            *by_stack.entry(code).or_default() += s.values[k];
        }
    }
    let period = u64::try_from(p.period).unwrap_or(0);
    let mut out: Vec<Stack> = by_stack
        .into_iter()
        .map(|(frames, v)| Stack {
            rate: v as f64 / secs,
            points: (v.max(0) as u64).checked_div(period).unwrap_or(0),
            frames,
        })
        .collect();
    out.sort_by(|a, b| {
        b.rate
            .partial_cmp(&a.rate)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.frames.cmp(&b.frames))
    });
    out.truncate(limit);
    Some(out)
}
