//! The aggregator thread: every interval a snapshot to each sink, and the reports of leaks,
//! giant allocations and long polls.

use super::sink::Sink;
use super::{GiantReport, Shared};
use crate::leak::LeakDetector;
use crate::runtime::RUNTIME;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tracing_prof_alloc::__private::set_current_tag;
use tracing_prof_alloc::Tag;
use tracing_prof_model::SuspectedLeak;

/// What the aggregator is asked to do besides its interval's export.
pub(crate) enum Command {
    /// Export now, then answer.
    Flush(Sender<()>),
    /// The final export, then stop (the guard's drop).
    Shutdown,
    /// The final export, then stop, then answer once the sinks have flushed (a SIGTERM; see
    /// `crate::terminate`).
    Terminate(Sender<()>),
}

pub(super) struct Aggregator {
    pub(super) shared: Arc<Shared>,
    pub(super) sinks: Vec<Box<dyn Sink>>,
    pub(super) interval: Duration,
    /// Last error reported per sink, to report each distinct failure once.
    pub(super) reported: HashMap<String, String>,
    pub(super) leaks: Option<LeakDetector>,
    pub(super) leak_level: tracing::Level,
    pub(super) giants: bool,
    /// Span paths whose long polls were reported (once each).
    pub(super) long_polls_reported: std::collections::HashSet<Vec<tracing_prof_model::SpanFrame>>,
    /// The toggle signal and the flight recorder's, each with the count of it handled so far
    /// (see `crate::user_signal`).
    pub(super) toggle_signal: Option<(crate::UserSignal, u64)>,
    pub(super) flight_signal: Option<(crate::UserSignal, u64)>,
    /// `seq` of the last giant allocation read.
    pub(super) next_giant: u64,
    /// Reads the heap for its peak (see `crate::peak`).
    pub(super) peak_watch: crate::peak::PeakWatch,
    /// The cgroup memory thresholds armed (see `crate::incident`).
    pub(super) oom: crate::incident::OomWatch,
    /// The flight recorder, when on (see `crate::flight`).
    pub(super) flight: Option<crate::flight::FlightRecorder>,
    /// What its triggers remember.
    pub(super) triggers: crate::incident::Triggers,
    /// The peak's snapshot as last exported, by its `seq`: built again only for a new peak.
    pub(super) peak_built: Option<(u64, Arc<tracing_prof_model::Snapshot>)>,
}

impl Aggregator {
    /// Runs until told to stop; returns whom to tell once the sinks have flushed, if anyone.
    pub(super) fn run(&mut self, inbox: Receiver<Command>) -> Option<Sender<()>> {
        // Everything this thread allocates is the profiler's own; its events reach no layer.
        set_current_tag(Tag::PROFILER);
        let mut no_events = Some(tracing::dispatcher::set_default(&tracing::Dispatch::none()));
        let mut next = Instant::now() + self.interval;
        let mut next_drain = Instant::now() + crate::cpu::DRAIN_EVERY;
        let mut drains = 0u64;
        // The heap's peak and the cgroup's thresholds are read at one rate.
        let watch_oom = self.oom.is_on() && self.shared.cgroup.is_some();
        let tick = self
            .shared
            .peak_every
            .or(watch_oom.then_some(crate::DEFAULT_PEAK_EVERY));
        let mut next_tick = Instant::now();
        loop {
            if let Some(every) = tick
                && Instant::now() >= next_tick
            {
                if self.shared.peak_every.is_some() {
                    self.read_peak();
                }
                if watch_oom {
                    self.watch_oom(&mut no_events);
                }
                next_tick = Instant::now() + every;
            }
            let sampling = tracing_prof_cpu::is_running();
            let mut wake = if sampling { next.min(next_drain) } else { next };
            if tick.is_some() {
                wake = wake.min(next_tick);
            }
            if let Some((sig, seen)) = &mut self.toggle_signal {
                wake = wake.min(Instant::now() + crate::user_signal::POLL);
                if crate::user_signal::received_since(*sig, seen) % 2 == 1 {
                    let paused = self.shared.paused.load(Ordering::Acquire);
                    self.shared.set_paused(!paused);
                }
            }
            if let Some((sig, seen)) = &mut self.flight_signal {
                wake = wake.min(Instant::now() + crate::user_signal::POLL);
                if crate::user_signal::received_since(*sig, seen) > 0 {
                    let reason = format!(
                        "{} received: the flight recorder's recording, on demand",
                        sig.name()
                    );
                    self.incident("signal".to_owned(), reason, None, &mut no_events);
                }
            }
            match inbox.recv_timeout(wake.saturating_duration_since(Instant::now())) {
                // Woken for the peak or a signal, not for a drain or an export.
                Err(RecvTimeoutError::Timeout)
                    if Instant::now() < next && (!sampling || Instant::now() < next_drain) => {}
                Err(RecvTimeoutError::Timeout) if Instant::now() < next => {
                    // A drain tick: keep the samplers' rings from filling up.
                    next_drain = Instant::now() + crate::cpu::DRAIN_EVERY;
                    drains += 1;
                    RUNTIME.cpu.drain(&RUNTIME.paths);
                    if drains.is_multiple_of(10) {
                        self.watch_cpu_sampler();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.export(&mut no_events, false);
                    next += self.interval;
                    if next < Instant::now() {
                        next = Instant::now() + self.interval; // fell behind: skip, don't burst
                    }
                }
                Ok(Command::Flush(reply)) => {
                    self.export(&mut no_events, false);
                    let _ = reply.send(());
                }
                Ok(Command::Shutdown) | Err(RecvTimeoutError::Disconnected) => {
                    self.export(&mut no_events, true);
                    return None;
                }
                Ok(Command::Terminate(reply)) => {
                    self.export(&mut no_events, true);
                    return Some(reply);
                }
            }
        }
    }

    /// One reading of the heap for its peak (not while paused: nothing is counted then).
    fn read_peak(&mut self) {
        if self.shared.paused.load(Ordering::Acquire) {
            return;
        }
        self.peak_watch.read(&self.shared.peak);
    }

    /// Reads the cgroup's working set; a threshold crossed writes an incident at once.
    fn watch_oom(&mut self, no_events: &mut Option<tracing::dispatcher::DefaultGuard>) {
        let Some(now) = self.shared.cgroup.as_ref().and_then(|c| c.read()) else {
            return;
        };
        let Some(threshold) = self.oom.check(now.used()) else {
            return;
        };
        let reason = format!(
            "the working set reached {:.1}% of the cgroup's {} memory limit (threshold {threshold}%): {}",
            now.used() * 100.0,
            tracing_prof_model::units::format_bytes(now.limit_bytes),
            now.describe()
        );
        self.incident(format!("memory-{threshold}pct"), reason, None, no_events);
    }

    /// Takes a snapshot now and hands it to every sink as an incident; says so to the
    /// application's subscriber.
    fn incident(
        &mut self,
        cause: String,
        reason: String,
        snapshot: Option<tracing_prof_model::Snapshot>,
        no_events: &mut Option<tracing::dispatcher::DefaultGuard>,
    ) {
        if !self.sinks.iter().any(|s| s.keeps_incidents()) {
            // Nothing would keep it: say it, capture nothing.
            to_application(no_events, || {
                tracing::warn!(target: "tracing_prof::incident", cause = %cause, "incident (no sink keeps incidents): {reason}");
            });
            return;
        }
        let snapshot = snapshot.unwrap_or_else(|| {
            let mut s = crate::capture(self.shared.started.elapsed());
            s.heap_peak = self.peak_snapshot();
            s.process_memory = self.shared.process_memory(&s);
            s.suspected_leaks = self.shared.leaks.lock().clone();
            s
        });
        let mut incident = super::Incident::new(cause, reason, snapshot);
        let windows = self.shared.flight.lock().clone();
        incident.flight = crate::flight::files(&windows);
        let mut kept = Vec::new();
        for sink in &mut self.sinks {
            let name = sink.name().to_owned();
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink.incident(&incident)))
                    .unwrap_or_else(|_| Err("the sink panicked".into()));
            match result {
                Ok(()) => kept.push(name),
                Err(e) => eprintln!("tracing-prof: {name}: incident not written: {e}"),
            }
        }
        if !kept.is_empty() {
            self.shared.incidents.fetch_add(1, Ordering::Relaxed);
        }
        to_application(no_events, || {
            tracing::warn!(
                target: "tracing_prof::incident",
                cause = %incident.cause,
                kept_by = %kept.join(", "),
                "incident: {}",
                incident.reason
            );
        });
    }

    /// The peak's snapshot for this export: built when the peak is new since the last.
    fn peak_snapshot(&mut self) -> Option<Arc<tracing_prof_model::Snapshot>> {
        let every = self.shared.peak_every?;
        let Some(state) = self.shared.peak.lock().clone() else {
            self.peak_built = None;
            return None;
        };
        if let Some((seq, built)) = &self.peak_built
            && *seq == state.seq
        {
            return Some(Arc::clone(built));
        }
        let built = Arc::new(crate::peak::snapshot(
            &state,
            every,
            self.shared.started.elapsed(),
        ));
        self.peak_built = Some((state.seq, Arc::clone(&built)));
        Some(built)
    }

    /// Once a second while CPU sampling runs: stops it if someone replaced our SIGPROF handler
    /// (our timers' signals would go to theirs), and follows libraries loaded since.
    fn watch_cpu_sampler(&self) {
        crate::monotonic::recheck();
        if !tracing_prof_cpu::is_running() {
            return;
        }
        if !tracing_prof_cpu::handler_installed() {
            RUNTIME.stop_cpu();
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
    ///
    /// The final export (`last`, at shutdown or SIGTERM) records no flight window and writes
    /// no incident: the process is ending, and a SIGTERM's end must not cut a folder short.
    fn export(&mut self, no_events: &mut Option<tracing::dispatcher::DefaultGuard>, last: bool) {
        if self.sinks.is_empty()
            && self.leaks.is_none()
            && !self.giants
            && !RUNTIME.long_polls.enabled()
        {
            return;
        }
        if self.shared.paused.load(Ordering::Acquire) {
            return; // paused: no files, no pushes
        }
        let mut events: Vec<Box<dyn Fn()>> = Vec::new();
        if self.giants {
            let (new, missed, next) =
                tracing_prof_alloc::__private::giant_allocations_since(self.next_giant);
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
                    span_path: RUNTIME.paths.display(g.tag),
                    refused: g.refused,
                    stack: {
                        let (span, parent) = RUNTIME.paths.innermost_two(g.tag);
                        crate::symbolize::code_stack(
                            &g.ips,
                            crate::symbolize::InSpan {
                                span: span.as_ref(),
                                parent: parent.as_ref(),
                            },
                            crate::symbolize::Leaf::TrimAllocator,
                        )
                    },
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
                if kept.len() == tracing_prof_alloc::__private::GIANT_RING {
                    kept.pop_front();
                }
                kept.push_back(report);
            }
            drop(kept);
        }
        if self.shared.peak_every.is_some() {
            self.read_peak();
        }
        let mut new_long_polls = Vec::new();
        let mut profile = crate::capture(self.shared.started.elapsed());
        profile.heap_peak = self.peak_snapshot();
        profile.process_memory = self.shared.process_memory(&profile);
        self.shared
            .process_memory_last
            .lock()
            .clone_from(&profile.process_memory);
        for p in &profile.paths {
            if p.time.long_polls > 0 && self.long_polls_reported.insert(p.frames.clone()) {
                let (path, count) = (p.display_path(), p.time.long_polls);
                new_long_polls.push(path.clone());
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
            to_application(no_events, || events.iter().for_each(|emit| emit()));
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
        if !last {
            self.record_flight(profile, &new_long_polls, no_events);
        }
    }

    /// Keeps this export's window in the flight recorder, then writes an incident with the
    /// recording for what its triggers saw: a slow span since the last export, a path's first
    /// long poll, a heap peak that doubled; each cause at most once per recorder length.
    fn record_flight(
        &mut self,
        profile: tracing_prof_model::Snapshot,
        new_long_polls: &[String],
        no_events: &mut Option<tracing::dispatcher::DefaultGuard>,
    ) {
        let Some(recorder) = &mut self.flight else {
            return;
        };
        // The triggers read this export before the recorder keeps it (moved: the base of the
        // next window is this snapshot, not a copy).
        let slow = self.triggers.slow_spans(&profile, &self.shared.slow_spans);
        let peak = profile.heap_peak.as_ref().and_then(|p| p.peak);
        recorder.record(profile);
        let windows = recorder.windows();
        let held = windows.len();
        *self.shared.flight.lock() = windows;
        let gap = recorder.length();
        let mut causes: Vec<(&'static str, String)> = Vec::new();
        if let Some((path, n, bound)) = slow.first() {
            causes.push((
                "slow-span",
                format!(
                    "{n} spans of `{path}` slower than {} since the last export (its threshold, \
                     at the nearest bucket bound)",
                    tracing_prof_model::units::format_nanos(*bound)
                ),
            ));
        }
        if let Some(path) = new_long_polls.first() {
            causes.push((
                "long-poll",
                format!("span path `{path}` blocked an async worker thread (a long poll)"),
            ));
        }
        if let Some(peak) = peak
            && self.triggers.peak_grew(peak.inuse_bytes)
        {
            causes.push((
                "peak-growth",
                format!("a new heap peak: {}", peak.describe()),
            ));
        }
        // Not before the recorder holds a window: its recording is what these incidents are
        // for (a service's first long poll at its first export writes nothing).
        if held == 0 {
            return;
        }
        for (cause, reason) in causes {
            if self.triggers.may(cause, gap) {
                let snapshot = self.flight.as_ref().and_then(|r| r.last()).cloned();
                self.incident(cause.to_owned(), reason, snapshot, no_events);
            }
        }
    }
}

/// Runs `emit` with the application's subscriber: events meant for it (leaks, giant
/// allocations, long polls, incidents) leave this thread's no-op dispatcher (`no_events`),
/// which is set again after.
fn to_application(no_events: &mut Option<tracing::dispatcher::DefaultGuard>, emit: impl FnOnce()) {
    drop(no_events.take());
    emit();
    *no_events = Some(tracing::dispatcher::set_default(&tracing::Dispatch::none()));
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
    // `span_path` names the path as everywhere else (the `span_path` label, the SQL column);
    // the message adds its label values, which tell apart paths that differ by them only.
    let labeled = leak.labeled_path();
    macro_rules! at {
        ($lvl:expr) => {
            tracing::event!(
                target: "tracing_prof::leak",
                $lvl,
                span_path = %leak.path,
                in_use_bytes = leak.inuse_bytes,
                growth_bytes = leak.growth_bytes,
                snapshots = leak.snapshots,
                "suspected memory leak: the in-use memory of span path `{}` grew in {} captures \
                 without falling, by {} bytes, to {} bytes",
                labeled,
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

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Command::Flush(_) => "Flush",
            Command::Shutdown => "Shutdown",
            Command::Terminate(_) => "Terminate",
        })
    }
}
