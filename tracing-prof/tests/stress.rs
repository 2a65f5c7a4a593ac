//! 8 threads, each a million alloc/realloc/free calls of random sizes and alignments under
//! random span nesting: every span path's in-use memory returns exactly to its value before,
//! and every allocation is counted. Meanwhile a reader takes snapshots and checks that it never
//! sees a free before its allocation.

use std::alloc::{Layout, alloc, dealloc, realloc};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use tracing::Span;
use tracing_prof::{ProfileLayer, Snapshot, TaggingAllocator};
use tracing_prof_alloc::__private::TagTotals;
use tracing_prof_alloc::__private::read_totals;
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: TaggingAllocator<std::alloc::System> = TaggingAllocator::new(std::alloc::System);

const THREADS: usize = 8;
const OPS: usize = 1_000_000;
const PATHS: [&[&str]; 5] = [
    &["st_a"],
    &["st_a", "st_b"],
    &["st_a", "st_b", "st_c"],
    &["st_d"],
    &["st_d", "st_b"],
];

/// One callsite, used under two parents: two paths.
fn span_b(parent: &Span) -> Span {
    tracing::info_span!(parent: parent, "st_b")
}

/// The number of operations, divided by `TRACING_PROF_TEST_SHRINK` when set (`.ci/run` runs a
/// reduced version of this test under valgrind, which is about 50 times slower).
fn shrunk(n: usize) -> usize {
    let by = std::env::var("TRACING_PROF_TEST_SHRINK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    (n / by).max(1)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[derive(Clone, Copy)]
struct Block {
    ptr: usize,
    layout: Layout,
    path: usize,
}

/// Expected (alloc_objects, alloc_bytes) per path, counted by the worker itself.
type Expected = [(u64, u64); 5];

fn worker(seed: u64, start: Arc<Barrier>) -> Expected {
    let a = tracing::info_span!("st_a");
    let ab = span_b(&a);
    let abc = tracing::info_span!(parent: &ab, "st_c");
    let d = tracing::info_span!("st_d");
    let db = span_b(&d);
    let chains: [Vec<&Span>; 5] = [
        vec![&a],
        vec![&a, &ab],
        vec![&a, &ab, &abc],
        vec![&d],
        vec![&d, &db],
    ];
    let mut pool: Vec<Block> = Vec::with_capacity(256);
    // Warm-up: the registry's per-thread stack reaches its depth outside the measured part.
    abc.in_scope(|| a.in_scope(|| ab.in_scope(|| ())));
    start.wait(); // main takes the "before" snapshot
    start.wait();

    let mut rng = Rng(seed);
    let mut expected: Expected = [(0, 0); 5];
    for _ in 0..shrunk(OPS / 64) {
        let path = (rng.next() % 5) as usize;
        let guards: [Option<tracing::span::Entered<'_>>; 3] = {
            let c = &chains[path];
            [
                c.first().map(|s| s.enter()),
                c.get(1).map(|s| s.enter()),
                c.get(2).map(|s| s.enter()),
            ]
        };
        for _ in 0..64 {
            match rng.next() % 3 {
                0 if pool.len() < pool.capacity() => {
                    let size = 1 + (rng.next() % 2048) as usize;
                    let align = match rng.next() % 64 {
                        0 => 4096,
                        n => [1, 8, 16, 64][(n % 4) as usize],
                    };
                    let layout = Layout::from_size_align(size, align).unwrap();
                    // SAFETY: non-zero size.
                    let ptr = unsafe { alloc(layout) };
                    assert!(!ptr.is_null() && (ptr as usize).is_multiple_of(align));
                    // SAFETY: ptr has `size` writable bytes.
                    unsafe { ptr.write(size as u8) };
                    expected[path].0 += 1;
                    expected[path].1 += size as u64;
                    pool.push(Block {
                        ptr: ptr as usize,
                        layout,
                        path,
                    });
                }
                1 if !pool.is_empty() => {
                    let i = (rng.next() as usize) % pool.len();
                    let b = pool[i];
                    let new = 1 + (rng.next() % 4096) as usize;
                    // SAFETY: b is live with b.layout; the first byte is kept by realloc.
                    let q = unsafe { realloc(b.ptr as *mut u8, b.layout, new) };
                    assert!(!q.is_null() && (q as usize).is_multiple_of(b.layout.align()));
                    // SAFETY: q is live and has at least one byte.
                    let first = unsafe { q.read() };
                    assert_eq!(first, b.layout.size() as u8, "content lost in realloc");
                    // SAFETY: as above.
                    unsafe { q.write(new as u8) };
                    // An allocation of the new size, under the block's path.
                    expected[b.path].0 += 1;
                    expected[b.path].1 += new as u64;
                    pool[i] = Block {
                        ptr: q as usize,
                        layout: Layout::from_size_align(new, b.layout.align()).unwrap(),
                        ..b
                    };
                }
                _ if !pool.is_empty() => {
                    let b = pool.swap_remove((rng.next() as usize) % pool.len());
                    // SAFETY: b is live with b.layout.
                    unsafe { dealloc(b.ptr as *mut u8, b.layout) };
                }
                _ => {}
            }
        }
        drop(guards);
    }
    for b in pool.drain(..) {
        // SAFETY: every pooled block is live with its layout.
        unsafe { dealloc(b.ptr as *mut u8, b.layout) };
    }
    expected
}

fn memory(profile: &Snapshot) -> Vec<(u64, u64, u64, u64)> {
    PATHS
        .iter()
        .map(|names| {
            profile.path(names).map_or((0, 0, 0, 0), |p| {
                let m = p.memory;
                (
                    m.alloc_objects,
                    m.alloc_bytes,
                    m.inuse_objects,
                    m.inuse_bytes,
                )
            })
        })
        .collect()
}

#[test]
fn eight_threads_a_million_operations_each() {
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(ProfileLayer::new()),
    )
    .unwrap();
    let start = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|i| {
            let start = Arc::clone(&start);
            std::thread::spawn(move || worker(0x9E37_79B9 + i as u64 * 7919, start))
        })
        .collect();
    start.wait();
    let before = memory(&tracing_prof::core::capture(Default::default()));

    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut totals = vec![TagTotals::default(); 64];
            let mut reads = 0u32;
            while !stop.load(Ordering::Relaxed) {
                read_totals(&mut totals);
                for (tag, t) in totals.iter().enumerate() {
                    assert!(
                        t.free_objects <= t.alloc_objects,
                        "tag {tag}: free seen before alloc: {t:?}"
                    );
                }
                reads += 1;
            }
            reads
        })
    };
    start.wait();

    let mut expected: Expected = [(0, 0); 5];
    for w in workers {
        for (e, got) in expected.iter_mut().zip(w.join().expect("worker panicked")) {
            e.0 += got.0;
            e.1 += got.1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let reads = reader.join().expect("reader saw an inconsistent snapshot");
    let after = memory(&tracing_prof::core::capture(Default::default()));

    for (i, names) in PATHS.iter().enumerate() {
        let (b, a, e) = (before[i], after[i], expected[i]);
        assert_eq!(
            (a.2, a.3),
            (b.2, b.3),
            "{names:?}: in-use did not return to its value before"
        );
        assert_eq!(
            (a.0 - b.0, a.1 - b.1),
            e,
            "{names:?}: allocations lost or double counted"
        );
        assert!(
            e.0 > shrunk(100_000) as u64,
            "{names:?}: too few allocations to mean anything"
        );
    }
    assert!(reads > 0);
}
