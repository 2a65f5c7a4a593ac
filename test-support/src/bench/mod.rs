//! What the benchmarks share: [`ab`], A/B rounds with per-round ratios for a noisy machine,
//! [`pairs`], the allocation pattern of the allocator benchmarks, and [`pool`], long-lived
//! threads for thread scaling. (The whole-process runner, which needs the example's workload,
//! is `tracing_prof_examples::bench`.)

pub mod ab;
pub mod pairs;
pub mod pool;
