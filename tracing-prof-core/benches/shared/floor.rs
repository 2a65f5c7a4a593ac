//! The floor layer (`test-support`'s `bench::floor`) over our clock and our allocation tag, as
//! the span benchmarks compare it with ours.

use tracing_prof_core::{Clock, ProfileLayer, SystemClock};
use tracing_prof_test_support::bench::floor::Floor;

/// The floor layer reading the clock our layer reads, calibrated first (making a layer of ours
/// calibrates it), and switching the tag our layer switches.
pub(crate) fn floor_layer() -> Floor<impl Fn() -> u64, impl Fn(u32) -> u32> {
    let _ = ProfileLayer::new();
    Floor::new(
        || SystemClock::default().now_ns(),
        |tag| {
            tracing_prof_alloc::__private::set_current_tag(tracing_prof_alloc::Tag::new(tag)).get()
        },
    )
}
