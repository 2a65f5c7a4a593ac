//! The block header: where it sits, how big it is, what it holds.
//!
//! Every block handed out by [`TaggingAllocator`](crate::TaggingAllocator) starts `offset` bytes
//! after the block the inner allocator returned, and the [`HEADER_SIZE`] bytes right in front of
//! the user's pointer hold a header: the span path tag (`u32`) and a `u32` of magic number and flags:
//!
//! ```text
//!  inner block start                         user pointer (aligned to layout.align())
//!  |                                         |
//!  v                                         v
//!  [ padding (only when align > 8) | Header ][ user bytes ............ ]
//!  <----------------- offset --------------->
//! ```
//!
//! `offset = max(HEADER_SIZE, align)`, so the user pointer keeps the requested alignment and the
//! header stays 8-byte aligned. The same rule is applied in `alloc`, `alloc_zeroed`, `realloc`
//! and `dealloc` (a peer used `+8` on realloc only, which overflows blocks with align > 8).
//!
//! # How a header is recognised
//! It is not guessed: the allocator writes a header on *every* block from the very first
//! allocation of the process, whether or not a profiler is running, so every pointer that reaches
//! `dealloc`/`realloc` through the `GlobalAlloc` contract has one. Blocks from another allocator
//! (C's `malloc`, a second Rust allocator) can never legally reach this allocator's `dealloc`.
//! The header also carries a 16-bit magic number that debug builds check on free, to catch a
//! broken contract early.

use std::alloc::Layout;

/// Bytes of header in front of every block with `align <= 8`. Blocks with a larger alignment
/// spend `align` bytes (the header plus padding) so that the user pointer stays aligned.
pub const HEADER_SIZE: usize = 8;

/// Alignment the header itself needs.
const HEADER_ALIGN: usize = 8;

/// High 16 bits of [`Header::meta`]: recognises our headers in debug assertions.
const MAGIC: u32 = 0x7470 << 16;

/// What sits in front of every block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(8))]
pub(crate) struct Header {
    /// The raw [`Tag`](crate::Tag) of the span path that allocated the block.
    pub(crate) tag: u32,
    /// Magic in the high 16 bits; the low 16 bits are reserved for flags.
    pub(crate) meta: u32,
}

const _: () = assert!(size_of::<Header>() == HEADER_SIZE);

impl Header {
    #[inline]
    pub(crate) const fn new(tag: u32) -> Self {
        Header { tag, meta: MAGIC }
    }

    #[inline]
    pub(crate) const fn is_ours(&self) -> bool {
        self.meta & 0xffff_0000 == MAGIC
    }
}

/// Distance from the inner block's start to the user pointer for a given alignment.
#[inline]
pub(crate) const fn offset_for(align: usize) -> usize {
    if align > HEADER_SIZE {
        align
    } else {
        HEADER_SIZE
    }
}

/// The layout asked of the inner allocator for a user block of `size` bytes aligned to `align`,
/// or `None` when the sum does not fit in a valid `Layout`.
///
/// `align` must be a power of two (it comes from a `Layout`).
#[inline]
pub(crate) fn outer_layout(size: usize, align: usize) -> Option<Layout> {
    debug_assert!(align.is_power_of_two());
    let outer_align = if align > HEADER_ALIGN {
        align
    } else {
        HEADER_ALIGN
    };
    // `Layout` needs size rounded up to the alignment to fit in isize; `offset <= outer_align`.
    if size > isize::MAX as usize - 2 * outer_align {
        return None;
    }
    // SAFETY: `outer_align` is a power of two (align, or 8), and `size + offset` rounded up to
    // `outer_align` is at most `size + 2 * outer_align <= isize::MAX` by the check above.
    Some(unsafe { Layout::from_size_align_unchecked(size + offset_for(align), outer_align) })
}

/// [`outer_layout`] without its overflow check, for requests below the cold-path limit.
///
/// # Safety
/// `size` and `align` must both be below `giant::SAFE_LIMIT`, and `align` a power of two.
#[inline(always)]
pub(crate) unsafe fn outer_layout_small(size: usize, align: usize) -> Layout {
    debug_assert!(size < crate::giant::SAFE_LIMIT && align < crate::giant::SAFE_LIMIT);
    let outer_align = if align > HEADER_ALIGN {
        align
    } else {
        HEADER_ALIGN
    };
    // SAFETY: `outer_align` is a power of two; `size + offset` < 2 * SAFE_LIMIT, and rounding it
    // up to `outer_align` (< SAFE_LIMIT) stays below isize::MAX.
    unsafe { Layout::from_size_align_unchecked(size + offset_for(align), outer_align) }
}

/// Writes the header in front of `user`.
///
/// # Safety
/// `user` must be `offset_for(align)` bytes into a live block of at least that many bytes, with
/// the block's start aligned to at least 8, as produced by `outer_layout`.
#[inline]
pub(crate) unsafe fn write(user: *mut u8, header: Header) {
    // SAFETY: the caller guarantees the HEADER_SIZE bytes before `user` are inside the block; the
    // offset is a multiple of 8 from an 8-aligned start, so `user - 8` is 8-aligned.
    unsafe { user.sub(HEADER_SIZE).cast::<Header>().write(header) }
}

/// Reads the header in front of `user`.
///
/// # Safety
/// `user` must be a pointer returned by `TaggingAllocator` for a block that is still live.
#[inline]
pub(crate) unsafe fn read(user: *const u8) -> Header {
    // SAFETY: every live block of ours has an initialised, 8-aligned header right before it.
    let header = unsafe { user.sub(HEADER_SIZE).cast::<Header>().read() };
    debug_assert!(
        header.is_ours(),
        "tracing-prof-alloc: freed pointer has no header of ours"
    );
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_keep_alignment() {
        for align in [1, 2, 4, 8, 16, 32, 64, 4096, 1 << 20] {
            let off = offset_for(align);
            assert!(off >= HEADER_SIZE);
            assert_eq!(off % align, 0, "align {align}");
            assert_eq!(off % HEADER_ALIGN, 0);
            let l = outer_layout(10, align).unwrap();
            assert_eq!(l.size(), 10 + off);
            assert!(l.align() >= align && l.align() >= HEADER_ALIGN);
        }
    }

    #[test]
    fn overflowing_sizes_are_refused() {
        assert!(outer_layout(usize::MAX, 8).is_none());
        assert!(outer_layout(isize::MAX as usize, 8).is_none());
        assert!(outer_layout(usize::MAX - 4, 4096).is_none());
    }
}
