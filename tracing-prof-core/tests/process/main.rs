//! The core's integration tests that need a process each, in one test binary: each test runs
//! in a child process of its own, one at a time (see `isolated` in the test-support crate), as
//! they did as separate binaries: they install a global subscriber, read the process's clocks
//! and memory, or time its teardown. One link and one compilation of what they share.

mod cpu_clock;
mod exact_time;
#[cfg(feature = "opentelemetry")]
mod process_context;
mod real_time;
mod span_index_layout;
mod teardown_time;

use tracing_prof_test_support::isolated::isolated;
