//! What the whole-process benchmarks share (`benches/` here and in `peers/`): [`child`] runs a
//! variant in a child process and reads back its times and peak memory; [`switch`] is the
//! global allocator that picks tagging or plain jemalloc per child.

pub mod child;
pub mod switch;
