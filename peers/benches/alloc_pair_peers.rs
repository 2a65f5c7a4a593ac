//! alloc+free pairs of 8..1024 bytes inside a span's allocation context: System, our
//! `TaggingAllocator<System>` (tag current), and tracing-prof 0.3's `TrackingAllocator` (an
//! allocation group entered), called directly in one binary, alternating.
//!
//! `cargo bench --manifest-path peers/Cargo.toml`

use pairs::pairs;
use std::alloc::System;
use tracing_prof_03::allocator::{AllocationGroup, TrackingAllocator, enter_allocation_group};
use tracing_prof_alloc::{Tag, TagGuard, TaggingAllocator};
use tracing_prof_test_support::bench::{ab, pairs};

static OURS: TaggingAllocator<System> = TaggingAllocator::new(System);
static THEIRS: TrackingAllocator = TrackingAllocator::system();

fn main() {
    let _ours = TagGuard::new(Tag::new(10));
    enter_allocation_group(AllocationGroup::from(tracing::span::Id::from_u64(42)));
    ab::compare(
        "alloc+free pair, 8..1024 B, 1 thread, inside a span: System vs ours vs tracing-prof 0.3",
        41,
        vec![
            ab::variant("System", |n| pairs(&System, n)),
            ab::variant("TaggingAllocator<System> (ours)", |n| pairs(&OURS, n)),
            ab::variant("tracing-prof 0.3 TrackingAllocator", |n| pairs(&THEIRS, n)),
        ],
    );
}
