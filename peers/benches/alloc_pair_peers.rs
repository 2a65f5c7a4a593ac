//! alloc+free pairs of 8..1024 bytes inside a span's allocation context: System, our
//! `TaggingAllocator<System>` (tag current), and tracing-prof 0.3's `TrackingAllocator` (an
//! allocation group entered), called directly in one binary, alternating.
//!
//! `cargo bench --manifest-path peers/Cargo.toml`

#[path = "../../benches/ab.rs"]
mod ab;

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use tracing_prof_03::allocator::{AllocationGroup, TrackingAllocator, enter_allocation_group};
use tracing_prof_alloc::{Tag, TagGuard, TaggingAllocator};

const SIZES: [usize; 8] = [8, 16, 32, 64, 128, 256, 512, 1024];

fn pairs<A: GlobalAlloc>(a: &A, n: u64) {
    for i in 0..n {
        let layout = Layout::from_size_align(SIZES[(i & 7) as usize], 8).unwrap();
        // SAFETY: non-zero size; freed right away with the same layout.
        unsafe {
            let p = a.alloc(black_box(layout));
            black_box(p).write(1);
            a.dealloc(p, layout);
        }
    }
}

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
