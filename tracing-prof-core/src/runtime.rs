//! The profiler's process-wide state, in one value: [`RUNTIME`].
//!
//! What every thread's spans and samples add to, and what a capture reads, lives here and
//! nowhere else in this crate: the span path table, the label sets of span fields, the CPU
//! sample store, the long-poll counts, and the names of the allocator's thread tables. A [`Config`] reaches it when a profiler is built,
//! through [`Runtime::apply`] (with [`Runtime::apply_giant_policy`] last); pausing and resuming
//! switch sampling off and on under [`Runtime::switching`]; [`crate::capture`] reads it; the
//! `fork` handler takes its locks through [`Runtime::lock_for_fork`], in the one order any code
//! takes them in.
//!
//! It is one `static`, not a value handed around: the layer's hot paths (span enter and exit
//! read the long-poll threshold) reach a field of a static at a
//! fixed address, as cheaply as a `static` of its own, and a span created before any profiler
//! is built, or in a process that never builds one, still has a table to intern into. Each part
//! starts on a cache line of its own (`#[repr(align(64))]`), so that what one part writes
//! never shares a line with what another part's hot path reads. Every part is all zeros when
//! new, so the value costs the binary no data: it lives in `.bss`.
//!
//! Not here: what is per thread (the stack of entered spans, `entered.rs`; the thread's record
//! of `tracing-prof-thread`, where it publishes the path it is in; its span times,
//! `span_times.rs`, kept with that record; the allocator's counters), the span table that maps a `tracing` span id to its state (`span_index.rs`:
//! lock-free pages of its own), and caches that can be rebuilt (the symbolizer's).

use crate::config::{Config, ConfigError};
use crate::cpu::Cpu;
use crate::labels::Labels;
use crate::long_poll::LongPollCounts;
use crate::span_path::Paths;
use crate::threads::ThreadNames;
use std::sync::{Mutex, MutexGuard, PoisonError};
use tracing_core::Metadata;
use tracing_core::span::Attributes;
use tracing_prof_alloc::Tag;

/// The profiler's process-wide state (see the module docs).
pub(crate) struct Runtime {
    /// Span paths: (parent path, callsite, label set) interned to a tag.
    pub(crate) paths: Paths,
    /// The span fields shown as labels, and their values interned.
    pub(crate) labels: Labels,
    /// The CPU samples drained from the sampler's rings, and how CPU time is measured.
    pub(crate) cpu: Cpu,
    /// The long-poll threshold and each path's long polls.
    pub(crate) long_polls: LongPollCounts,
    /// The names of the allocator's thread tables.
    pub(crate) thread_names: ThreadNames,
    /// Held while profiling is paused or resumed, one switch at a time: the first of the
    /// runtime's locks, since a switch takes the CPU store's (and so the span paths') under it.
    switching: Mutex<()>,
}

/// The one [`Runtime`] of the process.
pub(crate) static RUNTIME: Runtime = Runtime {
    paths: Paths::new(),
    labels: Labels::new(),
    cpu: Cpu::new(),
    long_polls: LongPollCounts::new(),
    thread_names: ThreadNames::new(),
    switching: Mutex::new(()),
};

impl Runtime {
    /// Applies the process-wide settings of `config` (a profiler being built): the span path
    /// cap, the label fields, the long-poll threshold, the heap sampler's rate and temporary
    /// threshold, the toggle and flight signals, and CPU sampling. `Err` for a setting the process refused;
    /// `Ok(Some(_))` says why CPU sampling could not start (the profiler goes on without it).
    ///
    /// The giant-allocation policy is not applied here: see
    /// [`apply_giant_policy`](Self::apply_giant_policy).
    pub(crate) fn apply(
        &self,
        config: &Config,
    ) -> Result<Option<tracing_prof_cpu::StartError>, ConfigError> {
        self.paths.set_cap(config.max_span_paths);
        self.labels
            .configure(&config.label_fields, config.label_values);
        self.long_polls.set_threshold(config.long_poll);
        tracing_prof_alloc::__private::set_temporary_threshold(config.temporary_threshold);
        if !tracing_prof_alloc::__private::set_sample_rate(config.sample_rate) {
            return Err(ConfigError::Value {
                setting: "sample_rate",
                reason: "the system allocator refused the sample table".into(),
            });
        }
        for (setting, sig) in [
            (
                "toggle_signal (TRACING_PROF_TOGGLE_SIGNAL)",
                config.toggle_signal,
            ),
            (
                "flight_signal (TRACING_PROF_FLIGHT_SIGNAL)",
                config.flight_signal,
            ),
        ] {
            if let Some(sig) = sig {
                crate::user_signal::install(sig)
                    .map_err(|reason| ConfigError::Value { setting, reason })?;
            }
        }
        Ok(self
            .cpu
            .start(config.cpu_time, config.cpu_hz, config.cpu_unwind)
            .err())
    }

    /// Applies `config`'s giant-allocation policy: last, once the profiler is built, so that
    /// what building it allocates is never refused.
    pub(crate) fn apply_giant_policy(&self, config: &Config) {
        tracing_prof_alloc::__private::set_giant_policy(config.giant_bytes, config.giant_refuse);
    }

    /// The tag of the span being created with `attrs` under `parent`: its path with the label
    /// set of its fields, interned if new. Allocates (call it with the profiler's tag
    /// current), may lock; never called on enter or exit.
    #[inline]
    pub(crate) fn intern(&self, parent: Tag, attrs: &Attributes<'_>) -> Tag {
        let metadata: &'static Metadata<'static> = attrs.metadata();
        self.paths
            .intern(parent, metadata, self.labels.of_span(attrs), &self.labels)
    }

    /// The lock under which profiling is paused or resumed (see [`Runtime::lock_for_fork`]).
    pub(crate) fn switching(&self) -> MutexGuard<'_, ()> {
        self.switching
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the CPU sampler if this process's profiler started it, keeping what it recorded.
    pub(crate) fn stop_cpu(&self) {
        self.cpu.stop(&self.paths);
    }

    /// Takes every lock of the runtime, in the one order any code takes them in (the pause
    /// switch, under which the sampler stops and starts; the CPU sample store, which resolves
    /// span paths under its lock; span paths, which read label sets under theirs; label values;
    /// thread names), for `fork` (see `crate::fork`).
    pub(crate) fn lock_for_fork(&'static self) -> [Box<dyn std::any::Any>; 5] {
        [
            Box::new(self.switching()),
            self.cpu.lock_for_fork(),
            self.paths.lock_for_fork(),
            self.labels.lock_for_fork(),
            self.thread_names.lock_for_fork(),
        ]
    }
}
