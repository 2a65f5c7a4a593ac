//! The tables at a cursor: per span path, per function, per thread, and a path's long polls
//! and intervals, summed over the frames of the table's window.

use super::{History, TREND_TICKS, Tick, merged, num_label, path_name, per_path, seconds};
use std::collections::HashMap;
use tracing_prof_model::{FrameKind, Grouping, ProfileKind, SPAN_MARK, Sample};

/// One span path's row.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PathRow {
    pub(crate) name: String,
    /// Spans closed per second.
    pub(crate) calls: f64,
    /// CPU in cores, its own (not its children's); `None` when nothing measures CPU.
    pub(crate) cpu: Option<f64>,
    /// Bytes allocated per second.
    pub(crate) alloc: f64,
    /// Bytes in use at the cursor.
    pub(crate) inuse: i64,
    /// A suspected leak.
    pub(crate) leak: bool,
    /// Long polls in the table's window.
    pub(crate) long_polls: i64,
    /// The 99th percentile of its spans' durations (creation to close) in the table's
    /// window, in nanoseconds; `None` when none closed there.
    pub(crate) p99: Option<u64>,
    /// The share of its spans closed in the window that recorded an ERROR event.
    pub(crate) errors: Option<f64>,
    /// In use over the last [`TREND_TICKS`] ticks, oldest first.
    pub(crate) trend: Vec<i64>,
}

/// The span path rows at `cursor`, unsorted.
pub(crate) fn path_rows(history: &History, cursor: usize) -> Vec<PathRow> {
    let frames = history.table(cursor);
    let secs = seconds(&frames);
    let mut rows: HashMap<String, PathRow> = HashMap::new();
    fn entry<'a>(rows: &'a mut HashMap<String, PathRow>, name: &str) -> &'a mut PathRow {
        rows.entry(name.to_owned()).or_insert_with(|| PathRow {
            name: name.to_owned(),
            ..PathRow::default()
        })
    }

    let spans = merged(&frames, ProfileKind::Spans);
    let cpu_sampled = merged(&frames, ProfileKind::Cpu);
    if let Some(spans) = &spans {
        for (name, n) in per_path(spans, "spans") {
            entry(&mut rows, &name).calls = n as f64 / secs;
        }
        for s in &spans.samples {
            if let Some(n) = num_label(s, "long_polls") {
                entry(&mut rows, &path_name(s)).long_polls += n;
            }
        }
        // Errors are counted where durations are, at a span's close.
        let errors = per_path(spans, "errors");
        for (name, buckets) in spans.latencies() {
            let closed: u64 = buckets.iter().sum();
            let row = entry(&mut rows, &name);
            row.p99 = tracing_prof_model::duration_quantile(&buckets, 0.99);
            if closed > 0 {
                let n = errors.get(&name).copied().unwrap_or(0);
                row.errors = Some(n as f64 / closed as f64);
            }
        }
    }
    let cpu = match (&cpu_sampled, &spans) {
        (Some(p), _) => Some(per_path(p, "cpu")),
        (None, Some(p)) if p.sample_type_index("cpu").is_some() => Some(per_path(p, "cpu")),
        _ => None,
    };
    if let Some(cpu) = &cpu {
        for (name, ns) in cpu {
            entry(&mut rows, name).cpu = Some(*ns as f64 / 1e9 / secs);
        }
    }
    if let Some(memory) = merged(&frames, ProfileKind::SpanMemory) {
        for (name, n) in per_path(&memory, "alloc_space") {
            entry(&mut rows, &name).alloc = n as f64 / secs;
        }
    }
    if let Some(last) = frames
        .last()
        .and_then(|f| f.profile(ProfileKind::SpanMemory))
    {
        for s in &last.samples {
            if s.label("leak") == Some("suspected") {
                entry(&mut rows, &path_name(s)).leak = true;
            }
        }
    }
    if let Some(tick) = history.tick(cursor) {
        for (name, n) in &tick.path_inuse {
            entry(&mut rows, name).inuse = *n;
        }
    }
    let from = (cursor + 1).saturating_sub(TREND_TICKS);
    let ticks: Vec<&Tick> = history.ticks(from, cursor + 1).map(|(_, t)| t).collect();
    let mut out: Vec<PathRow> = rows.into_values().collect();
    for r in &mut out {
        if cpu.is_some() && r.cpu.is_none() {
            r.cpu = Some(0.0);
        }
        r.trend = ticks
            .iter()
            .map(|t| t.path_inuse.get(&r.name).copied().unwrap_or(0))
            .collect();
    }
    out
}

/// One function's CPU.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FunctionRow {
    pub(crate) name: String,
    pub(crate) location: Option<String>,
    /// CPU in cores where it is the leaf.
    pub(crate) flat: f64,
    /// CPU in cores where it is on the stack.
    pub(crate) cum: f64,
}

/// The functions' CPU at `cursor` from the sampled CPU stacks (code frames only); `None`
/// without CPU sampling.
pub(crate) fn function_rows(history: &History, cursor: usize) -> Option<Vec<FunctionRow>> {
    let frames = history.table(cursor);
    let cpu = merged(&frames, ProfileKind::Cpu)?;
    let secs = seconds(&frames);
    let top = cpu.top(Some("cpu"), Grouping::Function, false, 0).ok()?;
    Some(
        top.rows
            .into_iter()
            .filter(|r| !r.name.ends_with(SPAN_MARK) && !r.name.starts_with('('))
            .map(|r| FunctionRow {
                name: r.name,
                location: r.location,
                flat: r.flat as f64 / 1e9 / secs,
                cum: r.cum as f64 / 1e9 / secs,
            })
            .collect(),
    )
}

/// One thread's memory.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ThreadRow {
    pub(crate) name: String,
    /// Bytes in use at the cursor.
    pub(crate) inuse: i64,
    /// Bytes allocated per second.
    pub(crate) alloc: f64,
    /// Allocations per second.
    pub(crate) allocs: f64,
}

/// Memory per thread at `cursor`.
pub(crate) fn thread_rows(history: &History, cursor: usize) -> Vec<ThreadRow> {
    let frames = history.table(cursor);
    let secs = seconds(&frames);
    let mut rows: Vec<ThreadRow> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    let name = |s: &Sample| {
        s.stack
            .iter()
            .find(|f| f.kind == FrameKind::Thread)
            .map_or_else(|| "(thread)".to_owned(), |f| f.function.to_string())
    };
    // One row per thread: a thread that exited within the window is one row, named as the
    // last frame names it (`thread NAME [INDEX, exited]`), not two.
    let mut row = |rows: &mut Vec<ThreadRow>, n: String| -> usize {
        let key = n.replace(", exited]", "]");
        *at.entry(key).or_insert_with(|| {
            rows.push(ThreadRow {
                name: n,
                inuse: 0,
                alloc: 0.0,
                allocs: 0.0,
            });
            rows.len() - 1
        })
    };
    if let Some(p) = merged(&frames, ProfileKind::Threads) {
        let (space, objects) = (
            p.sample_type_index("alloc_space"),
            p.sample_type_index("alloc_objects"),
        );
        for s in &p.samples {
            let i = row(&mut rows, name(s));
            if let Some(k) = space {
                rows[i].alloc += s.values[k] as f64 / secs;
            }
            if let Some(k) = objects {
                rows[i].allocs += s.values[k] as f64 / secs;
            }
        }
    }
    if let Some(p) = frames.last().and_then(|f| f.profile(ProfileKind::Threads))
        && let Some(k) = p.sample_type_index("inuse_space")
    {
        for s in &p.samples {
            let i = row(&mut rows, name(s));
            rows[i].inuse = s.values[k];
            rows[i].name = name(s);
        }
    }
    rows
}

/// Long polls per span path in the table's window, most first.
pub(crate) fn long_polls(history: &History, cursor: usize) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = path_rows(history, cursor)
        .into_iter()
        .filter(|r| r.long_polls > 0)
        .map(|r| (r.name, r.long_polls))
        .collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// The latency of span path `path` itself in the table's window, from the `spans` profile's
/// histogram: p50, p90 and p99 in nanoseconds, spans closed, and those that recorded an
/// ERROR event; `None` when no span of it closed there (or the service predates the
/// histogram).
pub(crate) fn latency(
    history: &History,
    cursor: usize,
    path: &str,
) -> Option<([u64; 3], u64, u64)> {
    let frames = history.table(cursor);
    let spans = merged(&frames, ProfileKind::Spans)?;
    let (_, buckets) = spans
        .latencies()
        .into_iter()
        .find(|(name, _)| name == path)?;
    let q = |q: f64| tracing_prof_model::duration_quantile(&buckets, q);
    let quantiles = [q(0.5)?, q(0.9)?, q(0.99)?];
    let errors = spans.sample_type_index("errors").map_or(0, |k| {
        spans
            .samples
            .iter()
            .filter(|s| path_name(s) == path)
            .map(|s| u64::try_from(s.values[k]).unwrap_or(0))
            .sum()
    });
    Some((quantiles, buckets.iter().sum(), errors))
}

/// The enter-to-exit intervals of span path `path` itself (not the paths below) in the
/// table's window, per length bucket (`<1us` to `>=10s`, shortest first): the buckets with any.
pub(crate) fn intervals(history: &History, cursor: usize, path: &str) -> Vec<(String, i64)> {
    let frames = history.table(cursor);
    let Some(spans) = merged(&frames, ProfileKind::Spans) else {
        return Vec::new();
    };
    let Some(k) = spans.sample_type_index("intervals") else {
        return Vec::new();
    };
    let mut out: Vec<(String, i64)> = tracing_prof_model::LIFETIME_BUCKET_NAMES
        .iter()
        .map(|b| ((*b).to_owned(), 0))
        .collect();
    for s in spans.samples.iter().filter(|s| path_name(s) == path) {
        if let Some(row) = s
            .label("interval")
            .and_then(|b| out.iter_mut().find(|(name, _)| name == b))
        {
            row.1 += s.values[k];
        }
    }
    out.retain(|(_, n)| *n > 0);
    out
}
