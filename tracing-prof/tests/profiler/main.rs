//! The profiler's integration tests that need a process each, in one test binary: each test
//! runs in a child process of its own, one at a time (see `isolated` in the test-support
//! crate). Each test binary of this crate links the whole profiler: one link and one
//! compilation of what the tests share, instead of 26, saves about a minute of CI's two cores.

#[global_allocator]
static GLOBAL: tracing_prof::TaggingAllocator<std::alloc::System> =
    tracing_prof::TaggingAllocator::new(std::alloc::System);

mod async_depth;
mod budget;
mod cpu_exact_files;
mod cpu_stress;
mod cpu_threads;
mod debug_tables;
mod file_export;
mod fork;
mod fork_while_pausing;
mod heap_stacks;
mod in_flight;
mod init_checks;
mod leaks;
mod lifetimes_and_threads;
mod live_spans;
mod long_polls;
mod memory_incidents;
mod no_debug_info;
mod overflow;
mod pause;
mod round_trip;
mod same_name_spans;
mod sampling_before_init;
mod sink_stats;
mod span_labels;
mod span_reuse;

use tracing_prof_test_support::isolated::{isolated, test_name};
