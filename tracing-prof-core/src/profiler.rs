//! The profiler: a builder, a background aggregator thread that exports to sinks, and the
//! guard that flushes on drop.

use crate::config::{Config, ConfigError};
use crate::fork::ForkSafe;
use crate::layer::ProfileLayer;
use crate::leak::LeakDetector;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing_prof_alloc::{Tag, set_current_tag};
use tracing_prof_model::{CodeFrame, Snapshot, SuspectedLeak};

/// The error a [`Sink`] returns.
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// Somewhere profiles go: files, a server, a test's buffer.
///
/// Sinks run on the aggregator thread, never on an application thread. A failing export is
/// counted and reported on stderr once (again only when the error changes, and once when the
/// sink recovers); the next interval tries again.
pub trait Sink: Send + 'static {
    /// A short name for error messages, e.g. `"pprof files"`.
    fn name(&self) -> &str;

    /// Exports one snapshot (cumulative: counters since the profiler started).
    fn export(&mut self, snapshot: &Snapshot) -> Result<(), SinkError>;

    /// For a sink that delivers after `export` returns (a push queue): a way to read its
    /// delivery counters from any thread, asked once when the profiler is built, shown by
    /// [`Profiler::sink_stats`]. `None` (the default): `export`'s result is the whole story.
    fn delivery(&self) -> Option<DeliveryProbe> {
        None
    }
}

/// Reads a sink's [`Delivery`] counters; see [`Sink::delivery`].
pub type DeliveryProbe = Arc<dyn Fn() -> Delivery + Send + Sync>;

/// What a sink that delivers later has done with what it was given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Delivery {
    /// Batches delivered.
    pub delivered: u64,
    /// Attempts that failed (each retry counts).
    pub failed_attempts: u64,
    /// Batches given up (queue full, retries exhausted, refused by the receiver).
    pub dropped: u64,
    /// Batches waiting.
    pub queued: u64,
}

impl Delivery {
    /// Counters as a sink reports them.
    pub fn new(delivered: u64, failed_attempts: u64, dropped: u64, queued: u64) -> Self {
        Delivery {
            delivered,
            failed_attempts,
            dropped,
            queued,
        }
    }
}

/// One sink's counters; see [`Profiler::sink_stats`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SinkStats {
    /// The sink's name.
    pub name: String,
    /// Exports that succeeded.
    pub exports: u64,
    /// Exports that failed.
    pub export_errors: u64,
    /// The last export's error, until an export succeeds again.
    pub last_error: Option<String>,
    /// Its delivery counters, for a sink that delivers later (Pyroscope).
    pub delivery: Option<Delivery>,
}

/// The state of a service the profiler runs beside its sinks, such as the `/debug/pprof`
/// server; see [`Profiler::set_service_status`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServiceStatus {
    /// What it is (`/debug/pprof server`).
    pub name: String,
    /// Whether it works (`false`: it could not start and is trying again).
    pub up: bool,
    /// What it is doing, or why it is not: `listening on 127.0.0.1:6060`, or the error and
    /// when it will try again.
    pub detail: String,
}

impl ServiceStatus {
    /// `name` in the state `up`, said by `detail`.
    pub fn new(name: impl Into<String>, up: bool, detail: impl Into<String>) -> Self {
        ServiceStatus {
            name: name.into(),
            up,
            detail: detail.into(),
        }
    }
}

/// The profiler's side of one sink's counters.
struct SinkCounters {
    name: String,
    exports: AtomicU64,
    export_errors: AtomicU64,
    last_error: ForkSafe<Option<String>>,
    delivery: Option<DeliveryProbe>,
}

impl fmt::Debug for SinkCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkCounters")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

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

/// Set while a profiler runs: from `build` until its aggregator thread has finished.
static RUNNING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Owns [`RUNNING`]: clears it when dropped (the aggregator's end, or a failed build).
struct RunningToken(());

impl RunningToken {
    fn take() -> Result<Self, BuildError> {
        RUNNING
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| RunningToken(()))
            .map_err(|_| BuildError::AlreadyRunning)
    }
}

impl Drop for RunningToken {
    fn drop(&mut self) {
        RUNNING.store(false, Ordering::Release);
    }
}

/// In a child of `fork`: no aggregator runs there.
pub(crate) fn after_fork_in_child() {
    RUNNING.store(false, Ordering::Release);
}

/// Counters about the profiler itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Profiles exported successfully, summed over sinks.
    pub exports: u64,
    /// Exports that failed, summed over sinks.
    pub export_errors: u64,
    /// Spans counted under `(other span paths)` because the path cap was reached.
    pub overflowed_spans: u64,
    /// Giant allocations overwritten in their ring before the aggregator read them.
    pub giant_allocations_missed: u64,
    /// Per-thread counter tables made (threads seen; exited threads' tables are reused).
    pub thread_tables: usize,
    /// Heap sampling rate in bytes (0: off).
    pub sample_rate: u64,
    /// Stack buckets of the heap sampler in use, out of `tracing_prof_alloc::MAX_STACKS - 1`.
    pub sampled_stacks: usize,
    /// Samples counted under `(stack table full)` because no bucket was left for their stack.
    pub stack_table_full: u64,
    /// Spans whose "outlived" counts could not be tracked (their instance slot was taken).
    pub untracked_span_instances: u64,
    /// Bytes of memory the span table holds: 64 per open span, in 4 KiB pages, outside the
    /// allocator (an anonymous mapping, so not in the profiles' `(tracing-prof)` path). Pages
    /// that no open span uses any more are given back at each capture.
    pub span_table_bytes: usize,
    /// Spans created so far that found no room in the span table (both of their places taken,
    /// or the table's reservation refused): kept in the registry's extensions, at the cost of a
    /// registry lookup per enter and about 200 bytes the registry keeps.
    pub spans_outside_table: u64,
    /// The CPU stack sampler's counters (rate 0: not running; see [`Profiler::cpu_error`]).
    pub cpu: tracing_prof_cpu::SamplerStats,
    /// Whether profiling is paused (see [`Profiler::pause`]).
    pub paused: bool,
    /// Services that are not working now (a `/debug/pprof` server whose port is taken, trying
    /// again); [`Profiler::services`] says which and why.
    pub services_down: usize,
}

#[derive(Debug)]
struct Shared {
    started: Instant,
    exports: AtomicU64,
    export_errors: AtomicU64,
    /// What the aggregator's leak detection last found.
    leaks: ForkSafe<Vec<SuspectedLeak>>,
    /// The most recent giant allocations, at most GIANT_RING.
    giants: ForkSafe<std::collections::VecDeque<GiantReport>>,
    giants_missed: AtomicU64,
    /// Why CPU sampling is not running, when it was asked for.
    cpu_error: ForkSafe<Option<String>>,
    /// Per sink, in the order they were added.
    sinks: Vec<SinkCounters>,
    /// The services beside the sinks, by name, in the order they first reported.
    services: ForkSafe<Vec<ServiceStatus>>,
    /// Whether profiling is paused; changed under `toggle`.
    paused: AtomicBool,
    /// Serializes pause and resume.
    toggle: ForkSafe<()>,
    /// What resume starts again.
    sample_rate: u64,
    cpu_time: crate::CpuTime,
    cpu_hz: u32,
    cpu_unwind: crate::Unwind,
}

impl Shared {
    /// Pauses (`true`) or resumes profiling; returns whether that changed anything.
    fn set_paused(&self, paused: bool) -> bool {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        let _one_at_a_time = self.toggle.lock();
        if self.paused.load(Ordering::Acquire) == paused {
            return false;
        }
        if paused {
            self.paused.store(true, Ordering::Release);
            tracing_prof_alloc::set_sample_rate(0);
            crate::cpu::stop();
        } else {
            tracing_prof_alloc::set_sample_rate(self.sample_rate);
            if self.cpu_hz > 0 {
                if let Err(e) = crate::cpu::start(self.cpu_time, self.cpu_hz, self.cpu_unwind) {
                    eprintln!("tracing-prof: CPU sampling did not start again: {e}");
                    *self.cpu_error.lock() = Some(e.to_string());
                }
            }
            self.paused.store(false, Ordering::Release);
        }
        true
    }
}

/// The long polls of one span path (see [`Profiler::long_polls`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LongPolls {
    /// The span names, root first, joined by ` -> `.
    pub path: String,
    /// The path's frames, root first.
    pub frames: Vec<tracing_prof_model::SpanFrame>,
    /// Long polls since the start.
    pub count: u64,
    /// The longest of them.
    pub longest: Duration,
}

/// A giant allocation, as the aggregator read it (see [`ProfilerBuilder::giant_allocations`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GiantReport {
    /// Bytes requested.
    pub size: usize,
    /// The span path it was requested in.
    pub span_path: String,
    /// Whether it was refused.
    pub refused: bool,
    /// The code that asked, root first (trimmed like the sampled stacks).
    pub stack: Vec<CodeFrame>,
}

impl GiantReport {
    /// The innermost code frame: the function that asked, or `?` when unknown.
    pub fn site(&self) -> &str {
        self.stack.last().map_or("?", |f| &f.function)
    }
}

/// A handle to read the profiler's numbers from any thread.
#[derive(Clone, Debug)]
pub struct Profiler {
    shared: Arc<Shared>,
}

impl Profiler {
    /// Starts configuring a profiler with the documented defaults.
    pub fn builder() -> ProfilerBuilder {
        ProfilerBuilder::default()
    }

    /// Whether a profiler is running in this process: built, and its aggregator not finished
    /// (the guard is alive, or its final export is still under way). While it is, building
    /// another fails with [`BuildError::AlreadyRunning`].
    pub fn running() -> bool {
        RUNNING.load(Ordering::Acquire)
    }

    /// Everything counted so far, read now on the calling thread, with the suspected leaks the
    /// aggregator last found.
    pub fn snapshot(&self) -> Snapshot {
        let mut p = crate::capture(self.shared.started.elapsed());
        p.suspected_leaks = self.suspected_leaks();
        p
    }

    /// What is running now, as Go's goroutine dump shows goroutines: each thread that entered a
    /// span, with the span path it is in and since when; each span path with open spans, its
    /// count and its oldest spans' ages (at most [`LISTED_PER_PATH`]), the path with the oldest
    /// span first. Reads the span table without a lock: the cost grows with the spans open now,
    /// never with those closed, and the answer's size with the span paths (capped).
    ///
    /// Spans of the registry's extensions (no room in the table, see
    /// [`Stats::spans_outside_table`]) are not listed; `unlisted` counts them. Ages assume the
    /// real clock (a layer given a test clock lists nonsense ages).
    ///
    /// [`LISTED_PER_PATH`]: tracing_prof_model::LISTED_PER_PATH
    pub fn in_flight(&self) -> tracing_prof_model::InFlight {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        crate::in_flight::read(&crate::capture::path_index(), crate::monotonic::now_ns())
    }

    /// The most recent giant allocations (at most 64), oldest first, as of the aggregator's last
    /// capture; see [`ProfilerBuilder::giant_allocations`].
    pub fn giant_allocations(&self) -> Vec<GiantReport> {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        let g = self.shared.giants.lock();
        g.iter().cloned().collect()
    }

    /// Span paths whose in-use memory grew in each of the last captures (see the leak detection in the README),
    /// as of the aggregator's last capture.
    pub fn suspected_leaks(&self) -> Vec<SuspectedLeak> {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        self.shared.leaks.lock().clone()
    }

    /// Counters about the profiler itself.
    pub fn stats(&self) -> Stats {
        let sampler = tracing_prof_alloc::sampler_stats();
        Stats {
            exports: self.shared.exports.load(Ordering::Relaxed),
            export_errors: self.shared.export_errors.load(Ordering::Relaxed),
            overflowed_spans: crate::span_path::overflowed_spans(),
            giant_allocations_missed: self.shared.giants_missed.load(Ordering::Relaxed),
            thread_tables: tracing_prof_alloc::thread_tables(),
            sample_rate: sampler.rate,
            sampled_stacks: sampler.stacks,
            stack_table_full: sampler.table_full,
            untracked_span_instances: tracing_prof_alloc::untracked_instances(),
            span_table_bytes: crate::span_index::resident_bytes(),
            spans_outside_table: crate::span_index::spans_outside(),
            cpu: tracing_prof_cpu::stats(),
            paused: self.is_paused(),
            services_down: self.shared.services.lock().iter().filter(|s| !s.up).count(),
        }
    }

    /// Records the state of a service run beside the profiler (the `/debug/pprof` server
    /// does), replacing the last one of the same name; [`Profiler::services`] and
    /// [`Stats::services_down`] read it, and the `/debug/pprof/` index shows it.
    pub fn set_service_status(&self, status: ServiceStatus) {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        let mut services = self.shared.services.lock();
        match services.iter_mut().find(|s| s.name == status.name) {
            Some(s) => *s = status,
            None => services.push(status),
        }
    }

    /// Forgets the service `name` (it stopped): it is no longer listed.
    pub fn remove_service(&self, name: &str) {
        self.shared.services.lock().retain(|s| s.name != name);
    }

    /// The services run beside the profiler, as they last said (see
    /// [`Profiler::set_service_status`]).
    pub fn services(&self) -> Vec<ServiceStatus> {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        self.shared.services.lock().clone()
    }

    /// Pauses profiling: no heap sampling, no CPU sampling, no exports (so no files and no
    /// pushes) until [`Profiler::resume`]. The exact counters keep counting, so in-use memory
    /// is right again after resuming, and the first export after it covers the pause too.
    /// Returns whether it was running. Takes effect at once on every thread (a thread in the
    /// middle of its next heap sample finishes it).
    pub fn pause(&self) -> bool {
        self.shared.set_paused(true)
    }

    /// Resumes profiling after [`Profiler::pause`]; returns whether it was paused.
    pub fn resume(&self) -> bool {
        self.shared.set_paused(false)
    }

    /// Whether profiling is paused.
    pub fn is_paused(&self) -> bool {
        self.shared.paused.load(Ordering::Acquire)
    }

    /// The span paths with long polls (see [`ProfilerBuilder::long_poll`]), most first: how
    /// many since the start, and the longest. Worker threads are those named as tokio names
    /// its workers; the span whose own time was long is counted, not its parents.
    pub fn long_polls(&self) -> Vec<LongPolls> {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        let mut out: Vec<LongPolls> = crate::span_path::all_paths()
            .into_iter()
            .filter_map(|(tag, frames)| {
                let (count, longest_ns) = crate::long_poll::of(tag);
                (count > 0).then(|| LongPolls {
                    path: tracing_prof_model::display_path(&frames),
                    frames,
                    count,
                    longest: Duration::from_nanos(longest_ns),
                })
            })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then(b.longest.cmp(&a.longest)));
        out
    }

    /// Each sink's counters, in the order the sinks were added: exports and failures as the
    /// aggregator saw them, the last error, and for a sink that delivers later (Pyroscope) its
    /// own delivery counters, read now. A push that fails after `export` queued it shows here,
    /// not in [`Stats::export_errors`].
    pub fn sink_stats(&self) -> Vec<SinkStats> {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        self.shared
            .sinks
            .iter()
            .map(|c| SinkStats {
                name: c.name.clone(),
                exports: c.exports.load(Ordering::Relaxed),
                export_errors: c.export_errors.load(Ordering::Relaxed),
                last_error: c.last_error.lock().clone(),
                delivery: c.delivery.as_ref().map(|probe| probe()),
            })
            .collect()
    }

    /// Why CPU sampling is not running although it was asked for (another SIGPROF handler in
    /// the process, an unsupported platform...), or `None`.
    pub fn cpu_error(&self) -> Option<String> {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        self.shared.cpu_error.lock().clone()
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
    config: Config,
    sinks: Vec<Box<dyn Sink>>,
}

impl fmt::Debug for ProfilerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sinks: Vec<&str> = self.sinks.iter().map(|s| s.name()).collect();
        f.debug_struct("ProfilerBuilder")
            .field("config", &self.config)
            .field("sinks", &sinks)
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

    /// Leak detection: a span path is a suspected leak once its in-use memory grew in `snapshots`
    /// consecutive captures by at least `min_bytes` in all; `snapshots == 0` turns it off.
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

    /// Counts an enter-to-exit interval of a span's own (less its child spans) on an async
    /// runtime's worker thread at least `threshold` long as a long poll: it kept the worker
    /// from its other tasks. `None` counts none. Default
    /// [`DEFAULT_LONG_POLL`](crate::config::DEFAULT_LONG_POLL); `TRACING_PROF_LONG_POLL`.
    /// See [`Profiler::long_polls`].
    pub fn long_poll(mut self, threshold: Option<Duration>) -> Self {
        self.config.long_poll = threshold;
        self
    }

    /// A signal that pauses and resumes profiling, each time it arrives (see
    /// [`Profiler::pause`]); `TRACING_PROF_TOGGLE_SIGNAL`. None by default: `SIGUSR1` and
    /// `SIGUSR2` kill a process that does not handle them, and a profiler must not change
    /// that unasked. Building fails if the application already handles (or ignores) it.
    pub fn toggle_signal(mut self, signal: Option<crate::ToggleSignal>) -> Self {
        self.config.toggle_signal = signal;
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
        let running = RunningToken::take()?;
        crate::span_path::set_cap(self.config.max_span_paths);
        crate::labels::configure(&self.config.label_fields, self.config.label_values);
        crate::fork::register();
        crate::long_poll::set_threshold(self.config.long_poll);
        tracing_prof_alloc::set_temporary_threshold(self.config.temporary_threshold);
        if !tracing_prof_alloc::set_sample_rate(self.config.sample_rate) {
            return Err(BuildError::Config(ConfigError::Value {
                setting: "sample_rate",
                reason: "the system allocator refused the sample table".into(),
            }));
        }
        let shared = Arc::new(Shared {
            started: Instant::now(),
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
            toggle: ForkSafe::new(()),
            sample_rate: self.config.sample_rate,
            cpu_time: self.config.cpu_time,
            cpu_hz: self.config.cpu_hz,
            cpu_unwind: self.config.cpu_unwind,
        });
        if let Some(sig) = self.config.toggle_signal {
            crate::pause::install(sig).map_err(|reason| {
                BuildError::Config(ConfigError::Value {
                    setting: "toggle_signal (TRACING_PROF_TOGGLE_SIGNAL)",
                    reason,
                })
            })?;
        }
        if let Err(e) = crate::cpu::start(
            self.config.cpu_time,
            self.config.cpu_hz,
            self.config.cpu_unwind,
        ) {
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
            toggle_signal: self.config.toggle_signal.is_some(),
            toggles_seen: 0,
            // Only records made from now on: older ones belong to an earlier profiler.
            next_giant: tracing_prof_alloc::giant_allocations_end(),
        };
        let thread = std::thread::Builder::new()
            .name("tracing-prof".into())
            .spawn(move || {
                aggregator.run(inbox);
                // Sinks flush in their Drop (a push queue, say): inside the guard's timeout.
                drop(aggregator);
                crate::cpu::stop();
                drop(running);
                let _ = done_tx.send(());
            })
            .map_err(BuildError::Spawn)?;
        let layer = ProfileLayer::new()
            .with_cpu_time(self.config.cpu_time == crate::CpuTime::Exact)
            .with_clock(crate::SystemClock::new(self.config.cpu_clock));
        // Last: what `build` itself allocates is never refused.
        tracing_prof_alloc::set_giant_policy(self.config.giant_bytes, self.config.giant_refuse);
        let guard = ProfilerGuard {
            profiler: Profiler { shared },
            commands,
            done,
            thread: Some(thread),
            timeout: self.config.shutdown_timeout,
            attached: Vec::new(),
        };
        Ok((layer, guard))
    }
}

enum Command {
    Flush(Sender<()>),
    Shutdown,
}

struct Aggregator {
    shared: Arc<Shared>,
    sinks: Vec<Box<dyn Sink>>,
    interval: Duration,
    /// Last error reported per sink, to report each distinct failure once.
    reported: HashMap<String, String>,
    leaks: Option<LeakDetector>,
    leak_level: tracing::Level,
    giants: bool,
    /// Span paths whose long polls were reported (once each).
    long_polls_reported: std::collections::HashSet<Vec<tracing_prof_model::SpanFrame>>,
    /// Whether a toggle signal is configured, and the toggles handled so far.
    toggle_signal: bool,
    toggles_seen: u64,
    /// `seq` of the last giant allocation read.
    next_giant: u64,
}

impl Aggregator {
    fn run(&mut self, inbox: Receiver<Command>) {
        // Everything this thread allocates is the profiler's own; its events reach no layer.
        set_current_tag(Tag::PROFILER);
        let mut no_events = Some(tracing::dispatcher::set_default(&tracing::Dispatch::none()));
        let mut next = Instant::now() + self.interval;
        let mut next_drain = Instant::now() + crate::cpu::DRAIN_EVERY;
        let mut drains = 0u64;
        loop {
            let sampling = tracing_prof_cpu::is_running();
            let mut wake = if sampling { next.min(next_drain) } else { next };
            if self.toggle_signal {
                wake = wake.min(Instant::now() + crate::pause::TOGGLE_POLL);
                if crate::pause::toggles_since(&mut self.toggles_seen) % 2 == 1 {
                    let paused = self.shared.paused.load(Ordering::Acquire);
                    self.shared.set_paused(!paused);
                }
            }
            match inbox.recv_timeout(wake.saturating_duration_since(Instant::now())) {
                Err(RecvTimeoutError::Timeout) if Instant::now() < next && !sampling => {}
                Err(RecvTimeoutError::Timeout) if Instant::now() < next => {
                    // A drain tick: keep the samplers' rings from filling up.
                    next_drain = Instant::now() + crate::cpu::DRAIN_EVERY;
                    drains += 1;
                    crate::cpu::drain();
                    if drains % 10 == 0 {
                        self.watch_cpu_sampler();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.export(&mut no_events);
                    next += self.interval;
                    if next < Instant::now() {
                        next = Instant::now() + self.interval; // fell behind: skip, don't burst
                    }
                }
                Ok(Command::Flush(reply)) => {
                    self.export(&mut no_events);
                    let _ = reply.send(());
                }
                Ok(Command::Shutdown) | Err(RecvTimeoutError::Disconnected) => {
                    self.export(&mut no_events);
                    return;
                }
            }
        }
    }

    /// Once a second while CPU sampling runs: stops it if someone replaced our SIGPROF handler
    /// (our timers' signals would go to theirs), and follows libraries loaded since.
    fn watch_cpu_sampler(&self) {
        crate::monotonic::recheck();
        if !tracing_prof_cpu::is_running() {
            return;
        }
        if !tracing_prof_cpu::handler_installed() {
            crate::cpu::stop();
            let msg = "another SIGPROF handler replaced tracing-prof's; CPU sampling stopped";
            eprintln!("tracing-prof: {msg}");
            *self.shared.cpu_error.lock() = Some(msg.to_owned());
            return;
        }
        tracing_prof_cpu::refresh_modules();
    }

    /// Captures, runs leak detection, and hands the profile to every sink.
    ///
    /// `no_events` is this thread's no-op dispatcher guard: its own work never reaches the
    /// application's subscriber, except the leak events, which are meant for it.
    fn export(&mut self, no_events: &mut Option<tracing::dispatcher::DefaultGuard>) {
        if self.sinks.is_empty()
            && self.leaks.is_none()
            && !self.giants
            && !crate::long_poll::enabled()
        {
            return;
        }
        if self.shared.paused.load(Ordering::Acquire) {
            return; // paused: no files, no pushes
        }
        let mut events: Vec<Box<dyn Fn()>> = Vec::new();
        if self.giants {
            let (new, missed, next) = tracing_prof_alloc::giant_allocations_since(self.next_giant);
            self.next_giant = next;
            self.shared
                .giants_missed
                .fetch_add(missed, Ordering::Relaxed);
            let mut reports = Vec::new();
            for g in new {
                if g.tag == Tag::PROFILER {
                    continue; // the profiler's own (symbolization, encoding): never refused
                }
                let report = GiantReport {
                    size: g.size,
                    span_path: crate::span_path::display(g.tag),
                    refused: g.refused,
                    stack: crate::symbolize::code_stack(
                        &g.ips,
                        crate::span_path::innermost(g.tag).as_ref(),
                        crate::symbolize::Leaf::TrimAllocator,
                    ),
                };
                events.push(Box::new({
                    let r = report.clone();
                    move || log_giant(&r)
                }));
                reports.push(report);
            }
            // Symbolized above, outside the lock: a ForkSafe lock is held briefly, alone.
            let mut kept = self.shared.giants.lock();
            for report in reports {
                if kept.len() == tracing_prof_alloc::GIANT_RING {
                    kept.pop_front();
                }
                kept.push_back(report);
            }
            drop(kept);
        }
        let mut profile = crate::capture(self.shared.started.elapsed());
        for p in &profile.paths {
            if p.time.long_polls > 0 && self.long_polls_reported.insert(p.frames.clone()) {
                let (path, count) = (p.display_path(), p.time.long_polls);
                events.push(Box::new(move || log_long_poll(&path, count)));
            }
        }
        if let Some(detector) = &mut self.leaks {
            let (now, new) = detector.observe(&profile);
            profile.suspected_leaks = now.clone();
            *self.shared.leaks.lock() = now;
            let level = self.leak_level;
            for leak in new {
                events.push(Box::new(move || log_leak(level, &leak)));
            }
        }
        if !events.is_empty() {
            // These events are meant for the application's subscriber: leave the no-op one.
            drop(no_events.take());
            for emit in &events {
                emit();
            }
            *no_events = Some(tracing::dispatcher::set_default(&tracing::Dispatch::none()));
        }
        for (sink, counters) in self.sinks.iter_mut().zip(&self.shared.sinks) {
            let name = sink.name().to_owned();
            // A panicking sink is a failed export, not the end of profiling.
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink.export(&profile)))
                    .unwrap_or_else(|panic| {
                        let what = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "a non-string payload".into());
                        Err(format!("the sink panicked: {what}").into())
                    });
            match result {
                Ok(()) => {
                    self.shared.exports.fetch_add(1, Ordering::Relaxed);
                    counters.exports.fetch_add(1, Ordering::Relaxed);
                    *counters.last_error.lock() = None;
                    if self.reported.remove(&name).is_some() {
                        eprintln!("tracing-prof: {name}: exporting works again");
                    }
                }
                Err(e) => {
                    self.shared.export_errors.fetch_add(1, Ordering::Relaxed);
                    counters.export_errors.fetch_add(1, Ordering::Relaxed);
                    let msg = e.to_string();
                    *counters.last_error.lock() = Some(msg.clone());
                    if self.reported.get(&name) != Some(&msg) {
                        eprintln!(
                            "tracing-prof: {name}: export failed: {msg} \
                             (will retry every interval; this error is reported once)"
                        );
                        self.reported.insert(name, msg);
                    }
                }
            }
        }
    }
}

fn log_giant(g: &GiantReport) {
    tracing::warn!(
        target: "tracing_prof::giant",
        size = g.size,
        span_path = %g.span_path,
        refused = g.refused,
        site = %g.site(),
        "giant allocation of {} bytes in span path `{}`{}",
        g.size,
        g.span_path,
        if g.refused { ", refused" } else { "" }
    );
}

fn log_long_poll(path: &str, count: u64) {
    tracing::warn!(
        target: "tracing_prof::long_poll",
        span_path = %path,
        long_polls = count,
        "span path `{path}` blocked an async worker thread: {count} poll(s) at least the \
         long-poll threshold long so far (see Profiler::long_polls)"
    );
}

fn log_leak(level: tracing::Level, leak: &SuspectedLeak) {
    macro_rules! at {
        ($lvl:expr) => {
            tracing::event!(
                target: "tracing_prof::leak",
                $lvl,
                span_path = %leak.path,
                in_use_bytes = leak.inuse_bytes,
                growth_bytes = leak.growth_bytes,
                snapshots = leak.snapshots,
                "suspected memory leak: the in-use memory of span path `{}` grew in each of the last {} \
                 captures, by {} bytes, to {} bytes",
                leak.path,
                leak.snapshots,
                leak.growth_bytes,
                leak.inuse_bytes
            )
        };
    }
    match level {
        tracing::Level::ERROR => at!(tracing::Level::ERROR),
        tracing::Level::WARN => at!(tracing::Level::WARN),
        tracing::Level::INFO => at!(tracing::Level::INFO),
        tracing::Level::DEBUG => at!(tracing::Level::DEBUG),
        _ => at!(tracing::Level::TRACE),
    }
}

/// Keeps the profiler running; dropping it exports a last profile and stops the thread.
///
/// The drop waits at most the configured shutdown timeout; past it the thread is left to finish
/// alone and a message says so.
#[derive(Debug)]
#[must_use = "dropping the guard stops the profiler"]
pub struct ProfilerGuard {
    profiler: Profiler,
    commands: Sender<Command>,
    done: Receiver<()>,
    thread: Option<JoinHandle<()>>,
    timeout: Duration,
    /// What lives as long as the profiler and stops before its final export (see
    /// [`ProfilerGuard::attach`]).
    attached: Vec<Box<dyn std::any::Any + Send>>,
}

/// A flush that did not complete in time.
#[derive(Debug, thiserror::Error)]
#[error("tracing-prof: the aggregator did not finish exporting within {0:?}")]
pub struct FlushTimeout(pub Duration);

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Command::Flush(_) => "Flush",
            Command::Shutdown => "Shutdown",
        })
    }
}

impl ProfilerGuard {
    /// A handle for snapshots and stats, usable after the guard is gone.
    pub fn profiler(&self) -> &Profiler {
        &self.profiler
    }

    /// Keeps `thing` (a `/debug/pprof` server, say) alive as long as the guard, and drops it,
    /// last attached first, before the final export when the guard drops.
    ///
    /// # Examples
    /// ```
    /// let (_layer, mut guard) = tracing_prof_core::Profiler::builder().build().unwrap();
    /// guard.attach(String::from("anything that must live as long as the profiler"));
    /// assert!(guard.attached::<String>().is_some());
    /// ```
    pub fn attach(&mut self, thing: impl std::any::Any + Send) {
        self.attached.push(Box::new(thing));
    }

    /// The first attached thing of type `T`, if any.
    pub fn attached<T: std::any::Any>(&self) -> Option<&T> {
        self.attached.iter().find_map(|b| b.downcast_ref::<T>())
    }

    /// Exports to every sink now and waits for it, at most `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<(), FlushTimeout> {
        let (tx, rx) = bounded(1);
        let deadline = Instant::now() + timeout;
        self.commands
            .send_deadline(Command::Flush(tx), deadline)
            .map_err(|_| FlushTimeout(timeout))?;
        rx.recv_deadline(deadline)
            .map_err(|_| FlushTimeout(timeout))
    }
}

impl Drop for ProfilerGuard {
    fn drop(&mut self) {
        while let Some(thing) = self.attached.pop() {
            drop(thing);
        }
        let deadline = Instant::now() + self.timeout;
        let _ = self.commands.send_deadline(Command::Shutdown, deadline);
        match self.done.recv_deadline(deadline) {
            Ok(()) | Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => eprintln!(
                "tracing-prof: the final export did not finish within {:?}; not waiting for it",
                self.timeout
            ),
        }
    }
}
