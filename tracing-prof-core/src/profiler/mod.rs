//! The profiler: a builder, a background aggregator thread that exports to sinks, and the
//! guard that flushes on drop.
//!
//! `sink` (what an exporter implements, and the delivery counters), `builder` (the settings
//! applied, the threads started), this module (the [`Profiler`] handle and the state it shares
//! with the aggregator), `aggregator` (the thread: snapshots, exports, leak, giant and
//! long-poll reports) and `guard` (the final export on drop).

mod aggregator;
pub(crate) use aggregator::Command;
mod builder;
mod guard;
mod sink;

pub use builder::{BuildError, ProfilerBuilder};
pub use guard::{FlushTimeout, ProfilerGuard};
pub use sink::{Delivery, DeliveryProbe, Incident, ServiceStatus, Sink, SinkError, SinkStats};

use crate::fork::ForkSafe;
use crate::runtime::RUNTIME;
use sink::SinkCounters;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tracing_prof_alloc::Tag;
use tracing_prof_model::{CodeFrame, Snapshot, SuspectedLeak};

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
    /// Stack buckets of the heap sampler in use, out of `tracing_prof_alloc::__private::MAX_STACKS - 1`.
    pub sampled_stacks: usize,
    /// Samples counted under `(stack table full)` because no bucket was left for their stack.
    pub stack_table_full: u64,
    /// Span instances that could not be opened, every slot being held: a sampled allocation
    /// whose span had none yet (its "outlived" count misses that block), or a span created
    /// where it needs one at once.
    pub untracked_span_instances: u64,
    /// Bytes of memory the span table holds: 64 per open span (128 with the `opentelemetry`
    /// feature), in 4 KiB pages, outside the
    /// allocator (an anonymous mapping, so not in the profiles' `(tracing-prof)` path). Pages
    /// that no open span uses any more are given back at each capture.
    pub span_table_bytes: usize,
    /// Spans created so far that found no room in the span table (both of their places taken,
    /// or the table's reservation refused): kept in the registry's extensions, at the cost of a
    /// registry lookup per enter and about 200 bytes the registry keeps.
    pub spans_outside_table: u64,
    /// The CPU stack sampler's counters (rate 0: not running; see [`Profiler::cpu_error`]).
    pub cpu: tracing_prof_cpu::CpuSamplerStats,
    /// (CPU stack, trace span) pairs let go to keep the store bounded (the `opentelemetry`
    /// feature; see [`TraceLinks`](crate::TraceLinks)): pairs not sampled for 5 minutes, and
    /// the least recently sampled beyond 65 536. Their samples stay in their stack's count; windows after that no longer name the
    /// span.
    pub cpu_links_let_go: u64,
    /// Whether profiling is paused (see [`Profiler::pause`]).
    pub paused: bool,
    /// Services that are not working now (a `/debug/pprof` server whose port is taken, trying
    /// again); [`Profiler::services`] says which and why.
    pub services_down: usize,
    /// Incidents kept by a sink (thresholds of the cgroup's memory limit crossed, see
    /// [`ProfilerBuilder::oom_thresholds`](crate::ProfilerBuilder::oom_thresholds); the
    /// flight recorder's triggers, see
    /// [`ProfilerBuilder::flight_recorder`](crate::ProfilerBuilder::flight_recorder)).
    pub incidents: u64,
    /// The flight recorder's windows kept, and their bytes (see
    /// [`ProfilerBuilder::flight_recorder`](crate::ProfilerBuilder::flight_recorder)).
    pub flight_recorder: (usize, usize),
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) started: Instant,
    pub(super) exports: AtomicU64,
    pub(super) export_errors: AtomicU64,
    /// What the aggregator's leak detection last found.
    pub(super) leaks: ForkSafe<Vec<SuspectedLeak>>,
    /// The most recent giant allocations, at most GIANT_RING.
    pub(super) giants: ForkSafe<std::collections::VecDeque<GiantReport>>,
    pub(super) giants_missed: AtomicU64,
    /// Why CPU sampling is not running, when it was asked for.
    pub(super) cpu_error: ForkSafe<Option<String>>,
    /// Per sink, in the order they were added.
    pub(super) sinks: Vec<SinkCounters>,
    /// The services beside the sinks, by name, in the order they first reported.
    pub(super) services: ForkSafe<Vec<ServiceStatus>>,
    /// Whether profiling is paused; changed under `Runtime::switching`.
    pub(super) paused: AtomicBool,
    /// What resume starts again.
    pub(super) sample_rate: u64,
    /// The slow-span thresholds configured.
    pub(super) slow_spans: Vec<crate::SlowSpan>,
    /// The heap's highest reading so far (see `crate::peak`).
    pub(super) peak: crate::peak::SharedPeak,
    pub(super) peak_every: Option<Duration>,
    /// What the wrapped allocator says of its memory, when the application said which.
    pub(super) allocator_stats: Option<Box<dyn crate::AllocatorStats>>,
    /// The process's memory cgroup, found at build (`None` too where no level has a limit).
    pub(super) cgroup: Option<crate::cgroup::MemoryCgroup>,
    /// The process's memory as the last export read it: what `/metrics` and
    /// [`Profiler::paths_snapshot`] carry, so that a scrape reads no `/proc` file.
    pub(super) process_memory_last: ForkSafe<Option<tracing_prof_model::ProcessMemory>>,
    /// Memory incidents written.
    pub(super) incidents: AtomicU64,
    /// The flight recorder's windows as of the last export (see `crate::flight`).
    pub(super) flight: ForkSafe<Vec<Arc<crate::flight::FlightWindow>>>,
    pub(super) cpu_time: crate::CpuTime,
    pub(super) cpu_hz: u32,
    pub(super) cpu_unwind: crate::Unwind,
}

impl Shared {
    /// The process's memory beside the heap `snapshot` counts, every path's and the
    /// profiler's own (see [`Profiler::process_memory`]).
    pub(super) fn process_memory(
        &self,
        snapshot: &Snapshot,
    ) -> Option<tracing_prof_model::ProcessMemory> {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        let heap = snapshot.paths.iter().map(|p| p.memory.inuse_bytes).sum();
        crate::process_memory::read(heap, self.allocator_stats.as_deref(), self.cgroup.as_ref())
    }

    /// Pauses (`true`) or resumes profiling; returns whether that changed anything.
    fn set_paused(&self, paused: bool) -> bool {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        // Not a `ForkSafe` lock: the switch takes the CPU store's lock under it, and a fork
        // takes that one before the gate of `ForkSafe` locks (see `crate::fork`).
        let one_at_a_time = RUNTIME.switching();
        if self.paused.load(Ordering::Acquire) == paused {
            return false;
        }
        let mut cpu_error = None;
        if paused {
            self.paused.store(true, Ordering::Release);
            tracing_prof_alloc::__private::set_sample_rate(0);
            RUNTIME.stop_cpu();
        } else {
            tracing_prof_alloc::__private::set_sample_rate(self.sample_rate);
            if self.cpu_hz > 0
                && let Err(e) = RUNTIME
                    .cpu
                    .start(self.cpu_time, self.cpu_hz, self.cpu_unwind)
            {
                eprintln!("tracing-prof: CPU sampling did not start again: {e}");
                cpu_error = Some(e.to_string());
            }
            self.paused.store(false, Ordering::Release);
        }
        drop(one_at_a_time);
        if cpu_error.is_some() {
            *self.cpu_error.lock() = cpu_error;
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
    pub(super) shared: Arc<Shared>,
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
        crate::running::is_running()
    }

    /// Everything counted so far, read now on the calling thread, with the suspected leaks the
    /// aggregator last found.
    pub fn snapshot(&self) -> Snapshot {
        let mut p = crate::capture(self.shared.started.elapsed());
        p.suspected_leaks = self.suspected_leaks();
        p.process_memory = self.shared.process_memory(&p);
        p
    }

    /// What the process's resident memory is made of now: the resident set and its
    /// anonymous and file-backed parts (`/proc/self/smaps_rollup`), the heap in use (exact),
    /// what the wrapped allocator holds ([`ProfilerBuilder::allocator_stats`]), the cgroup's
    /// limit, and so what the heap does not explain. `None` where `/proc` cannot say. Every
    /// snapshot carries it too ([`Snapshot::process_memory`]); [`paths_snapshot`] and
    /// `/metrics` carry the last export's reading.
    ///
    /// A read, not a cached value: `smaps_rollup` walks the process's mappings under the
    /// kernel's `mmap_lock`, and glibc's `mallinfo2` takes each arena's lock. Call it at a
    /// capture's rate.
    ///
    /// [`paths_snapshot`]: Self::paths_snapshot
    ///
    /// [`ProfilerBuilder::allocator_stats`]: crate::ProfilerBuilder::allocator_stats
    /// [`Snapshot::process_memory`]: tracing_prof_model::Snapshot::process_memory
    pub fn process_memory(&self) -> Option<tracing_prof_model::ProcessMemory> {
        let paths = crate::capture_paths(self.shared.started.elapsed());
        self.shared.process_memory(&paths)
    }

    /// The slow-span thresholds it was built with ([`ProfilerBuilder::slow_span`],
    /// `TRACING_PROF_SLOW_SPAN`).
    pub fn slow_spans(&self) -> &[crate::SlowSpan] {
        &self.shared.slow_spans
    }

    /// The heap at its high-water mark since the profiler started (or since
    /// [`reset_peak`](Self::reset_peak)): the exact memory of every span path as read at the
    /// highest total, and the sampled heap stacks as read then (or at an earlier reading of
    /// the same rise: [`Peak::stacks_at`](tracing_prof_model::Peak::stacks_at)), symbolized
    /// now. [`Snapshot::peak`] says when and how much. `None` before the first reading that
    /// found memory in use, or when the watch is off ([`ProfilerBuilder::peak_every`]).
    ///
    /// The aggregator thread reads the heap every
    /// [`DEFAULT_PEAK_EVERY`](crate::DEFAULT_PEAK_EVERY) (settable): a spike that rises and
    /// falls between two readings is not seen.
    ///
    /// [`Snapshot::peak`]: tracing_prof_model::Snapshot::peak
    /// [`ProfilerBuilder::peak_every`]: crate::ProfilerBuilder::peak_every
    pub fn peak(&self) -> Option<Snapshot> {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        let state = self.shared.peak.lock().clone()?;
        let every = self.shared.peak_every?;
        Some(crate::peak::snapshot(
            &state,
            every,
            self.shared.started.elapsed(),
        ))
    }

    /// The flight recorder's windows: the last minutes of exports
    /// ([`ProfilerBuilder::flight_recorder`](crate::ProfilerBuilder::flight_recorder), 5 by
    /// default), each interval's own numbers of every kind as gzip'd pprof, named
    /// `END-N/KIND.pb.gz` (`20261128T010203.456Z-7/heap.pb.gz`: the window's end and
    /// number), oldest first. Empty before the
    /// second export, or with the recorder off. `/debug/pprof/flightrecorder` serves them as
    /// a tar.gz; every incident keeps them.
    pub fn flight_recording(&self) -> Vec<crate::FlightFile> {
        let windows = self.shared.flight.lock().clone();
        crate::flight::files(&windows)
    }

    /// Forgets the peak: the next reading starts a new one (after a deploy's warm-up, say).
    pub fn reset_peak(&self) {
        *self.shared.peak.lock() = None;
    }

    /// The span paths' counters only, read now (time, latency histograms, errors and memory per
    /// path; no stacks): what `/metrics` serves. Cheaper than [`snapshot`](Self::snapshot):
    /// nothing is symbolized but new CPU samples, and the cost grows with span paths × threads
    /// seen. `outlived` is not read (0).
    pub fn paths_snapshot(&self) -> Snapshot {
        let mut p = crate::capture_paths(self.shared.started.elapsed());
        p.process_memory = self.shared.process_memory_last.lock().clone();
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
        crate::in_flight::read(&RUNTIME.paths.index(), crate::monotonic::now_ns())
    }

    /// The most recent giant allocations (at most 64), oldest first, as of the aggregator's last
    /// capture; see [`ProfilerBuilder::giant_allocations`].
    pub fn giant_allocations(&self) -> Vec<GiantReport> {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        let g = self.shared.giants.lock();
        g.iter().cloned().collect()
    }

    /// Span paths whose in-use memory grew over the last captures without falling (see `docs/memory.md`, "Suspected leaks"),
    /// as of the aggregator's last capture.
    pub fn suspected_leaks(&self) -> Vec<SuspectedLeak> {
        let _profiler = tracing_prof_alloc::TagGuard::new(Tag::PROFILER);
        self.shared.leaks.lock().clone()
    }

    /// Counters about the profiler itself.
    pub fn stats(&self) -> Stats {
        let sampler = tracing_prof_alloc::__private::sampler_stats();
        Stats {
            exports: self.shared.exports.load(Ordering::Relaxed),
            export_errors: self.shared.export_errors.load(Ordering::Relaxed),
            overflowed_spans: RUNTIME.paths.overflowed_spans(),
            giant_allocations_missed: self.shared.giants_missed.load(Ordering::Relaxed),
            thread_tables: tracing_prof_alloc::__private::thread_tables(),
            sample_rate: sampler.rate,
            sampled_stacks: sampler.stacks,
            stack_table_full: sampler.table_full,
            untracked_span_instances: tracing_prof_alloc::__private::untracked_instances(),
            span_table_bytes: crate::span_index::resident_bytes(),
            spans_outside_table: crate::span_index::spans_outside(),
            cpu_links_let_go: RUNTIME.cpu.links_let_go(),
            cpu: tracing_prof_cpu::stats(),
            paused: self.is_paused(),
            services_down: self.shared.services.lock().iter().filter(|s| !s.up).count(),
            incidents: self.shared.incidents.load(Ordering::Relaxed),
            flight_recorder: crate::flight::held(&self.shared.flight.lock()),
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
        let mut out: Vec<LongPolls> = RUNTIME
            .paths
            .all()
            .into_iter()
            .filter_map(|(tag, frames)| {
                let (count, longest_ns) = RUNTIME.long_polls.of(tag);
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
