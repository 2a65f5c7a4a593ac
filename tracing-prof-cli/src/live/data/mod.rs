//! What the views show, computed from the frames received: per span path, per function, per
//! thread, and over time. Tables sum the frames of the last [`TABLE_FRAMES`] seconds up to the
//! cursor and show rates per second; in-use memory is a level, taken from the cursor's frame.
//!
//! Frames are kept as they arrived (gzip'd, about 13 KiB each for the example) and decoded only
//! where the tables look: the last [`TABLE_FRAMES`] and those up to the cursor. Decoded, a
//! frame of the example takes about 200 KiB.

mod stacks;
mod tables;

pub(crate) use stacks::{Stack, Window, in_long_poll};
pub(crate) use tables::{
    PathRow, function_rows, intervals, latency, long_polls, path_rows, thread_rows,
};

use std::collections::{HashMap, VecDeque};
use std::time::SystemTime;
use tracing_prof_model::{Grouping, LabelValue, LiveFrame, Profile, ProfileKind, Sample};

/// Frames whose profiles are kept for the tables and drill-downs (five minutes at one a second).
pub(crate) const KEPT_FRAMES: usize = 300;
/// Per-second totals kept for the chart and the trends (an hour at one a second).
pub(crate) const KEPT_TICKS: usize = 3600;
/// Frames the tables sum (ten seconds at one a second).
pub(crate) const TABLE_FRAMES: usize = 10;
/// Ticks in a row's trend.
pub(crate) const TREND_TICKS: usize = 20;

/// Rows without a span: the samples outside every span.
const NO_SPAN: &str = "(no span path)";

/// One frame's totals, kept longer than the frame.
#[derive(Clone, Debug)]
pub(crate) struct Tick {
    /// The window's end.
    pub(crate) time: SystemTime,
    /// Its length in seconds.
    pub(crate) seconds: f64,
    /// Whether the profiler was paused.
    pub(crate) paused: bool,
    /// Memory in use at the end, bytes (exact, all span paths).
    pub(crate) inuse: i64,
    /// CPU time in the window, nanoseconds: sampled, or measured per span; `None` when neither.
    pub(crate) cpu_ns: Option<i64>,
    /// Bytes allocated in the window.
    pub(crate) alloc_bytes: i64,
    /// In use per span path at the end.
    pub(crate) path_inuse: HashMap<String, i64>,
}

impl Tick {
    fn of(frame: &LiveFrame) -> Tick {
        let memory = frame.profile(ProfileKind::SpanMemory);
        let total = |p: Option<&Profile>, name: &str| {
            p.and_then(|p| Some(p.total(p.sample_type_index(name)?)))
        };
        let mut path_inuse = HashMap::new();
        if let Some(p) = memory
            && let Some(i) = p.sample_type_index("inuse_space")
        {
            for s in &p.samples {
                *path_inuse.entry(path_name(s)).or_default() += s.values[i];
            }
        }
        Tick {
            time: frame.time,
            seconds: frame.duration.as_secs_f64(),
            paused: frame.paused,
            inuse: total(memory, "inuse_space").unwrap_or(0),
            cpu_ns: total(frame.profile(ProfileKind::Cpu), "cpu")
                .or_else(|| total(frame.profile(ProfileKind::Spans), "cpu")),
            alloc_bytes: total(memory, "alloc_space").unwrap_or(0),
            path_inuse,
        }
    }

    /// CPU in cores (1.0: one core busy all the window).
    pub(crate) fn cores(&self) -> Option<f64> {
        self.cpu_ns
            .map(|ns| ns as f64 / 1e9 / self.seconds.max(1e-3))
    }
}

/// The span path of a sample as the tables name it.
pub(super) fn path_name(s: &Sample) -> String {
    let p = s.span_path();
    if p.is_empty() { NO_SPAN.to_owned() } else { p }
}

/// A frame as it arrived, and decoded while the tables may look at it.
#[derive(Debug)]
struct Kept {
    bytes: Box<[u8]>,
    frame: Option<LiveFrame>,
}

/// Frames and ticks received, numbered from 0 in order of arrival.
#[derive(Debug, Default)]
pub(crate) struct History {
    ticks: VecDeque<Tick>,
    frames: VecDeque<Kept>,
    /// The number of the first tick kept.
    first_tick: usize,
    /// The number of the first frame kept.
    first_frame: usize,
}

impl History {
    /// Adds the next frame, `bytes` as it arrived and `frame` decoded from them; the oldest go
    /// past [`KEPT_FRAMES`] and [`KEPT_TICKS`]. Frames older than the last [`TABLE_FRAMES`]
    /// are kept as bytes only, unless [`History::focus`] asks for them.
    pub(crate) fn push(&mut self, bytes: Vec<u8>, frame: LiveFrame) {
        self.ticks.push_back(Tick::of(&frame));
        self.frames.push_back(Kept {
            bytes: bytes.into_boxed_slice(),
            frame: Some(frame),
        });
        if self.ticks.len() > KEPT_TICKS {
            self.ticks.pop_front();
            self.first_tick += 1;
        }
        if self.frames.len() > KEPT_FRAMES {
            self.frames.pop_front();
            self.first_frame += 1;
        }
        if let Some(k) = self.frames.len().checked_sub(TABLE_FRAMES + 1) {
            // Left the live edge's table; `focus` decodes it again if the cursor goes there.
            self.frames[k].frame = None;
        }
    }

    /// Decodes the frames the tables at `cursor` use, and only those and the live edge's.
    pub(crate) fn focus(&mut self, cursor: usize) {
        let end = self.end();
        let wanted = |n: usize| n + TABLE_FRAMES > cursor && n <= cursor || n + TABLE_FRAMES >= end;
        let first = self.first_frame;
        for (i, k) in self.frames.iter_mut().enumerate() {
            match (wanted(first + i), k.frame.is_some()) {
                (true, false) => k.frame = LiveFrame::decode(&k.bytes).ok(),
                (false, true) => k.frame = None,
                _ => {}
            }
        }
    }

    /// Frames decoded now.
    #[cfg(test)]
    fn decoded(&self) -> usize {
        self.frames.iter().filter(|k| k.frame.is_some()).count()
    }

    /// The number of the next frame (one past the last).
    pub(crate) fn end(&self) -> usize {
        self.first_tick + self.ticks.len()
    }

    /// The first tick number still kept.
    pub(crate) fn first(&self) -> usize {
        self.first_tick
    }

    /// Tick `n`, when kept.
    pub(crate) fn tick(&self, n: usize) -> Option<&Tick> {
        self.ticks.get(n.checked_sub(self.first_tick)?)
    }

    /// Ticks `from..to` that are kept, with their numbers.
    pub(crate) fn ticks(&self, from: usize, to: usize) -> impl Iterator<Item = (usize, &Tick)> {
        (from.max(self.first_tick)..to.min(self.end())).filter_map(|n| Some((n, self.tick(n)?)))
    }

    /// Frame `n`, when kept and decoded (see [`History::focus`]).
    pub(crate) fn frame(&self, n: usize) -> Option<&LiveFrame> {
        self.frames
            .get(n.checked_sub(self.first_frame)?)?
            .frame
            .as_ref()
    }

    /// The kept frames of the [`TABLE_FRAMES`] up to and including `cursor`, oldest first.
    pub(crate) fn table(&self, cursor: usize) -> Vec<&LiveFrame> {
        let from = (cursor + 1).saturating_sub(TABLE_FRAMES);
        (from..=cursor).filter_map(|n| self.frame(n)).collect()
    }
}

/// The profiles of `kind` in `frames` as one (samples of all, sample types of the first; frames
/// whose profile has other types are left out).
pub(crate) fn merged(frames: &[&LiveFrame], kind: ProfileKind) -> Option<Profile> {
    let mut out: Option<Profile> = None;
    for p in frames.iter().filter_map(|f| f.profile(kind)) {
        match &mut out {
            None => out = Some(p.clone()),
            Some(o) if o.sample_types == p.sample_types => {
                o.samples.extend(p.samples.iter().cloned());
            }
            Some(_) => {}
        }
    }
    out
}

/// Seconds the frames cover.
pub(crate) fn seconds(frames: &[&LiveFrame]) -> f64 {
    frames
        .iter()
        .map(|f| f.duration.as_secs_f64())
        .sum::<f64>()
        .max(1e-3)
}

/// Flat value of `sample_type` per span path.
pub(super) fn per_path(p: &Profile, sample_type: &str) -> HashMap<String, i64> {
    let Ok(top) = p.top(Some(sample_type), Grouping::SpanPath, false, 0) else {
        return HashMap::new();
    };
    top.rows
        .into_iter()
        .filter(|r| r.flat != 0)
        .map(|r| (r.name, r.flat))
        .collect()
}

pub(super) fn num_label(s: &Sample, key: &str) -> Option<i64> {
    s.labels.iter().find_map(|l| match &l.value {
        LabelValue::Num { value, .. } if l.key == key => Some(*value),
        _ => None,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::stacks::blocker;
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};
    use tracing_prof_model::{
        CodeFrame, CpuSource, CpuStack, FrameKind, InFlight, OpenPath, OpenSpan, PathKind,
        PathProfile, Snapshot, SpanFrame, StackProfile, ThreadNow, ThreadProfile,
    };

    fn request() -> Vec<SpanFrame> {
        vec![SpanFrame::new(
            "app",
            "request",
            Some("src/main.rs"),
            Some(3),
        )]
    }

    fn query() -> Vec<SpanFrame> {
        let mut f = request();
        let mut q = SpanFrame::new("app", "db_query", Some("src/db.rs"), Some(9));
        q.fields.push(("table".into(), "users".into()));
        f.push(q);
        f
    }

    /// Frame `i` of a deterministic service, encoded as the endpoint sends it: each second, 100 requests and 50 queries;
    /// queries take 0.5 cores in `parse_row`, requests 0.25 in `render`; queries allocate
    /// 1 MiB and keep `i` MiB (a leak), requests allocate 2 MiB and keep none.
    fn frame_bytes(i: u64) -> Vec<u8> {
        frame_bytes_with(i, true)
    }

    /// [`frame_bytes`], the worker thread alive or exited at the frame's end.
    fn frame_bytes_with(i: u64, worker_alive: bool) -> Vec<u8> {
        let t = |s: u64| UNIX_EPOCH + Duration::from_secs(1_000 + s);
        let mut base = Snapshot::new(t(i), Duration::from_secs(i));
        let mut end = Snapshot::new(t(i + 1), Duration::from_secs(i + 1));
        for s in [&mut base, &mut end] {
            s.cpu = CpuSource::Sampled { hz: 100 };
            s.sample_rate = 1;
        }
        let mut r = PathProfile::new(PathKind::Span, request());
        r.time.spans = 100;
        // 100 polls a second: 90 under 1 ms, 10 under 10 ms.
        r.time.intervals[3] = 90;
        r.time.intervals[4] = 10;
        // 100 spans of 1.1 ms a frame, 2 of them with an ERROR.
        r.time.durations[tracing_prof_model::duration_bucket(1_100_000)] = 100;
        r.time.errors = 2;
        r.time.long_polls = u64::from(i == 1);
        r.memory.alloc_bytes = 2 << 20;
        r.memory.alloc_objects = 200;
        let mut q = PathProfile::new(PathKind::Span, query());
        q.time.spans = 50;
        q.memory.alloc_bytes = 1 << 20;
        q.memory.alloc_objects = 50;
        q.memory.inuse_bytes = i << 20;
        end.paths = vec![r, q];
        if i >= 3 {
            end.suspected_leaks
                .push(tracing_prof_model::SuspectedLeak::new(
                    PathKind::Span,
                    query(),
                    Vec::new(),
                    i << 20,
                    3 << 20,
                    3,
                ));
        }
        let code = |f: &str, line: u32| CodeFrame {
            file: Some("src/db.rs".into()),
            line: Some(line),
            ..CodeFrame::named(f)
        };
        let mut c1 = CpuStack::new(
            PathKind::Span,
            query(),
            vec![
                CodeFrame {
                    // A long location, as a C library's inline header has.
                    file: Some(
                        "/build/jemalloc/include/jemalloc/internal/jemalloc_internal_inlines_c.h"
                            .into(),
                    ),
                    ..code("app::run_query", 20)
                },
                code("app::parse_row", 31),
            ],
        );
        c1.samples = 50;
        c1.cpu_ns = 500_000_000;
        let mut c2 = CpuStack::new(PathKind::Span, request(), vec![code("app::render", 44)]);
        c2.samples = 25;
        c2.cpu_ns = 250_000_000;
        // Frame 1's long poll was render's.
        c2.long_poll = i == 1;
        end.cpu_stacks = vec![c1, c2];
        let mut h = StackProfile::new(PathKind::Span, query(), vec![code("app::load", 12)]);
        h.samples = 10;
        h.sampled_bytes = 1 << 20;
        h.memory.alloc_bytes = 1 << 20;
        h.memory.alloc_objects = 50;
        end.stacks = vec![h];
        let mut w = ThreadProfile::new(1, 7, "worker".into(), worker_alive);
        w.memory.alloc_bytes = 3 << 20;
        w.memory.alloc_objects = 250;
        w.memory.inuse_bytes = i << 20;
        end.threads = vec![w];
        let mut now = InFlight::default();
        now.time = Some(end.time);
        now.threads = vec![ThreadNow::new(
            7,
            "worker".into(),
            query(),
            Some(Duration::from_millis(2)),
        )];
        now.paths = vec![OpenPath::new(
            request(),
            3,
            vec![OpenSpan::new(Duration::from_secs(40), Duration::ZERO)],
        )];
        LiveFrame::new(&end.window_since(&base), now, i == 5).encode()
    }

    /// Frame `i` as the endpoint sends it, and decoded from that.
    pub(crate) fn frame(i: u64) -> (Vec<u8>, LiveFrame) {
        let bytes = frame_bytes(i);
        let f = LiveFrame::decode(&bytes).unwrap();
        (bytes, f)
    }

    pub(crate) fn history(n: u64) -> History {
        let mut h = History::default();
        for i in 0..n {
            let (bytes, f) = frame(i);
            h.push(bytes, f);
        }
        h
    }

    #[test]
    fn path_rows_are_rates_over_the_table_window_and_levels_at_the_cursor() {
        let mut h = history(12);
        let mut rows = path_rows(&h, 11);
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["request", "request -> db_query"]);
        let (r, q) = (&rows[0], &rows[1]);
        assert_eq!((r.calls, q.calls), (100.0, 50.0));
        assert_eq!((r.cpu, q.cpu), (Some(0.25), Some(0.5)));
        assert_eq!((r.alloc, q.alloc), (2097152.0, 1048576.0));
        assert_eq!((r.inuse, q.inuse), (0, 11 << 20));
        assert_eq!((r.leak, q.leak), (false, true));
        // Every request in (1 ms, 1.25 ms], 2 of each frame's 100 with an ERROR; the query's
        // spans carry no histogram in these frames.
        assert_eq!((r.p99, q.p99), (Some(1_247_500), None));
        assert_eq!((r.errors, q.errors), (Some(0.02), None));
        assert_eq!(
            r.long_polls, 0,
            "the long poll of frame 1 is out of the window"
        );
        assert_eq!(q.trend, (0..12).map(|i| i << 20).collect::<Vec<i64>>());
        h.focus(5);
        let at5 = path_rows(&h, 5);
        let r5 = at5.iter().find(|r| r.name == "request").unwrap();
        assert_eq!(r5.long_polls, 1);
        assert_eq!(long_polls(&h, 5), [("request".to_owned(), 1)]);
    }

    /// A long poll is blamed on the application's code of the path itself: not on the
    /// profiler's own `on_close` (the innermost frame of some samples), not on a child span's
    /// function, whose long polls are its own.
    #[test]
    fn long_polls_are_blamed_on_the_application_code_of_the_path() {
        use tracing_prof_model::{Frame, Label, Sample, SampleType};
        let code =
            |name: &str| Frame::new(FrameKind::Code, name, Some("src/main.rs".into()), Some(7));
        let span = |name: &str| Frame::new(FrameKind::Span, format!("app::{name}"), None, None);
        let sample = |spans: &[&str], code: Vec<Frame>, cpu: i64| Sample {
            stack: spans.iter().map(|s| span(s)).chain(code).collect(),
            values: vec![cpu / 10_000_000, cpu],
            labels: vec![
                Label::str("span_path", spans.join(tracing_prof_model::PATH_SEPARATOR)),
                Label::str("long_poll", "true"),
            ],
        };
        let mut p = Profile::new(vec![
            SampleType::new("samples", "count"),
            SampleType::new("cpu", "nanoseconds"),
        ]);
        p.samples = vec![
            // 30 ms in the profiler's on_close, called from the handler.
            sample(
                &["request"],
                vec![
                    code("app::handler"),
                    code(
                        "<tracing_prof_core::layer::ProfileLayer as tracing_subscriber::layer::Layer<S>>::on_close",
                    ),
                ],
                30_000_000,
            ),
            // 20 ms sleeping, called from the handler.
            sample(
                &["request"],
                vec![
                    code("app::handler"),
                    code("std::thread::sleep"),
                    code("nanosleep"),
                ],
                20_000_000,
            ),
            // 40 ms in a child span's own long poll.
            sample(
                &["request", "query"],
                vec![code("app::child_work")],
                40_000_000,
            ),
            // 10 ms in another function of the path.
            sample(&["request"], vec![code("app::render")], 10_000_000),
            // 25 ms waking a thread in a library the handler called.
            sample(
                &["request"],
                vec![
                    code("app::handler"),
                    code("tokio::sync::notify::Notify::notify_one"),
                    code(
                        "<parking_lot_core::thread_parker::imp::UnparkHandle as UnparkHandleT>::unpark",
                    ),
                ],
                25_000_000,
            ),
        ];
        assert_eq!(
            blocker(&p, "request").as_deref(),
            Some("app::handler (src/main.rs:7)")
        );
        assert_eq!(
            blocker(&p, "request -> query").as_deref(),
            Some("app::child_work (src/main.rs:7)")
        );
    }

    #[test]
    fn functions_threads_and_stacks() {
        let h = history(4);
        let f = function_rows(&h, 3).unwrap();
        let top: Vec<(&str, f64, f64)> =
            f.iter().map(|r| (r.name.as_str(), r.flat, r.cum)).collect();
        assert_eq!(
            top,
            [
                ("app::parse_row", 0.5, 0.5),
                ("app::render", 0.25, 0.25),
                ("app::run_query", 0.0, 0.5)
            ]
        );
        let t = thread_rows(&h, 3);
        assert_eq!(t.len(), 1);
        // The worker exits in the last frame: still one row, said exited (it was two rows).
        let mut gone = history(3);
        let bytes = frame_bytes_with(3, false);
        let f = LiveFrame::decode(&bytes).unwrap();
        gone.push(bytes, f);
        let rows = thread_rows(&gone, 3);
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["thread worker [1, exited]"]);
        assert_eq!(
            (t[0].inuse, t[0].alloc, t[0].allocs),
            (3 << 20, 3145728.0, 250.0)
        );
        let cpu_window = Window::of(&h, 3, ProfileKind::Cpu).unwrap();
        let cpu = cpu_window.stacks("cpu", "request", 5, |_| true).unwrap();
        let rates: Vec<f64> = cpu.iter().map(|s| s.rate).collect();
        assert_eq!(rates, [5e8, 2.5e8], "query's stack is under request too");
        let points: Vec<u64> = cpu.iter().map(|s| s.points).collect();
        assert_eq!(
            points,
            [200, 100],
            "the samples each stands on: 50 and 25 in each frame"
        );
        assert_eq!(
            cpu[0].frames,
            [
                "app::parse_row (src/db.rs:31)",
                "app::run_query (internal/jemalloc_internal_inlines_c.h:20)"
            ]
        );
        let heap = Window::of(&h, 3, ProfileKind::Heap).unwrap().stacks(
            "alloc_space",
            "request -> db_query",
            5,
            |_| true,
        );
        let blocked = cpu_window
            .stacks("cpu", "request", 5, in_long_poll)
            .unwrap();
        assert_eq!(blocked.len(), 1);
        assert_eq!(blocked[0].frames, ["app::render (src/db.rs:44)"]);
        assert_eq!(blocked[0].rate, 2.5e8 / 4.0, "frame 1's of the 4");
        assert_eq!(heap.unwrap()[0].frames, ["app::load (src/db.rs:12)"]);
        assert_eq!(
            intervals(&h, 3, "request"),
            [("<1ms".to_owned(), 360), ("<10ms".to_owned(), 40)]
        );
        assert!(intervals(&h, 3, "request -> db_query").is_empty());
        // All in (1 ms, 1.25 ms]: interpolated inside it; 2 errors in each frame's 100 spans.
        let (q, spans, errors) = latency(&h, 3, "request").unwrap();
        assert_eq!(q, [1_125_000, 1_225_000, 1_247_500]);
        assert_eq!((spans, errors), (400, 8));
        assert!(latency(&h, 3, "request -> db_query").is_none());
        let tick = h.tick(3).unwrap();
        assert_eq!((tick.inuse, tick.alloc_bytes), (3 << 20, 3 << 20));
        assert_eq!(tick.cores(), Some(0.75));
    }

    #[test]
    fn history_keeps_its_bounds_and_decodes_only_what_tables_use() {
        let mut h = History::default();
        let (bytes, f) = frame(1);
        for _ in 0..(KEPT_FRAMES + 5) {
            h.push(bytes.clone(), f.clone());
        }
        assert_eq!(h.end(), KEPT_FRAMES + 5);
        assert_eq!(h.decoded(), TABLE_FRAMES, "the live edge only");
        assert!(h.tick(0).is_some());
        assert_eq!(h.table(KEPT_FRAMES + 4).len(), TABLE_FRAMES);
        assert!(h.frame(5).is_none(), "kept, not decoded");
        h.focus(20);
        assert!(h.frame(4).is_none(), "gone");
        assert!(h.frame(11).is_some() && h.frame(20).is_some() && h.frame(21).is_none());
        assert_eq!(h.decoded(), 2 * TABLE_FRAMES);
        h.focus(KEPT_FRAMES + 4);
        assert_eq!(h.decoded(), TABLE_FRAMES);

        // Tables in the past read the same numbers as when those frames were new.
        let mut h = History::default();
        for i in 0..40 {
            let (bytes, f) = frame(i);
            h.push(bytes, f);
        }
        let mut past = history(6);
        past.focus(5);
        h.focus(5);
        let sorted = |mut r: Vec<PathRow>| {
            r.sort_by(|a, b| a.name.cmp(&b.name));
            r.into_iter()
                .map(|mut r| {
                    r.trend.clear();
                    r
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(sorted(path_rows(&h, 5)), sorted(path_rows(&past, 5)));
    }
}
