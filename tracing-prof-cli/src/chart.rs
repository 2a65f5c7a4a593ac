//! Memory over time: the exact in-use bytes of the top span paths at every `span_memory`
//! capture given, as an SVG line chart for the report, with the paths the captures call
//! suspected leaks drawn dashed and marked.

use crate::input::Loaded;
use std::collections::HashMap;
use std::time::SystemTime;
use tracing_prof_model::{Grouping, units};

/// Paths drawn, at most: the largest by their highest in-use.
const LINES: usize = 8;
const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 320.0;
const LEFT: f64 = 80.0;
const BOTTOM: f64 = 40.0;
const COLORS: [&str; LINES] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf",
];

/// One path's line: its name, whether a capture calls it a suspected leak, and its in-use
/// bytes at each capture (seconds since the first).
#[derive(Debug, PartialEq)]
pub(crate) struct Line {
    pub(crate) path: String,
    pub(crate) leak: bool,
    pub(crate) points: Vec<(f64, i64)>,
}

/// The lines of the cumulative `span_memory` captures among `loaded` (ours, by their
/// comment; the heap's peak is not one) of the newest capture's process, oldest first: the
/// first capture's time, the number of captures and the lines; `None` with fewer than two.
pub(crate) fn memory_lines(loaded: &[Loaded]) -> Option<(SystemTime, usize, Vec<Line>)> {
    let mut captures: Vec<(SystemTime, &Loaded)> = loaded
        .iter()
        .filter(|l| l.name.contains("span_memory."))
        .filter(|l| !l.name.contains("_peak") && l.is_our_cumulative())
        .filter_map(|l| Some((l.profile.time?, l)))
        .collect();
    // One process's: the newest capture's (a restarted service's runs are not one line);
    // names without a process (`span_memory.latest.pb.gz`) are the same files again.
    captures.sort_by_key(|c| (c.0, c.1.process().is_none()));
    if let Some(pid) = captures.iter().rev().find_map(|(_, l)| l.process()) {
        captures.retain(|(_, l)| l.process().is_none_or(|p| p == pid));
    }
    captures.dedup_by_key(|c| c.0);
    if captures.len() < 2 {
        return None;
    }
    let start = captures[0].0;
    // Per capture, in use per path; a path missing from a capture held nothing then.
    let mut at: Vec<(f64, HashMap<String, i64>)> = Vec::new();
    let mut leaks: Vec<String> = Vec::new();
    for (time, l) in &captures {
        let x = time.duration_since(start).unwrap_or_default().as_secs_f64();
        let rows = l
            .profile
            .top(Some("inuse_space"), Grouping::SpanPath, false, 0)
            .map(|t| t.rows.into_iter().map(|r| (r.name, r.flat)).collect())
            .unwrap_or_default();
        leaks.extend(
            l.profile
                .comments
                .iter()
                .filter_map(|c| c.strip_prefix("tracing-prof: suspected leak: "))
                .map(str::to_owned),
        );
        at.push((x, rows));
    }
    let mut by_path: HashMap<String, Line> = HashMap::new();
    for name in at.iter().flat_map(|(_, rows)| rows.keys()) {
        by_path.entry(name.clone()).or_insert_with(|| Line {
            path: name.clone(),
            leak: leaks.iter().any(|c| c.starts_with(&format!("{name}:"))),
            points: at
                .iter()
                .map(|(x, rows)| (*x, rows.get(name).copied().unwrap_or(0)))
                .collect(),
        });
    }
    let mut lines: Vec<Line> = by_path.into_values().collect();
    let peak = |l: &Line| l.points.iter().map(|p| p.1).max().unwrap_or(0);
    lines.sort_by(|a, b| peak(b).cmp(&peak(a)).then_with(|| a.path.cmp(&b.path)));
    lines.truncate(LINES);
    Some((start, captures.len(), lines))
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The chart as an SVG element: time from the first capture across, bytes up, a legend.
pub(crate) fn svg(start: SystemTime, lines: &[Line]) -> String {
    let max_x = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .fold(0.0, f64::max)
        .max(1e-3);
    let max_y = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let plot_w = WIDTH - LEFT - 20.0;
    let plot_h = HEIGHT - BOTTOM - 20.0;
    let x = |s: f64| LEFT + s / max_x * plot_w;
    let y = |b: i64| 20.0 + plot_h - b as f64 / max_y * plot_h;
    let legend_h = 18.0 * lines.len() as f64 + 10.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"{WIDTH}\" \
         height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">",
        HEIGHT + legend_h
    );
    // Axes, with the highest value and the time span.
    s.push_str(&format!(
        "<line x1=\"{LEFT}\" y1=\"20\" x2=\"{LEFT}\" y2=\"{b}\" stroke=\"#999\"/>\
         <line x1=\"{LEFT}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#999\"/>\
         <text x=\"{tx}\" y=\"24\" text-anchor=\"end\">{top}</text>\
         <text x=\"{tx}\" y=\"{b}\" text-anchor=\"end\">0</text>\
         <text x=\"{LEFT}\" y=\"{ty}\">{from}</text>\
         <text x=\"{r}\" y=\"{ty}\" text-anchor=\"end\">+{span}</text>",
        b = 20.0 + plot_h,
        r = LEFT + plot_w,
        tx = LEFT - 6.0,
        ty = 20.0 + plot_h + 16.0,
        top = esc(&units::format_bytes(max_y as u64)),
        from = esc(&units::format_utc_seconds(start)),
        span = esc(&units::format_nanos((max_x * 1e9) as u64)),
    ));
    for (i, l) in lines.iter().enumerate() {
        let color = if l.leak {
            "#d62728"
        } else {
            COLORS[i % COLORS.len()]
        };
        let dash = if l.leak {
            " stroke-dasharray=\"6 3\""
        } else {
            ""
        };
        let points: Vec<String> = l
            .points
            .iter()
            .map(|&(t, b)| format!("{:.1},{:.1}", x(t), y(b)))
            .collect();
        s.push_str(&format!(
            "<polyline data-path=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash} \
             points=\"{}\"/>",
            esc(&l.path),
            points.join(" ")
        ));
        let ly = HEIGHT + 14.0 + 18.0 * i as f64;
        let last = l.points.last().map_or(0, |p| p.1);
        s.push_str(&format!(
            "<line x1=\"{LEFT}\" y1=\"{a}\" x2=\"{b}\" y2=\"{a}\" stroke=\"{color}\" \
             stroke-width=\"2\"{dash}/><text x=\"{c}\" y=\"{d}\">{}{} (last {})</text>",
            esc(&l.path),
            if l.leak { " — LEAK?" } else { "" },
            esc(&units::format_bytes(u64::try_from(last).unwrap_or(0))),
            a = ly - 4.0,
            b = LEFT + 24.0,
            c = LEFT + 30.0,
            d = ly,
        ));
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs)
    }

    #[test]
    fn lines_scale_to_the_chart_and_a_leak_is_dashed_and_named() {
        let lines = vec![
            Line {
                path: "request -> cache".into(),
                leak: false,
                points: vec![(0.0, 100), (10.0, 200)],
            },
            Line {
                path: "request -> session_store".into(),
                leak: true,
                points: vec![(0.0, 0), (10.0, 50)],
            },
        ];
        let s = svg(at(1_800_000_000), &lines);
        // x from 80 to 880, y from 280 (0) to 20 (200 B).
        assert!(s.contains("points=\"80.0,150.0 880.0,20.0\""), "{s}");
        assert!(s.contains("points=\"80.0,280.0 880.0,215.0\""), "{s}");
        assert!(s.contains("stroke=\"#d62728\" stroke-width=\"2\" stroke-dasharray=\"6 3\""));
        assert!(
            s.contains("request -&gt; session_store — LEAK? (last 50 B)"),
            "{s}"
        );
        assert!(
            s.contains(">200 B</text>") && s.contains(">+10.00 s</text>"),
            "{s}"
        );
    }
}
