//! The allocator as `#[global_allocator]`: exact counts per tag, every alignment, realloc both ways.
//!
//! Each test uses its own tags, so tests running in parallel threads never see each other's counts.

use std::alloc::{GlobalAlloc, Layout, System};
use tracing_prof_alloc::__private::TagTotals;
use tracing_prof_alloc::__private::read_totals;
use tracing_prof_alloc::{ReallocMode, Tag, TagGuard, TaggingAllocator};

#[global_allocator]
static GLOBAL: TaggingAllocator<System> = TaggingAllocator::new(System);

fn totals(tag: u32) -> TagTotals {
    let mut all = vec![TagTotals::default(); tag as usize + 1];
    read_totals(&mut all);
    all[tag as usize]
}

/// Runs `f` with `tag` current and returns the tag's counters after minus before.
fn delta(tag: u32, f: impl FnOnce()) -> (u64, u64, u64, u64) {
    let b = totals(tag);
    {
        let _g = TagGuard::new(Tag::new(tag));
        f();
    }
    let a = totals(tag);
    (
        a.alloc_objects - b.alloc_objects,
        a.alloc_bytes - b.alloc_bytes,
        a.free_objects - b.free_objects,
        a.free_bytes - b.free_bytes,
    )
}

#[test]
fn counts_user_bytes_exactly() {
    let (ao, ab, fo, fb) = delta(100, || {
        let a = std::hint::black_box(vec![0u8; 1000]);
        let b = std::hint::black_box(Box::new([0u64; 3]));
        drop(a);
        std::mem::forget(b);
    });
    assert_eq!((ao, ab, fo, fb), (2, 1024, 1, 1000));
}

#[test]
fn every_alignment_is_honoured_and_zeroed_stays_zero() {
    let (ao, ab, fo, fb) = delta(101, || {
        for align in [1usize, 2, 4, 8, 16, 32, 64, 128, 256, 4096, 8192] {
            for size in [1usize, 7, 8, 9, 100, 4096, 5000] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: non-zero size; the block is freed with the same layout.
                unsafe {
                    let p = GLOBAL.alloc_zeroed(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "align {align} size {size}");
                    assert!(std::slice::from_raw_parts(p, size).iter().all(|&b| b == 0));
                    p.write_bytes(0xAB, size);
                    GLOBAL.dealloc(p, layout);
                }
            }
        }
    });
    let per_align: u64 = [1u64, 7, 8, 9, 100, 4096, 5000].iter().sum();
    assert_eq!((ao, ab, fo, fb), (77, 11 * per_align, 77, 11 * per_align));
}

#[test]
fn realloc_resize_keeps_the_first_tag_and_the_content() {
    let mut v: Vec<u8> = Vec::new();
    let (ao, ab, fo, fb) = delta(102, || {
        v.reserve_exact(10);
        v.extend_from_slice(&[7; 10]);
    });
    assert_eq!((ao, ab, fo, fb), (1, 10, 0, 0));
    // Growth and shrink happen under another tag but are charged to the block's tag (102):
    // each realloc an allocation of the new size and a free of the old one (10 -> 1000 -> 10
    // -> 100), as heap profilers count it.
    let (ao2, ..) = delta(103, || {
        v.reserve_exact(990);
        assert_eq!(&v[..], &[7; 10]);
        v.shrink_to_fit();
        v.reserve_exact(90);
    });
    assert_eq!(ao2, 0);
    let t = totals(102);
    assert_eq!(
        (t.alloc_objects, t.alloc_bytes, t.free_objects, t.free_bytes),
        (4, 10 + 1000 + 10 + 100, 3, 10 + 1000 + 10)
    );
    assert_eq!(t.inuse_bytes(), 100);
    drop(v);
    let t = totals(102);
    assert_eq!((t.inuse_objects(), t.inuse_bytes()), (0, 0));
}

#[test]
fn realloc_free_and_alloc_retags() {
    static FREE_AND_ALLOC: TaggingAllocator<System> =
        TaggingAllocator::with_realloc_mode(System, ReallocMode::FreeAndAlloc);
    let layout = Layout::from_size_align(64, 64).unwrap();
    let p = {
        let _g = TagGuard::new(Tag::new(104));
        // SAFETY: non-zero size.
        unsafe { FREE_AND_ALLOC.alloc(layout) }
    };
    // SAFETY: p is live with `layout`; the content survives the move.
    unsafe { p.write_bytes(9, 64) };
    let q = {
        let _g = TagGuard::new(Tag::new(105));
        // SAFETY: p came from this allocator with `layout`.
        unsafe { FREE_AND_ALLOC.realloc(p, layout, 4000) }
    };
    assert_eq!(q as usize % 64, 0);
    // SAFETY: q has 4000 bytes, the first 64 copied from p.
    let copied = unsafe { std::slice::from_raw_parts(q, 64) };
    assert!(copied.iter().all(|&b| b == 9));
    let (a, b) = (totals(104), totals(105));
    assert_eq!(
        (a.alloc_objects, a.alloc_bytes, a.free_objects, a.free_bytes),
        (1, 64, 1, 64)
    );
    assert_eq!(
        (b.alloc_objects, b.alloc_bytes, b.inuse_bytes()),
        (1, 4000, 4000)
    );
    // SAFETY: q is live with size 4000 and align 64.
    unsafe { FREE_AND_ALLOC.dealloc(q, Layout::from_size_align(4000, 64).unwrap()) };
    assert_eq!(totals(105).inuse_bytes(), 0);
}

#[test]
fn frees_on_another_thread_credit_the_allocating_tag() {
    // A bounded channel allocates its buffer here, outside the measured part.
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u32>>(1000);
    let freer = std::thread::spawn(move || {
        let _g = TagGuard::new(Tag::new(107)); // the freeing thread's own tag must not matter
        for v in rx {
            drop(v);
        }
    });
    let (ao, ab, ..) = delta(106, || {
        for i in 0..1000 {
            tx.send(Vec::with_capacity(i + 1)).unwrap();
        }
    });
    drop(tx);
    freer.join().unwrap();
    let t = totals(106);
    assert_eq!((ao, ab), (1000, 4 * (1..=1000).sum::<u64>()));
    assert_eq!((t.free_objects, t.free_bytes), (1000, ab));
    // The freeing thread's tag is credited only with its own blocks (channel wake-up state).
    let other = totals(107);
    assert!(
        other.free_bytes <= other.alloc_bytes && other.free_bytes < 1000,
        "{other:?}"
    );
}

#[test]
fn exited_threads_tables_are_reused_and_their_counts_kept() {
    let run = || {
        std::thread::spawn(|| {
            let _g = TagGuard::new(Tag::new(108));
            std::mem::forget(std::hint::black_box(vec![1u8; 10]));
        })
        .join()
        .unwrap()
    };
    run();
    let tables = tracing_prof_alloc::__private::thread_tables();
    for _ in 0..20 {
        run();
    }
    // Other tests' threads may be alive at the same time, so allow some growth but not 20.
    assert!(tracing_prof_alloc::__private::thread_tables() < tables + 10);
    assert_eq!(totals(108).inuse_bytes(), 210);
}

#[test]
fn out_of_range_tags_go_to_overflow() {
    assert_eq!(Tag::new(u32::MAX), Tag::OVERFLOW);
    assert_eq!(Tag::new(tracing_prof_alloc::MAX_TAGS as u32), Tag::OVERFLOW);
    assert_eq!(Tag::new(5).get(), 5);
}

#[test]
fn impossible_sizes_return_null_instead_of_panicking() {
    let layout = Layout::from_size_align(isize::MAX as usize - 4096, 8).unwrap();
    // SAFETY: a valid (if absurd) layout; null is an allowed answer.
    let p = std::hint::black_box(unsafe { GLOBAL.alloc(std::hint::black_box(layout)) });
    assert!(p.is_null());
    let small = Layout::from_size_align(8, 8).unwrap();
    // SAFETY: valid layout; the block is freed below.
    let p = unsafe { GLOBAL.alloc(small) };
    // SAFETY: p is live with `small`; a too-large new size must fail and leave p valid.
    let q = std::hint::black_box(unsafe { GLOBAL.realloc(p, small, usize::MAX - 2) });
    assert!(q.is_null());
    // SAFETY: p is still live.
    unsafe { GLOBAL.dealloc(p, small) };
}

/// Allocates, writes and frees a block the optimizer can see whole. When the allocator's
/// methods were inlined here, LLVM folded the header read in `dealloc` and the free was credited
/// to tag 0 (see the comment on the `GlobalAlloc` impl).
fn alloc_write_free(size: usize, align: usize) {
    let layout = Layout::from_size_align(size, align).unwrap();
    // SAFETY: non-zero size; freed with the same layout.
    unsafe {
        let p = std::alloc::alloc(layout);
        assert!(!p.is_null() && (p as usize).is_multiple_of(align));
        p.write_bytes(1, size);
        std::alloc::dealloc(p, layout);
    }
}

#[test]
fn paired_alloc_free_is_not_miscounted() {
    let before = totals(0);
    let (ao, ab, fo, fb) = delta(109, || {
        alloc_write_free(200, 8);
        alloc_write_free(64, 64);
    });
    // Either the optimizer removed both calls (nothing counted) or both are counted here.
    assert_eq!(
        (ao, ab),
        (fo, fb),
        "a free went elsewhere: tag 0 went from {before:?} to {:?}",
        totals(0)
    );
    assert!(ao == 0 || (ao, ab) == (2, 264));
}

/// An inner allocator that records how `realloc` reaches it and grows in place when it can.
struct InPlace {
    reallocs: std::sync::atomic::AtomicUsize,
}

// SAFETY: forwards to System; `realloc` returns the same pointer only when the block's usable
// size (malloc_usable_size) already covers the new size, which is growth in place.
unsafe impl GlobalAlloc for InPlace {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: same contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        self.reallocs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: same contract.
        unsafe { System.realloc(p, l, n) }
    }
}

#[test]
fn realloc_reaches_the_inner_realloc_so_blocks_can_grow_in_place() {
    let a = TaggingAllocator::new(InPlace {
        reallocs: Default::default(),
    });
    let l = Layout::from_size_align(100, 8).unwrap();
    // SAFETY: valid layouts; each call passes the block's current layout.
    unsafe {
        let p = a.alloc(l);
        p.write_bytes(3, 100);
        // glibc rounds 100 + 8 up to a usable 120 bytes: growing to 104 fits in place.
        let q = a.realloc(p, l, 104);
        assert_eq!(q, p, "growth that fits must stay in place");
        let r = a.realloc(q, Layout::from_size_align(104, 8).unwrap(), 100_000);
        assert!(std::slice::from_raw_parts(r, 100).iter().all(|&b| b == 3));
        a.dealloc(r, Layout::from_size_align(100_000, 8).unwrap());
    }
    assert_eq!(
        a.inner()
            .reallocs
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

#[test]
fn jemalloc_inner_honours_alignment_and_counts() {
    let a = TaggingAllocator::new(tikv_jemallocator::Jemalloc);
    let (ao, ab, fo, fb) = delta(110, || {
        for align in [8usize, 16, 64, 4096] {
            let l = Layout::from_size_align(3000, align).unwrap();
            // SAFETY: valid layouts; each block is freed with its current layout.
            unsafe {
                let p = a.alloc(l);
                assert_eq!(p as usize % align, 0);
                let q = a.realloc(p, l, 9000);
                assert_eq!(q as usize % align, 0);
                a.dealloc(q, Layout::from_size_align(9000, align).unwrap());
            }
        }
    });
    // Per alignment: 3000 allocated, reallocated to 9000 (an allocation and a free), freed.
    assert_eq!((ao, ab, fo, fb), (8, 4 * 12_000, 8, 4 * 12_000));
}

// Allocations before `main` (a constructor) and in a thread-local destructor, where the thread's
// table may already be released: both must work and be counted.
extern "C" fn before_main() {
    let _g = TagGuard::new(Tag::new(111));
    std::mem::forget(vec![0u8; 77]);
}

#[used]
#[unsafe(link_section = ".init_array")]
static BEFORE_MAIN: extern "C" fn() = before_main;

#[test]
fn allocations_before_main_are_counted() {
    let t = totals(111);
    assert_eq!((t.alloc_objects, t.alloc_bytes), (1, 77));
}

struct AllocatesOnDrop;

impl Drop for AllocatesOnDrop {
    fn drop(&mut self) {
        let _g = TagGuard::new(Tag::new(112));
        let kept = vec![1u8; 33];
        drop(std::hint::black_box(vec![2u8; 44]));
        std::mem::forget(kept);
    }
}

thread_local! {
    static LATE: AllocatesOnDrop = const { AllocatesOnDrop };
}

#[test]
fn allocations_during_tls_teardown_are_counted() {
    for _ in 0..3 {
        std::thread::spawn(|| {
            LATE.with(|_| ()); // registered before the thread's first allocation below
            drop(std::hint::black_box(vec![0u8; 8]));
        })
        .join()
        .unwrap();
    }
    let t = totals(112);
    assert_eq!(
        (t.alloc_objects, t.alloc_bytes, t.free_objects, t.free_bytes),
        (6, 3 * 77, 3, 3 * 44)
    );
}

/// A pointer the allocator never returned, freed through it: the process aborts with a message
/// naming the pointer, on the fast path and on realloc, instead of freeing `ptr - 8`.
#[test]
fn a_pointer_that_is_not_ours_aborts_with_a_message() {
    const CHILD: &str = "TRACING_PROF_ALLOC_NOT_OURS";
    if let Ok(how) = std::env::var(CHILD) {
        static WRAPPED: TaggingAllocator<System> = TaggingAllocator::new(System);
        let layout = Layout::from_size_align(64, 8).unwrap();
        // SAFETY: deliberately breaks the contract: the block comes from System, and is zeroed
        // so that its "header" is not ours.
        unsafe {
            let p = System
                .alloc_zeroed(Layout::from_size_align(128, 8).unwrap())
                .add(64);
            match how.as_str() {
                "dealloc" => WRAPPED.dealloc(p, layout),
                _ => {
                    WRAPPED.realloc(p, layout, 256);
                }
            }
        }
        unreachable!("the allocator returned");
    }
    for how in ["dealloc", "realloc"] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_pointer_that_is_not_ours_aborts_with_a_message",
            ])
            .env(CHILD, how)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{how}: {stderr}");
        assert!(
            stderr.contains("tracing-prof-alloc: freed or reallocated pointer 0x")
                && stderr.contains("has no header of ours"),
            "{how}: {stderr}"
        );
    }
}

/// An inner allocator that records whether it was ever handed a layout that `Layout` itself
/// would refuse, and allocates nothing.
struct Strict;

static STRICT_SAW_INVALID: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

// SAFETY: never returns memory (null is always allowed); only checks what it is given.
unsafe impl GlobalAlloc for Strict {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if Layout::from_size_align(layout.size(), layout.align()).is_err() {
            STRICT_SAW_INVALID.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        std::ptr::null_mut()
    }
    unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {}
}

/// Alignments a `Layout` allows, up to 2^62: the header arithmetic never wraps (it did, and
/// handed the inner allocator an invalid layout) and the answer is null, in every build.
#[test]
fn alignments_near_isize_max_never_reach_the_inner_allocator_invalid() {
    static WRAPPED: TaggingAllocator<Strict> = TaggingAllocator::new(Strict);
    for shift in [20, 40, 61, 62] {
        for size in [1usize, 8, 4096] {
            let Ok(layout) = Layout::from_size_align(size, 1 << shift) else {
                continue;
            };
            // SAFETY: valid layouts; null is an allowed answer and nothing is freed.
            unsafe {
                assert!(WRAPPED.alloc(layout).is_null());
                assert!(WRAPPED.alloc_zeroed(layout).is_null());
            }
        }
    }
    assert!(
        !STRICT_SAW_INVALID.load(std::sync::atomic::Ordering::SeqCst),
        "the inner allocator was handed an invalid layout"
    );
}
