//! Allocation budgets for tests: "this code makes at most N allocations and M bytes".
//!
//! ```
//! use tracing_prof_core::{Budget, ProfileLayer};
//! use tracing_subscriber::prelude::*;
//! # #[global_allocator]
//! # static A: tracing_prof_alloc::TaggingAllocator<std::alloc::System> =
//! #     tracing_prof_alloc::TaggingAllocator::new(std::alloc::System);
//! tracing::subscriber::with_default(tracing_subscriber::registry().with(ProfileLayer::new()), || {
//!     let v = Budget::new().max_allocations(1).max_bytes(1024).assert(|| vec![0u8; 512]);
//!     assert!(Budget::new().max_bytes(100).check(|| vec![0u8; 512]).is_err());
//! #   drop(v);
//! });
//! ```
//!
//! The closure runs inside a span named `budget`; spans the code enters become its children, so
//! everything allocated on this thread under it counts, and a failure lists those span paths,
//! most bytes first. Only the calling thread's allocations count, so tests running in parallel
//! never see each other's. Needs the tagging allocator as global allocator and a
//! [`ProfileLayer`](crate::ProfileLayer) in the current subscriber (as the example shows).
//!
//! A failure also lists the top allocation sites: while the closure runs, every allocation of
//! the thread has its code stack captured (a few microseconds each; turn it off with
//! [`Budget::sites`]`(false)` for closures that allocate millions of times). A realloc counts
//! as an allocation of its new size there.
//!
//! Limitations: allocations on threads the closure spawns are not counted.

use crate::runtime::RUNTIME;
use std::fmt;
use tracing_prof_alloc::__private::TagTotals;
use tracing_prof_alloc::__private::{SiteRecorder, read_thread_totals, record_sites};
use tracing_prof_alloc::{Tag, TagGuard, current_tag};

/// Limits on what a closure may allocate; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    max_allocations: Option<u64>,
    max_bytes: Option<u64>,
    sites: bool,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_allocations: None,
            max_bytes: None,
            sites: true,
        }
    }
}

/// Where a closure allocated, by code location.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AllocationSite {
    /// The innermost code frame that asked for memory, with its file and line.
    pub location: String,
    /// The code stack from the closure down to it, root first.
    pub stack: Vec<tracing_prof_model::CodeFrame>,
    /// Allocations made there.
    pub allocations: u64,
    /// Bytes requested there.
    pub bytes: u64,
}

/// What a closure allocated on its thread, per span path under the budget.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetReport {
    /// The budget checked.
    pub budget: Budget,
    /// Allocations made (realloc growth adds bytes, not allocations).
    pub allocations: u64,
    /// Bytes requested.
    pub bytes: u64,
    /// `(span path, allocations, bytes)`, most bytes first; paths start at `budget`.
    pub by_path: Vec<(String, u64, u64)>,
    /// Allocation sites, most bytes first (empty with [`Budget::sites`]`(false)`).
    pub sites: Vec<AllocationSite>,
}

/// Why a budget check failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BudgetError {
    /// The closure allocated more than the budget allows.
    #[error("{0}")]
    Exceeded(BudgetReport),
    /// Entering a span did not switch the allocation tag: no `ProfileLayer` in the current
    /// subscriber (or the tagging allocator is not installed).
    #[error(
        "allocation budgets need a tracing_prof ProfileLayer in the current subscriber and the \
         TaggingAllocator as global allocator"
    )]
    NoProfiler,
}

impl Budget {
    /// No limits yet.
    pub fn new() -> Self {
        Budget::default()
    }

    /// At most `n` allocations.
    pub fn max_allocations(mut self, n: u64) -> Self {
        self.max_allocations = Some(n);
        self
    }

    /// At most `n` bytes allocated (realloc growth included).
    pub fn max_bytes(mut self, n: u64) -> Self {
        self.max_bytes = Some(n);
        self
    }

    /// Whether to record the code location of every allocation for the report (default: yes;
    /// each allocation in the closure then costs a few microseconds more).
    pub fn sites(mut self, on: bool) -> Self {
        self.sites = on;
        self
    }

    /// Runs `f` and returns its value, or what it allocated if that exceeds the budget.
    pub fn check<T>(&self, f: impl FnOnce() -> T) -> Result<T, BudgetError> {
        let (value, report) = self.measure(f)?;
        let over = |limit: Option<u64>, used: u64| limit.is_some_and(|l| used > l);
        if over(self.max_allocations, report.allocations) || over(self.max_bytes, report.bytes) {
            Err(BudgetError::Exceeded(report))
        } else {
            Ok(value)
        }
    }

    /// Like [`Budget::check`], panicking with the report when the budget is exceeded.
    #[track_caller]
    pub fn assert<T>(&self, f: impl FnOnce() -> T) -> T {
        match self.check(f) {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        }
    }

    /// Runs `f` inside a `budget` span and reports what it allocated on this thread.
    pub fn measure<T>(&self, f: impl FnOnce() -> T) -> Result<(T, BudgetReport), BudgetError> {
        let span = tracing::info_span!("budget");
        let outer = current_tag();
        let entered = span.enter();
        let tag = current_tag();
        if tag == outer || tag == Tag::OVERFLOW {
            return Err(BudgetError::NoProfiler);
        }
        let mut recorder = self.sites.then(SiteRecorder::new);
        let before = thread_totals();
        let value = match &mut recorder {
            Some(r) => record_sites(r, f),
            None => f(),
        };
        let after = thread_totals();
        drop(entered);
        let _profiler = TagGuard::new(Tag::PROFILER);
        let paths = RUNTIME.paths.all();
        let Some(root) = paths
            .iter()
            .find(|(t, _)| *t == tag)
            .map(|(_, f)| f.clone())
        else {
            return Err(BudgetError::NoProfiler);
        };
        let mut by_path: Vec<(String, u64, u64)> = paths
            .iter()
            .filter(|(_, frames)| frames.starts_with(&root))
            .filter_map(|(t, frames)| {
                let i = t.get() as usize;
                let (b, a) = (
                    before.get(i).copied().unwrap_or_default(),
                    after.get(i).copied().unwrap_or_default(),
                );
                let allocs = a.alloc_objects.saturating_sub(b.alloc_objects);
                let bytes = a.alloc_bytes.saturating_sub(b.alloc_bytes);
                let path = tracing_prof_model::display_path(&frames[root.len() - 1..]);
                (allocs > 0 || bytes > 0).then_some((path, allocs, bytes))
            })
            .collect();
        by_path.sort_by(|x, y| y.2.cmp(&x.2).then_with(|| x.0.cmp(&y.0)));
        let report = BudgetReport {
            budget: *self,
            allocations: by_path.iter().map(|p| p.1).sum(),
            bytes: by_path.iter().map(|p| p.2).sum(),
            by_path,
            sites: recorder.map_or_else(Vec::new, |r| sites_of(&r)),
        };
        Ok((value, report))
    }
}

/// Symbolizes and merges the recorded sites, most bytes first.
fn sites_of(recorder: &SiteRecorder) -> Vec<AllocationSite> {
    let mut merged: Vec<AllocationSite> = Vec::new();
    // One symbolization batch for every site.
    crate::symbolize::prepare(recorder.sites().flat_map(|s| s.0.iter().copied()));
    // Inside the budget's span: stacks are cut where `Budget::measure` entered it.
    let span = tracing_prof_model::SpanFrame::synthetic("budget");
    for (ips, allocations, bytes) in recorder.sites() {
        let stack = crate::symbolize::code_stack(
            ips,
            crate::symbolize::InSpan {
                span: Some(&span),
                parent: None,
            },
            crate::symbolize::Leaf::TrimAllocator,
        );
        if let Some(s) = merged.iter_mut().find(|s| s.stack == stack) {
            s.allocations += allocations;
            s.bytes += bytes;
            continue;
        }
        let location = stack.last().map_or_else(
            || "?".to_owned(),
            |f| match (&f.file, f.line) {
                (Some(file), Some(line)) => format!("{} ({file}:{line})", f.function),
                _ => f.function.to_string(),
            },
        );
        merged.push(AllocationSite {
            location,
            stack,
            allocations,
            bytes,
        });
    }
    let (other_allocations, other_bytes) = recorder.other();
    if other_allocations > 0 {
        merged.push(AllocationSite {
            location: "(more sites than the recorder holds)".to_owned(),
            stack: Vec::new(),
            allocations: other_allocations,
            bytes: other_bytes,
        });
    }
    merged.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then_with(|| a.location.cmp(&b.location))
    });
    merged
}

fn thread_totals() -> Vec<TagTotals> {
    let _profiler = TagGuard::new(Tag::PROFILER);
    let mut t = vec![TagTotals::default(); tracing_prof_alloc::MAX_TAGS];
    read_thread_totals(&mut t);
    t
}

impl fmt::Display for BudgetReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = |l: Option<u64>| l.map_or_else(|| "no limit".to_owned(), |l| l.to_string());
        writeln!(
            f,
            "allocation budget exceeded: {} allocations (budget: {}), {} bytes (budget: {})",
            self.allocations,
            limit(self.budget.max_allocations),
            self.bytes,
            limit(self.budget.max_bytes)
        )?;
        writeln!(
            f,
            "where they were allocated (span paths, most bytes first):"
        )?;
        for (path, allocs, bytes) in self.by_path.iter().take(10) {
            writeln!(f, "  {bytes:>12} bytes in {allocs:>6} allocations  {path}")?;
        }
        if self.by_path.len() > 10 {
            writeln!(f, "  ... and {} more span paths", self.by_path.len() - 10)?;
        }
        if !self.sites.is_empty() {
            writeln!(f, "top allocation sites (most bytes first):")?;
            for s in self.sites.iter().take(5) {
                writeln!(
                    f,
                    "  {:>12} bytes in {:>6} allocations  {}",
                    s.bytes, s.allocations, s.location
                )?;
            }
            if self.sites.len() > 5 {
                writeln!(f, "  ... and {} more sites", self.sites.len() - 5)?;
            }
        }
        Ok(())
    }
}
