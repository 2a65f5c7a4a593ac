//! Walking the interrupted thread's stack from inside the signal handler.
//!
//! Two ways, chosen with [`Unwind`]:
//! - **DWARF** (the default): the call frame information of `.eh_frame` that rustc emits for
//!   every function, whether or not frame pointers are kept, read by framehop with rule caches
//!   set up before sampling starts (no allocation while unwinding). Works on a plain
//!   `cargo build --release` binary. Where no table covers an address (JIT code, a stripped
//!   library), framehop falls back to the frame pointer.
//! - **Frame pointers**: follows the chain of saved frame pointers only. Cheaper per frame, but
//!   correct only where every function keeps them (`-C force-frame-pointers=yes`; Rust's
//!   precompiled standard library does since 2024); elsewhere frames are skipped or the walk
//!   stops early.
//!
//! Every memory read goes through one check: the address must lie between the interrupted
//! stack pointer and the top of the thread's stack (recorded when the thread was armed), and
//! be 8-byte aligned. A bad frame therefore ends the walk instead of faulting. The walk never
//! allocates, locks, calls the platform unwinder (`_Unwind_Backtrace`, which may take the
//! loader's lock) or `dl_iterate_phdr`.

use crate::modules;
use crate::{MAX_CPU_FRAMES, Unwind};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

static MODE: AtomicU8 = AtomicU8::new(0);

pub(crate) fn set_mode(mode: Unwind) {
    MODE.store(
        match mode {
            Unwind::Dwarf => 0,
            Unwind::FramePointers => 1,
        },
        Ordering::Relaxed,
    );
}

pub(crate) fn mode() -> Unwind {
    match MODE.load(Ordering::Relaxed) {
        0 => Unwind::Dwarf,
        _ => Unwind::FramePointers,
    }
}

/// The registers unwinding starts from: where the thread was interrupted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Regs {
    pub(crate) pc: u64,
    pub(crate) sp: u64,
    pub(crate) fp: u64,
    /// The link register (aarch64); 0 elsewhere.
    #[cfg_attr(target_arch = "x86_64", allow(dead_code, reason = "aarch64 only"))]
    pub(crate) lr: u64,
}

impl Regs {
    /// The interrupted registers from the `ucontext_t` a SA_SIGINFO handler receives.
    ///
    /// # Safety
    /// `uc` must be the third argument of a SA_SIGINFO signal handler now running.
    #[cfg(target_arch = "x86_64")]
    pub(crate) unsafe fn from_ucontext(uc: *const libc::c_void) -> Regs {
        // SAFETY: the kernel passes a valid ucontext_t for the duration of the handler.
        let g = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
        Regs {
            pc: g[libc::REG_RIP as usize] as u64,
            sp: g[libc::REG_RSP as usize] as u64,
            fp: g[libc::REG_RBP as usize] as u64,
            lr: 0,
        }
    }

    /// The interrupted registers from the `ucontext_t` a SA_SIGINFO handler receives.
    ///
    /// # Safety
    /// `uc` must be the third argument of a SA_SIGINFO signal handler now running.
    #[cfg(target_arch = "aarch64")]
    pub(crate) unsafe fn from_ucontext(uc: *const libc::c_void) -> Regs {
        // SAFETY: the kernel passes a valid ucontext_t for the duration of the handler.
        let m = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext };
        Regs {
            pc: m.pc,
            sp: m.sp,
            fp: m.regs[29],
            lr: m.regs[30],
        }
    }
}

/// The readable part of the interrupted stack: `[sp, top)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stack {
    pub(crate) sp: u64,
    pub(crate) top: u64,
}

impl Stack {
    /// The readable part of the stack of the thread that owns `ts`, from `sp`. Where `sp` lies
    /// outside that thread's stack (a coroutine's or a signal stack of its own), nothing is
    /// readable: the walk keeps the first address only, rather than read between two unrelated
    /// memory areas.
    pub(crate) fn of(ts: &crate::thread::ThreadSampler, sp: u64) -> Stack {
        let top = ts.stack_top.load(Ordering::Relaxed);
        let bottom = ts.stack_bottom.load(Ordering::Relaxed);
        let inside = bottom != 0 && (bottom..top).contains(&sp);
        Stack {
            sp,
            top: if inside { top } else { sp },
        }
    }

    /// Reads the word at `addr` if it lies within `[sp, top)` and is aligned.
    #[inline]
    fn read(&self, addr: u64) -> Result<u64, ()> {
        let past_top = addr.checked_add(8).is_none_or(|end| end > self.top);
        if addr < self.sp || past_top || !addr.is_multiple_of(8) {
            return Err(());
        }
        // SAFETY: `[sp, top)` is the live part of this thread's stack (`top` was read from the
        // thread's stack attributes when it was armed, `sp` is where it was interrupted), which
        // is mapped and readable; the address is aligned and the word lies inside it.
        Ok(unsafe { std::ptr::read_volatile(addr as *const u64) })
    }
}

/// The result of a walk.
pub(crate) struct Walk {
    /// Frames written.
    pub(crate) depth: usize,
    /// Whether the stack went on beyond [`MAX_CPU_FRAMES`].
    pub(crate) truncated: bool,
}

/// Walks the stack from `regs`, writing the code addresses into `out`, innermost first: the
/// interrupted instruction first, then return addresses. `hint` (the thread id) spreads
/// threads over the rule caches.
pub(crate) fn walk(regs: Regs, stack: Stack, out: &mut [u64; MAX_CPU_FRAMES], hint: usize) -> Walk {
    if mode() == Unwind::Dwarf
        && let Some(unwinder) = modules::unwinder()
        && let Some(mut cache) = CachePool::take(hint)
    {
        let w = dwarf(unwinder, cache.get(), regs, stack, out);
        drop(cache);
        return w;
    }
    frame_pointers(regs, stack, out)
}

/// Walks the calling thread's own stack, as [`walk`] does an interrupted one: `out[0]` is an
/// address inside this function, then the return addresses from its caller's up.
#[inline(never)]
pub(crate) fn own_stack(
    ts: &crate::thread::ThreadSampler,
    out: &mut [u64; MAX_CPU_FRAMES],
    hint: usize,
) -> Walk {
    let regs = here();
    walk(regs, Stack::of(ts, regs.sp), out, hint)
}

/// The registers where this is inlined: the instruction pointer, stack pointer and frame
/// pointer, read at one instruction, as an interrupted thread's would be.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn here() -> Regs {
    let (pc, sp, fp): (u64, u64, u64);
    // SAFETY: copies three registers into others; touches no memory, the stack or the flags.
    unsafe {
        core::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {fp}, rbp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            fp = out(reg) fp,
            options(nomem, nostack, preserves_flags),
        );
    }
    Regs { pc, sp, fp, lr: 0 }
}

/// The registers where this is inlined: the instruction pointer, stack pointer, frame pointer
/// and link register, read together, as an interrupted thread's would be.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn here() -> Regs {
    let (pc, sp, fp, lr): (u64, u64, u64, u64);
    // SAFETY: copies four registers into others; touches no memory, the stack or the flags.
    unsafe {
        core::arch::asm!(
            "adr {pc}, .",
            "mov {sp}, sp",
            "mov {fp}, x29",
            "mov {lr}, x30",
            pc = out(reg) pc,
            sp = out(reg) sp,
            fp = out(reg) fp,
            lr = out(reg) lr,
            options(nomem, nostack, preserves_flags),
        );
    }
    Regs { pc, sp, fp, lr }
}

fn frame_pointers(regs: Regs, stack: Stack, out: &mut [u64; MAX_CPU_FRAMES]) -> Walk {
    out[0] = regs.pc;
    let mut depth = 1;
    #[cfg(target_arch = "aarch64")]
    if regs.lr != 0 {
        // A leaf function may not have saved the link register yet.
        out[1] = regs.lr;
        depth = 2;
    }
    let mut fp = regs.fp;
    while depth < MAX_CPU_FRAMES {
        let (Ok(next), Ok(ret)) = (stack.read(fp), stack.read(fp.wrapping_add(8))) else {
            return Walk {
                depth,
                truncated: false,
            };
        };
        if ret == 0 || next <= fp {
            if ret != 0 {
                out[depth] = ret;
                depth += 1;
            }
            return Walk {
                depth,
                truncated: false,
            };
        }
        #[cfg(target_arch = "aarch64")]
        if depth == 2 && ret == out[1] {
            fp = next;
            continue; // the link register was saved after all
        }
        out[depth] = ret;
        depth += 1;
        fp = next;
    }
    Walk {
        depth,
        truncated: stack.read(fp).is_ok(),
    }
}

fn dwarf(
    unwinder: &modules::Unwinder,
    cache: &mut modules::Cache,
    regs: Regs,
    stack: Stack,
    out: &mut [u64; MAX_CPU_FRAMES],
) -> Walk {
    use framehop::Unwinder as _;
    #[cfg(target_arch = "x86_64")]
    let start = framehop::UnwindRegsNative::new(regs.pc, regs.sp, regs.fp);
    #[cfg(target_arch = "aarch64")]
    let start = framehop::UnwindRegsNative::new(regs.lr, regs.sp, regs.fp);
    let mut read = |addr: u64| stack.read(addr);
    let mut frames = unwinder.iter_frames(regs.pc, start, cache, &mut read);
    let mut depth = 0;
    loop {
        match frames.next() {
            Ok(Some(f)) => {
                if depth == MAX_CPU_FRAMES {
                    return Walk {
                        depth,
                        truncated: true,
                    };
                }
                out[depth] = f.address();
                depth += 1;
            }
            // The end of the stack, or a frame that could not be read: keep what we have.
            Ok(None) | Err(_) => {
                return Walk {
                    depth,
                    truncated: false,
                };
            }
        }
    }
}

/// framehop's rule caches, one per handler that may run at the same time: taken with a
/// compare-and-swap on the slot's own flag (no lock, no waiting); when every slot is busy, the
/// handler unwinds with frame pointers instead.
struct CacheSlot {
    busy: AtomicBool,
    cache: UnsafeCell<modules::Cache>,
}

// SAFETY: `cache` is only touched by the holder of `busy` (see `CachePool::take`).
unsafe impl Sync for CacheSlot {}

static POOL: std::sync::OnceLock<Box<[CacheSlot]>> = std::sync::OnceLock::new();

/// Creates the rule caches (off the signal path): two per CPU, at most 64.
pub(crate) fn prepare() {
    POOL.get_or_init(|| {
        let n = std::thread::available_parallelism()
            .map_or(4, |n| n.get() * 2)
            .min(64);
        (0..n)
            .map(|_| CacheSlot {
                busy: AtomicBool::new(false),
                cache: UnsafeCell::new(modules::Cache::default()),
            })
            .collect()
    });
}

/// framehop's rule-cache hits and misses, summed over the caches free now (one a handler
/// holds is skipped rather than waited for).
pub(crate) fn cache_stats() -> (u64, u64) {
    let (mut hits, mut misses) = (0, 0);
    for slot in POOL.get().map_or(&[][..], |p| &p[..]) {
        if slot
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            let held = CachePool(slot);
            // SAFETY: this holder set `busy`, as in `CachePool::get`.
            let s = unsafe { &*held.0.cache.get() }.stats();
            hits += s.hit_count;
            misses +=
                s.miss_empty_slot_count + s.miss_wrong_address_count + s.miss_wrong_modules_count;
        }
    }
    (hits, misses)
}

pub(crate) struct CachePool(&'static CacheSlot);

impl CachePool {
    /// A free cache, if the pool exists and one is free. Never blocks.
    fn take(hint: usize) -> Option<CachePool> {
        let pool = POOL.get()?;
        let start = hint % pool.len();
        for i in 0..pool.len() {
            let slot = &pool[(start + i) % pool.len()];
            if slot
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Some(CachePool(slot));
            }
        }
        None
    }

    fn get(&mut self) -> &mut modules::Cache {
        // SAFETY: this holder set `busy`, so no one else touches the cache until it is dropped;
        // the `&mut self` borrow keeps this holder from handing out two references at once.
        unsafe { &mut *self.0.cache.get() }
    }
}

impl Drop for CachePool {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}
