//! The views' tables (span paths, functions, threads): their rows, sorted and filtered as the
//! app says, with the units each column is read in.

use super::super::app::{App, Sort, View};
use super::super::data::{self, PathRow};
use ratatui::layout::Constraint;
use ratatui::style::{Color, Modifier, Style};
use std::cmp::Ordering;
use tracing_prof_model::units;

/// One row of the view's table: its name (for the filter and Enter), cells, style.
#[derive(Clone, Debug)]
pub(crate) struct TableRow {
    pub(crate) name: String,
    pub(super) cells: Vec<String>,
    pub(super) style: Style,
}

/// A table: headers, widths, rows (filtered and sorted), and what to say when it is empty.
#[derive(Debug)]
pub(crate) struct ViewTable {
    pub(super) headers: Vec<&'static str>,
    pub(super) widths: Vec<Constraint>,
    pub(crate) rows: Vec<TableRow>,
    pub(super) empty: String,
}

pub(super) fn bytes(b: i64) -> String {
    units::format_bytes(u64::try_from(b).unwrap_or(0))
}

pub(super) fn rate(b: f64) -> String {
    if b <= 0.0 {
        "0".into()
    } else {
        format!("{}/s", units::format_bytes(b as u64))
    }
}

pub(super) fn cores(c: Option<f64>) -> String {
    c.map_or_else(|| "-".into(), |c| format!("{:.1}%", c * 100.0))
}

/// A duration in nanoseconds, in the unit that reads best (`1.2 ms`).
fn nanoseconds(ns: u64) -> String {
    units::format_value(i64::try_from(ns).unwrap_or(i64::MAX), "nanoseconds")
}

/// A share as a percentage: `0`, `<0.1%`, `2.5%`.
fn share(s: f64) -> String {
    if s <= 0.0 {
        "0".into()
    } else if s < 0.001 {
        "<0.1%".into()
    } else {
        format!("{:.1}%", s * 100.0)
    }
}

fn per_second(n: f64) -> String {
    if n == 0.0 {
        "0".into()
    } else if n < 10.0 {
        format!("{n:.1}")
    } else {
        format!("{n:.0}")
    }
}

/// A trend in eight heights, scaled to its largest value.
pub(crate) fn trend(values: &[i64]) -> String {
    const BARS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = values.iter().copied().max().unwrap_or(0);
    if max <= 0 {
        return "▁".repeat(values.len());
    }
    values
        .iter()
        .map(|&v| {
            let h = (v.max(0) as f64 / max as f64 * 8.0).round() as usize;
            BARS[h.clamp(1, 8)]
        })
        .collect()
}

fn desc(a: f64, b: f64) -> Ordering {
    b.partial_cmp(&a).unwrap_or(Ordering::Equal)
}

fn span_table(app: &App) -> ViewTable {
    let mut rows: Vec<PathRow> = data::path_rows(&app.history, app.cursor)
        .into_iter()
        .filter(|r| app.shows(&r.name))
        .collect();
    let sort = app.sort();
    rows.sort_by(|a, b| {
        match sort {
            Sort::InUse => b.inuse.cmp(&a.inuse),
            Sort::Alloc => desc(a.alloc, b.alloc),
            Sort::Calls => desc(a.calls, b.calls),
            Sort::P99 => b.p99.cmp(&a.p99),
            Sort::Name => Ordering::Equal,
            _ => desc(a.cpu.unwrap_or(0.0), b.cpu.unwrap_or(0.0)),
        }
        .then_with(|| b.inuse.cmp(&a.inuse))
        .then_with(|| a.name.cmp(&b.name))
    });
    let rows = rows
        .into_iter()
        .map(|r| {
            let mut flags = Vec::new();
            if r.leak {
                flags.push("LEAK?".to_owned());
            }
            if r.long_polls > 0 {
                flags.push(format!("{} long polls", r.long_polls));
            }
            let style = if r.leak {
                Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
            } else if r.long_polls > 0 {
                Style::new().fg(Color::Yellow)
            } else {
                Style::new()
            };
            TableRow {
                cells: vec![
                    r.name.clone(),
                    per_second(r.calls),
                    r.p99.map_or_else(|| "-".into(), nanoseconds),
                    r.errors.map_or_else(|| "-".into(), share),
                    cores(r.cpu),
                    rate(r.alloc),
                    bytes(r.inuse),
                    trend(&r.trend),
                    flags.join(", "),
                ],
                name: r.name,
                style,
            }
        })
        .collect();
    ViewTable {
        headers: vec![
            "span path",
            "calls/s",
            "p99",
            "errors",
            "cpu",
            "alloc",
            "in use",
            "in use trend",
            "",
        ],
        widths: vec![
            Constraint::Min(24),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(12),
            Constraint::Length(10),
            Constraint::Length(data::TREND_TICKS as u16),
            Constraint::Length(20),
        ],
        rows,
        empty: "no span path had anything in this window".into(),
    }
}

fn function_table(app: &App) -> ViewTable {
    let headers = vec!["function", "self cpu", "total cpu", "location"];
    let Some(mut rows) = data::function_rows(&app.history, app.cursor) else {
        let widths = vec![
            Constraint::Min(30),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(32),
        ];
        let why = app
            .history
            .frame(app.cursor)
            .and_then(|f| f.notes.iter().find(|n| n.starts_with("CPU")).cloned())
            .unwrap_or_else(|| "no CPU samples in this window".into());
        return ViewTable {
            headers,
            widths,
            rows: Vec::new(),
            empty: format!("{why}; view 1 shows CPU per span path where it is measured"),
        };
    };
    rows.retain(|r| app.shows(&r.name));
    match app.sort() {
        Sort::Total => rows.sort_by(|a, b| desc(a.cum, b.cum).then_with(|| desc(a.flat, b.flat))),
        Sort::Name => rows.sort_by(|a, b| a.name.cmp(&b.name)),
        _ => {} // by self CPU already
    }
    // The locations whole (up to 60 columns), the names in what is left.
    let location_width = rows
        .iter()
        .filter_map(|r| r.location.as_deref())
        .map(|l| short_location(l).chars().count())
        .max()
        .unwrap_or(8)
        .clamp(8, 60) as u16;
    let widths = vec![
        Constraint::Fill(1),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(location_width),
    ];
    ViewTable {
        headers,
        widths,
        rows: rows
            .into_iter()
            .map(|r| TableRow {
                cells: vec![
                    r.name.clone(),
                    cores(Some(r.flat)),
                    cores(Some(r.cum)),
                    r.location
                        .as_deref()
                        .map(short_location)
                        .unwrap_or_default(),
                ],
                name: r.name,
                style: Style::new(),
            })
            .collect(),
        empty: "no CPU samples in this window".into(),
    }
}

/// `file:line` with the file cut to its last two components, as pprof's tables show it.
fn short_location(location: &str) -> String {
    let parts: Vec<&str> = location.rsplitn(3, '/').collect();
    match parts.as_slice() {
        [last, dir, _] => format!("{dir}/{last}"),
        _ => location.to_owned(),
    }
}

fn thread_table(app: &App) -> ViewTable {
    let mut rows = data::thread_rows(&app.history, app.cursor);
    rows.retain(|r| app.shows(&r.name));
    rows.sort_by(|a, b| match app.sort() {
        Sort::Alloc => desc(a.alloc, b.alloc).then_with(|| a.name.cmp(&b.name)),
        Sort::Name => a.name.cmp(&b.name),
        _ => b.inuse.cmp(&a.inuse).then_with(|| a.name.cmp(&b.name)),
    });
    ViewTable {
        headers: vec!["thread", "in use", "alloc", "allocations/s"],
        widths: vec![
            Constraint::Min(30),
            Constraint::Length(10),
            Constraint::Length(12),
            Constraint::Length(14),
        ],
        rows: rows
            .into_iter()
            .map(|r| TableRow {
                cells: vec![
                    r.name.clone(),
                    bytes(r.inuse),
                    rate(r.alloc),
                    per_second(r.allocs),
                ],
                name: r.name,
                style: Style::new(),
            })
            .collect(),
        empty: "no thread allocated in this window".into(),
    }
}

/// The table of the current view (views 4 and 5 have none).
pub(crate) fn table(app: &App) -> Option<ViewTable> {
    match app.view {
        View::Spans if app.drill.is_none() => Some(span_table(app)),
        View::Functions => Some(function_table(app)),
        View::Threads => Some(thread_table(app)),
        _ => None,
    }
}
