//! The block header: where it sits, how big it is, what it holds.
//!
//! Every block handed out by [`TaggingAllocator`](crate::TaggingAllocator) starts `offset` bytes
//! after the block the inner allocator returned, and the [`HEADER_SIZE`] bytes right in front of
//! the user's pointer hold a header: the span path tag (`u32`) and a `u32` of magic number, flags
//! and the allocating thread's table index (its *origin*, for the per-thread view):
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
//! # Sampled blocks
//! A block chosen by the heap sampler is laid out with a larger offset (48 bytes, or 64 or
//! `align` for larger alignments), and a `SampleHeader` (birth time, stack bucket, weight,
//! span instance) in front of the header:
//!
//! ```text
//!  [ padding | SampleHeader (32 bytes) | Header ][ user bytes ... ]
//! ```
//!
//! The header's `EXTENDED` flag says which offset a block has, so `dealloc` and `realloc` find the
//! inner block from the header they read anyway; an unsampled free tests one bit more. `LIVE`
//! says the sample header describes a live sample (a sampled block that a `realloc` made
//! unsampled keeps its layout but drops `LIVE`).
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
/// [`Header::meta`] flag: the block has the sampled layout (a [`SampleHeader`] in front).
pub(crate) const EXTENDED: u32 = 1 << 15;
/// [`Header::meta`] flag: the [`SampleHeader`] describes a live sample.
pub(crate) const LIVE: u32 = 1 << 14;
/// [`Header::meta`] bits holding the origin (the allocating thread's table index).
pub(crate) const ORIGIN_MASK: u32 = (1 << 14) - 1;

/// Offset of a sampled block with `align <= SAMPLED_OFFSET`: room for both headers.
pub(crate) const SAMPLED_OFFSET: usize = 48;

/// What sits in front of the [`Header`] of a sampled block.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct SampleHeader {
    /// When the sample was taken (its allocation).
    pub(crate) born: std::time::Instant,
    /// Index of its stack bucket in the sample table.
    pub(crate) bucket: u32,
    /// How many allocations it stands for (1 at rate 1).
    pub(crate) weight: f32,
    /// The span instance it was allocated in (0: none); see `instances`.
    pub(crate) instance: u64,
}

const _: () = assert!(size_of::<SampleHeader>() + HEADER_SIZE <= SAMPLED_OFFSET);
const _: () = assert!(SAMPLED_OFFSET.is_multiple_of(16));
const _: () = assert!(align_of::<SampleHeader>() <= HEADER_ALIGN);

/// What sits in front of every block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(8))]
pub(crate) struct Header {
    /// The raw [`Tag`](crate::Tag) of the span path that allocated the block.
    pub(crate) tag: u32,
    /// Magic in the high 16 bits, then the [`EXTENDED`] and [`LIVE`] flags, then the origin.
    pub(crate) meta: u32,
}

const _: () = assert!(size_of::<Header>() == HEADER_SIZE);

impl Header {
    /// A header for a block of `tag` allocated by the thread with table index `origin`, with
    /// `flags` ([`EXTENDED`], [`LIVE`]).
    #[inline]
    pub(crate) const fn new(tag: u32, origin: u32, flags: u32) -> Self {
        Header {
            tag,
            meta: MAGIC | flags | (origin & ORIGIN_MASK),
        }
    }

    /// The header as the one word stored in front of a block.
    #[inline(always)]
    const fn to_word(self) -> u64 {
        self.tag as u64 | (self.meta as u64) << 32
    }

    #[inline(always)]
    const fn from_word(w: u64) -> Self {
        Header {
            tag: w as u32,
            meta: (w >> 32) as u32,
        }
    }

    #[inline]
    pub(crate) const fn origin(&self) -> u32 {
        self.meta & ORIGIN_MASK
    }

    #[inline]
    pub(crate) const fn is_extended(&self) -> bool {
        self.meta & EXTENDED != 0
    }

    #[inline]
    pub(crate) const fn is_live_sample(&self) -> bool {
        self.meta & LIVE != 0
    }

    #[inline]
    pub(crate) const fn is_ours(&self) -> bool {
        self.meta & 0xffff_0000 == MAGIC
    }
}

/// Distance from the inner block's start to the user pointer for a given alignment, in the
/// plain layout (`extended == false`) or the sampled one: at least the headers' size, and a
/// multiple of `align`.
#[inline(always)]
pub(crate) const fn offset_for(align: usize, extended: bool) -> usize {
    if !extended {
        return if align > HEADER_SIZE {
            align
        } else {
            HEADER_SIZE
        };
    }
    if align <= 16 {
        SAMPLED_OFFSET
    } else {
        // A power of two above 16: SAMPLED_OFFSET rounded up to it.
        (SAMPLED_OFFSET + align - 1) & !(align - 1)
    }
}

/// The layout asked of the inner allocator for a user block of `size` bytes aligned to `align`,
/// or `None` when the sum does not fit in a valid `Layout`.
///
/// `align` must be a power of two (it comes from a `Layout`).
#[inline]
pub(crate) fn outer_layout(size: usize, align: usize, extended: bool) -> Option<Layout> {
    let outer_align = if align > HEADER_ALIGN {
        align
    } else {
        HEADER_ALIGN
    };
    // `Layout` needs size rounded up to the alignment to fit in isize; `offset` is at most
    // `max(outer_align, SAMPLED_OFFSET)`. Checked: an alignment near `isize::MAX` (a valid
    // `Layout` may ask for 2^62) must give `None`, never wrap.
    let room = (isize::MAX as usize)
        .checked_sub(outer_align.checked_mul(2)?)?
        .checked_sub(SAMPLED_OFFSET)?;
    if size > room || !align.is_power_of_two() {
        return None;
    }
    // SAFETY: `outer_align` is a power of two (align, or 8), and `size + offset` rounded up to
    // `outer_align` is at most `size + 2 * outer_align + SAMPLED_OFFSET <= isize::MAX` by the
    // check above.
    Some(unsafe {
        Layout::from_size_align_unchecked(size + offset_for(align, extended), outer_align)
    })
}

/// [`outer_layout`] without its overflow check, for requests below the cold-path limit.
///
/// # Safety
/// `size` and `align` must both be below `giant::SAFE_LIMIT`, and `align` a power of two.
#[inline(always)]
pub(crate) unsafe fn outer_layout_small(size: usize, align: usize, extended: bool) -> Layout {
    let outer_align = if align > HEADER_ALIGN {
        align
    } else {
        HEADER_ALIGN
    };
    // SAFETY: `outer_align` is a power of two; `size + offset` < 2 * SAFE_LIMIT + SAMPLED_OFFSET,
    // and rounding it up to `outer_align` (< SAFE_LIMIT) stays below isize::MAX.
    unsafe { Layout::from_size_align_unchecked(size + offset_for(align, extended), outer_align) }
}

/// The user pointer `offset` bytes into the inner block at `base`, with `base`'s provenance
/// exposed first.
///
/// # Why exposed provenance
/// The caller of `__rust_alloc` is told the block starts at the user pointer (LLVM marks the
/// returned pointer as a fresh object), yet the header and the inner block lie *before* it. A
/// pointer derived from the user pointer has no right to that memory, and an optimizer that can
/// see both sides (the allocator inlined into its caller, fat LTO) used that: with this
/// allocator's methods inlined and `lto = "fat"`, frees found no header and aborted
/// (`.ci/run`'s inlined fat-LTO build of `tests/allocator.rs`). So the allocator exposes the
/// inner block's provenance here and takes it back from the address in [`base_of`] and
/// [`read`]: a pointer made from an address may carry any exposed provenance, so the optimizer
/// must assume the access is to the inner block, which it is.
///
/// # Safety
/// `base` must be a live block from the inner allocator at least `offset` bytes long.
#[inline(always)]
pub(crate) unsafe fn user_of(base: *mut u8, offset: usize) -> *mut u8 {
    let _ = base.expose_provenance();
    // SAFETY: the caller guarantees `offset` bytes are inside the block.
    unsafe { base.add(offset) }
}

/// The inner block's start, `offset` bytes before `user`, with the provenance [`user_of`]
/// exposed.
///
/// The address arithmetic is checked by the caller (the offset is the block's own).
#[inline(always)]
pub(crate) fn base_of(user: *mut u8, offset: usize) -> *mut u8 {
    std::ptr::with_exposed_provenance_mut(user.addr().wrapping_sub(offset))
}

/// Writes the header in front of `user`.
///
/// # Safety
/// `user` must be `offset_for(align, _)` bytes into a live block of at least that many bytes,
/// with the block's start aligned to at least 8, as produced by `outer_layout`.
#[inline]
pub(crate) unsafe fn write(user: *mut u8, header: Header) {
    // SAFETY: the caller guarantees the HEADER_SIZE bytes before `user` are inside the block; the
    // offset is a multiple of 8 from an 8-aligned start, so `user - 8` is 8-aligned.
    // One 8-byte store, as `read` does one 8-byte load: a load that spans two smaller stores
    // cannot be forwarded from them and waits for them to retire (about 3 ns per short-lived
    // block, measured with alloc_pair).
    unsafe { user.sub(HEADER_SIZE).cast::<u64>().write(header.to_word()) }
}

/// Reads the header in front of `user`.
///
/// # Safety
/// `user` must be a pointer returned by `TaggingAllocator` for a block that is still live.
#[inline]
pub(crate) unsafe fn read(user: *const u8) -> Header {
    // Through the inner block's exposed provenance: see `user_of`.
    let at = std::ptr::with_exposed_provenance::<u64>(user.addr().wrapping_sub(HEADER_SIZE));
    // SAFETY: every live block of ours has an initialised, 8-aligned header right before it,
    // inside the inner block whose provenance `user_of` exposed.
    Header::from_word(unsafe { at.read() })
}

/// Writes the sample header in front of `user`'s header.
///
/// # Safety
/// `user` must be `offset_for(align, true)` bytes into a live block with the block's start
/// aligned to at least 8 (a block with the sampled layout).
#[inline]
pub(crate) unsafe fn write_sample(user: *mut u8, sample: SampleHeader) {
    // SAFETY: the sampled layout leaves SAMPLED_OFFSET >= HEADER_SIZE + size_of::<SampleHeader>()
    // bytes in front of `user`, 8-aligned (the offset is a multiple of 8 from an 8-aligned start).
    unsafe {
        user.sub(HEADER_SIZE + size_of::<SampleHeader>())
            .cast::<SampleHeader>()
            .write(sample)
    }
}

/// Reads the sample header in front of `user`'s header.
///
/// # Safety
/// `user` must be a live block of ours whose header has the [`EXTENDED`] flag and whose sample
/// header was written by [`write_sample`].
#[inline]
pub(crate) unsafe fn read_sample(user: *const u8) -> SampleHeader {
    let at = std::ptr::with_exposed_provenance::<SampleHeader>(
        user.addr()
            .wrapping_sub(HEADER_SIZE + size_of::<SampleHeader>()),
    );
    // SAFETY: as for `write_sample`, through the exposed provenance of the inner block (see
    // `user_of`); the caller guarantees it was initialised.
    unsafe { at.read() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_keep_alignment() {
        for extended in [false, true] {
            for align in [1, 2, 4, 8, 16, 32, 64, 4096, 1 << 20] {
                let off = offset_for(align, extended);
                assert!(off >= HEADER_SIZE);
                if extended {
                    assert!(off >= HEADER_SIZE + size_of::<SampleHeader>());
                }
                assert_eq!(off % align, 0, "align {align}");
                assert_eq!(off % HEADER_ALIGN, 0);
                let l = outer_layout(10, align, extended).unwrap();
                assert_eq!(l.size(), 10 + off);
                assert!(l.align() >= align && l.align() >= HEADER_ALIGN);
            }
        }
    }

    #[test]
    fn overflowing_sizes_are_refused() {
        for extended in [false, true] {
            assert!(outer_layout(usize::MAX, 8, extended).is_none());
            assert!(outer_layout(isize::MAX as usize, 8, extended).is_none());
            assert!(outer_layout(usize::MAX - 4, 4096, extended).is_none());
        }
    }
}
