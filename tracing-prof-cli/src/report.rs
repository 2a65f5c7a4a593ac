//! One self-contained HTML page: per profile, its description, a flame graph per main sample
//! type (inferno's interactive SVG, each in its own frame as a `data:` URL, so their scripts and
//! ids never meet), the top functions and the top span paths. No external resource: the page opens
//! from a file, an e-mail or a ticket.

use crate::input::Loaded;
use base64::Engine as _;
use tracing_prof_model::{Grouping, Profile, units};

/// The `height` of an SVG's root element (inferno sizes it to the deepest stack).
fn svg_height(svg: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(svg.get(..svg.len().min(2048))?).ok()?;
    let root = &text[text.find("<svg")?..];
    let at = root.find(" height=\"")? + " height=\"".len();
    root[at..].split('"').next()?.parse().ok()
}

/// Escapes text for HTML content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The sample types worth a flame graph: the default one, and for memory the allocated
/// counterpart (in-use alone hides churn).
fn drawn_types(p: &Profile) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(t) = p.sample_types.get(p.default_index()) {
        v.push(t.name.clone());
    }
    if v.first().is_some_and(|t| t == "inuse_space") && p.sample_type_index("alloc_space").is_some()
    {
        v.push("alloc_space".to_owned());
    }
    v
}

fn table(p: &Profile, sample_type: &str, grouping: Grouping, limit: usize) -> String {
    let Ok(top) = p.top(Some(sample_type), grouping, false, limit) else {
        return String::new();
    };
    if top.rows.is_empty() {
        return "<p class=\"empty\">(no samples)</p>".to_owned();
    }
    let mut h = String::from(
        "<table><thead><tr><th>flat</th><th>flat%</th><th>cum</th><th>cum%</th><th class=\"name\">",
    );
    h.push_str(match grouping {
        Grouping::SpanPath => "span path",
        _ => "function",
    });
    h.push_str("</th></tr></thead><tbody>");
    for r in &top.rows {
        let location = r
            .location
            .as_deref()
            .map(|l| format!(" <span class=\"loc\">{}</span>", esc(l)))
            .unwrap_or_default();
        h.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"name\">{}{location}</td></tr>",
            esc(&units::format_value(r.flat, &top.unit)),
            esc(&units::percent(r.flat, top.total)),
            esc(&units::format_value(r.cum, &top.unit)),
            esc(&units::percent(r.cum, top.total)),
            esc(&r.name),
        ));
    }
    h.push_str("</tbody></table>");
    if top.omitted > 0 {
        h.push_str(&format!(
            "<p class=\"more\">and {} more rows</p>",
            top.omitted
        ));
    }
    h
}

/// The page for `profiles`, tables of at most `limit` rows.
pub(crate) fn html(profiles: &[Loaded], limit: usize) -> String {
    let mut body = String::new();
    let mut toc = String::new();
    // Memory over time first, above the list of profiles.
    let mut chart = String::new();
    if let Some((start, captures, lines)) = crate::chart::memory_lines(profiles) {
        chart.push_str(&format!(
            "<section id=\"memory\"><h2>Memory over time</h2><p class=\"meta\">The exact \
             in-use bytes of the top span paths at each of the {} span_memory captures given; \
             dashed and marked: paths the captures call suspected leaks.</p>{}</section>",
            captures,
            crate::chart::svg(start, &lines)
        ));
    }
    for (i, l) in profiles.iter().enumerate() {
        let p = &l.profile;
        let anchor = format!("p{i}");
        toc.push_str(&format!(
            "<li><a href=\"#{anchor}\">{}</a></li>",
            esc(&l.name)
        ));
        body.push_str(&format!(
            "<section id=\"{anchor}\"><h2>{}</h2><p class=\"meta\">{}</p>",
            esc(&l.name),
            esc(&l.describe())
        ));
        let types: Vec<String> = p
            .sample_types
            .iter()
            .enumerate()
            .map(|(index, t)| {
                let total = units::format_value(p.total(index), &t.unit);
                match p.estimate(index) {
                    // A sampled total says so, as `top` does.
                    Some(e) => format!("{} ({} in all, {e})", t.name, total),
                    None => format!("{} ({} in all)", t.name, total),
                }
            })
            .collect();
        body.push_str(&format!(
            "<p class=\"meta\">{} records (a stack and its labels each); sample types: {}</p>",
            p.samples.len(),
            esc(&types.join(", "))
        ));
        for c in &p.comments {
            body.push_str(&format!("<p class=\"comment\">{}</p>", esc(c)));
        }
        for ty in drawn_types(p) {
            body.push_str(&format!("<h3>{}</h3>", esc(&ty)));
            let title = format!("{} {ty}", l.stem());
            match p.flamegraph_svg(Some(&ty), &title) {
                Ok(svg) => {
                    let height = svg_height(&svg).unwrap_or(600) + 8;
                    body.push_str(&format!(
                        "<iframe class=\"flame\" title=\"{}\" style=\"height: {height}px\" \
                         src=\"data:image/svg+xml;base64,{}\"></iframe>",
                        esc(&title),
                        base64::engine::general_purpose::STANDARD.encode(&svg)
                    ));
                }
                Err(e) => body.push_str(&format!("<p class=\"empty\">{}</p>", esc(&e.to_string()))),
            }
            body.push_str("<div class=\"tables\"><div>");
            body.push_str(&format!("<h4>Top functions by {}</h4>", esc(&ty)));
            body.push_str(&table(p, &ty, Grouping::Function, limit));
            body.push_str("</div>");
            if p.samples.iter().any(|s| s.span_frames().next().is_some()) {
                body.push_str("<div>");
                body.push_str(&format!("<h4>Top span paths by {}</h4>", esc(&ty)));
                body.push_str(&table(p, &ty, Grouping::SpanPath, limit));
                body.push_str("</div>");
            }
            body.push_str("</div>");
        }
        body.push_str("</section>");
    }
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"generator\" content=\"tracing-prof {}\">\
         <title>tracing-prof report</title><style>{STYLE}</style></head>\
         <body><h1>tracing-prof report</h1>{chart}<ul class=\"toc\">{toc}</ul>{body}\
         <p class=\"meta\">Flame graphs: click to zoom, Ctrl-F to search. Span frames carry \
         [span]; the frames above them are the code that ran inside the span.</p></body></html>\n",
        env!("CARGO_PKG_VERSION")
    )
}

const STYLE: &str = "
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; border-top: 1px solid #ccc; padding-top: .8em; }
h3 { font-size: 1em; margin-bottom: .3em; } h4 { font-size: .9em; margin: .5em 0 .2em; }
.meta { color: #555; font-size: .9em; margin: .2em 0; }
.comment { font-family: monospace; font-size: .85em; color: #444; margin: .1em 0; }
iframe.flame { width: 1210px; max-width: 100%; border: 1px solid #ddd; }
.tables { display: flex; flex-wrap: wrap; gap: 2em; }
table { border-collapse: collapse; font-size: .85em; }
td, th { padding: .15em .6em; text-align: right; white-space: nowrap; }
td.name, th.name { text-align: left; white-space: normal; max-width: 60em; }
tr:nth-child(even) { background: #f6f6f6; }
.loc { color: #777; } .empty, .more { color: #777; font-size: .85em; }
";
