//! Drawing `tracing-prof live`: a status line, the view tabs, the view, the keys.

use super::app::{App, Origin, View, ZOOMS};
use super::data::{self, TABLE_FRAMES};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style, Stylize};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Axis, Block, Borders, Cell, Chart, Dataset, GraphType, Paragraph, Row, Table, TableState, Wrap,
};
mod tables;

pub(crate) use tables::table;
use tables::{ViewTable, bytes, cores, rate};
use tracing_prof_model::{ProfileKind, units};

/// `HH:MM:SS` of a time, UTC.
fn clock(t: std::time::SystemTime) -> String {
    let s = crate::input::utc(t);
    s.get(11..19).unwrap_or(&s).to_owned()
}

fn status_line(app: &App) -> Line<'static> {
    let source = match &app.origin {
        // The host and port say it; the path is always /debug/pprof/live.
        Origin::Url(u) => u
            .split_once("://")
            .map_or(u.as_str(), |(_, rest)| rest)
            .trim_end_matches("/debug/pprof/live")
            .to_owned(),
        Origin::Recording(f) => format!("recording {f}"),
    };
    let mut spans = vec![
        Span::from(" tracing-prof live ").bold().reversed(),
        Span::from(format!(" {source} ")),
    ];
    if let Some(to) = &app.recording_to {
        spans.push(Span::from(format!("● rec {to}  ")).red());
    }
    let Some(tick) = app.history.tick(app.cursor) else {
        spans.push(Span::from("waiting for the first frame...").italic());
        return Line::from(spans);
    };
    // A service that stopped answering is no longer profiling: the last frame is all there is.
    let gone = matches!(app.origin, Origin::Url(_)) && app.error.is_some();
    if gone {
        spans.push(Span::from("✕ not answering").red().bold());
    } else if tick.paused {
        spans.push(Span::from(" PROFILER PAUSED ").bold().on_yellow().black());
    } else {
        spans.push(Span::from("● profiling").green());
    }
    let at = clock(tick.time);
    match (&app.origin, app.follow) {
        (Origin::Url(_), true) if gone => {
            spans.push(Span::from(format!("  last frame {at}")).red());
        }
        (Origin::Url(_), true) => spans.push(Span::from(format!("  {at}"))),
        (Origin::Url(_), false) => spans.push(
            Span::from(format!("  view held at {at} (p: follow)"))
                .bold()
                .cyan(),
        ),
        (Origin::Recording(_), _) => {
            spans.push(Span::from(format!("  at {at} (←→ move)")).bold().cyan());
        }
    }
    spans.push(Span::from(format!(
        "  cpu {}  in use {}  alloc {}",
        cores(tick.cores()),
        bytes(tick.inuse),
        rate(tick.alloc_bytes as f64 / tick.seconds.max(1e-3)),
    )));
    Line::from(spans)
}

fn tabs_line(app: &App) -> Line<'static> {
    let mut spans = Vec::new();
    for (i, v) in View::ALL.iter().enumerate() {
        let label = format!(" {} {} ", i + 1, v.title());
        spans.push(if *v == app.view {
            Span::from(label).bold().reversed()
        } else {
            Span::from(label)
        });
    }
    if matches!(app.view, View::Spans | View::Functions | View::Threads) {
        spans.push(Span::from(format!(
            "   last {TABLE_FRAMES} s, per second · sort: {}",
            app.sort().label()
        )));
    }
    if app.editing || !app.filter.is_empty() {
        let cursor = if app.editing { "_" } else { "" };
        spans.push(Span::from(format!(" · filter: {}{cursor}", app.filter)).yellow());
    }
    Line::from(spans)
}

fn keys_line(app: &App) -> Line<'static> {
    let keys = if app.editing {
        "type to filter · Enter: keep · Esc: clear"
    } else if app.drill.is_some() {
        "Esc: back · ←→ time · p pause · q quit"
    } else {
        match app.view {
            View::Spans => {
                "q quit · 1-5 views · ↑↓ select · Enter stacks · / filter · s sort · p pause · ←→ time"
            }
            View::Chart => "q quit · 1-5 views · ←→ pan · +/- zoom · p pause · End: now",
            View::Now => "q quit · 1-5 views · p pause · ←→ time",
            _ => "q quit · 1-5 views · ↑↓ select · / filter · s sort · p pause · ←→ time",
        }
    };
    Line::from(Span::from(format!(" {keys}")).dim())
}

fn draw_table(f: &mut Frame, area: Rect, app: &App, t: ViewTable) {
    if t.rows.is_empty() {
        let text = if app.history.tick(app.cursor).is_none() {
            "waiting for the first frame...".to_owned()
        } else if app.filter.is_empty() {
            t.empty
        } else {
            format!("nothing matches the filter {:?}", app.filter)
        };
        f.render_widget(
            Paragraph::new(text)
                .wrap(Wrap { trim: true })
                .block(Block::new().borders(Borders::TOP)),
            area,
        );
        return;
    }
    let header = Row::new(t.headers.iter().map(|h| Cell::from(*h)))
        .bold()
        .underlined();
    let rows = t
        .rows
        .into_iter()
        .map(|r| Row::new(r.cells.into_iter().map(Cell::from)).style(r.style));
    let table = Table::new(rows, t.widths)
        .header(header)
        .row_highlight_style(Style::new().reversed())
        .highlight_symbol("> ");
    let mut state = TableState::default().with_selected(Some(app.selected));
    f.render_stateful_widget(table, area, &mut state);
}

fn drill(f: &mut Frame, area: Rect, app: &App, path: &str) {
    let mut lines = vec![
        Line::from(format!("{path}: code stacks, last {TABLE_FRAMES} s")).bold(),
        Line::from(""),
    ];
    let (h, at) = (&app.history, app.cursor);
    if let Some(([p50, p90, p99], spans, errors)) = data::latency(h, at, path) {
        let ns = |v: u64| units::format_value(i64::try_from(v).unwrap_or(i64::MAX), "nanoseconds");
        lines.push(Line::from("Latency, creation to close:").underlined());
        lines.push(Line::from(format!(
            "  p50 {}  p90 {}  p99 {}  of {spans} spans, {errors} with an ERROR ({:.1}%)",
            ns(p50),
            ns(p90),
            ns(p99),
            errors as f64 * 100.0 / spans.max(1) as f64
        )));
        lines.push(Line::from(""));
    }
    let intervals = data::intervals(h, at, path);
    if !intervals.is_empty() {
        let total: i64 = intervals.iter().map(|(_, n)| n).sum();
        lines.push(Line::from("Its enter-to-exit intervals (polls), own time:").underlined());
        for (bucket, n) in intervals {
            let width = (n as f64 / total.max(1) as f64 * 40.0).ceil() as usize;
            lines.push(Line::from(format!(
                "  {bucket:>7} {n:>9}  {}",
                "█".repeat(width)
            )));
        }
        lines.push(Line::from(""));
    }
    let mut section =
        |title: &str, found: Option<Vec<data::Stack>>, show: &dyn Fn(f64) -> String| {
            lines.push(Line::from(title.to_owned()).underlined());
            match found {
                None => lines.push(Line::from("  (not sampled in this service)").dim()),
                Some(s) if s.is_empty() => lines.push(Line::from("  (none in this window)").dim()),
                Some(stacks) => {
                    for s in stacks {
                        // Sampled: an estimate, and how far off it may be.
                        let error = match s.points {
                            0 => String::new(),
                            n => format!(
                                "  (estimate from {n} samples, ±{:.0}%)",
                                100.0 / (n as f64).sqrt()
                            ),
                        };
                        lines.push(Line::from(format!("  {}{error}", show(s.rate))).bold());
                        for fr in s.frames.iter().take(8) {
                            lines.push(Line::from(format!("      {fr}")));
                        }
                        if s.frames.len() > 8 {
                            lines.push(
                                Line::from(format!("      ... {} more", s.frames.len() - 8)).dim(),
                            );
                        }
                    }
                }
            }
            lines.push(Line::from(""));
        };
    let cpu = |r: f64| format!("{} of a core", cores(Some(r / 1e9)));
    let cpu_window = data::Window::of(h, at, ProfileKind::Cpu);
    section(
        "CPU (sampled; exact per span path with TRACING_PROF_CPU_TIME=exact), in this span path and below:",
        cpu_window
            .as_ref()
            .and_then(|w| w.stacks("cpu", path, 5, |_| true)),
        &cpu,
    );
    let blocked = cpu_window
        .as_ref()
        .and_then(|w| w.stacks("cpu", path, 3, data::in_long_poll));
    if blocked.as_ref().is_some_and(|b| !b.is_empty()) {
        section(
            "CPU in long polls (a worker that entered or left no span for the threshold):",
            blocked,
            &cpu,
        );
    }
    section(
        "Allocations (sampled; the table's memory columns are exact), in this span path and below:",
        data::Window::of(h, at, ProfileKind::Heap)
            .and_then(|w| w.stacks("alloc_space", path, 5, |_| true)),
        &|r| rate(r),
    );
    f.render_widget(
        Paragraph::new(lines).block(Block::new().borders(Borders::TOP)),
        area,
    );
}

/// Span paths drawn under the total in the memory chart: the three holding the most.
const CHART_PATHS: usize = 3;

/// A named line of a chart: its name, its points, its color.
type ChartLine = (String, Vec<(f64, f64)>, Color);

fn chart(f: &mut Frame, area: Rect, app: &App) {
    let width = ZOOMS[app.zoom];
    let to = app.cursor + 1;
    let from = to.saturating_sub(width);
    let x = |n: usize| n as f64 - app.cursor as f64;
    let ticks: Vec<(usize, &data::Tick)> = app.history.ticks(from, to).collect();
    let memory: Vec<(f64, f64)> = ticks
        .iter()
        .map(|(n, t)| (x(*n), t.inuse as f64 / 1048576.0))
        .collect();
    let cpu: Vec<(f64, f64)> = ticks
        .iter()
        .filter_map(|(n, t)| Some((x(*n), t.cores()? * 100.0)))
        .collect();
    let [top, bottom] = Layout::vertical([Constraint::Fill(1); 2]).areas(area);
    // The ends of the time axis as clock times, where there are frames to say them.
    let end = app.history.tick(app.cursor).map(|t| t.time);
    let start = end.map(|t| clock(t - std::time::Duration::from_secs(width as u64 - 1)));
    let (start, end) = (
        start.unwrap_or_else(|| format!("-{}s", width - 1)),
        end.map_or_else(|| "now".to_owned(), clock),
    );
    let x_axis = || {
        Axis::default()
            .bounds([-(width as f64 - 1.0), 0.0])
            .labels([start.clone(), end.clone()])
    };
    // The span paths holding the most at the cursor, each a line of its own under the total;
    // a suspected leak in red, named so.
    let leaks: Vec<String> = data::path_rows(&app.history, app.cursor)
        .into_iter()
        .filter(|r| r.leak)
        .map(|r| r.name)
        .collect();
    let mut held: Vec<(&String, &i64)> = app
        .history
        .tick(app.cursor)
        .map(|t| t.path_inuse.iter().filter(|(_, b)| **b > 0).collect())
        .unwrap_or_default();
    held.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    let paths: Vec<ChartLine> = held
        .iter()
        .take(CHART_PATHS)
        .enumerate()
        .map(|(i, (name, _))| {
            let points = ticks
                .iter()
                .map(|(n, t)| {
                    let b = t.path_inuse.get(*name).copied().unwrap_or(0);
                    (x(*n), b as f64 / 1048576.0)
                })
                .collect();
            let leak = leaks.contains(name);
            let color = if leak {
                Color::Red
            } else {
                [Color::Yellow, Color::Magenta, Color::Blue][i % 3]
            };
            let label = if leak {
                format!("{name} LEAK?")
            } else {
                (*name).clone()
            };
            (label, points, color)
        })
        .collect();
    let max = |v: &[(f64, f64)]| v.iter().map(|p| p.1).fold(0.0_f64, f64::max).max(1e-9) * 1.1;
    let draw = |f: &mut Frame,
                area: Rect,
                title: String,
                unit: &str,
                points: &[(f64, f64)],
                color,
                lines: &[ChartLine]| {
        let top = max(points);
        let mut datasets = vec![
            Dataset::default()
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::new().fg(color))
                .data(points),
        ];
        for (name, points, color) in lines {
            datasets.push(
                Dataset::default()
                    .name(name.clone())
                    .marker(Marker::Braille)
                    .graph_type(GraphType::Line)
                    .style(Style::new().fg(*color))
                    .data(points),
            );
        }
        let chart = Chart::new(datasets)
            // The paths' names always shown (ratatui hides a legend wider than a quarter of
            // the chart, and span paths are long).
            .hidden_legend_constraints((Constraint::Ratio(1, 1), Constraint::Ratio(1, 1)))
            .legend_position(Some(ratatui::widgets::LegendPosition::TopLeft))
            .block(Block::bordered().title(title))
            .x_axis(x_axis())
            .y_axis(
                Axis::default()
                    .bounds([0.0, top])
                    .labels([format!("0 {unit}"), format!("{top:.1} {unit}")]),
            );
        f.render_widget(chart, area);
    };
    let last = |v: &[(f64, f64)]| v.last().map_or(0.0, |p| p.1);
    draw(
        f,
        top,
        format!(" memory in use: {:.1} MiB, last {width} s ", last(&memory)),
        "MiB",
        &memory,
        Color::Cyan,
        &paths,
    );
    if cpu.is_empty() {
        f.render_widget(
            Paragraph::new("CPU: nothing measures CPU in this service").block(Block::bordered()),
            bottom,
        );
    } else {
        draw(
            f,
            bottom,
            format!(" CPU: {:.1}% of a core, last {width} s ", last(&cpu)),
            "%",
            &cpu,
            Color::Green,
            &[],
        );
    }
}

fn now(f: &mut Frame, area: Rect, app: &App) {
    let Some(frame) = app.history.frame(app.cursor) else {
        f.render_widget(Paragraph::new("no frame kept at this time"), area);
        return;
    };
    let nanos = |d: std::time::Duration| {
        units::format_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    };
    let inf = &frame.in_flight;
    let mut lines = vec![
        Line::from(format!(
            "Open spans: {} at {} (oldest first)",
            inf.open(),
            clock(frame.time)
        ))
        .bold(),
    ];
    for p in inf
        .paths
        .iter()
        .filter(|p| app.shows(&tracing_prof_model::display_path_with_fields(&p.frames)))
    {
        let ages: Vec<String> = p.oldest.iter().take(3).map(|s| nanos(s.age)).collect();
        lines.push(Line::from(format!(
            "  {:>6} open  oldest {:<28} {}",
            p.open,
            ages.join(", "),
            tracing_prof_model::display_path_with_fields(&p.frames)
        )));
    }
    let polls = data::long_polls(&app.history, app.cursor);
    let cpu_window = data::Window::of(&app.history, app.cursor, ProfileKind::Cpu);
    lines.push(Line::from(""));
    lines.push(
        Line::from(format!(
            "Long polls on executor threads, last {TABLE_FRAMES} s"
        ))
        .bold(),
    );
    if polls.is_empty() {
        lines.push(Line::from("  none").dim());
    }
    for (path, n) in polls {
        // The function that blocked most, where CPU samples caught it.
        let blocker = cpu_window
            .as_ref()
            .and_then(|w| w.blocker(&path))
            .map(|f| format!("   in {f}"))
            .unwrap_or_default();
        lines.push(Line::from(format!("  {n:>6}  {path}{blocker}")).yellow());
    }
    lines.push(Line::from(""));
    lines.push(Line::from(format!("Threads: {}", inf.threads.len())).bold());
    for t in &inf.threads {
        let path = tracing_prof_model::display_path_with_fields(&t.frames);
        let since = t
            .since
            .map(|d| format!(" for {}", nanos(d)))
            .unwrap_or_default();
        lines.push(Line::from(format!(
            "  {:>7} {:<20} {path}{since}",
            t.tid,
            if t.name.is_empty() { "?" } else { &t.name }
        )));
    }
    for n in &frame.notes {
        lines.push(Line::from(format!("note: {n}")).dim());
    }
    f.render_widget(
        Paragraph::new(lines).block(Block::new().borders(Borders::TOP)),
        area,
    );
}

/// Draws the whole screen.
pub(crate) fn draw(f: &mut Frame, app: &App) {
    let error_height = if app.error.is_some() { 2 } else { 0 };
    let [status, tabs, body, error, keys] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Fill(1),
        Constraint::Length(error_height),
        Constraint::Length(1),
    ])
    .areas(f.area());
    f.render_widget(Paragraph::new(status_line(app)), status);
    f.render_widget(Paragraph::new(tabs_line(app)), tabs);
    match (&app.drill, app.view) {
        (Some(path), View::Spans) => drill(f, body, app, path),
        (_, View::Chart) => chart(f, body, app),
        (_, View::Now) => now(f, body, app),
        _ => {
            if let Some(t) = table(app) {
                draw_table(f, body, app, t);
            }
        }
    }
    if let Some(e) = &app.error {
        f.render_widget(
            Paragraph::new(Span::from(format!(" {e}")))
                .white()
                .on_red()
                .wrap(Wrap { trim: true }),
            error,
        );
    }
    f.render_widget(Paragraph::new(keys_line(app)), keys);
}

#[cfg(test)]
mod tests {
    use super::tables::trend;
    use super::*;
    use crate::live::data::tests::frame;
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    fn screen(app: &App) -> String {
        let mut t = Terminal::new(TestBackend::new(120, 30)).unwrap();
        t.draw(|f| draw(f, app)).unwrap();
        let buf = t.backend().buffer().clone();
        let mut out = String::new();
        for y in 0..buf.area.height {
            for x in 0..buf.area.width {
                out.push_str(buf[(x, y)].symbol());
            }
            out.push('\n');
        }
        out
    }

    fn app(n: u64) -> App {
        let mut app = App::new(Origin::Url("http://127.0.0.1:6060".into()));
        for i in 0..n {
            let (bytes, f) = frame(i);
            app.on_frame(bytes, f);
        }
        app
    }

    fn press(app: &mut App, c: KeyCode) {
        let names: Vec<String> = table(app)
            .map(|t| t.rows.into_iter().map(|r| r.name).collect())
            .unwrap_or_default();
        let selected = names.get(app.selected).cloned();
        app.on_key(KeyEvent::new(c, KeyModifiers::NONE), names.len(), selected);
    }

    #[test]
    fn the_spans_view_ranks_paths_by_cpu_and_marks_the_leak() {
        let s = screen(&app(12));
        let lines: Vec<&str> = s.lines().collect();
        assert!(
            lines[0].contains("tracing-prof live  127.0.0.1:6060 "),
            "{s}"
        );
        assert!(
            lines[0].contains("cpu 75.0%  in use 11.0 MiB  alloc 3.0 MiB/s"),
            "{s}"
        );
        assert!(
            lines[1].contains(" 1 Spans ") && lines[1].contains("sort: cpu"),
            "{s}"
        );
        let query = lines
            .iter()
            .position(|l| l.contains("request -> db_query"))
            .unwrap();
        let request = lines
            .iter()
            .position(|l| l.contains("request ") && !l.contains("db_query") && l.contains("100"))
            .unwrap();
        assert!(query < request, "0.5 cores before 0.25:\n{s}");
        let q = lines[query];
        for cell in ["50", "50.0%", "1.0 MiB/s", "11.0 MiB", "LEAK?"] {
            assert!(q.contains(cell), "{cell:?} in {q:?}");
        }
        assert!(q.contains("▁▂"), "a rising trend: {q:?}");
        // The request's p99 and ERROR share; the query's spans carry no histogram here.
        let r = lines[request];
        for cell in ["1.2 ms", "2.0%"] {
            assert!(r.contains(cell), "{cell:?} in {r:?}");
        }
        assert!(
            lines
                .iter()
                .any(|l| l.contains("calls/s  p99      errors  cpu")),
            "{s}"
        );
        assert!(lines.last().unwrap().contains("Enter stacks"), "{s}");
    }

    #[test]
    fn views_switch_and_a_path_drills_down_to_its_stacks() {
        let mut app = app(6);
        press(&mut app, KeyCode::Enter);
        let s = screen(&app);
        assert!(s.contains("request -> db_query: code stacks"), "{s}");
        assert!(s.contains("50.0% of a core"), "{s}");
        assert!(s.contains("app::parse_row (src/db.rs:31)"), "{s}");
        assert!(s.contains("app::load (src/db.rs:12)"), "{s}");
        assert!(
            !s.contains("CPU in long polls"),
            "none under this path: {s}"
        );
        press(&mut app, KeyCode::Esc);
        press(&mut app, KeyCode::Char('2'));
        let s = screen(&app);
        assert!(
            s.contains("app::parse_row") && s.contains("src/db.rs:31"),
            "{s}"
        );
        // A long location whole (it was cut to 32 columns while names had the rest).
        assert!(
            s.contains("internal/jemalloc_internal_inlines_c.h:20"),
            "{s}"
        );
        press(&mut app, KeyCode::Char('3'));
        assert!(screen(&app).contains("thread worker [1]"));
        press(&mut app, KeyCode::Char('4'));
        let s = screen(&app);
        assert!(
            s.contains("memory in use: 5.0 MiB") && s.contains("CPU: 75.0% of a core"),
            "{s}"
        );
        assert!(
            s.contains("00:15:47") && s.contains("00:16:46"),
            "the time axis in clock time, 59 s apart: {s}"
        );
        // The path holding the memory has a line of its own, named, marked as the leak.
        assert!(s.contains("request -> db_query LEAK?"), "{s}");
        press(&mut app, KeyCode::Char('5'));
        let s = screen(&app);
        assert!(s.contains("Open spans: 3"), "{s}");
        assert!(
            s.contains("worker               request -> db_query {table=users} for 2.0 ms"),
            "each thread's path, with its span fields: {s}"
        );
        assert!(s.contains("3 open  oldest 40.00 s"), "{s}");
        assert!(
            s.contains("1  request   in app::render (src/db.rs:44)"),
            "the long poll of frame 1, and what it ran: {s}"
        );
        assert!(
            s.contains("PROFILER PAUSED"),
            "frame 5 was taken paused: {s}"
        );
    }

    #[test]
    fn the_filter_and_an_error_show() {
        let mut app = app(3);
        for c in ['/', 'd', 'b'] {
            press(&mut app, KeyCode::Char(c));
        }
        let s = screen(&app);
        assert!(s.contains("filter: db_"), "{s}");
        assert!(
            s.contains("request -> db_query") && !s.contains("  request  "),
            "{s}"
        );
        press(&mut app, KeyCode::Char('x'));
        assert!(screen(&app).contains("nothing matches the filter \"dbx\""));
        // The service gone: the header says so, never "profiling" (it kept saying it).
        let mut live = App::new(Origin::Url("http://127.0.0.1:6060".into()));
        let (bytes, f) = frame(0);
        live.on_frame(bytes, f);
        assert!(screen(&live).contains("● profiling"));
        live.on_error("cannot reach http://127.0.0.1:6060: connection refused".into());
        let s = screen(&live);
        assert!(s.contains("connection refused"), "{s}");
        assert!(
            s.contains("✕ not answering") && s.contains("last frame") && !s.contains("● profiling"),
            "{s}"
        );
        let empty = App::new(Origin::Recording("x.tplive".into()));
        assert!(screen(&empty).contains("waiting for the first frame"));
    }

    #[test]
    fn trends_scale_to_their_largest_value() {
        assert_eq!(trend(&[0, 4, 8]), "▁▄█");
        assert_eq!(trend(&[0, 0]), "▁▁");
        assert_eq!(trend(&[]), "");
    }
}
