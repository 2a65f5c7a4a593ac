//! alloc+free pairs of 8..1024 bytes with a span's tag current: each allocator plain and wrapped
//! in `TaggingAllocator`, on one thread and on two.
//!
//! `cargo bench -p tracing-prof-alloc --bench alloc_pair`

#[path = "../../benches/ab.rs"]
mod ab;
#[path = "../../benches/pairs.rs"]
mod pairs;

use pairs::pairs;
use std::alloc::{GlobalAlloc, System};
use tikv_jemallocator::Jemalloc;
use tracing_prof_alloc::{Tag, TagGuard, TaggingAllocator};

/// The same on two threads at once; returns when both are done.
fn pairs_2threads<A: GlobalAlloc + Sync>(a: &A, n: u64) {
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let _span = TagGuard::new(Tag::new(10));
                pairs(a, n);
            });
        }
    });
}

static TAG_SYSTEM: TaggingAllocator<System> = TaggingAllocator::new(System);
static TAG_JEMALLOC: TaggingAllocator<Jemalloc> = TaggingAllocator::new(Jemalloc);

fn main() {
    let _span = TagGuard::new(Tag::new(10));
    if ab::wanted("alloc_pair/1thread") {
        ab::compare(
            "alloc+free pair, 8..1024 B, 1 thread: System vs TaggingAllocator<System>",
            41,
            vec![
                ab::variant("System", |n| pairs(&System, n)),
                ab::variant("Tagging<System>", |n| pairs(&TAG_SYSTEM, n)),
            ],
        );
        ab::compare(
            "alloc+free pair, 8..1024 B, 1 thread: Jemalloc vs TaggingAllocator<Jemalloc>",
            41,
            vec![
                ab::variant("Jemalloc", |n| pairs(&Jemalloc, n)),
                ab::variant("Tagging<Jemalloc>", |n| pairs(&TAG_JEMALLOC, n)),
            ],
        );
    }
    if ab::wanted("alloc_pair/2threads") {
        ab::compare(
            "alloc+free pair, 8..1024 B, 2 threads at once (ns per pair per thread): System",
            21,
            vec![
                ab::variant("System", |n| pairs_2threads(&System, n)),
                ab::variant("Tagging<System>", |n| pairs_2threads(&TAG_SYSTEM, n)),
            ],
        );
        ab::compare(
            "alloc+free pair, 8..1024 B, 2 threads at once (ns per pair per thread): Jemalloc",
            21,
            vec![
                ab::variant("Jemalloc", |n| pairs_2threads(&Jemalloc, n)),
                ab::variant("Tagging<Jemalloc>", |n| pairs_2threads(&TAG_JEMALLOC, n)),
            ],
        );
    }
}
