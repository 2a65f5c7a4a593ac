//! Settings, their documented defaults, and the `TRACING_PROF_*` environment variables.

use crate::CpuClock;
use std::time::Duration;
pub use tracing_prof_cpu::Unwind;

/// How per-span CPU time is measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CpuTime {
    /// From the CPU stack samples (the default): no cost on span enter and exit; an estimate
    /// per span path, whose error shrinks with the time measured (see the README).
    #[default]
    Sampled,
    /// A per-thread CPU clock read on every enter and exit ([`CpuClock`]): exact per interval,
    /// about 0.5 µs per read (a system call). For spans entered rarely, or tests.
    Exact,
    /// Not measured.
    Off,
}

/// Distinct values kept per span field label before further ones are shown as `(other)`: 32.
pub const DEFAULT_LABEL_VALUES: usize = 32;
/// Characters kept of a label value: 64.
pub const MAX_LABEL_VALUE_CHARS: usize = 64;

/// How often the aggregator exports a profile: 10 s.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// Distinct span paths tracked before new ones are lumped into `(other span paths)`: 1024.
pub const DEFAULT_MAX_SPAN_PATHS: usize = 1024;
/// How per-span CPU time is measured: [`CpuTime::Sampled`], from the CPU stack samples, so that
/// span enter and exit pay no system call.
pub const DEFAULT_CPU_TIME: CpuTime = CpuTime::Sampled;
/// Which CPU clock [`CpuTime::Exact`] reads: [`CpuClock::Thread`], exact per span; see
/// [`crate::CpuClock`] for why not `getrusage` by default.
pub const DEFAULT_CPU_CLOCK: CpuClock = CpuClock::Thread;
/// CPU stack samples per second of CPU time on each thread: 100, as Go's. `0` turns CPU
/// sampling off.
pub const DEFAULT_CPU_HZ: u32 = tracing_prof_cpu::DEFAULT_HZ;
/// How the CPU sampler walks stacks: [`Unwind::Dwarf`], which needs no frame pointers.
pub const DEFAULT_CPU_UNWIND: Unwind = Unwind::Dwarf;
/// How long dropping the guard waits for the final export: 5 s.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Level of the event logged when a span path becomes a suspected leak: WARN.
pub const DEFAULT_LEAK_LEVEL: tracing::Level = tracing::Level::WARN;
pub use crate::cpu::{DRAIN_EVERY as CPU_DRAIN_EVERY, MAX_CPU_STACKS};
pub use crate::leak::{DEFAULT_LEAK_MIN_BYTES, DEFAULT_LEAK_SNAPSHOTS};

/// Mean bytes allocated between two heap samples (code stacks): 512 KiB, Go's and jemalloc's
/// default. `0` turns sampling off; `1` samples every allocation.
pub const DEFAULT_SAMPLE_RATE: u64 = tracing_prof_alloc::DEFAULT_SAMPLE_RATE;
/// Sampled blocks freed sooner than this after allocation count as temporary: 1 ms.
pub const DEFAULT_TEMPORARY_THRESHOLD: Duration = tracing_prof_alloc::DEFAULT_TEMPORARY_THRESHOLD;

/// Size at or above which an allocation is reported as giant: none (off).
pub const DEFAULT_GIANT_BYTES: Option<usize> = None;

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
/// An enter-to-exit interval of a span's own on an async runtime's worker at least this long is
/// a long poll: 10 ms.
pub const DEFAULT_LONG_POLL: Option<Duration> = Some(Duration::from_millis(10));
/// A signal that pauses and resumes profiling: `SIGUSR1` or `SIGUSR2` (unset: none).
pub const ENV_TOGGLE_SIGNAL: &str = "TRACING_PROF_TOGGLE_SIGNAL";

/// A signal that pauses and resumes profiling (see [`crate::Profiler::pause`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ToggleSignal {
    /// `SIGUSR1`.
    Usr1,
    /// `SIGUSR2`.
    Usr2,
}

impl ToggleSignal {
    pub(crate) fn number(self) -> libc::c_int {
        match self {
            ToggleSignal::Usr1 => libc::SIGUSR1,
            ToggleSignal::Usr2 => libc::SIGUSR2,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            ToggleSignal::Usr1 => "SIGUSR1",
            ToggleSignal::Usr2 => "SIGUSR2",
        }
    }

    /// `SIGUSR1` or `SIGUSR2`, with or without `SIG`, in any case.
    fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_uppercase().trim_start_matches("SIG") {
            "USR1" => Ok(ToggleSignal::Usr1),
            "USR2" => Ok(ToggleSignal::Usr2),
            _ => Err(format!("expected SIGUSR1 or SIGUSR2, got {s:?}")),
        }
    }
}

/// Every `TRACING_PROF_*` setting of tracing-prof: those [`Config::apply_env`] reads, then
/// the exporters' (files, `/debug/pprof`, Pyroscope). [`Config::apply_env`] says on stderr,
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
    // The exporters' (`tracing-prof-export`).
    "TRACING_PROF_DIR",
    "TRACING_PROF_DELTAS",
    "TRACING_PROF_FLAMEGRAPHS",
    "TRACING_PROF_KEEP_FILES",
    "TRACING_PROF_HTTP_ADDR",
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
pub fn unknown_variables(names: impl Iterator<Item = String>) -> Vec<String> {
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
fn warn_unknown_variables() {
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

/// An invalid setting.
#[derive(thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// An environment variable is set to something that does not parse.
    #[error("environment variable {name}={value:?} is invalid: {reason}")]
    Env {
        /// The variable.
        name: &'static str,
        /// Its value (lossily decoded if it was not UTF-8).
        value: String,
        /// What was expected.
        reason: String,
    },
    /// A value given to the builder is out of range.
    #[error("invalid {setting}: {reason}")]
    Value {
        /// The setting.
        setting: &'static str,
        /// What was expected.
        reason: String,
    },
}

// `fn main() -> Result<(), Box<dyn Error>>` prints an error it returns with `Debug`: the
// message, not the variant's structure, is what the user must read.
impl std::fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// The core settings. Build one with [`Config::default`] and adjust, or [`Config::from_env`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// See [`DEFAULT_INTERVAL`].
    pub interval: Duration,
    /// See [`DEFAULT_MAX_SPAN_PATHS`].
    pub max_span_paths: usize,
    /// See [`DEFAULT_CPU_TIME`].
    pub cpu_time: CpuTime,
    /// See [`DEFAULT_CPU_CLOCK`].
    pub cpu_clock: CpuClock,
    /// See [`DEFAULT_CPU_HZ`].
    pub cpu_hz: u32,
    /// See [`DEFAULT_CPU_UNWIND`].
    pub cpu_unwind: Unwind,
    /// See [`DEFAULT_SHUTDOWN_TIMEOUT`].
    pub shutdown_timeout: Duration,
    /// See [`DEFAULT_LEAK_SNAPSHOTS`]; `0` turns leak detection off.
    pub leak_snapshots: usize,
    /// See [`DEFAULT_LEAK_MIN_BYTES`].
    pub leak_min_bytes: u64,
    /// See [`DEFAULT_LEAK_LEVEL`].
    pub leak_level: tracing::Level,
    /// See [`DEFAULT_GIANT_BYTES`].
    pub giant_bytes: Option<usize>,
    /// Whether giant allocations are refused (null returned) rather than only reported.
    pub giant_refuse: bool,
    /// See [`DEFAULT_SAMPLE_RATE`].
    pub sample_rate: u64,
    /// See [`DEFAULT_TEMPORARY_THRESHOLD`].
    pub temporary_threshold: Duration,
    /// Span fields whose values become pprof labels (none by default); see
    /// [`crate::ProfilerBuilder::span_field_labels`].
    pub label_fields: Vec<String>,
    /// See [`DEFAULT_LABEL_VALUES`].
    pub label_values: usize,
    /// A signal that pauses and resumes profiling; none by default.
    pub toggle_signal: Option<ToggleSignal>,
    /// See [`DEFAULT_LONG_POLL`]; `None`: long polls are not counted.
    pub long_poll: Option<Duration>,
    /// Which spans' OpenTelemetry ids label CPU samples; see [`TraceLinks`](crate::TraceLinks).
    pub trace_links: crate::TraceLinks,
    /// With the `opentelemetry` feature, whether the profiler publishes the OpenTelemetry
    /// process context (OTEP 4719) while it runs; see `process_context`. Default: yes.
    pub process_context: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            interval: DEFAULT_INTERVAL,
            max_span_paths: DEFAULT_MAX_SPAN_PATHS,
            cpu_time: DEFAULT_CPU_TIME,
            cpu_clock: DEFAULT_CPU_CLOCK,
            cpu_hz: DEFAULT_CPU_HZ,
            cpu_unwind: DEFAULT_CPU_UNWIND,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            leak_snapshots: DEFAULT_LEAK_SNAPSHOTS,
            leak_min_bytes: DEFAULT_LEAK_MIN_BYTES,
            leak_level: DEFAULT_LEAK_LEVEL,
            giant_bytes: DEFAULT_GIANT_BYTES,
            giant_refuse: false,
            sample_rate: DEFAULT_SAMPLE_RATE,
            temporary_threshold: DEFAULT_TEMPORARY_THRESHOLD,
            label_fields: Vec::new(),
            label_values: DEFAULT_LABEL_VALUES,
            toggle_signal: None,
            long_poll: DEFAULT_LONG_POLL,
            trace_links: crate::TraceLinks::default(),
            process_context: true,
        }
    }
}

impl Config {
    /// Defaults overridden by whichever `TRACING_PROF_*` variables are set.
    pub fn from_env() -> Result<Config, ConfigError> {
        let mut c = Config::default();
        c.apply_env()?;
        Ok(c)
    }

    /// Overrides the fields whose `TRACING_PROF_*` variable is set. A bad value is an error
    /// naming the variable; nothing falls back silently. A `TRACING_PROF_*` variable that is
    /// no setting is said on stderr, once (see [`ENV_VARS`]).
    pub fn apply_env(&mut self) -> Result<(), ConfigError> {
        warn_unknown_variables();
        if let Some(d) = env_var(ENV_INTERVAL, parse_duration)? {
            self.interval = d;
        }
        if let Some(n) = env_var(ENV_MAX_SPAN_PATHS, parse_max_paths)? {
            self.max_span_paths = n;
        }
        if let Some(t) = env_var(ENV_CPU_TIME, |s| match s.to_ascii_lowercase().as_str() {
            "sampled" | "1" | "true" | "on" | "yes" => Ok(CpuTime::Sampled),
            "exact" => Ok(CpuTime::Exact),
            "off" | "0" | "false" | "no" => Ok(CpuTime::Off),
            _ => Err(format!("expected sampled, exact or off, got {s:?}")),
        })? {
            self.cpu_time = t;
        }
        if let Some(l) = env_var(ENV_TRACE_LINKS, |s| match s.to_ascii_lowercase().as_str() {
            "roots" => Ok(crate::TraceLinks::LocalRoots),
            "all" => Ok(crate::TraceLinks::AllSpans),
            "off" | "0" | "false" | "no" => Ok(crate::TraceLinks::Off),
            _ => Err(format!("expected roots, all or off, got {s:?}")),
        })? {
            self.trace_links = l;
        }
        if let Some(hz) = env_var(ENV_CPU_HZ, |s| match s.parse::<u32>() {
            Ok(n) if n <= tracing_prof_cpu::MAX_HZ => Ok(n),
            _ => Err(format!(
                "expected samples per second from 0 (off) to {}, got {s:?}",
                tracing_prof_cpu::MAX_HZ
            )),
        })? {
            self.cpu_hz = hz;
        }
        if let Some(u) = env_var(ENV_CPU_UNWIND, |s| match s {
            "dwarf" => Ok(Unwind::Dwarf),
            "fp" | "frame-pointers" => Ok(Unwind::FramePointers),
            _ => Err(format!("expected dwarf or fp, got {s:?}")),
        })? {
            self.cpu_unwind = u;
        }
        if let Some(c) = env_var(ENV_CPU_CLOCK, |s| match s {
            "rusage" => Ok(CpuClock::Rusage),
            "thread" => Ok(CpuClock::Thread),
            _ => Err(format!("expected rusage or thread, got {s:?}")),
        })? {
            self.cpu_clock = c;
        }
        if let Some(n) = env_var(ENV_LEAK_SNAPSHOTS, |s| {
            s.parse::<usize>()
                .map_err(|_| format!("expected a whole number (0 turns detection off), got {s:?}"))
        })? {
            self.leak_snapshots = n;
        }
        if let Some(n) = env_var(ENV_LEAK_MIN_BYTES, |s| {
            s.parse::<u64>()
                .map_err(|_| format!("expected a number of bytes, got {s:?}"))
        })? {
            self.leak_min_bytes = n;
        }
        if let Some(level) = env_var(ENV_LEAK_LEVEL, |s| {
            s.parse::<tracing::Level>()
                .map_err(|_| format!("expected error, warn, info, debug or trace, got {s:?}"))
        })? {
            self.leak_level = level;
        }
        if let Some(n) = env_var(ENV_GIANT_BYTES, |s| {
            let n = s
                .parse::<usize>()
                .map_err(|_| format!("expected a number of bytes (0 turns it off), got {s:?}"))?;
            check_giant_bytes(Some(n).filter(|&n| n > 0))?;
            Ok(n)
        })? {
            self.giant_bytes = (n > 0).then_some(n);
        }
        if let Some(b) = env_var(ENV_GIANT_REFUSE, parse_bool)? {
            self.giant_refuse = b;
        }
        if let Some(n) = env_var(ENV_SAMPLE_RATE, |s| {
            s.parse::<u64>().map_err(|_| {
                format!("expected mean bytes between samples (0: off, 1: all), got {s:?}")
            })
        })? {
            self.sample_rate = n;
        }
        if let Some(d) = env_var(ENV_TEMPORARY, parse_duration)? {
            self.temporary_threshold = d;
        }
        if let Some(d) = env_var(ENV_SHUTDOWN_TIMEOUT, parse_duration)? {
            self.shutdown_timeout = d;
        }
        if let Some(d) = env_var(ENV_LONG_POLL, |s| match s {
            "0" | "off" => Ok(None),
            _ => parse_duration(s).map(Some),
        })? {
            self.long_poll = d;
        }
        if let Some(sig) = env_var(ENV_TOGGLE_SIGNAL, ToggleSignal::parse)? {
            self.toggle_signal = Some(sig);
        }
        if let Some(fields) = env_var(ENV_LABEL_FIELDS, parse_label_fields)? {
            self.label_fields = fields;
        }
        if let Some(n) = env_var(ENV_LABEL_VALUES, |s| match s.parse::<usize>() {
            Ok(n) if (1..=crate::labels::MAX_LABEL_VALUES).contains(&n) => Ok(n),
            _ => Err(format!(
                "expected distinct values per field from 1 to {}, got {s:?}",
                crate::labels::MAX_LABEL_VALUES
            )),
        })? {
            self.label_values = n;
        }
        Ok(())
    }

    /// Checks ranges the types cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(MIN_INTERVAL..=MAX_DURATION).contains(&self.interval) {
            return Err(ConfigError::Value {
                setting: "interval",
                reason: format!("must be from 100ms to 24h, got {:?}", self.interval),
            });
        }
        for (setting, d) in [
            ("shutdown_timeout", self.shutdown_timeout),
            ("temporary_threshold", self.temporary_threshold),
        ] {
            if d.is_zero() || d > MAX_DURATION {
                return Err(ConfigError::Value {
                    setting,
                    reason: format!("must be more than 0 and at most 24h, got {d:?}"),
                });
            }
        }
        check_giant_bytes(self.giant_bytes).map_err(|reason| ConfigError::Value {
            setting: "giant_bytes",
            reason,
        })?;
        if self.cpu_hz > tracing_prof_cpu::MAX_HZ {
            return Err(ConfigError::Value {
                setting: "cpu_hz",
                reason: format!("must be at most {}", tracing_prof_cpu::MAX_HZ),
            });
        }
        parse_label_fields(&self.label_fields.join(","))
            .and_then(|parsed| {
                (parsed.len() == self.label_fields.len())
                    .then_some(())
                    .ok_or_else(|| "field names must not be empty or contain commas".to_owned())
            })
            .map_err(|reason| ConfigError::Value {
                setting: "label_fields",
                reason,
            })?;
        if !(1..=crate::labels::MAX_LABEL_VALUES).contains(&self.label_values) {
            return Err(ConfigError::Value {
                setting: "label_values",
                reason: format!("must be 1 to {}", crate::labels::MAX_LABEL_VALUES),
            });
        }
        parse_max_paths(&self.max_span_paths.to_string())
            .map(drop)
            .map_err(|reason| ConfigError::Value {
                setting: "max_span_paths",
                reason,
            })
    }
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

/// Parses `100us`, `250ms`, `10s`, `2m`, `1h`; a bare number is seconds. Zero is refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let expected = || format!("expected a duration like 500ms, 10s, 2m or 1h, got {s:?}");
    let n: u64 = num.parse().map_err(|_| expected())?;
    let d = match unit.trim() {
        "us" | "µs" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(expected()),
    };
    if d.is_zero() {
        Err("must be greater than zero".into())
    } else if d > MAX_DURATION {
        Err(format!("must be at most 24h, got {s:?}"))
    } else {
        Ok(d)
    }
}

/// The longest duration any setting takes: a day.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
/// The shortest export interval: 100 ms (each export captures, symbolizes and encodes).
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The smallest giant-allocation threshold: 64 KiB. Below it ordinary allocations would take
/// the cold path (a stack capture each), and with refusal on the program could not run.
pub const MIN_GIANT_BYTES: usize = 64 << 10;

fn check_giant_bytes(bytes: Option<usize>) -> Result<(), String> {
    match bytes {
        Some(n) if n < MIN_GIANT_BYTES => Err(format!(
            "must be at least {MIN_GIANT_BYTES} bytes (64 KiB), or 0 for off; got {n}"
        )),
        _ => Ok(()),
    }
}

/// Parses `1/0`, `true/false`, `on/off`, `yes/no` (any case).
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(format!(
            "expected 1/0, true/false, on/off or yes/no, got {s:?}"
        )),
    }
}

fn parse_max_paths(s: &str) -> Result<usize, String> {
    let max = crate::span_path::MAX_SPAN_PATHS;
    match s.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a whole number from 1 to {max}, got {s:?}"
        )),
    }
}

/// `route,method` as field names: non-empty, made of letters, digits, `_` and `.`, none of
/// the profiles' own labels ([`tracing_prof_model::PROFILE_LABELS`]), at most
/// [`crate::labels::MAX_LABEL_FIELDS`].
pub(crate) fn parse_label_fields(s: &str) -> Result<Vec<String>, String> {
    let fields: Vec<String> = s
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    if let Some(bad) = fields.iter().find(|f| {
        !f.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    }) {
        return Err(format!(
            "{bad:?} is not a field name (letters, digits, _ and . only)"
        ));
    }
    if let Some(ours) = fields
        .iter()
        .find(|f| tracing_prof_model::PROFILE_LABELS.contains(&f.as_str()))
    {
        return Err(format!(
            "{ours:?} is a label the profiles set themselves; rename the field (reserved: {})",
            tracing_prof_model::PROFILE_LABELS.join(", ")
        ));
    }
    if fields.len() > crate::labels::MAX_LABEL_FIELDS {
        return Err(format!(
            "at most {} fields, got {}",
            crate::labels::MAX_LABEL_FIELDS,
            fields.len()
        ));
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variable this file reads is in [`ENV_VARS`], so the facade's warning about unknown
    /// variables never names a real one.
    #[test]
    fn every_variable_read_here_is_listed() {
        let all = include_str!("config.rs");
        let source = &all[..all.find("#[cfg(test)]").unwrap()];
        // Less the lists themselves (they would pass on their own entries) and the prefix.
        let mut source = source.to_owned();
        for list in ["pub const ENV_VARS", "const DEV_VARS"] {
            let start = source.find(list).unwrap();
            let end = start + source[start..].find("\n];").unwrap();
            source.replace_range(start..end, "");
        }
        let source = source.replace("\"TRACING_PROF_\"", "");
        let mut read: Vec<&str> = source
            .match_indices("\"TRACING_PROF_")
            .map(|(i, _)| {
                let rest = &source[i + 1..];
                &rest[..rest.find('"').unwrap()]
            })
            .collect();
        read.sort_unstable();
        read.dedup();
        for name in &read {
            assert!(ENV_VARS.contains(name), "{name} is not in ENV_VARS");
        }
    }

    #[test]
    fn unknown_variables_are_named_with_the_closest_setting() {
        let names = [
            "TRACING_PROF_INTERVALL",
            "TRACING_PROF_DIR",
            "PATH",
            "TRACING_PROF_COLOUR",
        ]
        .map(String::from);
        assert_eq!(
            unknown_variables(names.into_iter()),
            [
                "TRACING_PROF_COLOUR is not a tracing-prof setting; it is ignored",
                "TRACING_PROF_INTERVALL is not a tracing-prof setting (did you mean TRACING_PROF_INTERVAL?); it is ignored",
            ]
        );
    }

    #[test]
    fn toggle_signals_parse_by_name() {
        for ok in ["SIGUSR2", "usr2", " SigUsr2 "] {
            assert_eq!(ToggleSignal::parse(ok), Ok(ToggleSignal::Usr2), "{ok}");
        }
        assert_eq!(ToggleSignal::parse("SIGUSR1"), Ok(ToggleSignal::Usr1));
        for bad in ["SIGTERM", "12", ""] {
            assert!(ToggleSignal::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("100us"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn bools_and_counts() {
        assert_eq!(parse_bool("Off"), Ok(false));
        assert!(parse_bool("maybe").is_err());
        assert!(parse_max_paths("0").is_err());
        assert!(parse_max_paths("99999").is_err());
        assert_eq!(parse_max_paths("64"), Ok(64));
    }

    // Environment variables are process-wide, so all env cases run in this one test.
    #[test]
    fn label_fields_parse_and_refuse_clearly() {
        assert_eq!(
            parse_label_fields(" route, http.method ,").unwrap(),
            ["route", "http.method"]
        );
        assert!(
            parse_label_fields("route;drop")
                .unwrap_err()
                .contains("\"route;drop\"")
        );
        assert!(
            parse_label_fields("a,b,c,d,e,f,g,h,i")
                .unwrap_err()
                .contains("at most 8")
        );
        // Ours: a field `trace_id` would be read as a trace link.
        for ours in ["route,trace_id", "span_path", "service.name"] {
            assert!(
                parse_label_fields(ours)
                    .unwrap_err()
                    .contains("a label the profiles set themselves"),
                "{ours}"
            );
        }
        let c = Config {
            label_fields: vec!["ok".into(), String::new()],
            ..Config::default()
        };
        assert!(c.validate().is_err());
        let c = Config {
            label_fields: vec!["ok".into()],
            label_values: 0,
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn env_errors_name_the_variable() {
        // SAFETY: no other test in this crate reads or writes these variables.
        unsafe { std::env::set_var(ENV_INTERVAL, "soon") };
        let e = Config::from_env().unwrap_err();
        assert!(e.to_string().contains("TRACING_PROF_INTERVAL"), "{e}");
        // SAFETY: as above.
        unsafe {
            std::env::set_var(ENV_INTERVAL, "3s");
            std::env::set_var(ENV_CPU_TIME, "exact");
        }
        let c = Config::from_env().unwrap();
        assert_eq!(
            (c.interval, c.cpu_time, c.max_span_paths),
            (Duration::from_secs(3), CpuTime::Exact, 1024)
        );
        // Set but blank is an error, not "unset" (for a token it would mean no authentication).
        // SAFETY: as above.
        unsafe { std::env::set_var(ENV_MAX_SPAN_PATHS, "  ") };
        let e = Config::from_env().unwrap_err().to_string();
        assert!(
            e.contains("TRACING_PROF_MAX_SPAN_PATHS") && e.contains("empty"),
            "{e}"
        );
        // Durations are bounded, and so is the interval from below.
        for (var, value) in [
            (ENV_SHUTDOWN_TIMEOUT, "18446744073709551615"),
            (ENV_INTERVAL, "18446744073709551615s"),
            (ENV_INTERVAL, "25h"),
        ] {
            // SAFETY: as above.
            unsafe {
                std::env::remove_var(ENV_MAX_SPAN_PATHS);
                std::env::set_var(var, value);
            }
            let e = Config::from_env().unwrap_err().to_string();
            assert!(e.contains(var) && e.contains("24h"), "{e}");
            // SAFETY: as above.
            unsafe { std::env::remove_var(var) };
        }
        // SAFETY: as above.
        unsafe { std::env::set_var(ENV_INTERVAL, "1us") };
        let e = Config::from_env()
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("100ms"), "{e}");
        // SAFETY: as above.
        unsafe {
            for v in [
                ENV_INTERVAL,
                ENV_CPU_TIME,
                ENV_MAX_SPAN_PATHS,
                ENV_SHUTDOWN_TIMEOUT,
            ] {
                std::env::remove_var(v);
            }
        }
    }
}
