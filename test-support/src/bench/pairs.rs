//! The alloc+free pair loop shared by the allocator benchmarks.

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;

/// Sizes the pairs cycle through.
pub const SIZES: [usize; 8] = [8, 16, 32, 64, 128, 256, 512, 1024];

/// `n` alloc+free pairs on `a`, sizes cycling through 8..1024 bytes.
///
/// Each call goes through an out-of-line shim shaped like the `__rust_alloc` and
/// `__rust_dealloc` that rustc generates for a `#[global_allocator]`: every Rust program
/// reaches its allocator that way, never by a call the optimizer can inline into the caller.
/// For a plain allocator the shim inlines its `alloc` and jumps on to the C allocator (as the
/// real shim does); for `TaggingAllocator`, whose methods are kept out of line, the shim jumps
/// to them. Calling `a.alloc` directly from the loop instead would let the plain allocator's
/// call be inlined into the loop, charging wrappers a call level that real programs pay for
/// every allocator alike.
pub fn pairs<A: GlobalAlloc>(a: &A, n: u64) {
    for i in 0..n {
        let size = SIZES[(i & 7) as usize];
        // SAFETY: non-zero size, align 8; freed right away with the same layout.
        unsafe {
            let p = rust_alloc(a, black_box(size), 8);
            black_box(p).write(1);
            rust_dealloc(a, p, size, 8);
        }
    }
}

/// Like `__rust_alloc`: the layout as two words, the allocator called from here.
///
/// # Safety
/// As for `GlobalAlloc::alloc`, with a valid non-zero-size layout of `size` and `align`.
#[inline(never)]
unsafe fn rust_alloc<A: GlobalAlloc>(a: &A, size: usize, align: usize) -> *mut u8 {
    // SAFETY: the caller passes a valid layout.
    unsafe { a.alloc(Layout::from_size_align_unchecked(size, align)) }
}

/// Like `__rust_dealloc`.
///
/// # Safety
/// As for `GlobalAlloc::dealloc`: `p` came from `rust_alloc(a, size, align)`.
#[inline(never)]
unsafe fn rust_dealloc<A: GlobalAlloc>(a: &A, p: *mut u8, size: usize, align: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { a.dealloc(p, Layout::from_size_align_unchecked(size, align)) }
}
