//! An untrusted length handed to `try_reserve` is refused at once with heap sampling on, and
//! counts nothing. It used to draw the request's sample points one by one first: 2^29 draws,
//! seconds, for 2^48 bytes at the default rate, minutes for 2^56. (Its own process: the
//! sampling rate is process-wide.)

use tracing_prof_alloc::__private::TagTotals;
use tracing_prof_alloc::__private::{read_totals, set_sample_rate};
use tracing_prof_alloc::{Tag, TagGuard, TaggingAllocator};

#[global_allocator]
static GLOBAL: TaggingAllocator<std::alloc::System> = TaggingAllocator::new(std::alloc::System);

fn totals(tag: u32) -> TagTotals {
    let mut all = vec![TagTotals::default(); tag as usize + 1];
    read_totals(&mut all);
    all[tag as usize]
}

#[test]
fn huge_try_reserve_is_refused_and_counts_nothing() {
    assert!(set_sample_rate(tracing_prof_alloc::DEFAULT_SAMPLE_RATE));
    let tag = 77;
    let before = totals(tag);
    {
        let _g = TagGuard::new(Tag::new(tag));
        for shift in [40, 48, 56] {
            let mut v: Vec<u8> = Vec::new();
            assert!(v.try_reserve(1usize << shift).is_err(), "2^{shift} bytes");
        }
    }
    assert_eq!(totals(tag), before, "a refused request counts nothing");
}
