//! The `tracing-prof` command on checked-in profiles (ours from the example service, and Go's
//! own heap and CPU profiles, `fixtures/go/main.go`), against expected outputs
//! (`fixtures/expected/*.txt`; `TRACING_PROF_BLESS=1` rewrites them after a deliberate change)
//! and against `go tool pprof` itself on the same files.

use assert_cmd::Command;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tracing_prof_test_support::have_go;

fn fixture(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
        .to_str()
        .unwrap()
        .to_owned()
}

fn tracing_prof() -> Command {
    let mut c = Command::cargo_bin("tracing-prof").unwrap();
    c.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"));
    c.env_remove("TRACING_PROF_HTTP_TOKEN");
    c
}

/// Runs the command; returns (success, stdout, stderr).
fn run(args: &[&str]) -> (bool, String, String) {
    let out = tracing_prof().args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(args: &[&str]) -> String {
    let (success, stdout, stderr) = run(args);
    assert!(success, "tracing-prof {args:?} failed:\n{stderr}");
    stdout
}

/// Compares `actual` with `fixtures/expected/{name}.txt`, or writes it there when blessing.
fn expect(name: &str, actual: &str) {
    let path = PathBuf::from(fixture(&format!("expected/{name}.txt")));
    if std::env::var_os("TRACING_PROF_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (TRACING_PROF_BLESS=1 writes it)", path.display()));
    assert_eq!(
        actual,
        expected,
        "output of {name} differs from {} (TRACING_PROF_BLESS=1 rewrites it after a deliberate change)",
        path.display()
    );
}

#[test]
fn outputs_match_the_expected_files() {
    let cases: &[(&str, &[&str])] = &[
        ("top_cpu", &["top", "ours/cpu.pb.gz"]),
        (
            "top_cpu_by_span",
            &["top", "--by", "span", "ours/cpu.pb.gz"],
        ),
        (
            "top_cpu_under_render",
            &["top", "--span", "request -> render", "-l", "ours/cpu.pb.gz"],
        ),
        (
            "top_cpu_focus_ignore",
            &[
                "top",
                "--focus",
                "render",
                "--ignore",
                "Chain",
                "ours/cpu.pb.gz",
            ],
        ),
        (
            "top_cpu_tag",
            &[
                "top",
                "--tag",
                "span_path=request -> parse",
                "ours/cpu.pb.gz",
            ],
        ),
        (
            "top_heap_alloc",
            &["top", "-t", "alloc_space", "ours/heap.pb.gz"],
        ),
        (
            "top_span_memory",
            &["top", "--by", "span", "ours/span_memory.pb.gz"],
        ),
        (
            "top_spans_busy",
            &["top", "--by", "span", "-t", "wall_busy", "ours/spans.pb.gz"],
        ),
        ("top_lifetimes", &["top", "ours/lifetimes.pb.gz"]),
        // Two `#[instrument] fn apply` in two modules under one parent (from
        // `tracing-prof/tests/profiler/same_name_spans.rs`): two rows, named by their modules.
        (
            "top_same_name_cpu_by_span",
            &["top", "--by", "span", "same_name/cpu.pb.gz"],
        ),
        (
            "top_same_name_memory_by_span",
            &[
                "top",
                "--by",
                "span",
                "-t",
                "inuse_space",
                "same_name/span_memory.pb.gz",
            ],
        ),
        (
            "top_same_name_under_one",
            &[
                "top",
                "--span",
                "run -> same_name_spans::set::apply",
                "same_name/cpu.pb.gz",
            ],
        ),
        // Both under one name: which span paths were summed, said in the header.
        (
            "top_same_name_under_both",
            &["top", "--span", "run -> apply", "same_name/cpu.pb.gz"],
        ),
        ("top_threads", &["top", "ours/threads.pb.gz"]),
        ("top_go_heap", &["top", "go/heap.pb.gz"]),
        ("top_go_cpu", &["top", "--cum", "go/cpu.pb.gz"]),
        ("traces_heap", &["traces", "-n", "2", "ours/heap.pb.gz"]),
        (
            "tags_lifetimes",
            &["tags", "-t", "freed_objects", "ours/lifetimes.pb.gz"],
        ),
        ("tags_threads", &["tags", "ours/threads.pb.gz"]),
        (
            "diff_heap",
            &[
                "diff",
                "-t",
                "inuse_space",
                "--by",
                "span",
                "series/heap.1.pb.gz",
                "series/heap.5.pb.gz",
            ],
        ),
        (
            "leaks_span_memory",
            &[
                "leaks",
                "--by",
                "span",
                "series/span_memory.1.pb.gz",
                "series/span_memory.2.pb.gz",
                "series/span_memory.3.pb.gz",
                "series/span_memory.4.pb.gz",
                "series/span_memory.5.pb.gz",
            ],
        ),
    ];
    for (name, args) in cases {
        expect(name, &ok(args));
    }
}

/// `go tool pprof -top` on the same file, as flat and cum per (simplified) name, in raw units.
fn go_top(file: &str, sample_type: &str, unit: &str) -> BTreeMap<String, (i64, i64, usize)> {
    let out = std::process::Command::new("go")
        .args([
            "tool",
            "pprof",
            "-top",
            "-nodecount=1000000",
            "-nodefraction=0",
        ])
        .arg(format!("-sample_index={sample_type}"))
        .arg(format!("-unit={unit}"))
        .arg(fixture(file))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_top(&String::from_utf8_lossy(&out.stdout), true)
}

/// The rows of a `-top` table: name -> (flat, cum, rows merged into it), units stripped.
fn parse_top(text: &str, go: bool) -> BTreeMap<String, (i64, i64, usize)> {
    let mut rows = BTreeMap::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.trim_start().starts_with("flat") {
            in_table = true;
            continue;
        }
        if !in_table || line.starts_with("...") {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let num = |t: &str| -> i64 {
            t.trim_end_matches(|c: char| c.is_ascii_alphabetic())
                .parse()
                .unwrap_or_else(|_| panic!("{t:?} in {line:?}"))
        };
        let (flat, cum) = (num(words[0]), num(words[3]));
        let name = words[5..].join(" ");
        // Names as written: pprof shortens none of ours (see `short_function_name`).
        let name = if go {
            name.trim_end_matches(" (inline)").to_owned()
        } else {
            name
        };
        let e = rows.entry(name).or_insert((0, 0, 0));
        e.0 += flat;
        e.1 = e.1.max(cum);
        e.2 += 1;
    }
    rows
}

#[test]
fn top_agrees_with_go_tool_pprof() {
    if !have_go() {
        return;
    }
    let cases = [
        ("ours/cpu.pb.gz", "cpu", "ns"),
        ("ours/cpu.pb.gz", "samples", "count"),
        ("ours/heap.pb.gz", "inuse_space", "B"),
        ("ours/heap.pb.gz", "alloc_objects", "count"),
        ("ours/spans.pb.gz", "wall_busy", "ns"),
        ("ours/span_memory.pb.gz", "alloc_space", "B"),
        ("ours/lifetimes.pb.gz", "temporary_space", "B"),
        ("ours/threads.pb.gz", "inuse_space", "B"),
        ("go/heap.pb.gz", "alloc_space", "B"),
        ("go/heap.pb.gz", "inuse_objects", "count"),
        ("go/cpu.pb.gz", "cpu", "ns"),
    ];
    for (file, ty, unit) in cases {
        let go = go_top(file, ty, unit);
        let ours = parse_top(&ok(&["top", "--raw", "-n", "0", "-t", ty, file]), false);
        assert!(!go.is_empty(), "{file} {ty}: go printed no rows");
        // Every function go lists with a value, we list with the same flat value; cum too,
        // where our rows did not merge into one of go's by the name simplification.
        for (name, &(flat, cum, _)) in &go {
            if flat == 0 && cum == 0 {
                continue;
            }
            let Some(&(our_flat, our_cum, merged)) = ours.get(name) else {
                panic!("{file} {ty}: go lists {name:?} ({flat}, {cum}), we do not:\n{ours:#?}");
            };
            assert_eq!(our_flat, flat, "{file} {ty}: flat of {name:?}");
            if merged == 1 {
                assert_eq!(our_cum, cum, "{file} {ty}: cum of {name:?}");
            } else {
                // Several of our rows (generic instances) are one of go's: each is within it.
                assert!(
                    our_cum <= cum,
                    "{file} {ty}: cum of {name:?}: ours {our_cum}, go {cum}"
                );
            }
        }
        let our_total: i64 = ours.values().map(|v| v.0).sum();
        let go_total: i64 = go.values().map(|v| v.0).sum();
        assert_eq!(our_total, go_total, "{file} {ty}: flat totals");
    }
}

#[test]
fn flame_graphs_are_written_with_titles_and_units() {
    let dir = std::env::temp_dir().join(format!("tracing-prof-cli-svg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("cpu.svg");
    let (success, _, stderr) = run(&["flamegraph", "ours/cpu.pb.gz", "-o", svg.to_str().unwrap()]);
    assert!(success, "{stderr}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<?xml") && text.trim_end().ends_with("</svg>"));
    assert!(text.contains("cpu.pb.gz cpu") && text.contains("cpu: 4.14 s in all"));
    assert!(text.contains("tracing_prof_examples::render [span]"));
    // The differential one, from diff.
    let diff = dir.join("diff.svg");
    let (success, stdout, stderr) = run(&[
        "diff",
        "series/heap.1.pb.gz",
        "series/heap.5.pb.gz",
        "-t",
        "alloc_space",
        "--flamegraph",
        diff.to_str().unwrap(),
    ]);
    assert!(success, "{stderr}");
    assert!(stdout.contains("alloc_space:"), "{stdout}");
    let text = std::fs::read_to_string(&diff).unwrap();
    assert!(
        text.contains("heap.5.pb.gz minus series/heap.1.pb.gz"),
        "{}",
        &text[..400]
    );
    // Default name: beside, in the current directory, after the input.
    let (success, _, stderr) = tracing_prof()
        .current_dir(&dir)
        .args([
            "flamegraph",
            "-t",
            "inuse_space",
            &fixture("ours/heap.pb.gz"),
        ])
        .output()
        .map(|o| {
            (
                o.status.success(),
                (),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
        .unwrap();
    assert!(success, "{stderr}");
    assert!(dir.join("heap.inuse_space.svg").exists(), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The SQL statements of the README's "Query with SQL", as written there.
fn readme_queries() -> Vec<String> {
    let readme = tracing_prof_test_support::documentation();
    let section = &readme[readme.find("**Query with SQL.**").unwrap()..];
    let block = &section[section.find("```sql\n").unwrap() + 7..];
    let block = &block[..block.find("```").unwrap()];
    let sql: String = block
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    sql.split(';')
        .map(str::trim)
        .filter(|q| !q.is_empty())
        .map(str::to_owned)
        .collect()
}

/// One sample of `go tool pprof -raw`: its values, its stack (function names, leaf first) and
/// its string labels.
struct RawSample {
    values: Vec<i64>,
    stack: Vec<String>,
    labels: BTreeMap<String, String>,
}

/// `go tool pprof -raw FILE`: the sample types and the samples.
fn go_raw(file: &str) -> (Vec<String>, Vec<RawSample>) {
    let out = std::process::Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(fixture(file))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines().skip_while(|l| l.trim() != "Samples:").skip(1);
    let types: Vec<String> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .map(|t| t.split('/').next().unwrap().to_owned())
        .collect();
    // Per sample: its values, its location ids, its labels.
    type Sample = (Vec<i64>, Vec<u64>, BTreeMap<String, String>);
    let mut samples: Vec<Sample> = Vec::new();
    let mut names: BTreeMap<u64, String> = BTreeMap::new();
    let mut in_locations = false;
    for l in text.lines() {
        if l.trim() == "Locations" {
            in_locations = true;
            continue;
        }
        if l.trim() == "Mappings" {
            break;
        }
        if in_locations {
            // `     1: 0x0 M=1 name file:line s=0(...)`, possibly more lines for inlined ones.
            if let Some((id, rest)) = l.trim().split_once(": ")
                && let Ok(id) = id.parse::<u64>()
            {
                let rest = rest.split_once(' ').map_or(rest, |r| r.1); // the address
                let rest = rest.split_once(' ').map_or(rest, |r| r.1); // M=
                let name = rest.split(" s=").next().unwrap();
                // Less ` file:line`, when there is one.
                let name = match name.rsplit_once(' ') {
                    Some((n, loc)) if loc.contains(':') && loc.contains('/') => n,
                    _ => name,
                };
                names.insert(id, name.trim().to_owned());
            }
        }
    }
    for l in lines {
        let t = l.trim();
        if t == "Locations" || t.is_empty() {
            break;
        }
        if let Some((values, locs)) = t.split_once(':')
            && values.split_whitespace().all(|v| v.parse::<i64>().is_ok())
        {
            samples.push((
                values
                    .split_whitespace()
                    .map(|v| v.parse().unwrap())
                    .collect(),
                locs.split_whitespace()
                    .map(|v| v.parse().unwrap())
                    .collect(),
                BTreeMap::new(),
            ));
            continue;
        }
        // `key:[value] key2:[value 2]` or numeric labels `bytes:[512 bytes]`.
        let mut rest = t;
        while let Some(open) = rest.find(":[") {
            let key = rest[..open].trim().to_owned();
            let close = rest[open..].find(']').unwrap() + open;
            let value = rest[open + 2..close].to_owned();
            samples.last_mut().unwrap().2.insert(key, value);
            rest = &rest[close + 1..];
        }
    }
    let samples = samples
        .into_iter()
        .map(|(values, locs, labels)| RawSample {
            values,
            stack: locs.iter().map(|id| names[id].clone()).collect(),
            labels,
        })
        .collect();
    (types, samples)
}

/// The rows of a `tracing-prof query` answer, cells split on two spaces or more.
fn rows(answer: &str) -> Vec<Vec<String>> {
    answer
        .lines()
        .skip(1)
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

/// `totals` by `key`, largest first: the query's rows are the first `n`, with their values
/// (ties at the edge may come in either order).
fn assert_top(rows: &[Vec<String>], expected: &BTreeMap<String, i64>, what: &str) {
    assert!(!rows.is_empty(), "{what}: no rows");
    let mut sorted: Vec<i64> = expected.values().copied().collect();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    for r in rows {
        let value: i64 = r[1].parse().unwrap();
        assert_eq!(
            expected.get(&r[0]),
            Some(&value),
            "{what}: {r:?} against go tool pprof's {expected:?}"
        );
    }
    // The rows are the largest ones.
    let smallest = rows
        .iter()
        .map(|r| r[1].parse::<i64>().unwrap())
        .min()
        .unwrap();
    assert!(
        sorted.get(rows.len()).is_none_or(|&next| next <= smallest),
        "{what}: a larger one was left out: {expected:?}"
    );
}

/// The report over a run's captures starts with memory over time: a line per top span path
/// through each of its 7 span_memory captures (the latest name, the same file, not twice), the
/// example's deliberate leak dashed and marked.
#[test]
fn the_report_charts_memory_over_time_with_the_leak_marked() {
    let out = std::env::temp_dir().join(format!(
        "tracing-prof-cli-chart-{}.html",
        std::process::id()
    ));
    ok(&[
        "report",
        &fixture("run"),
        &fixture("run/captures"),
        "-o",
        out.to_str().unwrap(),
    ]);
    let page = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let chart = &page[page.find("<section id=\"memory\">").expect("the chart")..];
    let chart = &chart[..chart.find("</section>").unwrap()];
    assert!(
        chart.contains("each of the 7 span_memory captures"),
        "{chart}"
    );
    let lines: Vec<&str> = chart.split("<polyline ").skip(1).collect();
    assert_eq!(lines.len(), 8, "the top 8 paths");
    for l in &lines {
        let points = l
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert_eq!(points.split(' ').count(), 7, "a point per capture: {l}");
    }
    let leak = lines
        .iter()
        .find(|l| l.contains("data-path=\"request -&gt; session_store\""))
        .unwrap();
    assert!(leak.contains("stroke-dasharray"), "{leak}");
    assert!(
        chart.contains("request -&gt; session_store — LEAK?"),
        "{chart}"
    );
    assert!(
        page.find("id=\"memory\"") < page.find("class=\"toc\""),
        "first"
    );
}

/// The README's SQL, run on a directory the example service wrote (timestamped cumulative
/// captures and the `latest` names of the newest), answers what `go tool pprof` says of the
/// same files. (The README's first query summed every capture and the `latest` copy: 2.5 times
/// the CPU.)
#[test]
fn the_readme_sql_answers_what_go_tool_pprof_says() {
    let db =
        std::env::temp_dir().join(format!("tracing-prof-cli-readme-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&db);
    let db_s = db.to_str().unwrap();
    // The directory as the service left it (README.txt, latest names, captures/), given as
    // directories: their *.pb.gz files are read, the index is not.
    assert!(std::path::Path::new(&fixture("run/README.txt")).is_file());
    ok(&[
        "sqlite",
        "-o",
        db_s,
        &fixture("run"),
        &fixture("run/captures"),
    ]);
    let files: Vec<String> = std::fs::read_dir(fixture("run/captures"))
        .unwrap()
        .map(|e| format!("run/captures/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    let loaded = rows(&ok(&["query", db_s, "SELECT COUNT(*) FROM profiles"]));
    assert_eq!(
        loaded[0][0],
        (files.len() + 12).to_string(),
        "captures and latest names"
    );
    let queries = readme_queries();
    assert_eq!(queries.len(), 3, "{queries:?}");
    let answers: Vec<Vec<Vec<String>>> = queries
        .iter()
        .map(|q| rows(&ok(&["query", db_s, q])))
        .collect();
    // The `latest` files are duplicates of the newest captures.
    let dups = rows(&ok(&[
        "query",
        db_s,
        "SELECT COUNT(*) FROM profiles WHERE duplicate_of IS NOT NULL",
    ]));
    assert_eq!(
        dups[0][0], "12",
        "one latest name per kind, and per kind's deltas"
    );
    if !have_go() {
        return;
    }
    // CPU per span path: the span_path labels of the newest capture, in ms.
    let (types, samples) = go_raw("run/cpu.latest.pb.gz");
    let cpu = types.iter().position(|t| t == "cpu").unwrap();
    let mut by_path: BTreeMap<String, i64> = BTreeMap::new();
    for s in &samples {
        *by_path.entry(s.labels["span_path"].clone()).or_default() += s.values[cpu];
    }
    let by_path: BTreeMap<String, i64> = by_path
        .into_iter()
        .map(|(k, v)| (k, v / 1_000_000))
        .collect();
    assert_top(&answers[0], &by_path, "CPU per span path");
    // The leak over time: each span_memory capture's in-use bytes of the path, in order.
    let mut captures: Vec<&String> = files
        .iter()
        .filter(|f| f.starts_with("run/captures/span_memory."))
        .collect();
    captures.sort(); // the names sort by time
    let expected: Vec<i64> = captures
        .iter()
        .map(|f| {
            let (types, samples) = go_raw(f);
            let inuse = types.iter().position(|t| t == "inuse_space").unwrap();
            samples
                .iter()
                .filter(|s| {
                    s.stack
                        .first()
                        .is_some_and(|f| f.ends_with("::session_store [span]"))
                })
                .map(|s| s.values[inuse])
                .sum()
        })
        .collect();
    let got: Vec<i64> = answers[1].iter().map(|r| r[1].parse().unwrap()).collect();
    assert_eq!(got, expected, "the leak over time");
    assert!(
        expected.windows(2).all(|w| w[0] <= w[1]) && expected[0] < expected[expected.len() - 1]
    );
    // Allocated bytes per leaf function of the newest heap capture.
    let (types, samples) = go_raw("run/heap.latest.pb.gz");
    let alloc = types.iter().position(|t| t == "alloc_space").unwrap();
    let mut by_leaf: BTreeMap<String, i64> = BTreeMap::new();
    for s in &samples {
        // Samples with no code frame (none here) have no leaf.
        if let Some(leaf) = s
            .stack
            .first()
            .filter(|f| !f.ends_with("[span]") && !f.starts_with('('))
        {
            *by_leaf.entry(leaf.clone()).or_default() += s.values[alloc];
        }
    }
    assert_top(&answers[2], &by_leaf, "allocated bytes per function");
    let _ = std::fs::remove_file(&db);
}

#[test]
fn sqlite_export_and_queries() {
    let db = std::env::temp_dir().join(format!("tracing-prof-cli-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&db);
    let db_s = db.to_str().unwrap();
    let mut args = vec!["sqlite", "-o", db_s];
    let series: Vec<String> = (1..=5)
        .map(|i| format!("series/span_memory.{i}.pb.gz"))
        .collect();
    args.extend(series.iter().map(String::as_str));
    args.push("ours/cpu.pb.gz");
    args.push("go/heap.pb.gz");
    args.push("go/cpu.pb.gz");
    ok(&args);
    let scopes = ok(&[
        "query",
        db_s,
        "SELECT source, kind, scope, duplicate_of FROM profiles ORDER BY id",
    ]);
    let go_leaf = ok(&[
        "query",
        db_s,
        "SELECT s.leaf, SUM(v.value) AS bytes FROM samples s \
         JOIN sample_values v ON v.sample_id = s.id JOIN profiles p ON p.id = s.profile_id \
         WHERE p.source LIKE '%go/heap%' AND v.sample_type = 'inuse_space' \
         GROUP BY 1 ORDER BY 2 DESC LIMIT 2",
    ]);
    let frames = ok(&[
        "query",
        db_s,
        "SELECT f.kind, COUNT(*) FROM frames f GROUP BY 1 ORDER BY 1",
    ]);
    expect("sqlite_queries", &format!("{scopes}\n{go_leaf}\n{frames}"));
    // Sampled totals carry their sample points and error; exact counts NULL (Go's heap is
    // sampled, our span_memory exact).
    let sampled = ok(&[
        "query",
        db_s,
        "SELECT p.kind, t.name, t.sample_points, ROUND(t.relative_error, 3) FROM sample_types t \
         JOIN profiles p ON p.id = t.profile_id \
         WHERE (p.source LIKE '%go/heap%' OR p.source LIKE '%span_memory.1%') \
         AND t.name = 'inuse_space' ORDER BY p.id",
    ]);
    let sampled = rows(&sampled);
    assert_eq!(sampled.len(), 2, "{sampled:?}");
    assert_eq!(sampled[0][2], "NULL", "span_memory is exact: {sampled:?}");
    assert_eq!(sampled[1][2], "1843", "Go's heap, as top says: {sampled:?}");
    // Loading the same file again: a duplicate, left out of the views.
    ok(&["sqlite", "-o", db_s, "ours/cpu.pb.gz"]);
    let dup = ok(&[
        "query",
        db_s,
        "SELECT COUNT(*) FROM profiles WHERE duplicate_of IS NOT NULL",
    ]);
    assert_eq!(rows(&dup)[0][0], "1", "{dup}");
    // Read-only: a statement that writes fails, clearly.
    let (success, _, stderr) = run(&["query", db_s, "DELETE FROM samples"]);
    assert!(!success && stderr.contains("readonly"), "{stderr}");
    let (success, _, stderr) = run(&["query", db_s, "SELECT nope FROM missing_table"]);
    assert!(!success && stderr.contains("no such table"), "{stderr}");
    let _ = std::fs::remove_file(&db);
}

/// A bad input leaves no database behind (it left an empty one), and a file that is not a
/// database of ours is not written to.
#[test]
fn sqlite_leaves_nothing_behind_on_bad_input() {
    let dir = std::env::temp_dir().join(format!("tracing-prof-cli-sqlbad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.pb.gz");
    std::fs::write(&bad, b"not a profile").unwrap();
    let db = dir.join("new.db");
    let (success, _, stderr) = run(&[
        "sqlite",
        "-o",
        db.to_str().unwrap(),
        "ours/cpu.pb.gz",
        bad.to_str().unwrap(),
    ]);
    assert!(
        !success && stderr.contains("not a pprof profile"),
        "{stderr}"
    );
    assert!(!db.exists(), "a database was left behind");
    let text = dir.join("notes.txt");
    std::fs::write(&text, b"my notes").unwrap();
    let (success, _, stderr) = run(&["sqlite", "-o", text.to_str().unwrap(), "ours/cpu.pb.gz"]);
    assert!(!success && stderr.contains("notes.txt"), "{stderr}");
    assert_eq!(std::fs::read(&text).unwrap(), b"my notes");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_is_a_clear_error_never_a_panic() {
    let dir = std::env::temp_dir().join(format!("tracing-prof-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = std::fs::read(fixture("ours/heap.pb.gz")).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &vec![0u8; 300 << 20]).unwrap();
    let bomb = gz.finish().unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", Vec::new(), "empty"),
        ("text", b"hello, profile".to_vec(), "not a pprof profile"),
        (
            "truncated",
            good[..good.len() / 2].to_vec(),
            "corrupt or truncated",
        ),
        ("bomb", bomb, "larger than 256 MiB"),
        (
            "garbage",
            (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect(),
            "pprof",
        ),
    ];
    for (name, bytes, says) in cases {
        let path = dir.join(name);
        std::fs::write(&path, &bytes).unwrap();
        for cmd in ["top", "traces", "flamegraph", "report"] {
            let (success, stdout, stderr) = run(&[cmd, path.to_str().unwrap()]);
            assert!(!success, "{cmd} {name} succeeded:\n{stdout}");
            assert!(
                stderr.starts_with("tracing-prof: ") && stderr.contains(says),
                "{cmd} {name}: {stderr}"
            );
            assert!(!stderr.contains("panicked"), "{cmd} {name}: {stderr}");
        }
    }
    let (success, _, stderr) = run(&["top", dir.join("missing").to_str().unwrap()]);
    assert!(!success && stderr.contains("No such file"), "{stderr}");
    // A directory without profiles (the cases above end in no .pb.gz), for the commands that
    // take directories; one that takes a single profile says it is a directory.
    let d = dir.to_str().unwrap();
    let (success, _, stderr) = run(&["report", d]);
    assert!(
        !success && stderr.contains("is a directory with no .pb.gz profile in it"),
        "{stderr}"
    );
    let (success, _, stderr) = run(&["top", d]);
    assert!(!success && stderr.contains("Is a directory"), "{stderr}");
    let (success, _, stderr) = run(&["top", "-t", "nope", "ours/heap.pb.gz"]);
    assert!(
        !success && stderr.contains("no sample type \"nope\"") && stderr.contains("inuse_space"),
        "{stderr}"
    );
    let (success, _, stderr) = run(&["top", "--focus", "(", "ours/heap.pb.gz"]);
    assert!(!success && stderr.contains("--focus"), "{stderr}");
    let (success, _, stderr) = run(&["diff", "ours/heap.pb.gz", "ours/cpu.pb.gz"]);
    assert!(
        !success && stderr.contains("different sample types"),
        "{stderr}"
    );
    let (success, _, stderr) = run(&["leaks", "ours/heap.pb.gz", "ours/heap.pb.gz"]);
    assert!(
        !success
            && stderr.contains("(1 input repeats another capture and was left out)")
            && stderr.contains("at least two different"),
        "{stderr}"
    );
    // Usage errors exit with 2, as clap has it.
    let out = tracing_prof().args(["top"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reads_a_running_debug_pprof_endpoint() {
    use tracing_subscriber::prelude::*;
    let (layer, guard) = tracing_prof::Profiler::builder()
        .interval(std::time::Duration::from_secs(3600))
        .build()
        .unwrap();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    tracing::dispatcher::with_default(&dispatch, || {
        for _ in 0..3 {
            tracing::info_span!("cli_endpoint_request").in_scope(|| std::hint::black_box(1));
        }
    });
    let handler = tracing_prof::export::http::PprofHandler::new(guard.profiler().clone())
        .bearer_token("s3cret");
    let server = tracing_prof::export::HttpServer::start(handler, "127.0.0.1:0").unwrap();
    let url = format!("http://{}/debug/pprof/spans", server.local_addr().unwrap());
    let (success, _, stderr) = run(&["top", &url]);
    assert!(!success && stderr.contains("HTTP 401"), "{stderr}");
    let out = tracing_prof()
        .env("TRACING_PROF_HTTP_TOKEN", "s3cret")
        .args(["top", "--by", "span", "-t", "spans", "--raw", &url])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("3 ") && l.ends_with("cli_endpoint_request")),
        "{stdout}"
    );
    // Without the scheme, as `live` takes it (it was read as a file name).
    let bare = format!("{}/debug/pprof/spans", server.local_addr().unwrap());
    let out = tracing_prof()
        .env("TRACING_PROF_HTTP_TOKEN", "s3cret")
        .args(["top", "--by", "span", "-t", "spans", &bare])
        .output()
        .unwrap();
    assert!(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).contains("cli_endpoint_request"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(server);
    drop(guard);

    // A server answering 404 with an HTML page: one short line, the page's title, never the
    // page (it was dumped whole).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let html_404 = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut head = [0u8; 4096];
        let _ = s.read(&mut head);
        let page = format!(
            "<!DOCTYPE html><html><head><title>404 Not Found</title></head><body>{}</body></html>",
            "<p>The requested URL was not found on this server.</p>".repeat(20)
        );
        let _ = write!(
            s,
            "HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
            page.len()
        );
    });
    let (success, _, stderr) = run(&["top", &format!("http://{addr}/debug/pprof/heap")]);
    html_404.join().unwrap();
    assert!(!success, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("HTTP 404: 404 Not Found") && !stderr.contains('<'),
        "{stderr}"
    );
}

/// Whether headless Chromium can run; under `CI=true` it must (`.ci/run` installs it).
fn chromium() -> Option<&'static str> {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if std::process::Command::new(name)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Some(name);
        }
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "Chromium is missing and CI=true: the report test must run (install chromium)"
    );
    eprintln!("SKIPPED: chromium is not installed");
    None
}

/// Runs `html` in headless Chromium in a 1400x900 window and returns the page's title once
/// its scripts ran.
fn browser_title(browser: &str, html: &str, name: &str) -> String {
    let path = std::env::temp_dir().join(format!(
        "tracing-prof-cli-{name}-{}.html",
        std::process::id()
    ));
    std::fs::write(&path, html).unwrap();
    let out = std::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1400,900",
            "--virtual-time-budget=3000",
            "--dump-dom",
        ])
        .arg(format!("file://{}", path.display()))
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let dom = String::from_utf8_lossy(&out.stdout);
    let start = dom.find("<title>").map_or(0, |i| i + 7);
    let end = dom[start..].find("</title>").map_or(start, |i| start + i);
    dom[start..end].to_owned()
}

/// The span frames of a CPU flame graph are on the first screen of a 1400x900 window, the
/// SVG's and the report's, however deep the code under them: the runtime's 60-frame idle
/// stacks made the graph 1000+ px tall with the span frames at the bottom. Measured by
/// Chromium's layout of the SVG.
#[test]
fn flame_graphs_show_the_span_frames_on_the_first_screen() {
    let dir = std::env::temp_dir().join(format!(
        "tracing-prof-cli-firstscreen-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let svg_path = dir.join("cpu.svg");
    ok(&[
        "flamegraph",
        "ours/cpu.pb.gz",
        "-o",
        svg_path.to_str().unwrap(),
    ]);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let height: f64 = {
        let root = &svg[svg.find("<svg").unwrap()..];
        let at = root.find(" height=\"").unwrap() + 9;
        root[at..root[at..].find('"').unwrap() + at]
            .parse()
            .unwrap()
    };
    assert!(height > 900.0, "the fixture's stacks are deep: {height} px");
    let report = dir.join("report.html");
    ok(&["report", "ours/cpu.pb.gz", "-o", report.to_str().unwrap()]);
    let Some(browser) = chromium() else { return };
    // The SVG inline in a page, and the lowest edge of its span frames.
    let inline = &svg[svg.find("<svg").unwrap()..];
    let page = format!(
        "<!DOCTYPE html><html><head><title>?</title></head><body style=\"margin:0\">{inline}\
         <script>\
         const spans = [...document.querySelectorAll('g')].filter(g => {{\
           const t = g.querySelector('title'); return t && t.textContent.includes('[span]'); }});\
         document.title = 'spans ' + spans.length + ' bottom ' +\
           Math.max(...spans.map(g => g.getBoundingClientRect().bottom));\
         </script></body></html>"
    );
    let title = browser_title(browser, &page, "svg");
    let words: Vec<&str> = title.split_whitespace().collect();
    assert!(words.len() == 4 && words[1] != "0", "{title}");
    let bottom: f64 = words[3].parse().unwrap();
    assert!(
        bottom < 900.0,
        "span frames end {bottom} px down the SVG: {title}"
    );
    // The report: its first flame graph starts high enough for them to be seen too.
    let mut report_page = std::fs::read_to_string(&report).unwrap();
    report_page = report_page.replace(
        "</body>",
        "<script>document.title = 'top ' + \
         document.querySelector('iframe.flame').getBoundingClientRect().top;</script></body>",
    );
    let title = browser_title(browser, &report_page, "report");
    let top: f64 = title
        .strip_prefix("top ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{title}"));
    assert!(
        top + bottom < 900.0,
        "the report's span frames end {} px down the page",
        top + bottom
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_renders_in_a_browser() {
    let dir = std::env::temp_dir().join(format!("tracing-prof-cli-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let html = dir.join("report.html");
    let (success, _, stderr) = run(&[
        "report",
        "ours/cpu.pb.gz",
        "ours/heap.pb.gz",
        "go/cpu.pb.gz",
        "-o",
        html.to_str().unwrap(),
    ]);
    assert!(success, "{stderr}");
    let page = std::fs::read_to_string(&html).unwrap();
    // Self-contained: nothing fetched from elsewhere.
    assert!(
        !page.contains("src=\"http") && !page.contains("href=\"http"),
        "the page loads something from the network"
    );
    assert_eq!(
        page.matches("<iframe class=\"flame\"").count(),
        4,
        "cpu, heap in-use and allocated, go cpu"
    );
    // Sampled totals say they are estimates (exact counts would not).
    assert!(
        page.contains("inuse_space (") && page.contains("in all, an estimate from"),
        "the report's sampled totals do not say they are estimates"
    );
    let Some(browser) = chromium() else { return };
    // The page as the browser built it, scripts run: the tables are there.
    let out = std::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=3000",
            "--dump-dom",
        ])
        .arg(format!("file://{}", html.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        dom.contains("Top span paths by cpu") && dom.contains("request -&gt; render"),
        "{dom}"
    );
    assert!(
        !log.contains("Uncaught") && !log.contains("SyntaxError"),
        "the page logged a script error:\n{log}"
    );
    // And each flame graph document runs inferno's script without error and draws frames.
    for svg in ["cpu.svg", "go.svg"] {
        let path = dir.join(svg);
        let input = if svg == "go.svg" {
            "go/cpu.pb.gz"
        } else {
            "ours/cpu.pb.gz"
        };
        ok(&["flamegraph", input, "-o", path.to_str().unwrap()]);
        let out = std::process::Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--enable-logging=stderr",
                "--v=0",
                "--virtual-time-budget=3000",
                "--dump-dom",
            ])
            .arg(format!("file://{}", path.display()))
            .output()
            .unwrap();
        let dom = String::from_utf8_lossy(&out.stdout);
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(!log.contains("Uncaught"), "{svg}: {log}");
        assert!(
            dom.matches("<g>").count() + dom.matches("<g ").count() > 3,
            "{svg}: {dom}"
        );
    }
    // A screenshot: the flame graph's colours are on the page, not a blank frame.
    let png = dir.join("report.png");
    let out = std::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1300,1100",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", html.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
    assert!(size > 20_000, "a {size}-byte screenshot is a blank page");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `leaks` over the captures of two processes (a service restarted, its `profiles/` never
/// emptied) reads the last process's only, and says so: a series across the restart would set
/// one process's memory against another's and could hide a leak.
#[test]
fn leaks_reads_the_last_process_of_its_inputs() {
    let dir = std::env::temp_dir().join(format!("tracing-prof-cli-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let decode = |f: &str| tracing_prof_model::Profile::decode(&std::fs::read(f).unwrap()).unwrap();
    // `profile` written into the test's directory as `name`.
    let write = |name: String, profile: tracing_prof_model::Profile| {
        let path = dir.join(name);
        std::fs::write(&path, profile.encode()).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let leaks = |files: &[&String]| {
        let args: Vec<&str> = ["leaks", "--by", "span"]
            .into_iter()
            .chain(files.iter().map(|f| f.as_str()))
            .collect();
        run(&args)
    };
    let series: Vec<String> = (1..=5)
        .map(|i| fixture(&format!("series/span_memory.{i}.pb.gz")))
        .collect();
    let last = decode(&series[4]);
    // A second process: the first two captures of the series again, an hour later, so that
    // its counts start over below the first process's last ones.
    let restarted: Vec<String> = (0..2)
        .map(|i| {
            let mut p = decode(&series[i]);
            p.time = last
                .time
                .map(|t| t + std::time::Duration::from_secs(3600 + i as u64));
            write(format!("span_memory.restarted.{i}.pb.gz"), p)
        })
        .collect();
    let all: Vec<&String> = series.iter().chain(&restarted).collect();
    let (success, stdout, stderr) = leaks(&all);
    assert!(success, "{stderr}");
    assert!(
        stderr.contains("captures of 2 processes") && stderr.contains("only the last process's 2"),
        "{stderr}"
    );
    assert!(stdout.starts_with("2 profiles, "), "{stdout}");
    // Counts over windows of their own (`-delta` files) rise and fall: no restart is read
    // from them.
    let windowed: Vec<String> = all
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mut p = decode(f);
            // As our `-delta` files say it.
            p.duration = Some(std::time::Duration::from_secs(10));
            for c in &mut p.comments {
                if c.starts_with("tracing-prof: cumulative") {
                    *c = "tracing-prof: window of 10.000 s: counters grew by these values in it"
                        .to_owned();
                }
            }
            write(format!("span_memory-delta.{i}.pb.gz"), p)
        })
        .collect();
    let (success, stdout, stderr) = leaks(&windowed.iter().collect::<Vec<_>>());
    assert!(success, "{stderr}");
    assert!(!stderr.contains("processes"), "{stderr}");
    assert!(stdout.starts_with("7 profiles, "), "{stdout}");
    // Files named as the profiler names them say their process: the last input's is read,
    // even where two processes' captures interleave in time.
    let named: Vec<String> = all
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let pid = if i % 2 == 0 { 4242 } else { 77 };
            write(
                format!("span_memory.{pid}.20261126T2000{i:02}.000000Z.pb.gz"),
                decode(f),
            )
        })
        .collect();
    let (success, stdout, stderr) = leaks(&named.iter().collect::<Vec<_>>());
    assert!(success, "{stderr}");
    assert!(
        stderr.contains("captures of 2 processes, by their file names")
            && stderr.contains("pid 4242, 4 of them"),
        "{stderr}"
    );
    assert!(stdout.starts_with("4 profiles, "), "{stdout}");
    // The same process alone reads as before.
    let (success, alone, stderr) = leaks(&series.iter().collect::<Vec<_>>());
    assert!(success, "{stderr}");
    assert!(alone.starts_with("5 profiles, "), "{alone}");
    // One capture of the last process: nothing to compare, said so.
    let (success, _, stderr) = leaks(&all[..6]);
    assert!(
        !success && stderr.contains("the last process among the inputs has one"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `top --by span` on a spans profile with the latency histogram: p50, p90 and p99 per span
/// path, interpolated inside the bucket (100 spans of 1.1 ms, all in (1 ms, 1.25 ms]: 1.125,
/// 1.225 and 1.2475 ms), after the table and in its order.
#[test]
fn top_by_span_shows_the_latency_of_each_path() {
    use tracing_prof::model::{PathKind, PathProfile, Snapshot, SpanFrame, duration_bucket};
    let mut s = Snapshot::new(
        std::time::SystemTime::now(),
        std::time::Duration::from_secs(1),
    );
    let mut p = PathProfile::new(
        PathKind::Span,
        vec![SpanFrame::new("app", "checkout", None, None)],
    );
    p.time.spans = 100;
    p.time.wall_ns = 100 * 1_100_000;
    p.time.busy_ns = p.time.wall_ns;
    p.time.durations[duration_bucket(1_100_000)] = 100;
    s.paths.push(p);
    let file = std::env::temp_dir().join(format!(
        "tracing-prof-cli-latency-{}.pb.gz",
        std::process::id()
    ));
    std::fs::write(&file, s.encode(tracing_prof::ProfileKind::Spans)).unwrap();
    let out = ok(&["top", "--by", "span", "-t", "wall", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    let ns = |v: i64| tracing_prof::model::units::format_value(v, "nanoseconds");
    let expected = format!(
        "{:>10} {:>10} {:>10} {:>9}  checkout",
        ns(1_125_000),
        ns(1_225_000),
        ns(1_247_500),
        100
    );
    assert!(
        out.contains("\nLatency (wall time, creation to close"),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l == expected),
        "{expected:?} not in\n{out}"
    );
}
