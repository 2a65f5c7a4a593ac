//! `tracing-prof`: read what tracing-prof (or any pprof producer: Go, pprof-rs) wrote, without
//! a Go toolchain.
//!
//! ```text
//! tracing-prof top profiles/cpu.latest.pb.gz                    # hottest functions, span frames marked [span]
//! tracing-prof top --by span -t inuse_space profiles/span_memory.latest.pb.gz
//! tracing-prof diff before/heap.latest.pb.gz after/heap.latest.pb.gz --flamegraph grew.svg
//! tracing-prof leaks profiles/captures/heap.*.pb.gz             # what kept growing
//! tracing-prof report profiles -o report.html                   # one self-contained page
//! tracing-prof sqlite profiles/captures -o profiles.db && tracing-prof query profiles.db "SELECT ..."
//! ```
//!
//! Every command reads files (gzip'd or not), `-` for standard input, or an `http(s)://` URL
//! of a running `/debug/pprof` endpoint; `report` and `sqlite` also take a directory,
//! for the `*.pb.gz` files in it (a profile directory: the newest of each kind; its
//! `captures/`: every capture). Bad input is an error message and exit status 1, never
//! a panic; usage errors exit with 2.

mod chart;
mod input;
mod live;
mod report;
mod select;
mod sqlite;

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use tracing_prof_model::{Grouping, PROFILER_FRAME, series, units};

#[derive(Debug, Parser)]
#[command(
    name = "tracing-prof",
    version,
    about = "Read tracing-prof and pprof profiles: top, traces, diff, flame graphs, leaks, HTML reports, SQLite",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The functions or span paths with the largest values, as `go tool pprof -top` lists them.
    Top(TopArgs),
    /// The samples one by one, largest first: values, labels, and the stack with files and lines.
    Traces(TracesArgs),
    /// Label values and their totals (`go tool pprof -tags`), lifetime buckets and numbers in
    /// their own order.
    Tags(TracesArgs),
    /// NEW minus BASE: what grew (positive) and what shrank (negative), per function or span path.
    Diff(DiffArgs),
    /// A flame graph SVG (drawn by inferno) of any sample type.
    Flamegraph(FlamegraphArgs),
    /// Over a series of cumulative files of one process: what kept growing (a leak) and what changed most.
    Leaks(LeaksArgs),
    /// One self-contained HTML page with flame graphs and tables, for sharing.
    Report(ReportArgs),
    /// Loads profiles into an SQLite database (created or appended to); see `query`.
    Sqlite(SqliteArgs),
    /// Runs one SQL statement on a database made by `sqlite` (opened read-only) and prints the rows.
    Query(QueryArgs),
    /// A live terminal view of a running service (`http://HOST:PORT`, its `/debug/pprof`):
    /// CPU and memory by span path, functions, threads, a chart, what runs now. Or a recording.
    #[command(
        after_help = "Keys: 1-5 views (spans, functions, threads, chart, now) · ↑↓ select · \
        Enter: the span path's code stacks, Esc back · / filter · s sort · p hold the view · \
        ←→ step in time (the chart: pan), End: now · +/- zoom the chart · q quit"
    )]
    Live(LiveArgs),
}

/// What rows stand for.
#[derive(Clone, Copy, Debug, Default, ValueEnum)]
enum By {
    /// Functions, span frames (marked `[span]`) and code frames alike.
    #[default]
    Function,
    /// Span paths (`request -> render`): flat is the path's own value, cum includes paths below.
    Span,
}

impl From<By> for Grouping {
    fn from(b: By) -> Self {
        match b {
            By::Function => Grouping::Function,
            By::Span => Grouping::SpanPath,
        }
    }
}

/// Which samples and which values.
#[derive(Debug, Args)]
struct Select {
    /// The sample type (default: the profile's default, as pprof's `-sample_index`).
    #[arg(short = 't', long = "sample-type", value_name = "NAME")]
    sample_type: Option<String>,
    /// Only samples under this span path (`request` or `request -> render`; a path and
    /// everything below it), as `-tagfocus=span_path=...`.
    #[arg(long, value_name = "PATH")]
    span: Option<String>,
    /// Only samples with a frame whose name matches this regular expression (pprof's `-focus`).
    #[arg(long, value_name = "REGEX")]
    focus: Option<String>,
    /// Leave out samples with a frame whose name matches this regular expression (`-ignore`).
    #[arg(long, value_name = "REGEX")]
    ignore: Option<String>,
    /// Only samples with this label (`key=value`, e.g. `thread=worker-1`); repeat for several.
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    tags: Vec<String>,
}

#[derive(Debug, Args)]
struct TopArgs {
    /// A profile: a file, `-` for standard input, or an http(s) URL.
    input: String,
    #[command(flatten)]
    select: Select,
    /// Rows: functions or span paths.
    #[arg(long, value_enum, default_value_t)]
    by: By,
    /// Sort by cum instead of flat.
    #[arg(long)]
    cum: bool,
    /// Rows shown (0: all).
    #[arg(short = 'n', long, default_value_t = 20)]
    limit: usize,
    /// Show each function's file and line.
    #[arg(short = 'l', long)]
    locations: bool,
    /// Values as plain integers in the sample type's unit (nanoseconds, bytes, counts).
    #[arg(long)]
    raw: bool,
}

#[derive(Debug, Args)]
struct TracesArgs {
    /// A profile: a file, `-` for standard input, or an http(s) URL.
    input: String,
    #[command(flatten)]
    select: Select,
    /// Samples shown (0: all; `traces` only).
    #[arg(short = 'n', long, default_value_t = 10)]
    limit: usize,
}

#[derive(Debug, Args)]
struct DiffArgs {
    /// The earlier profile.
    base: String,
    /// The later profile.
    new: String,
    #[command(flatten)]
    select: Select,
    /// Rows: functions or span paths.
    #[arg(long, value_enum, default_value_t)]
    by: By,
    /// Rows shown (0: all).
    #[arg(short = 'n', long, default_value_t = 20)]
    limit: usize,
    /// Also write a differential flame graph (widths: NEW; red: grew, blue: shrank).
    #[arg(long, value_name = "SVG")]
    flamegraph: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct FlamegraphArgs {
    /// A profile: a file, `-` for standard input, or an http(s) URL.
    input: String,
    #[command(flatten)]
    select: Select,
    /// Where to write the SVG (`-`: standard output). Default: NAME.SAMPLE_TYPE.svg in the
    /// current directory, NAME the input's file name less `.pb.gz`.
    #[arg(short, long, value_name = "SVG")]
    output: Option<PathBuf>,
    /// The title (default: the input's name and the sample type).
    #[arg(long)]
    title: Option<String>,
}

#[derive(Debug, Args)]
struct LeaksArgs {
    /// Cumulative profiles of one process, oldest first (tracing-prof's timestamped names sort
    /// by time: `profiles/captures/heap.*.pb.gz`).
    #[arg(num_args = 2.., required = true)]
    inputs: Vec<String>,
    /// The sample type (default: `inuse_space`).
    #[arg(short = 't', long = "sample-type", default_value = "inuse_space")]
    sample_type: String,
    /// Rows: stacks (span path and the function that allocated) or span paths.
    #[arg(long, value_enum, default_value_t)]
    by: By,
    /// Growth over the steps judged (see --steps) below which nothing is suspected, in the
    /// sample type's unit.
    #[arg(long, default_value_t = 65536)]
    min_growth: i64,
    /// Steps at the end of the series to judge (default: all, and nothing is suspected with
    /// fewer than 3). Suspected: grew by `--min-growth` over them, in at least half of them,
    /// and never fell.
    #[arg(long)]
    steps: Option<usize>,
    /// Rows of the growth table (0: all).
    #[arg(short = 'n', long, default_value_t = 10)]
    limit: usize,
}

#[derive(Debug, Args)]
struct ReportArgs {
    /// Profiles to show, each with its flame graph and tables; a directory stands for the
    /// `*.pb.gz` files in it.
    #[arg(required = true)]
    inputs: Vec<String>,
    /// Where to write the page.
    #[arg(short, long, default_value = "tracing-prof-report.html")]
    output: PathBuf,
    /// Rows per table.
    #[arg(short = 'n', long, default_value_t = 15)]
    limit: usize,
}

#[derive(Debug, Args)]
struct SqliteArgs {
    /// Profiles to load; a directory stands for the `*.pb.gz` files in it.
    #[arg(required = true)]
    inputs: Vec<String>,
    /// The database (created if missing; profiles are appended).
    #[arg(short, long, value_name = "DB")]
    output: PathBuf,
}

#[derive(Debug, Args)]
struct QueryArgs {
    /// A database made by `tracing-prof sqlite`.
    db: PathBuf,
    /// One SQL statement (the database is opened read-only).
    sql: String,
}

#[derive(Debug, Args)]
struct LiveArgs {
    /// The service's endpoint (`http://127.0.0.1:6060`, `host:6060`, `.../debug/pprof`), or a
    /// recording made with `-o` to replay. `TRACING_PROF_HTTP_TOKEN` is sent as its bearer token.
    source: String,
    /// Also record every frame received to this file (replaced if it exists), for
    /// `tracing-prof live FILE` later.
    #[arg(short, long, value_name = "FILE")]
    output: Option<String>,
    /// Seconds per window (the refresh interval).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=60))]
    seconds: u64,
}

/// What went wrong, said once on stderr.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Input(#[from] input::InputError),
    #[error("{0}")]
    Model(#[from] tracing_prof_model::ModelError),
    #[error("{0}")]
    Select(String),
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Sqlite(#[from] sqlite::SqliteError),
    #[error("live: {0}")]
    Live(String),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = format!("tracing-prof: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                let text = s.to_string();
                if !msg.contains(&text) {
                    msg.push_str(&format!(": {text}"));
                }
                source = s.source();
            }
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}

/// Writes `text` to standard output; a closed pipe (`| head`) ends quietly.
fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

fn write_file(path: &std::path::Path, bytes: &[u8]) -> Result<(), CliError> {
    if path.as_os_str() == "-" {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(bytes).and_then(|()| out.flush());
        return Ok(());
    }
    std::fs::write(path, bytes).map_err(|source| CliError::Write {
        path: path.to_owned(),
        source,
    })
}

/// `", an estimate from N sample points, ±X%...; exact: ..."` where the total of sample type
/// `index` is sampled (found in a new user's trial: "inuse_space: 1.0 MiB in all" with 2.6 MiB
/// in use, and no word that it was sampled); nothing for exact counts.
fn estimate_note(p: &tracing_prof_model::Profile, index: usize) -> String {
    p.estimate(index)
        .map_or_else(String::new, |e| format!(", {e}"))
}

fn run(command: Command) -> Result<(), CliError> {
    match command {
        Command::Top(a) => {
            let loaded = input::load(&a.input)?;
            let p = select::apply(&loaded.profile, &a.select)?;
            let top = p.top(a.select.sample_type.as_deref(), a.by.into(), a.cum, a.limit)?;
            let index = p.sample_type_named(a.select.sample_type.as_deref())?;
            let latency = match a.by {
                By::Span => latency_table(&p, &top.rows),
                By::Function => String::new(),
            };
            let header = match loaded.process_memory() {
                Some(m) => format!("{}\nprocess memory: {m}", loaded.describe()),
                None => loaded.describe(),
            };
            print(&format!(
                "{header}\n{}: {} in all{}{}\n{}{latency}",
                top.sample_type,
                units::format_value(top.total, &top.unit),
                select::describe(&a.select, &p),
                estimate_note(&p, index),
                top.render_with(a.locations, a.raw)
            ));
        }
        Command::Traces(a) => {
            let loaded = input::load(&a.input)?;
            let p = select::apply(&loaded.profile, &a.select)?;
            let text = p.samples_text(a.select.sample_type.as_deref(), a.limit)?;
            let index = p.sample_type_named(a.select.sample_type.as_deref())?;
            let sampled = match p.estimate(index) {
                Some(e) => format!(
                    "\nsampled: each value below is an estimate; {} in all is {e}",
                    p.sample_types[index].name
                ),
                None => String::new(),
            };
            print(&format!("{}{sampled}\n\n{text}", loaded.describe()));
        }
        Command::Tags(a) => {
            let loaded = input::load(&a.input)?;
            let p = select::apply(&loaded.profile, &a.select)?;
            let index = p.sample_type_named(a.select.sample_type.as_deref())?;
            let ty = &p.sample_types[index];
            let mut text = format!(
                "{}\n{}{}{}\n",
                loaded.describe(),
                ty.name,
                select::describe(&a.select, &p),
                estimate_note(&p, index)
            );
            for t in p.tags(Some(&ty.name))? {
                text.push_str(&t.render(&ty.unit));
            }
            print(&text);
        }
        Command::Diff(a) => {
            let base = input::load(&a.base)?;
            let new = input::load(&a.new)?;
            let (b, n) = (
                select::apply(&base.profile, &a.select)?,
                select::apply(&new.profile, &a.select)?,
            );
            let diff = n.diff(&b)?;
            let mut top = diff.top(a.select.sample_type.as_deref(), a.by.into(), false, a.limit)?;
            let index = n.sample_type_named(a.select.sample_type.as_deref())?;
            let (before, after) = (b.total(index), n.total(index));
            // Percentages of the base's total, as `go tool pprof -diff_base` has them (a share
            // of the net change means little when changes cancel out).
            top.total = before;
            print(&format!(
                "base: {}\nnew:  {}\n{}: {} -> {} ({}{}); changes below, percentages of the base{}\n{}",
                base.describe(),
                new.describe(),
                top.sample_type,
                units::format_value(before, &top.unit),
                units::format_value(after, &top.unit),
                if after >= before { "+" } else { "" },
                units::format_value(after - before, &top.unit),
                select::describe(&a.select, &n),
                top.render(false)
            ));
            if let Some(path) = &a.flamegraph {
                let title = format!("{} minus {}", new.name, base.name);
                let svg = n.flamegraph_diff_svg(&b, a.select.sample_type.as_deref(), &title)?;
                write_file(path, &svg)?;
                eprintln!("wrote {}", path.display());
            }
        }
        Command::Flamegraph(a) => {
            let loaded = input::load(&a.input)?;
            let p = select::apply(&loaded.profile, &a.select)?;
            let index = p.sample_type_named(a.select.sample_type.as_deref())?;
            let ty = p.sample_types[index].name.clone();
            let title = a
                .title
                .clone()
                .unwrap_or_else(|| format!("{} {ty}", loaded.name));
            let svg = p.flamegraph_svg(Some(&ty), &title)?;
            let path = a
                .output
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("{}.{ty}.svg", loaded.stem())));
            write_file(&path, &svg)?;
            if path.as_os_str() != "-" {
                eprintln!("wrote {}", path.display());
            }
        }
        Command::Leaks(a) => {
            let loaded = input::load_all(&a.inputs)?;
            let loaded = in_time_order(loaded);
            let given = loaded.len();
            let loaded = last_process(loaded);
            if loaded.len() < 2 {
                return Err(CliError::Select(if loaded.len() < given {
                    "leaks needs at least two different profiles of one process: the last \
                     process among the inputs has one"
                        .to_owned()
                } else {
                    "leaks needs at least two different profiles of one process".to_owned()
                }));
            }
            let profiles: Vec<_> = loaded.iter().map(|l| l.profile.clone()).collect();
            print(&leaks(&loaded, &profiles, &a)?);
        }
        Command::Report(a) => {
            let loaded = input::load_all(&a.inputs)?;
            let html = report::html(&loaded, a.limit);
            write_file(&a.output, html.as_bytes())?;
            eprintln!("wrote {}", a.output.display());
        }
        Command::Sqlite(a) => {
            // Every input read before the database is touched: a bad file leaves nothing
            // behind, and the rest go in in one transaction.
            let loaded = input::load_all(&a.inputs)?;
            let existed = a.output.exists();
            let ids = sqlite::Db::open(&a.output).and_then(|mut db| db.add_all(&loaded));
            let ids = match ids {
                Ok(ids) => ids,
                Err(e) => {
                    if !existed {
                        let _ = std::fs::remove_file(&a.output);
                    }
                    return Err(e.into());
                }
            };
            for (loaded, id) in loaded.iter().zip(ids) {
                eprintln!(
                    "{}: profile {id}, {} samples",
                    loaded.name,
                    loaded.profile.samples.len()
                );
            }
        }
        Command::Query(a) => print(&sqlite::query(&a.db, &a.sql)?),
        Command::Live(a) => live::run(&live::Options {
            source: a.source,
            output: a.output,
            seconds: a.seconds,
        })
        .map_err(CliError::Live)?,
    }
    Ok(())
}

/// The inputs in the order they were taken (when every one says when), without repeats of one
/// capture (`heap.latest.pb.gz` beside the timestamped file it links to).
fn in_time_order(mut loaded: Vec<input::Loaded>) -> Vec<input::Loaded> {
    if loaded.iter().all(|l| l.profile.time.is_some()) {
        loaded.sort_by_key(|l| l.profile.time);
        let before = loaded.len();
        loaded.dedup_by(|b, a| a.profile.time == b.profile.time && a.profile == b.profile);
        match before - loaded.len() {
            0 => {}
            1 => eprintln!("(1 input repeats another capture and was left out)"),
            n => eprintln!("({n} inputs repeat another capture and were left out)"),
        }
    }
    loaded
}

/// The captures of the last process among `loaded` (in time order): a series over two
/// processes would compare one's memory with the other's, and could hide a leak.
/// - Our files name their process (`span_memory.4242.<stamp>.pb.gz`): the last input's
///   process is kept.
/// - Otherwise, when every input is one of our cumulative captures, a count of allocations
///   (`alloc_objects`) that falls from one input to the next says a new process began there
///   (within a process it only grows): the inputs before the last fall are left out.
/// - Anything else (Go's profiles, deltas, whose counts are a window's) is taken as it is.
///
/// What is left out is said on stderr.
fn last_process(loaded: Vec<input::Loaded>) -> Vec<input::Loaded> {
    let pids: Option<Vec<i64>> = loaded.iter().map(input::Loaded::process).collect();
    if let Some(pids) = pids {
        let Some(&last) = pids.last() else {
            return loaded;
        };
        let mut others: Vec<i64> = pids.iter().copied().filter(|&p| p != last).collect();
        if others.is_empty() {
            return loaded;
        }
        others.sort_unstable();
        others.dedup();
        let kept: Vec<input::Loaded> = loaded
            .into_iter()
            .zip(&pids)
            .filter(|(_, p)| **p == last)
            .map(|(l, _)| l)
            .collect();
        eprintln!(
            "(the inputs are captures of {} processes, by their file names; only the last \
             one's, pid {last}, {} of them, are read)",
            others.len() + 1,
            kept.len()
        );
        return kept;
    }
    if !loaded.iter().all(input::Loaded::is_our_cumulative) {
        return loaded;
    }
    let counts: Option<Vec<i64>> = loaded
        .iter()
        .map(|l| {
            let p = &l.profile;
            let i = p
                .sample_types
                .iter()
                .position(|t| t.name == "alloc_objects")?;
            Some(p.total(i))
        })
        .collect();
    let Some(counts) = counts else {
        return loaded;
    };
    let starts: Vec<usize> = (1..counts.len())
        .filter(|&i| counts[i] < counts[i - 1])
        .collect();
    let Some(&last) = starts.last() else {
        return loaded;
    };
    eprintln!(
        "(the inputs are captures of {} processes: alloc_objects falls from {} to {}; only the \
         last process's {} are read)",
        starts.len() + 1,
        loaded[last - 1].name,
        loaded[last].name,
        loaded.len() - last
    );
    loaded.into_iter().skip(last).collect()
}

/// The latency of the span paths among `rows`, in their order, from a `spans` profile's
/// latency histogram (`durations` samples); empty when the profile has none (another kind,
/// or written before the histogram was).
fn latency_table(p: &tracing_prof_model::Profile, rows: &[tracing_prof_model::TopRow]) -> String {
    let latencies = p.latencies();
    let mut out = String::new();
    for row in rows {
        let Some((_, buckets)) = latencies.iter().find(|(name, _)| *name == row.name) else {
            continue;
        };
        let q = |q: f64| {
            tracing_prof_model::duration_quantile(buckets, q).map_or_else(
                || "-".to_owned(),
                |ns| units::format_value(i64::try_from(ns).unwrap_or(i64::MAX), "nanoseconds"),
            )
        };
        let spans: u64 = buckets.iter().sum();
        out.push_str(&format!(
            "{:>10} {:>10} {:>10} {:>9}  {}\n",
            q(0.5),
            q(0.9),
            q(0.99),
            spans,
            row.name
        ));
    }
    if out.is_empty() {
        return out;
    }
    format!(
        "\nLatency (wall time, creation to close; from the histogram, within a bucket, 26% at \
         worst):\n{:>10} {:>10} {:>10} {:>9}  span path\n{out}",
        "p50", "p90", "p99", "spans"
    )
}

/// Steps (captures less one) the `leaks` command wants before it suspects anything, unless
/// `--steps` says otherwise.
const MIN_LEAK_STEPS: usize = 3;

/// The `leaks` command's text.
fn leaks(
    loaded: &[input::Loaded],
    profiles: &[tracing_prof_model::Profile],
    a: &LeaksArgs,
) -> Result<String, CliError> {
    let steps = a
        .steps
        .unwrap_or(profiles.len() - 1)
        .clamp(1, profiles.len() - 1);
    let growth = series::growth(profiles, Some(&a.sample_type), a.by.into())?;
    let index = profiles[0].sample_type_named(Some(&a.sample_type))?;
    let unit = profiles[0].sample_types[index].unit.clone();
    let fmt = |v: i64| units::format_value(v, &unit);
    let mut out = format!(
        "{} profiles, {} to {}\n",
        profiles.len(),
        loaded[0].name,
        loaded[loaded.len() - 1].name
    );
    // The profiler's own memory grows as it meets new stacks, up to its bounds (README,
    // "Overhead"); it is shown apart so that it is not taken for the application's leak.
    let own = |g: &series::Growth| g.name.starts_with(PROFILER_FRAME);
    // The profiler's own rule (`series::is_suspected_leak`), over the last `steps` steps.
    let trend = |g: &series::Growth| series::is_suspected_leak(&g.values, steps, a.min_growth);
    let suspected: Vec<_> = growth.iter().filter(|g| trend(g) && !own(g)).collect();
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    if a.steps.is_none() && steps < MIN_LEAK_STEPS {
        // A cache filling up grows in the first step or two just as a leak does.
        out.push_str(&format!(
            "\nToo few captures to judge: {} give {steps} step{}, and a cache filling up grows \
             in its first steps as a leak does. A leak keeps growing: give at least {} captures \
             (run longer, or export more often with TRACING_PROF_INTERVAL), or --steps to judge \
             these anyway.\n",
            profiles.len(),
            plural(steps),
            MIN_LEAK_STEPS + 1
        ));
    } else if suspected.is_empty() {
        out.push_str(&format!(
            "\nNo suspected leaks: no {}'s {} grew by {} or more over the last {steps} step{} without ever falling.\n",
            match a.by {
                By::Function => "stack",
                By::Span => "span path",
            },
            a.sample_type,
            fmt(a.min_growth),
            plural(steps)
        ));
    } else {
        out.push_str(&format!(
            "\nSuspected leaks ({} grew over the last {steps} step{}, in at least half of them, and never fell):\n",
            a.sample_type,
            plural(steps)
        ));
        for g in &suspected {
            out.push_str(&format!(
                "  {:>10}  {}  ({} now)\n",
                format!("+{}", fmt(g.change())),
                g.name,
                fmt(*g.values.last().unwrap_or(&0))
            ));
        }
    }
    if let Some(g) = growth.iter().find(|g| own(g) && g.change() > 0) {
        out.push_str(&format!(
            "\n{PROFILER_FRAME}, the profiler's own memory, grew by {} (it holds the stacks it has met, up to fixed bounds).\n",
            fmt(g.change())
        ));
    }
    out.push_str(&format!(
        "\nLargest changes, first to last ({}):\n  {:>10} {:>10} {:>6}  name\n",
        a.sample_type, "first", "last", "grew"
    ));
    let mut by_change: Vec<_> = growth.iter().filter(|g| g.change() != 0).collect();
    by_change.sort_by_key(|g| std::cmp::Reverse(g.change().abs()));
    let shown = if a.limit == 0 {
        by_change.len()
    } else {
        a.limit
    };
    for g in by_change.iter().take(shown) {
        out.push_str(&format!(
            "  {:>10} {:>10} {:>6}  {}\n",
            fmt(g.values[0]),
            fmt(*g.values.last().unwrap_or(&0)),
            format!("{}/{}", g.grew, profiles.len() - 1),
            g.name
        ));
    }
    Ok(out)
}
