//! What the benchmarks share: [`ab`], A/B rounds with per-round ratios for a noisy machine,
//! [`pairs`], the allocation pattern of the allocator benchmarks, [`pool`], long-lived
//! threads for thread scaling, and, with the `floor` feature, `floor`, the least a
//! span-timing layer does. (The whole-process runner, which needs the example's workload,
//! is `tracing_prof_examples::bench`.)

pub mod ab;
#[cfg(feature = "floor")]
pub mod floor;
pub mod pairs;
pub mod pool;
