//! The whole profiler end to end: CPU by span (`cpu_profile`) and exact memory by span path
//! (`exact_memory`), each test in a child process of its own (see `isolated` in the
//! test-support crate). CI builds this binary twice: in the normal build, and with frame
//! pointers, the allocator inlined into its callers and fat LTO (`.ci/run`), where one binary
//! is one whole-program link instead of two.

#[global_allocator]
static GLOBAL: tracing_prof::TaggingAllocator<std::alloc::System> =
    tracing_prof::TaggingAllocator::new(std::alloc::System);

mod cpu_profile;
mod exact_memory;

use tracing_prof_test_support::isolated::isolated;
