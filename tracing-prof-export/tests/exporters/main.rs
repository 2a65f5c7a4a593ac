//! The exporters' integration tests, in one test binary: each test runs in a child process of
//! its own, one at a time (see `isolated` in the test-support crate), as they did as separate
//! binaries: each starts the profiler or a global subscriber. One link and one compilation of
//! what they share instead of four. (The tests without the tagging allocator are binaries of
//! their own: their numbers are those of a program without it.)

#[global_allocator]
static GLOBAL: tracing_prof_alloc::TaggingAllocator<std::alloc::System> =
    tracing_prof_alloc::TaggingAllocator::new(std::alloc::System);

#[cfg(feature = "axum")]
mod axum_pprof;
#[cfg(feature = "otlp")]
mod otlp;
mod pyroscope;
mod pyroscope_outage;

use tracing_prof_test_support::isolated::isolated;
