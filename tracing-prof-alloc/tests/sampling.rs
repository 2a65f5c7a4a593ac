//! Heap sampling at rate 1 (every allocation sampled): exact sample counts, realloc into and out
//! of the sampled layout, every alignment, lifetimes, and the per-thread view.
//!
//! The rate is process-wide; every test here sets it to 1 and uses its own tags.

use std::alloc::{GlobalAlloc, Layout, System};
use std::time::Duration;
use tracing_prof_alloc::__private::TagTotals;
use tracing_prof_alloc::__private::{
    StackTotals, read_stacks, read_threads, read_totals, set_sample_rate, set_temporary_threshold,
};
use tracing_prof_alloc::{Tag, TagGuard, TaggingAllocator};

#[global_allocator]
static GLOBAL: TaggingAllocator<System> = TaggingAllocator::new(System);

fn stacks_of(tag: u32) -> Vec<StackTotals> {
    read_stacks()
        .into_iter()
        .filter(|s| s.tag == Tag::new(tag))
        .collect()
}

fn sum(tag: u32) -> (u64, u64, u64, u64) {
    stacks_of(tag).iter().fold((0, 0, 0, 0), |a, s| {
        (
            a.0 + s.samples,
            a.1 + s.sampled_bytes,
            a.2 + s.freed_samples,
            a.3 + s.freed_sampled_bytes,
        )
    })
}

fn totals(tag: u32) -> TagTotals {
    let mut all = vec![TagTotals::default(); tag as usize + 1];
    read_totals(&mut all);
    all[tag as usize]
}

#[inline(never)]
fn make_boxes(n: usize, size: usize) -> Vec<Vec<u8>> {
    (0..n).map(|_| vec![1u8; size]).collect()
}

#[test]
fn rate_one_samples_every_allocation_exactly() {
    assert!(set_sample_rate(1));
    let boxes = {
        let _g = TagGuard::new(Tag::new(200));
        std::hint::black_box(make_boxes(100, 1000))
    };
    let (n, bytes, freed, _) = sum(200);
    // The 100 boxes and the outer Vec of 100 * 24 bytes.
    assert_eq!((n, bytes, freed), (101, 100 * 1000 + 2400, 0));
    let est: f64 = stacks_of(200).iter().map(|s| s.alloc_objects).sum();
    assert_eq!(est, 101.0, "weights are exactly 1 at rate 1");
    assert!(stacks_of(200).iter().all(|s| !s.ips.is_empty()));
    drop(boxes);
    let (n, bytes, freed, freed_bytes) = sum(200);
    assert_eq!((freed, freed_bytes), (n, bytes));
    assert!(stacks_of(200).iter().all(|s| s.inuse_bytes() == 0));
    // The exact counters agree.
    let t = totals(200);
    assert_eq!((t.alloc_objects, t.alloc_bytes), (101, 102_400));
    assert_eq!(t.inuse_bytes(), 0);
}

#[test]
fn sampled_blocks_keep_alignment_zeroes_and_contents_through_realloc() {
    assert!(set_sample_rate(1));
    let _g = TagGuard::new(Tag::new(201));
    for align in [1usize, 8, 16, 32, 64, 4096] {
        for size in [1usize, 24, 100, 5000] {
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: non-zero sizes; every block is freed with its current layout.
            unsafe {
                let p = GLOBAL.alloc_zeroed(layout);
                assert_eq!(p as usize % align, 0);
                assert!(std::slice::from_raw_parts(p, size).iter().all(|&b| b == 0));
                p.write_bytes(0x5A, size);
                let q = GLOBAL.realloc(p, layout, size * 3);
                assert_eq!(q as usize % align, 0);
                assert!(
                    std::slice::from_raw_parts(q, size)
                        .iter()
                        .all(|&b| b == 0x5A)
                );
                let grown = Layout::from_size_align(size * 3, align).unwrap();
                let r = GLOBAL.realloc(q, grown, size);
                assert!(
                    std::slice::from_raw_parts(r, size)
                        .iter()
                        .all(|&b| b == 0x5A)
                );
                GLOBAL.dealloc(r, layout);
            }
        }
    }
    drop(_g);
    let (n, bytes, freed, freed_bytes) = sum(201);
    // Each block: one allocation and two reallocs, each a sample (free + new allocation).
    assert_eq!(n, 6 * 4 * 3);
    assert_eq!((freed, freed_bytes), (n, bytes));
    // The exact counters count a realloc the same way: they agree with the samples at rate 1.
    let t = totals(201);
    assert_eq!(
        (
            t.alloc_objects,
            t.alloc_bytes,
            t.free_objects,
            t.inuse_bytes()
        ),
        (n, bytes, n, 0)
    );
}

#[test]
fn plain_blocks_become_samples_on_realloc() {
    // Allocated with sampling off (plain layout), grown with sampling on.
    assert!(set_sample_rate(0));
    let mut v: Vec<u8> = {
        let _g = TagGuard::new(Tag::new(202));
        Vec::with_capacity(10)
    };
    v.extend_from_slice(b"0123456789");
    assert!(set_sample_rate(1));
    {
        let _g = TagGuard::new(Tag::new(203));
        v.reserve_exact(1000);
    }
    assert_eq!(&v[..], b"0123456789");
    assert_eq!(
        sum(203).0,
        1,
        "the realloc is sampled under the span current at it"
    );
    drop(v);
    assert_eq!(sum(203).2, 1);
    assert_eq!(
        totals(202).inuse_bytes(),
        0,
        "exact counters keep the block's first tag"
    );
}

#[test]
fn lifetimes_and_temporaries_are_counted_per_bucket() {
    assert!(set_sample_rate(1));
    set_temporary_threshold(Duration::from_millis(100));
    let _g = TagGuard::new(Tag::new(204));
    let held = make_boxes(10, 64);
    for _ in 0..40 {
        drop(std::hint::black_box(vec![0u8; 32]));
    }
    std::thread::sleep(Duration::from_millis(300));
    drop(held);
    drop(_g);
    let stacks = stacks_of(204);
    let temp: f64 = stacks.iter().map(|s| s.temporary_objects).sum();
    let freed: u64 = stacks.iter().map(|s| s.freed_samples).sum();
    let long: f64 = stacks.iter().map(|s| s.lifetime_objects[6]).sum(); // 100 ms .. 1 s
    assert_eq!(freed, 40 + 10 + 1);
    assert_eq!(temp, 40.0);
    assert_eq!(long, 11.0);
}

#[test]
fn per_thread_in_use_follows_the_allocating_thread() {
    // The allocating thread stays alive (parked at the barrier, which allocates nothing)
    // until both readings are taken: an exited thread's table is reused by the next thread,
    // and another test's thread would then count its own allocations on the same index.
    let parked = std::sync::Arc::new(std::sync::Barrier::new(2));
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn({
        let parked = std::sync::Arc::clone(&parked);
        move || {
            let blocks = make_boxes(50, 4000);
            // "<pid>/task/<tid>"
            let link = std::fs::read_link("/proc/thread-self").unwrap();
            let tid: u64 = link.file_name().unwrap().to_str().unwrap().parse().unwrap();
            let me = read_threads().into_iter().find(|t| t.tid == tid).unwrap();
            assert!(me.alive);
            tx.send((me.index, blocks)).unwrap();
            parked.wait();
        }
    });
    let (index, blocks) = rx.recv().unwrap();
    let find = || {
        read_threads()
            .into_iter()
            .find(|t| t.index == index)
            .unwrap()
    };
    let before = find();
    assert!(before.alloc_bytes >= 200_000 && before.inuse_bytes >= 200_000);
    drop(blocks); // freed by this thread, credited to the one that allocated
    let after = find();
    parked.wait();
    thread.join().unwrap();
    assert_eq!(before.inuse_bytes - after.inuse_bytes, 50 * 4000 + 50 * 24);
    assert_eq!(before.inuse_objects - after.inuse_objects, 51);
}
