//! The pages a reader opens in a browser or a terminal: the index with the profiler's health,
//! and the `?debug=1` tables.

use super::handler::HttpResponse;
use std::fmt::Write as _;
use tracing_prof_core::Profiler;
use tracing_prof_model::{ProfileKind, Snapshot, units};

/// `s` with the characters HTML gives a meaning escaped.
fn html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// What the profiler's sinks and services are doing: exports, failures, the last error.
fn health(profiler: &Profiler) -> String {
    let mut out = String::from("<table>\n");
    for s in profiler.sink_stats() {
        let state = match &s.last_error {
            Some(e) => format!("<b>failing</b>: {}", html(e)),
            None => "ok".to_owned(),
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{} exports, {} failed</td><td>{state}</td></tr>",
            html(&s.name),
            s.exports,
            s.export_errors
        );
    }
    for s in profiler.services() {
        let state = if s.up { "ok" } else { "<b>down</b>" };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{state}</td><td>{}</td></tr>",
            html(&s.name),
            html(&s.detail)
        );
    }
    out.push_str("</table>\n");
    out
}

pub(super) fn index(profiler: &Profiler) -> HttpResponse {
    let paused = profiler.is_paused();
    let state = if paused {
        "<p><b>Profiling is paused</b> (no heap or CPU sampling, no exports; exact counters \
         keep counting).</p>\n"
    } else {
        "<p>Profiling is running.</p>\n"
    };
    let memory = match profiler.process_memory() {
        Some(m) => format!("<p>Process memory: {}.</p>\n", html_escape(&m.describe())),
        None => String::new(),
    };
    let state = format!("{state}{}{memory}", health(profiler));
    let body = "<table>\n\
        <tr><td><a href=\"heap?debug=1\">heap</a></td><td>memory held now, by code stack under span path, sampled (inuse_space by default)</td></tr>\n\
        <tr><td><a href=\"allocs?debug=1\">allocs</a></td><td>memory allocated since start, as heap (alloc_space by default)</td></tr>\n\
        <tr><td><a href=\"span_memory?debug=1\">span_memory</a></td><td>memory per span path, exact (inuse_space by default)</td></tr>\n\
        <tr><td><a href=\"heap?peak=1&amp;debug=1\">heap?peak=1</a>, <a href=\"span_memory?peak=1&amp;debug=1\">span_memory?peak=1</a></td><td>the same at the heap's highest since the start (read every 100 ms by default)</td></tr>\n\
        <tr><td><a href=\"lifetimes?debug=1\">lifetimes</a></td><td>frees by lifetime and temporary allocations, by code stack, sampled</td></tr>\n\
        <tr><td><a href=\"threads?debug=1\">threads</a></td><td>memory per thread, exact (inuse_space by default)</td></tr>\n\
        <tr><td><a href=\"spans?debug=1\">spans</a></td><td>time per span path: count, wall, busy, idle, CPU, off-CPU</td></tr>\n\
        <tr><td><a href=\"cpu?debug=1\">cpu</a></td><td>CPU time by code stack under span path, sampled, since start</td></tr>\n\
        <tr><td><a href=\"profile?seconds=5&amp;debug=1\">profile</a></td><td>CPU profile of the next <code>seconds</code> (default 30), as Go's</td></tr>\n\
        <tr><td><a href=\"goroutine?debug=1\">goroutine</a></td><td>what runs now: open spans per span path, oldest first (<code>?debug=2</code>: each one), and the span path each thread is in</td></tr>\n\
        <tr><td><a href=\"flightrecorder\">flightrecorder</a></td><td>the flight recorder: the last minutes of exports, each interval's own profiles, as a tar.gz</td></tr>\n\
        <tr><td><a href=\"cmdline\">cmdline</a></td><td>the command line</td></tr>\n\
        <tr><td>live</td><td>one window (<code>?seconds=N</code>, default 1) for <code>tracing-prof live URL</code>, a terminal view</td></tr>\n\
        </table>\n<p>Add <code>?seconds=N</code> for what happens in the next N seconds, <code>?debug=1</code> for text.\n\
        Use: <code>go tool pprof http://HOST/debug/pprof/heap</code></p></body></html>\n";
    HttpResponse {
        status: 200,
        content_type: "text/html; charset=utf-8",
        headers: Vec::new(),
        body: format!(
            "<html><head><title>/debug/pprof/</title></head><body>\n\
             <h1>tracing-prof: /debug/pprof/</h1>\n{state}{body}"
        )
        .into(),
    }
}

/// `?debug=1`: a header, then the kind's samples, largest default sample type first, each with
/// its values in their units, its labels, and its stack one frame per line with file and line.
pub(super) fn text_table(snapshot: &Snapshot, kind: ProfileKind) -> String {
    let profile = snapshot.profile(kind);
    let what = if kind == ProfileKind::Threads {
        "threads"
    } else if kind.is_sampled(snapshot) {
        "sampled stacks"
    } else {
        "span paths"
    };
    let mut out = format!(
        "tracing-prof {} profile{}: {} {what}\n",
        kind.name(),
        if snapshot.window {
            format!(", last {:.1} s", snapshot.duration.as_secs_f64())
        } else {
            String::new()
        },
        profile.merged().samples.len()
    );
    if let Some(peak) = &snapshot.peak {
        let _ = writeln!(out, "{}", peak.describe());
    }
    if kind.is_sampled(snapshot) && matches!(kind, ProfileKind::Heap | ProfileKind::Allocs) {
        let _ = writeln!(
            out,
            "estimates from one sample per {} allocated on average",
            units::format_bytes(snapshot.sample_rate)
        );
    }
    out.push('\n');
    match profile.samples_text(None, 0) {
        Ok(text) if text.is_empty() => out.push_str("(no samples yet)\n"),
        Ok(text) => out.push_str(&text),
        Err(e) => {
            let _ = writeln!(out, "{e}");
        }
    }
    out
}

/// `s` as HTML text: `&`, `<` and `>` escaped.
fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
