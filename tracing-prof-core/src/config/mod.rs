//! Settings, their documented defaults, and the `TRACING_PROF_*` environment variables.

pub(crate) mod env;
pub(crate) mod parse;

use crate::CpuClock;

#[cfg(test)]
use env::unknown_variables;
pub use env::{
    ENV_CPU_CLOCK, ENV_CPU_HZ, ENV_CPU_TIME, ENV_CPU_UNWIND, ENV_FLIGHT_RECORDER,
    ENV_FLIGHT_SIGNAL, ENV_FLUSH_ON_SIGTERM, ENV_GIANT_BYTES, ENV_GIANT_REFUSE, ENV_INTERVAL,
    ENV_LABEL_FIELDS, ENV_LABEL_VALUES, ENV_LEAK_LEVEL, ENV_LEAK_MIN_BYTES, ENV_LEAK_SNAPSHOTS,
    ENV_LONG_POLL, ENV_MAX_SPAN_PATHS, ENV_OOM_THRESHOLDS, ENV_PEAK_EVERY, ENV_SAMPLE_RATE,
    ENV_SHUTDOWN_TIMEOUT, ENV_SLOW_SPAN, ENV_TEMPORARY, ENV_TOGGLE_SIGNAL, ENV_TRACE_LINKS,
    ENV_VARS,
};
use env::{env_var, warn_unknown_variables};
pub use parse::{MAX_DURATION, MAX_LEAK_SNAPSHOTS, MIN_GIANT_BYTES, MIN_INTERVAL};
use parse::{
    check_giant_bytes, check_interval, check_leak_snapshots, parse_interval, parse_leak_snapshots,
    parse_max_paths, parse_thresholds,
};
pub(crate) use parse::{parse_bool, parse_duration, parse_label_fields};
use std::time::Duration;
pub use tracing_prof_cpu::Unwind;

pub use crate::cpu::CpuTime;

/// Distinct values kept per span field label before further ones are shown as `(other)`: 32.
pub const DEFAULT_LABEL_VALUES: usize = 32;

/// How often the aggregator exports a profile: 10 s.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
pub use crate::span_path::DEFAULT_MAX_SPAN_PATHS;
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

/// An enter-to-exit interval of a span's own on an async runtime's worker at least this long is
/// a long poll: 10 ms.
pub const DEFAULT_LONG_POLL: Option<Duration> = Some(Duration::from_millis(10));

/// Shares of the cgroup's memory limit, in percent, whose crossing writes a memory incident:
/// 80%, 90% and 95%.
pub const DEFAULT_OOM_THRESHOLDS: [u8; 3] = [80, 90, 95];

pub use crate::user_signal::{ToggleSignal, UserSignal};

/// The shortest period of the heap's peak watch: 10 ms.
pub const MIN_PEAK_EVERY: Duration = Duration::from_millis(10);

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

/// A slow-span threshold: spans of `path` (the span path as the profiles' `span_path` label
/// writes it, `request -> render`; `*` for every path) that take longer than `threshold`, from
/// creation to close. Counted from the latency histogram, so the threshold stands at the
/// nearest bucket bound ([`tracing_prof_model::slow_bound`]: ten per decade, 50 ms stays 50
/// ms, 55 ms counts as 50 ms). The count is the hook of anything that reacts to slow spans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlowSpan {
    /// The span path, or `*`.
    pub path: String,
    /// Longer than this is slow.
    pub threshold: Duration,
}

impl SlowSpan {
    /// `request -> render:50ms,*:2s`: thresholds separated by commas, each `PATH:DURATION`
    /// (the duration after the last colon, so `a::b -> c:1s` works).
    pub fn parse_list(s: &str) -> Result<Vec<SlowSpan>, String> {
        s.split(',')
            .filter(|t| !t.trim().is_empty())
            .map(|t| {
                let (path, d) = t.rsplit_once(':').ok_or_else(|| {
                    format!("expected PATH:DURATION (request -> render:50ms), got {t:?}")
                })?;
                let path = path.trim();
                if path.is_empty() {
                    return Err(format!("no span path before the duration in {t:?}"));
                }
                let threshold = parse::parse_duration(d.trim())?;
                Ok(SlowSpan {
                    path: path.to_owned(),
                    threshold,
                })
            })
            .collect()
    }

    /// The threshold for the span path written `path`, if any (the path's own before `*`).
    pub fn for_path<'a>(slow: &'a [SlowSpan], path: &str) -> Option<&'a SlowSpan> {
        slow.iter()
            .find(|s| s.path == path)
            .or_else(|| slow.iter().find(|s| s.path == "*"))
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
    pub toggle_signal: Option<UserSignal>,
    /// A signal that writes an incident with the flight recorder's recording (cause
    /// `signal`); none by default. Not the toggle signal.
    pub flight_signal: Option<UserSignal>,
    /// Slow-span thresholds: spans of a path longer than its threshold are counted as slow
    /// (`tracing_prof_span_slow_total` at `/metrics`); none by default. See [`SlowSpan`].
    pub slow_spans: Vec<SlowSpan>,
    /// See [`DEFAULT_LONG_POLL`]; `None`: long polls are not counted.
    pub long_poll: Option<Duration>,
    /// How often the heap is read for its high-water mark (see
    /// [`DEFAULT_PEAK_EVERY`](crate::DEFAULT_PEAK_EVERY)); `None`: not watched.
    pub peak_every: Option<Duration>,
    /// Shares of the cgroup's memory limit (percent, ascending) whose crossing by the working
    /// set writes a memory incident; empty: none. See [`DEFAULT_OOM_THRESHOLDS`].
    pub oom_thresholds: Vec<u8>,
    /// How far back the flight recorder reaches and the most bytes it holds; `None`: off.
    /// See [`DEFAULT_FLIGHT_LENGTH`](crate::DEFAULT_FLIGHT_LENGTH).
    pub flight_recorder: Option<(Duration, usize)>,
    /// Which spans' OpenTelemetry ids label CPU samples; see [`TraceLinks`](crate::TraceLinks).
    pub trace_links: crate::TraceLinks,
    /// With the `opentelemetry` feature, whether the profiler publishes the OpenTelemetry
    /// process context (OTEP 4719) while it runs; see `process_context`. Default: yes.
    pub process_context: bool,
    /// Whether a SIGTERM makes the final export before the process ends, where SIGTERM has its
    /// default action at `build` (the application does not handle it). The process then ends
    /// by SIGTERM as it would have (a PID 1 exports and goes on); an application that
    /// registers its own handler later (`tokio::signal`) keeps its graceful shutdown, uncut.
    /// Default: yes.
    pub flush_on_sigterm: bool,
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
            flight_signal: None,
            slow_spans: Vec::new(),
            long_poll: DEFAULT_LONG_POLL,
            peak_every: Some(crate::DEFAULT_PEAK_EVERY),
            oom_thresholds: DEFAULT_OOM_THRESHOLDS.to_vec(),
            flight_recorder: Some((crate::DEFAULT_FLIGHT_LENGTH, crate::DEFAULT_FLIGHT_BYTES)),
            trace_links: crate::TraceLinks::default(),
            process_context: true,
            flush_on_sigterm: true,
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
        if let Some(d) = env_var(ENV_INTERVAL, parse_interval)? {
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
        if let Some(n) = env_var(ENV_LEAK_SNAPSHOTS, parse_leak_snapshots)? {
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
        if let Some(d) = env_var(ENV_PEAK_EVERY, |s| match s {
            "0" | "off" => Ok(None),
            _ => match parse_duration(s)? {
                d if d < MIN_PEAK_EVERY => Err(format!(
                    "must be at least {} ms (or off)",
                    MIN_PEAK_EVERY.as_millis()
                )),
                d => Ok(Some(d)),
            },
        })? {
            self.peak_every = d;
        }
        if let Some(f) = env_var(ENV_FLIGHT_RECORDER, |s| match s {
            "0" | "off" => Ok(None),
            _ => parse_duration(s).map(Some),
        })? {
            let bytes = self
                .flight_recorder
                .map_or(crate::DEFAULT_FLIGHT_BYTES, |(_, b)| b);
            self.flight_recorder = f.map(|length| (length, bytes));
        }
        if let Some(t) = env_var(ENV_OOM_THRESHOLDS, parse_thresholds)? {
            self.oom_thresholds = t;
        }
        if let Some(on) = env_var(ENV_FLUSH_ON_SIGTERM, parse_bool)? {
            self.flush_on_sigterm = on;
        }
        if let Some(slow) = env_var(ENV_SLOW_SPAN, SlowSpan::parse_list)? {
            self.slow_spans = slow;
        }
        if let Some(sig) = env_var(ENV_TOGGLE_SIGNAL, UserSignal::parse)? {
            self.toggle_signal = Some(sig);
        }
        if let Some(sig) = env_var(ENV_FLIGHT_SIGNAL, UserSignal::parse)? {
            self.flight_signal = Some(sig);
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
        check_interval(self.interval).map_err(|reason| ConfigError::Value {
            setting: "interval",
            reason,
        })?;
        check_leak_snapshots(self.leak_snapshots).map_err(|reason| ConfigError::Value {
            setting: "leak_snapshots",
            reason,
        })?;
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
        if let Some(sig) = self.flight_signal
            && self.toggle_signal == Some(sig)
        {
            return Err(ConfigError::Value {
                setting: "flight_signal (TRACING_PROF_FLIGHT_SIGNAL)",
                reason: format!(
                    "{} is the toggle signal (TRACING_PROF_TOGGLE_SIGNAL) already: give each its own",
                    sig.name()
                ),
            });
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_span_thresholds_parse_or_say_why_not() {
        let slow =
            SlowSpan::parse_list("request -> render:50ms, app::db -> query:1s,*:2s").unwrap();
        assert_eq!(
            slow.iter()
                .map(|s| (s.path.as_str(), s.threshold))
                .collect::<Vec<_>>(),
            [
                ("request -> render", Duration::from_millis(50)),
                ("app::db -> query", Duration::from_secs(1)),
                ("*", Duration::from_secs(2)),
            ]
        );
        assert_eq!(
            SlowSpan::for_path(&slow, "app::db -> query")
                .unwrap()
                .threshold,
            Duration::from_secs(1)
        );
        assert_eq!(SlowSpan::for_path(&slow, "other").unwrap().path, "*");
        assert!(SlowSpan::for_path(&slow[..1], "other").is_none());
        for (bad, says) in [
            ("request", "expected PATH:DURATION"),
            (":50ms", "no span path"),
            ("request:fast", "fast"),
        ] {
            let e = SlowSpan::parse_list(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    /// Every variable this file reads is in [`ENV_VARS`], so the facade's warning about unknown
    /// variables never names a real one.
    #[test]
    fn every_variable_read_here_is_listed() {
        let all = [
            include_str!("mod.rs"),
            include_str!("env.rs"),
            include_str!("parse.rs"),
        ];
        let source: String = all
            .iter()
            .map(|f| &f[..f.find("#[cfg(test)]").unwrap_or(f.len())])
            .collect();
        // Less the lists themselves (they would pass on their own entries) and the prefix.
        let mut source = source;
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
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("100us"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        // What people type (found in a new user's trial: `1.5s` was refused).
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("100µs"), Ok(Duration::from_micros(100)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration(".").is_err());
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
        // Below the interval's least, or a leak window past its most: an error naming the
        // variable, never a silent clamp.
        for (var, value, says) in [
            (ENV_INTERVAL, "1us", "100ms"),
            (ENV_INTERVAL, "50ms", "100ms"),
            (ENV_LEAK_SNAPSHOTS, "5000", "at most 1024"),
        ] {
            // SAFETY: as above.
            unsafe { std::env::set_var(var, value) };
            let e = Config::from_env().unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(says), "{e}");
            // SAFETY: as above.
            unsafe { std::env::remove_var(var) };
        }
        let c = Config {
            leak_snapshots: 5000,
            ..Config::default()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("at most 1024")
        );
        // SAFETY: as above.
        unsafe {
            for v in [
                ENV_LEAK_SNAPSHOTS,
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
