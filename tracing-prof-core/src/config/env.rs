//! The `TRACING_PROF_*` environment variables: their names, the list of every setting (for the
//! warning about misspelt ones), and how one is read.

use super::ConfigError;

/// Export interval, e.g. `10s`, `500ms`, `2m`.
pub const ENV_INTERVAL: &str = "TRACING_PROF_INTERVAL";
/// Cap on distinct span paths, `1..=MAX_SPAN_PATHS`.
pub const ENV_MAX_SPAN_PATHS: &str = "TRACING_PROF_MAX_SPAN_PATHS";
/// Per-span CPU time: `sampled`, `exact` or `off` (`1`/`on` mean `sampled`, `0` means `off`).
pub const ENV_CPU_TIME: &str = "TRACING_PROF_CPU_TIME";
/// CPU clock of `exact` CPU time: `rusage` or `thread`.
pub const ENV_CPU_CLOCK: &str = "TRACING_PROF_CPU_CLOCK";
/// CPU stack samples per second of CPU time per thread, `0` to `10000` (`0`: off).
pub const ENV_CPU_HZ: &str = "TRACING_PROF_CPU_HZ";
/// How the CPU sampler walks stacks: `dwarf` or `fp` (frame pointers).
pub const ENV_CPU_UNWIND: &str = "TRACING_PROF_CPU_UNWIND";
/// Which spans' OpenTelemetry ids label CPU samples (the `opentelemetry` feature): `roots`,
/// `all` or `off`. See [`TraceLinks`](crate::TraceLinks).
pub const ENV_TRACE_LINKS: &str = "TRACING_PROF_TRACE_LINKS";
/// Span fields shown as labels, comma-separated (`route,method`).
pub const ENV_LABEL_FIELDS: &str = "TRACING_PROF_LABEL_FIELDS";
/// Distinct values kept per label field.
pub const ENV_LABEL_VALUES: &str = "TRACING_PROF_LABEL_VALUES";
/// Captures the leak rule looks back over (see `leak_detection`), at most 1024; `0` turns
/// detection off.
pub const ENV_LEAK_SNAPSHOTS: &str = "TRACING_PROF_LEAK_SNAPSHOTS";
/// Least growth, in bytes, over those captures.
pub const ENV_LEAK_MIN_BYTES: &str = "TRACING_PROF_LEAK_MIN_BYTES";
/// Level of the leak event: `error`, `warn`, `info`, `debug` or `trace`.
pub const ENV_LEAK_LEVEL: &str = "TRACING_PROF_LEAK_LEVEL";
/// Giant allocation threshold in bytes (`0`: off).
pub const ENV_GIANT_BYTES: &str = "TRACING_PROF_GIANT_BYTES";
/// Refuse giant allocations (return null): `1`/`0`, `true`/`false`, ...
pub const ENV_GIANT_REFUSE: &str = "TRACING_PROF_GIANT_REFUSE";
/// Heap sampling rate in bytes (`0`: off, `1`: every allocation).
pub const ENV_SAMPLE_RATE: &str = "TRACING_PROF_SAMPLE_RATE";
/// Temporary-allocation threshold, a duration like [`ENV_INTERVAL`] (`us` accepted too).
pub const ENV_TEMPORARY: &str = "TRACING_PROF_TEMPORARY";
/// Shutdown timeout, a duration like [`ENV_INTERVAL`].
pub const ENV_SHUTDOWN_TIMEOUT: &str = "TRACING_PROF_SHUTDOWN_TIMEOUT";
/// Long-poll threshold, a duration like [`ENV_INTERVAL`] (`0` or `off`: not counted).
pub const ENV_LONG_POLL: &str = "TRACING_PROF_LONG_POLL";
/// Whether SIGTERM makes the final export before the process ends: `1`/`0`, `true`/`false`,
/// ... (default on; see `Config::flush_on_sigterm`).
pub const ENV_FLUSH_ON_SIGTERM: &str = "TRACING_PROF_FLUSH_ON_SIGTERM";
/// How often the heap is read for its peak, a duration like [`ENV_INTERVAL`] (at least 10 ms;
/// `0` or `off`: not watched).
pub const ENV_PEAK_EVERY: &str = "TRACING_PROF_PEAK_EVERY";
/// How far back the flight recorder reaches, a duration like [`ENV_INTERVAL`] (default 5m;
/// `off`: no recorder).
pub const ENV_FLIGHT_RECORDER: &str = "TRACING_PROF_FLIGHT_RECORDER";
/// Shares of the cgroup memory limit whose crossing writes a memory incident: percentages
/// separated by commas (`80,90,95`, the default), or `off`.
pub const ENV_OOM_THRESHOLDS: &str = "TRACING_PROF_OOM_THRESHOLDS";
/// Slow-span thresholds, `PATH:DURATION` separated by commas (`request -> render:50ms`; `*`
/// for every path): spans of the path longer than the duration are counted as slow.
pub const ENV_SLOW_SPAN: &str = "TRACING_PROF_SLOW_SPAN";
/// A signal that pauses and resumes profiling: `SIGUSR1` or `SIGUSR2` (unset: none).
pub const ENV_TOGGLE_SIGNAL: &str = "TRACING_PROF_TOGGLE_SIGNAL";
/// A signal that writes an incident with the flight recorder's recording: `SIGUSR1` or
/// `SIGUSR2` (unset: none), not the toggle signal.
pub const ENV_FLIGHT_SIGNAL: &str = "TRACING_PROF_FLIGHT_SIGNAL";

/// Every `TRACING_PROF_*` setting of tracing-prof: those [`Config::apply_env`](super::Config::apply_env) reads, then
/// the exporters' (files, `/debug/pprof`, Pyroscope). [`Config::apply_env`](super::Config::apply_env) says on stderr,
/// once, which other `TRACING_PROF_*` variables are set (misspellings, with the setting each
/// resembles).
pub const ENV_VARS: &[&str] = &[
    "TRACING_PROF_INTERVAL",
    "TRACING_PROF_MAX_SPAN_PATHS",
    "TRACING_PROF_CPU_TIME",
    "TRACING_PROF_CPU_CLOCK",
    "TRACING_PROF_CPU_HZ",
    "TRACING_PROF_CPU_UNWIND",
    "TRACING_PROF_TRACE_LINKS",
    "TRACING_PROF_SAMPLE_RATE",
    "TRACING_PROF_TEMPORARY",
    "TRACING_PROF_SHUTDOWN_TIMEOUT",
    "TRACING_PROF_GIANT_BYTES",
    "TRACING_PROF_GIANT_REFUSE",
    "TRACING_PROF_LABEL_FIELDS",
    "TRACING_PROF_LABEL_VALUES",
    "TRACING_PROF_LEAK_LEVEL",
    "TRACING_PROF_LEAK_MIN_BYTES",
    "TRACING_PROF_LEAK_SNAPSHOTS",
    "TRACING_PROF_LONG_POLL",
    "TRACING_PROF_TOGGLE_SIGNAL",
    "TRACING_PROF_SLOW_SPAN",
    "TRACING_PROF_PEAK_EVERY",
    "TRACING_PROF_OOM_THRESHOLDS",
    "TRACING_PROF_FLIGHT_RECORDER",
    "TRACING_PROF_FLIGHT_SIGNAL",
    "TRACING_PROF_FLUSH_ON_SIGTERM",
    // The exporters' (`tracing-prof-export`).
    "TRACING_PROF_DIR",
    "TRACING_PROF_DELTAS",
    "TRACING_PROF_FLAMEGRAPHS",
    "TRACING_PROF_KEEP_FILES",
    "TRACING_PROF_HTTP_ADDR",
    "TRACING_PROF_METRICS_ADDR",
    "TRACING_PROF_METRICS_HISTOGRAMS",
    "TRACING_PROF_METRICS_BUCKETS",
    "TRACING_PROF_HTTP_TOKEN",
    "TRACING_PROF_HTTP_ALLOW_PUBLIC",
    "TRACING_PROF_HTTP_REQUIRED",
    "TRACING_PROF_PYROSCOPE_API",
    "TRACING_PROF_PYROSCOPE_TIMEOUT",
];

/// Variables of this repository's own tests and benchmarks (not settings, never warned of).
const DEV_VARS: &[&str] = &[
    "TRACING_PROF_TEST_",
    "TRACING_PROF_BENCH_",
    "TRACING_PROF_EXPECT_FRAME_POINTERS",
    "TRACING_PROF_WRITE_FIXTURES",
    "TRACING_PROF_BLESS",
    "TRACING_PROF_FUZZ_ITERS",
    "TRACING_PROF_PEER_",
    "TRACING_PROF_GIANT_PANIC_CHILD",
    "TRACING_PROF_ALLOC_NOT_OURS",
];

/// Warnings for the `TRACING_PROF_*` names among `names` that are no setting, each with the
/// setting it most resembles, if one is close.
pub(crate) fn unknown_variables(names: impl Iterator<Item = String>) -> Vec<String> {
    let mut names: Vec<String> = names
        .filter(|n| {
            n.starts_with("TRACING_PROF_")
                && !ENV_VARS.contains(&n.as_str())
                && !DEV_VARS.iter().any(|d| n.starts_with(d))
        })
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let closest = ENV_VARS
                .iter()
                .map(|k| (edit_distance(&name, k), *k))
                .min()
                .filter(|(d, _)| *d <= 3);
            match closest {
                Some((_, k)) => format!(
                    "{name} is not a tracing-prof setting (did you mean {k}?); it is ignored"
                ),
                None => format!("{name} is not a tracing-prof setting; it is ignored"),
            }
        })
        .collect()
}

/// Says [`unknown_variables`] of the environment on stderr, once per process.
pub(super) fn warn_unknown_variables() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let names = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
        for warning in unknown_variables(names) {
            eprintln!("tracing-prof: {warning}");
        }
    });
}

/// Levenshtein distance.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(here + 1);
            prev = here;
        }
    }
    row[b.len()]
}

/// Reads and parses `name`; `Ok(None)` when unset or empty.
pub fn env_var<T>(
    name: &'static str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, ConfigError> {
    let Some(raw) = std::env::var_os(name) else {
        return Ok(None);
    };
    let err = |value: String, reason: String| ConfigError::Env {
        name,
        value,
        reason,
    };
    let Some(value) = raw.to_str() else {
        return Err(err(
            raw.to_string_lossy().into_owned(),
            "not valid UTF-8".into(),
        ));
    };
    if value.trim().is_empty() {
        // Set but empty (a template whose value went missing, say): never taken for unset,
        // which for a token would mean no authentication.
        return Err(err(
            value.to_owned(),
            "set but empty; unset it to use the default".into(),
        ));
    }
    parse(value.trim())
        .map(Some)
        .map_err(|reason| err(value.to_owned(), reason))
}
