//! Capturing the code stack of a sampled allocation: return addresses only, symbolized later
//! off the hot path by whoever reads the sample table.
//!
//! A walker set with [`set_stack_walker`] is asked first: the profiler installs its CPU
//! sampler's, which reads the same call frame information with cached rules, without a lock,
//! on threads it has armed. Where it declines, or none is set, the walk uses the platform unwinder (`_Unwind_Backtrace`, from libgcc_s or libunwind, which
//! every Rust program on these platforms already links for panics). It reads the DWARF call
//! frame information that rustc emits by default (`-C force-unwind-tables` is on for the usual
//! targets, with `panic = "abort"` too), so it needs no frame pointers and no build flag. It does
//! not allocate through the Rust global allocator. It costs a few microseconds per stack, which
//! is why only sampled allocations pay it.

use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A walk of the calling thread's stack: writes return addresses into the slice, innermost
/// first, and returns how many; `None` to leave the walk to the platform unwinder.
pub type StackWalker = fn(&mut [usize]) -> Option<usize>;

/// The walker asked first (see [`set_stack_walker`]); null: none.
static WALKER: AtomicPtr<()> = AtomicPtr::new(ptr::null_mut());

/// Makes `walker` capture sampled allocations' stacks where it can (`None`: the platform
/// unwinder always). It runs inside the allocator: it must not allocate through the global
/// allocator, lock or panic, and its first return address must be its caller's (its own frame
/// left out).
pub fn set_stack_walker(walker: Option<StackWalker>) {
    let p = walker.map_or(ptr::null_mut(), |f| f as *mut ());
    WALKER.store(p, Ordering::Release);
}

/// Writes the return addresses of the calling thread's stack into `out`, innermost first, and
/// returns how many it wrote (0 where unwinding is not supported).
#[inline(never)]
pub(crate) fn capture(out: &mut [usize]) -> usize {
    let walker = WALKER.load(Ordering::Acquire);
    if !walker.is_null() {
        // SAFETY: WALKER only ever holds null or a `StackWalker` stored by `set_stack_walker`.
        let walker = unsafe { std::mem::transmute::<*mut (), StackWalker>(walker) };
        if let Some(n) = walker(out) {
            return n;
        }
    }
    imp::capture(out)
}

#[cfg(all(
    unix,
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "x86",
        target_arch = "riscv64"
    )
))]
mod imp {
    use std::ffi::c_void;

    /// Opaque `struct _Unwind_Context`.
    #[repr(C)]
    struct UnwindContext {
        _private: [u8; 0],
    }

    /// `_URC_NO_REASON`: go on walking.
    const CONTINUE: i32 = 0;
    /// `_URC_END_OF_STACK`: stop here.
    const STOP: i32 = 5;

    type TraceFn = extern "C" fn(*mut UnwindContext, *mut c_void) -> i32;

    // SAFETY: these are the Itanium C++ ABI unwinder's entry points, with these signatures, as
    // provided by libgcc_s / libunwind, which std links on these targets.
    unsafe extern "C" {
        fn _Unwind_Backtrace(trace: TraceFn, arg: *mut c_void) -> i32;
        fn _Unwind_GetIP(ctx: *mut UnwindContext) -> usize;
    }

    struct Collector<'a> {
        out: &'a mut [usize],
        n: usize,
    }

    extern "C" fn on_frame(ctx: *mut UnwindContext, arg: *mut c_void) -> i32 {
        // SAFETY: `arg` is the `&mut Collector` that `capture` passes, live for the whole walk
        // and not otherwise used while the walk runs.
        let c = unsafe { &mut *arg.cast::<Collector<'_>>() };
        if c.n >= c.out.len() {
            return STOP;
        }
        // SAFETY: `ctx` is the context the unwinder passes to this callback.
        let ip = unsafe { _Unwind_GetIP(ctx) };
        if ip == 0 {
            return STOP;
        }
        c.out[c.n] = ip;
        c.n += 1;
        CONTINUE
    }

    pub(super) fn capture(out: &mut [usize]) -> usize {
        let mut c = Collector { out, n: 0 };
        // SAFETY: `on_frame` matches the callback contract and never unwinds; `arg` points to
        // `c`, which outlives the call.
        unsafe { _Unwind_Backtrace(on_frame, (&raw mut c).cast::<c_void>()) };
        c.n
    }
}

#[cfg(not(all(
    unix,
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "x86",
        target_arch = "riscv64"
    )
)))]
mod imp {
    pub(super) fn capture(_out: &mut [usize]) -> usize {
        0
    }
}
