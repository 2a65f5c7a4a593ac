//! The `GlobalAlloc` wrapper.

use crate::counters::{record_alloc_current, record_free, record_resize};
use crate::giant;
use crate::header::{self, Header};
use crate::tag::current_tag;
use std::alloc::{GlobalAlloc, Layout};

/// How `realloc` is counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReallocMode {
    /// One long-lived allocation whose size changes (the default). The block keeps the tag of the
    /// span that first allocated it; growth adds to that tag's `alloc_bytes`, shrinking adds to
    /// its `free_bytes`; object counts are unchanged. `alloc_space` then counts the bytes a block
    /// grew by, not every intermediate copy.
    #[default]
    Resize,
    /// A free of the old block and an allocation of the new one: the old size is credited to the
    /// old tag, the new size charged to the span current at the realloc, and the block is retagged.
    /// `alloc_objects` then counts every growth step, like a heap profiler that hooks `realloc`
    /// as malloc + free.
    FreeAndAlloc,
}

/// A `GlobalAlloc` that tags every block with the span path current on the allocating thread.
///
/// Wrap any allocator and install it yourself; this crate never installs one:
///
/// ```
/// use tracing_prof_alloc::TaggingAllocator;
/// use std::alloc::System;
///
/// #[global_allocator]
/// static GLOBAL: TaggingAllocator<System> = TaggingAllocator::new(System);
/// # fn main() { let v = vec![1u8; 100]; drop(v); }
/// ```
///
/// With jemalloc: `TaggingAllocator::new(tikv_jemallocator::Jemalloc)`.
///
/// Cost per block: a header of `max(8, align)` bytes (see [`crate::HEADER_SIZE`]); per call a
/// thread-local read and two plain stores to this thread's own counters. No lock, no syscall, no
/// allocation, no panic.
#[derive(Debug, Default)]
pub struct TaggingAllocator<A> {
    inner: A,
    realloc: ReallocMode,
}

impl<A> TaggingAllocator<A> {
    /// Wraps `inner`, counting `realloc` as [`ReallocMode::Resize`].
    pub const fn new(inner: A) -> Self {
        TaggingAllocator {
            inner,
            realloc: ReallocMode::Resize,
        }
    }

    /// Wraps `inner`, counting `realloc` as `mode` says.
    ///
    /// # Examples
    /// ```
    /// use tracing_prof_alloc::{ReallocMode, TaggingAllocator};
    /// static A: TaggingAllocator<std::alloc::System> =
    ///     TaggingAllocator::with_realloc_mode(std::alloc::System, ReallocMode::FreeAndAlloc);
    /// ```
    pub const fn with_realloc_mode(inner: A, mode: ReallocMode) -> Self {
        TaggingAllocator {
            inner,
            realloc: mode,
        }
    }

    /// The wrapped allocator.
    pub const fn inner(&self) -> &A {
        &self.inner
    }

    /// How this allocator counts `realloc`.
    pub const fn realloc_mode(&self) -> ReallocMode {
        self.realloc
    }
}

impl<A: GlobalAlloc> TaggingAllocator<A> {
    /// The outer layout of a request at or above the cold-path limit: reports a giant request,
    /// refuses it if so configured (before the inner allocator is asked, so nothing leaks), and
    /// checks the header arithmetic for overflow. `None`: return null.
    #[cold]
    #[inline(never)]
    fn cold_outer(size: usize, align: usize) -> Option<Layout> {
        if giant::is_giant(size) && giant::record(size, current_tag().get()) {
            return None;
        }
        header::outer_layout(size, align)
    }

    /// `alloc` and `alloc_zeroed`: asks `get` for the outer block, then writes the header.
    #[inline(always)]
    fn alloc_with(&self, layout: Layout, get: impl FnOnce(&A, Layout) -> *mut u8) -> *mut u8 {
        let outer = if giant::needs_cold_path(layout.size(), layout.align()) {
            match Self::cold_outer(layout.size(), layout.align()) {
                Some(outer) => outer,
                None => return std::ptr::null_mut(),
            }
        } else {
            // SAFETY: below the cold-path limit, as `needs_cold_path` just checked.
            unsafe { header::outer_layout_small(layout.size(), layout.align()) }
        };
        let base = get(&self.inner, outer);
        if base.is_null() {
            return base;
        }
        let tag = record_alloc_current(layout.size());
        // SAFETY: `base` is a live block of `outer_layout(layout)`, so `offset_for(align)` bytes
        // in is still inside it (the user part follows) and the header fits in front.
        let user = unsafe { base.add(header::offset_for(layout.align())) };
        // SAFETY: as above; `base` is aligned to at least 8 by `outer_layout`.
        unsafe { header::write(user, Header::new(tag)) };
        user
    }
}

// Why `#[inline(never)]`: LLVM treats the pointer `__rust_alloc` returns as the start of a fresh
// object and reasons about the memory around the `__rust_*` entry points (see
// rust-lang/unsafe-code-guidelines#534). With these methods inlined into a caller, it folded the
// header read in `dealloc` (an access just *before* that object) to garbage, and frees were
// credited to the wrong tag (tests/allocator.rs `paired_alloc_free_is_not_miscounted`). Kept out
// of line, the header accesses are opaque to the caller's optimizer; the cost is one call.
//
// SAFETY: every method forwards to `inner` with the layout `outer_layout` derives from the
// caller's layout (the same rule in all four methods), and returns a pointer `offset_for(align)`
// bytes into that block, which is aligned to `layout.align()` and has `layout.size()` usable
// bytes. Null from `inner` is returned unchanged. Nothing here unwinds.
unsafe impl<A: GlobalAlloc> GlobalAlloc for TaggingAllocator<A> {
    #[inline(never)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: `outer` has a non-zero size (it includes the header).
        self.alloc_with(layout, |inner, outer| unsafe { inner.alloc(outer) })
    }

    #[inline(never)]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: `outer` has a non-zero size. The header overwrites only bytes before the user
        // pointer, so the user's bytes stay zero.
        self.alloc_with(layout, |inner, outer| unsafe { inner.alloc_zeroed(outer) })
    }

    #[inline(never)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller passes a pointer we returned for this layout, so the header is there.
        let tag = unsafe { header::read(ptr) }.tag;
        record_free(tag, layout.size());
        let offset = header::offset_for(layout.align());
        // SAFETY: the same layout gave the same `outer_layout` when the block was allocated, so it
        // is valid now, and `ptr - offset` is the pointer `inner` returned.
        unsafe {
            let outer = header::outer_layout(layout.size(), layout.align()).unwrap_unchecked();
            self.inner.dealloc(ptr.sub(offset), outer);
        }
    }

    #[inline(never)]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let offset = header::offset_for(layout.align());
        let new_outer = if giant::needs_cold_path(new_size, layout.align()) {
            // A giant growth may be refused: the old block then stays valid and counted.
            let shrinking = new_size <= layout.size();
            let outer = if shrinking {
                header::outer_layout(new_size, layout.align())
            } else {
                Self::cold_outer(new_size, layout.align())
            };
            match outer {
                Some(outer) => outer,
                None => return std::ptr::null_mut(),
            }
        } else {
            // SAFETY: below the cold-path limit, as `needs_cold_path` just checked.
            unsafe { header::outer_layout_small(new_size, layout.align()) }
        };
        // SAFETY: `ptr` is ours and live, so its header is readable.
        let old = unsafe { header::read(ptr) };
        // SAFETY: `outer_layout` of the block's current layout succeeded at allocation time.
        let old_outer =
            unsafe { header::outer_layout(layout.size(), layout.align()).unwrap_unchecked() };
        // SAFETY: `ptr - offset` is the block `inner` returned with `old_outer`; `new_outer` keeps
        // its alignment and its size is valid for it. The inner realloc may grow in place, and on
        // a move copies the header along with the user bytes (they are the block's first bytes).
        let base = unsafe {
            self.inner
                .realloc(ptr.sub(offset), old_outer, new_outer.size())
        };
        if base.is_null() {
            // The old block is untouched and still counted as it was.
            return base;
        }
        // SAFETY: `base` is the live, resized block; the user pointer is `offset` bytes in.
        let user = unsafe { base.add(offset) };
        match self.realloc {
            ReallocMode::Resize => record_resize(old.tag, layout.size(), new_size),
            ReallocMode::FreeAndAlloc => {
                record_free(old.tag, layout.size());
                let tag = record_alloc_current(new_size);
                // SAFETY: the header in front of `user` belongs to this live block.
                unsafe { header::write(user, Header::new(tag)) };
            }
        }
        user
    }
}
