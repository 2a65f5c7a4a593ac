//! [`ProfilerBuilder`]: the settings, applied in one place, and the threads started.

use super::aggregator::{Aggregator, Command};
use super::guard::ProfilerGuard;
use super::sink::{Sink, SinkCounters};
use super::{Profiler, Shared};
use crate::config::{Config, ConfigError};
use crate::fork::ForkSafe;
use crate::layer::ProfileLayer;
use crate::leak::LeakDetector;
use crate::running::RunningToken;
use crate::runtime::RUNTIME;
use crossbeam_channel::bounded;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

/// Why the profiler could not start.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A setting is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The aggregator thread could not be spawned.
    #[error("cannot spawn the tracing-prof aggregator thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// Another profiler is running in this process (its guard is alive, or its final export
    /// has not finished). Everything it configures is process-wide (the allocator's sampling,
    /// span path table, giant policy, CPU timers), and two would write the same files and prune
    /// each other's: drop the first guard, or use its [`Profiler`] handle.
    #[error("a tracing-prof profiler is already running in this process")]
    AlreadyRunning,
}

// `fn main() -> Result<(), Box<dyn Error>>` prints an error it returns with `Debug`: the
// message, not the variant's structure, is what the user must read.
impl std::fmt::Debug for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Configures and starts a profiler.
///
/// # Examples
/// ```
/// use tracing_subscriber::prelude::*;
/// let (layer, guard) = tracing_prof_core::Profiler::builder()
///     .interval(std::time::Duration::from_secs(30))
///     .build()
///     .unwrap();
/// let subscriber = tracing_subscriber::registry().with(layer);
/// tracing::subscriber::with_default(subscriber, || {
///     tracing::info_span!("request").in_scope(|| { /* work */ });
/// });
/// let profile = guard.profiler().snapshot();
/// assert!(profile.path(&["request"]).is_some());
/// ```
#[derive(Default)]
pub struct ProfilerBuilder {
    pub(super) config: Config,
    pub(super) sinks: Vec<Box<dyn Sink>>,
    pub(super) allocator_stats: Option<Box<dyn crate::AllocatorStats>>,
}

impl fmt::Debug for ProfilerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sinks: Vec<&str> = self.sinks.iter().map(|s| s.name()).collect();
        f.debug_struct("ProfilerBuilder")
            .field("config", &self.config)
            .field("sinks", &sinks)
            .field("allocator_stats", &self.allocator_stats)
            .finish()
    }
}

impl ProfilerBuilder {
    /// Replaces all settings.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Overrides settings from the `TRACING_PROF_*` environment variables that are set.
    pub fn from_env(mut self) -> Result<Self, ConfigError> {
        self.config.apply_env()?;
        Ok(self)
    }

    /// How often profiles are exported. Default [`DEFAULT_INTERVAL`](crate::config::DEFAULT_INTERVAL).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.config.interval = interval;
        self
    }

    /// Cap on distinct span paths. Default [`DEFAULT_MAX_SPAN_PATHS`](crate::config::DEFAULT_MAX_SPAN_PATHS).
    pub fn max_span_paths(mut self, n: usize) -> Self {
        self.config.max_span_paths = n;
        self
    }

    /// Span fields whose values become labels on every profile kind (`route`, `method`):
    /// `go tool pprof -tagfocus=route=/users`, `tracing-prof top --tag route=/users`. Each
    /// field keeps its first [`DEFAULT_LABEL_VALUES`](crate::config::DEFAULT_LABEL_VALUES)
    /// distinct values (see [`ProfilerBuilder::max_label_values`]), later ones show as
    /// `(other)`. None by default. See [`crate::labels`] for what it costs and what counts.
    ///
    /// # Examples
    /// ```
    /// let builder = tracing_prof_core::Profiler::builder().span_field_labels(["route", "method"]);
    /// ```
    pub fn span_field_labels<I, T>(mut self, fields: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.config.label_fields = fields.into_iter().map(Into::into).collect();
        self
    }

    /// Distinct values kept per label field before `(other)`, 1 to
    /// [`MAX_LABEL_VALUES`](crate::labels::MAX_LABEL_VALUES).
    pub fn max_label_values(mut self, n: usize) -> Self {
        self.config.label_values = n;
        self
    }

    /// How per-span CPU time is measured: from the CPU samples, exactly on every enter and
    /// exit, or not at all. Default [`DEFAULT_CPU_TIME`](crate::config::DEFAULT_CPU_TIME).
    pub fn cpu_time(mut self, mode: crate::CpuTime) -> Self {
        self.config.cpu_time = mode;
        self
    }

    /// Which spans' OpenTelemetry ids label the CPU samples of their work (default: local
    /// roots). Needs the `opentelemetry` feature and a `tracing-opentelemetry` layer in the
    /// subscriber; see [`TraceLinks`](crate::TraceLinks).
    pub fn trace_links(mut self, links: crate::TraceLinks) -> Self {
        self.config.trace_links = links;
        self
    }

    /// Whether to publish the OpenTelemetry process context (OTEP 4719: the resource from
    /// `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, in a mapping named `OTEL_CTX` that
    /// the OpenTelemetry eBPF profiler reads) from `build` until the guard drops. Default: yes,
    /// with the `opentelemetry` feature; nothing without it.
    pub fn process_context(mut self, on: bool) -> Self {
        self.config.process_context = on;
        self
    }

    /// Whether a SIGTERM (systemd's and Kubernetes' stop) makes the final export before the
    /// process ends, where the application does not handle SIGTERM itself; see
    /// [`Config::flush_on_sigterm`](crate::config::Config::flush_on_sigterm). Default: yes;
    /// `TRACING_PROF_FLUSH_ON_SIGTERM`.
    pub fn flush_on_sigterm(mut self, on: bool) -> Self {
        self.config.flush_on_sigterm = on;
        self
    }

    /// CPU stack samples per second of CPU time on each thread (`0`: off). Default
    /// [`DEFAULT_CPU_HZ`](crate::config::DEFAULT_CPU_HZ). Process-wide.
    pub fn cpu_sampling(mut self, hz: u32) -> Self {
        self.config.cpu_hz = hz;
        self
    }

    /// How the CPU sampler walks stacks. Default
    /// [`DEFAULT_CPU_UNWIND`](crate::config::DEFAULT_CPU_UNWIND).
    pub fn cpu_unwind(mut self, unwind: crate::Unwind) -> Self {
        self.config.cpu_unwind = unwind;
        self
    }

    /// Which CPU clock. Default [`DEFAULT_CPU_CLOCK`](crate::config::DEFAULT_CPU_CLOCK); see
    /// [`CpuClock`](crate::CpuClock).
    pub fn cpu_clock(mut self, clock: crate::CpuClock) -> Self {
        self.config.cpu_clock = clock;
        self
    }

    /// Leak detection: a span path (or a sampled stack under it) is a suspected leak when, over
    /// the last `snapshots` captures, its in-use memory never fell, grew in at least half of
    /// them, and by at least `min_bytes` in all (the rule of `tracing-prof leaks` too:
    /// [`is_suspected_leak`](tracing_prof_model::series::is_suspected_leak)); `snapshots == 0`
    /// turns it off.
    /// Defaults [`DEFAULT_LEAK_SNAPSHOTS`](crate::config::DEFAULT_LEAK_SNAPSHOTS) and
    /// [`DEFAULT_LEAK_MIN_BYTES`](crate::config::DEFAULT_LEAK_MIN_BYTES).
    pub fn leak_detection(mut self, snapshots: usize, min_bytes: u64) -> Self {
        self.config.leak_snapshots = snapshots;
        self.config.leak_min_bytes = min_bytes;
        self
    }

    /// Level of the event logged when a path becomes a suspected leak. Default
    /// [`DEFAULT_LEAK_LEVEL`](crate::config::DEFAULT_LEAK_LEVEL).
    pub fn leak_level(mut self, level: tracing::Level) -> Self {
        self.config.leak_level = level;
        self
    }

    /// Reports allocations of at least `bytes` (with their span path: [`Profiler::giant_allocations`]
    /// and a WARN event, target `tracing_prof::giant`), and refuses them if `refuse`: null is
    /// returned before the inner allocator is asked, so the program's allocation-error handling
    /// runs and nothing leaks. Needs the tagging allocator. Off by default. `bytes` must be at
    /// least [`MIN_GIANT_BYTES`](crate::config::MIN_GIANT_BYTES). Process-wide.
    pub fn giant_allocations(mut self, bytes: usize, refuse: bool) -> Self {
        self.config.giant_bytes = Some(bytes);
        self.config.giant_refuse = refuse;
        self
    }

    /// Heap sampling: a mean of one allocation sampled, with its code stack, per `rate` bytes
    /// allocated (`0`: off; `1`: every allocation, for tests). Default
    /// [`DEFAULT_SAMPLE_RATE`](crate::config::DEFAULT_SAMPLE_RATE). Needs the tagging allocator.
    /// Process-wide (one profiler runs at a time: [`BuildError::AlreadyRunning`]).
    pub fn heap_sampling(mut self, rate: u64) -> Self {
        self.config.sample_rate = rate;
        self
    }

    /// Counts the spans of `path` (as the profiles write it, `request -> render`; `*` for
    /// every path without its own) longer than `threshold` as slow (see [`SlowSpan`]).
    ///
    /// [`SlowSpan`]: crate::SlowSpan
    pub fn slow_span(mut self, path: impl Into<String>, threshold: Duration) -> Self {
        self.config.slow_spans.push(crate::SlowSpan {
            path: path.into(),
            threshold,
        });
        self
    }

    /// Counts an enter-to-exit interval of a span's own (less its child spans) on an async
    /// runtime's worker thread at least `threshold` long as a long poll: it kept the worker
    /// from its other tasks. `None` counts none. Default
    /// [`DEFAULT_LONG_POLL`](crate::config::DEFAULT_LONG_POLL); `TRACING_PROF_LONG_POLL`. See
    /// [`Profiler::long_polls`].
    pub fn long_poll(mut self, threshold: Option<Duration>) -> Self {
        self.config.long_poll = threshold;
        self
    }

    /// What the allocator the tagging allocator wraps says of its memory, beside the resident
    /// set and the heap in use ([`Profiler::process_memory`]): [`GlibcMalloc`] for
    /// `std::alloc::System` on glibc, or your own [`AllocatorStats`]. None by default: the
    /// resident set and the exact heap are there without it.
    ///
    /// [`GlibcMalloc`]: crate::GlibcMalloc
    /// [`AllocatorStats`]: crate::AllocatorStats
    pub fn allocator_stats(mut self, stats: impl crate::AllocatorStats) -> Self {
        self.allocator_stats = Some(Box::new(stats));
        self
    }

    /// Shares of the cgroup's memory limit, in percent, whose crossing by the working set
    /// (usage less inactive page cache, as the OOM killer and the kubelet see it) writes a
    /// memory incident at once, through every sink that writes them ([`Sink::incident`]:
    /// files, into `incidents/`). Once per crossing, again after the working set has fallen 5
    /// points below. Default [`DEFAULT_OOM_THRESHOLDS`](crate::config::DEFAULT_OOM_THRESHOLDS)
    /// (80, 90, 95); none where no limit is set; `TRACING_PROF_OOM_THRESHOLDS`. Read by the
    /// aggregator thread at the peak watch's rate.
    ///
    /// [`Sink::incident`]: crate::Sink::incident
    pub fn oom_thresholds(mut self, percent: impl IntoIterator<Item = u8>) -> Self {
        let mut t: Vec<u8> = percent
            .into_iter()
            .filter(|p| (1..=100).contains(p))
            .collect();
        t.sort_unstable();
        t.dedup();
        self.config.oom_thresholds = t;
        self
    }

    /// The flight recorder: the last `length` of exports kept in memory as windows (each
    /// interval's numbers of every kind, gzip'd pprof), at most `bytes` of them, oldest
    /// dropped first; written with every incident, served at `/debug/pprof/flightrecorder`
    /// ([`Profiler::flight_recording`]). `None`: off. Default 5 minutes and 8 MiB
    /// ([`DEFAULT_FLIGHT_LENGTH`](crate::DEFAULT_FLIGHT_LENGTH),
    /// [`DEFAULT_FLIGHT_BYTES`](crate::DEFAULT_FLIGHT_BYTES)); `TRACING_PROF_FLIGHT_RECORDER`
    /// sets the length. Its memory: those bytes and the last export's snapshot (the base of
    /// the next window), on the aggregator thread; nothing on the application's threads.
    /// Besides a memory threshold, these write an incident with the recording, at most once
    /// per recorder length each: a slow span ([`slow_span`](Self::slow_span)) closed since the
    /// last export, a path's first long poll, a heap peak twice the last one written (64 MiB
    /// at least).
    pub fn flight_recorder(mut self, length_and_bytes: Option<(Duration, usize)>) -> Self {
        self.config.flight_recorder = length_and_bytes;
        self
    }

    /// How often the aggregator thread reads the heap for its high-water mark
    /// ([`Profiler::peak`]); `None`: not watched. Default
    /// [`DEFAULT_PEAK_EVERY`](crate::DEFAULT_PEAK_EVERY) (100 ms); `TRACING_PROF_PEAK_EVERY`. A
    /// spike that rises and falls between two readings is not seen; each reading costs the
    /// aggregator thread what a capture's read of the counters costs (span paths × threads ×
    /// 32 bytes), the application's threads nothing.
    pub fn peak_every(mut self, every: Option<Duration>) -> Self {
        self.config.peak_every = every;
        self
    }

    /// A signal that pauses and resumes profiling, each time it arrives (see
    /// [`Profiler::pause`]); `TRACING_PROF_TOGGLE_SIGNAL`. None by default: `SIGUSR1` and
    /// `SIGUSR2` kill a process that does not handle them, and a profiler must not change
    /// that unasked. Building fails if the application already handles (or ignores) it.
    pub fn toggle_signal(mut self, signal: Option<crate::UserSignal>) -> Self {
        self.config.toggle_signal = signal;
        self
    }

    /// A signal that writes an incident (cause `signal`) with the flight recorder's recording,
    /// each time it arrives, within 100 ms, from the aggregator thread; `TRACING_PROF_FLIGHT_SIGNAL`.
    /// None by default, for the toggle's reasons; not the toggle signal. Building fails if the
    /// application already handles (or ignores) it. A signal delivered while the aggregator is
    /// busy with an export is handled after it; several delivered between two looks write one
    /// incident.
    pub fn flight_signal(mut self, signal: Option<crate::UserSignal>) -> Self {
        self.config.flight_signal = signal;
        self
    }

    /// Sampled allocations freed sooner than `threshold` count as temporary. Default
    /// [`DEFAULT_TEMPORARY_THRESHOLD`](crate::config::DEFAULT_TEMPORARY_THRESHOLD).
    pub fn temporary_threshold(mut self, threshold: Duration) -> Self {
        self.config.temporary_threshold = threshold;
        self
    }

    /// How long the guard's drop waits for the final export. Default
    /// [`DEFAULT_SHUTDOWN_TIMEOUT`](crate::config::DEFAULT_SHUTDOWN_TIMEOUT).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.config.shutdown_timeout = timeout;
        self
    }

    /// Adds a destination for the profiles exported every interval and at shutdown.
    pub fn sink(mut self, sink: impl Sink) -> Self {
        self.sinks.push(Box::new(sink));
        self
    }

    /// The settings as they stand.
    pub fn current_config(&self) -> &Config {
        &self.config
    }

    /// Starts the aggregator thread and returns the layer to install and the guard to keep.
    pub fn build(self) -> Result<(ProfileLayer, ProfilerGuard), BuildError> {
        self.config.validate()?;
        let running = RunningToken::take().ok_or(BuildError::AlreadyRunning)?;
        crate::fork::register();
        // Before sampling starts: a capture's duration counts from here.
        let started = Instant::now();
        // Every process-wide setting, in one place; CPU sampling may fail to start, and the
        // profiler then goes on without it.
        let cpu_error = RUNTIME.apply(&self.config)?;
        let shared = Arc::new(Shared {
            started,
            exports: AtomicU64::new(0),
            export_errors: AtomicU64::new(0),
            leaks: ForkSafe::new(Vec::new()),
            giants: ForkSafe::new(std::collections::VecDeque::new()),
            giants_missed: AtomicU64::new(0),
            cpu_error: ForkSafe::new(None),
            services: ForkSafe::new(Vec::new()),
            sinks: self
                .sinks
                .iter()
                .map(|sink| SinkCounters {
                    name: sink.name().to_owned(),
                    exports: AtomicU64::new(0),
                    export_errors: AtomicU64::new(0),
                    last_error: ForkSafe::new(None),
                    delivery: sink.delivery(),
                })
                .collect(),
            paused: AtomicBool::new(false),
            sample_rate: self.config.sample_rate,
            slow_spans: self.config.slow_spans.clone(),
            peak: ForkSafe::new(None),
            allocator_stats: self.allocator_stats,
            cgroup: crate::cgroup::MemoryCgroup::find(std::path::Path::new("/"))
                .filter(crate::cgroup::MemoryCgroup::has_limit),
            process_memory_last: ForkSafe::new(None),
            incidents: AtomicU64::new(0),
            flight: ForkSafe::new(Vec::new()),
            // At least MIN_PEAK_EVERY however it was set (a zero period would spin).
            peak_every: self
                .config
                .peak_every
                .map(|d| d.max(crate::config::MIN_PEAK_EVERY)),
            cpu_time: self.config.cpu_time,
            cpu_hz: self.config.cpu_hz,
            cpu_unwind: self.config.cpu_unwind,
        });
        // The process's memory at start, for /metrics until the first export reads it again.
        let at_start =
            tracing_prof_model::Snapshot::new(std::time::SystemTime::now(), Duration::ZERO);
        *shared.process_memory_last.lock() = shared.process_memory(&at_start);
        if let Some(e) = cpu_error {
            eprintln!("tracing-prof: CPU sampling is off: {e}");
            *shared.cpu_error.lock() = Some(e.to_string());
        }
        let (commands, inbox) = bounded::<Command>(4);
        let (done_tx, done) = bounded::<()>(1);
        let mut aggregator = Aggregator {
            shared: Arc::clone(&shared),
            sinks: self.sinks,
            interval: self.config.interval,
            reported: HashMap::new(),
            leaks: (self.config.leak_snapshots > 0)
                .then(|| LeakDetector::new(self.config.leak_snapshots, self.config.leak_min_bytes)),
            leak_level: self.config.leak_level,
            giants: self.config.giant_bytes.is_some(),
            long_polls_reported: std::collections::HashSet::new(),
            // Only signals from now on: earlier ones were an earlier profiler's.
            toggle_signal: self
                .config
                .toggle_signal
                .map(|sig| (sig, crate::user_signal::received(sig))),
            flight_signal: self
                .config
                .flight_signal
                .map(|sig| (sig, crate::user_signal::received(sig))),
            // Only records made from now on: older ones belong to an earlier profiler.
            next_giant: tracing_prof_alloc::__private::giant_allocations_end(),
            peak_watch: crate::peak::PeakWatch::default(),
            oom: crate::incident::OomWatch::new(&self.config.oom_thresholds),
            flight: self
                .config
                .flight_recorder
                .map(|(length, bytes)| crate::flight::FlightRecorder::new(length, bytes)),
            triggers: crate::incident::Triggers::default(),
            peak_built: None,
        };
        let thread = std::thread::Builder::new()
            .name("tracing-prof".into())
            .spawn(move || {
                let terminated = aggregator.run(inbox);
                crate::terminate::disarm();
                // Sinks flush in their Drop (a push queue, say): inside the guard's timeout.
                drop(aggregator);
                if let Some(reply) = terminated {
                    let _ = reply.send(());
                }
                RUNTIME.stop_cpu();
                drop(running);
                let _ = done_tx.send(());
            })
            .map_err(BuildError::Spawn)?;
        if self.config.flush_on_sigterm {
            // Err: the application handles or ignores SIGTERM itself; its shutdown drops the
            // guard, which makes the final export.
            let _ = crate::terminate::arm(commands.clone(), self.config.shutdown_timeout);
        }
        let layer = ProfileLayer::new()
            .with_cpu_time(self.config.cpu_time == crate::CpuTime::Exact)
            .with_trace_links(self.config.trace_links)
            .with_clock(crate::SystemClock::new(self.config.cpu_clock));
        // Last: what `build` itself allocates is never refused.
        RUNTIME.apply_giant_policy(&self.config);
        #[allow(unused_mut, reason = "attached to only with the opentelemetry feature")]
        let mut guard = ProfilerGuard {
            profiler: Profiler { shared },
            commands,
            done,
            thread: Some(thread),
            timeout: self.config.shutdown_timeout,
            attached: Vec::new(),
        };
        #[cfg(feature = "opentelemetry")]
        if self.config.process_context {
            let resource = crate::otel_resource::resource_from_env();
            match crate::process_context::publish(&resource) {
                Ok(()) => guard
                    .attached
                    .push(Box::new(crate::process_context::RemoveOnDrop)),
                Err(e) => eprintln!(
                    "tracing-prof: the OpenTelemetry process context was not published ({e}); \
                     profiling goes on without it"
                ),
            }
        }
        Ok((layer, guard))
    }
}
