//! The sampler's stack table is bounded: once it is full, samples are counted in its overflow
//! bucket, none is lost; its buckets are handed out in order, every one used. (A test binary of its own: it fills the process-wide table.)

use std::alloc::System;
use tracing_prof_alloc::__private::{MAX_STACKS, read_stacks, sampler_stats, set_sample_rate};
use tracing_prof_alloc::{MAX_TAGS, Tag, TagGuard, TaggingAllocator};

#[global_allocator]
static GLOBAL: TaggingAllocator<System> = TaggingAllocator::new(System);

#[inline(never)]
fn site_a() -> Vec<u8> {
    std::hint::black_box(vec![1u8; 16])
}

#[inline(never)]
fn site_b() -> Vec<u8> {
    std::hint::black_box(vec![2u8; 16])
}

#[inline(never)]
fn site_c() -> Vec<u8> {
    std::hint::black_box(vec![3u8; 16])
}

#[test]
fn a_full_table_counts_instead_of_losing() {
    assert!(set_sample_rate(1));
    let tags = 3..MAX_TAGS as u32;
    let mut made = 0u64;
    for t in tags.clone() {
        let _g = TagGuard::new(Tag::new(t));
        for site in [site_a, site_b, site_c] {
            drop(site());
            made += 1;
        }
        if t == tags.start {
            // Buckets are handed out in order, so the table's memory is its first buckets, as
            // many as there are stacks (hashed into the whole table, each stack took a page).
            let first: Vec<u32> = read_stacks().iter().map(|s| s.bucket).collect();
            assert!(
                first.len() >= 3 && first.iter().zip(1u32..).all(|(&b, i)| b == i),
                "{first:?}"
            );
        }
    }
    set_sample_rate(0);
    // Three sites under 4093 tags: 12 279 stacks for 8191 buckets, every one of them used.
    let stats = sampler_stats();
    assert_eq!(stats.stacks, MAX_STACKS - 1, "{stats:?}");
    assert!(stats.table_full > 0, "{stats:?}");
    let stacks = read_stacks();
    let ours: u64 = stacks
        .iter()
        .filter(|s| s.bucket != 0 && tags.contains(&s.tag.get()))
        .map(|s| s.samples)
        .sum();
    let overflow = stacks
        .iter()
        .find(|s| s.bucket == 0)
        .map_or(0, |s| s.samples);
    assert!(
        ours < made && ours + overflow >= made,
        "{ours} + {overflow} vs {made}"
    );
    assert_eq!(stats.table_full, overflow);
    // Every claimed bucket is read, once, in bucket order.
    let buckets: Vec<u32> = stacks.iter().map(|s| s.bucket).collect();
    assert!(
        buckets.windows(2).all(|w| w[0] < w[1]),
        "not in bucket order"
    );
    assert_eq!(buckets.len(), stats.stacks + 1, "{stats:?}");
    // Handed out in order (the table's memory is its first buckets, as many as there are
    // stacks): here, on one thread, all of them from the first.
    assert!(
        buckets.iter().zip(0u32..).all(|(&b, i)| b == i),
        "buckets not handed out in order"
    );
}
