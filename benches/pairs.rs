//! The alloc+free pair loop shared by the allocator benchmarks.

#![allow(
    dead_code,
    unreachable_pub,
    reason = "each bench uses a part of this module"
)]

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;

/// Sizes the pairs cycle through.
pub const SIZES: [usize; 8] = [8, 16, 32, 64, 128, 256, 512, 1024];

/// `n` alloc+free pairs on `a`, sizes cycling through 8..1024 bytes, called directly.
pub fn pairs<A: GlobalAlloc>(a: &A, n: u64) {
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
