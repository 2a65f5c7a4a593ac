//! CPU sampling at 1000 Hz while 8 threads allocate, free, enter spans, and spawn and end
//! short-lived threads that do the same: no crash, no deadlock (a watchdog aborts after two
//! minutes), and the exact memory counters lose nothing: every path's in-use memory returns to
//! its value before and every allocation is counted once.

use std::alloc::{Layout, alloc, dealloc};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tracing_prof::{Profiler, Snapshot};
use tracing_subscriber::prelude::*;

const THREADS: usize = 8;
const RUN: Duration = Duration::from_millis(1500);
const PATHS: [&[&str]; 3] = [&["cs_outer"], &["cs_outer", "cs_inner"], &["cs_short"]];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Allocates and frees `n` random blocks under the current span (and nothing else: the live
/// blocks are kept on the stack); returns (objects, bytes).
fn churn(rng: &mut Rng, n: usize) -> (u64, u64) {
    let mut live = [(0usize, Layout::new::<u8>()); 16];
    let mut len = 0;
    let (mut objects, mut bytes) = (0, 0);
    for _ in 0..n {
        if len < live.len() && rng.next().is_multiple_of(2) {
            let size = 1 + (rng.next() % 4096) as usize;
            let layout =
                Layout::from_size_align(size, [8, 16, 64][(rng.next() % 3) as usize]).unwrap();
            // SAFETY: non-zero size.
            let p = unsafe { alloc(layout) };
            assert!(!p.is_null());
            live[len] = (p as usize, layout);
            len += 1;
            objects += 1;
            bytes += size as u64;
        } else if len > 0 {
            len -= 1;
            let (p, layout) = live[len];
            // SAFETY: a live block with its layout.
            unsafe { dealloc(p as *mut u8, layout) };
        }
    }
    for &(p, layout) in &live[..len] {
        // SAFETY: as above.
        unsafe { dealloc(p as *mut u8, layout) };
    }
    (objects, bytes)
}

fn memory(s: &Snapshot) -> Vec<(u64, u64, u64, u64)> {
    PATHS
        .iter()
        .map(|names| {
            s.path(names).map_or((0, 0, 0, 0), |p| {
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
fn sampling_at_1000_hz_under_churn_loses_nothing() {
    if crate::isolated(
        module_path!(),
        "sampling_at_1000_hz_under_churn_loses_nothing",
    ) {
        return;
    }
    let done = Arc::new(AtomicBool::new(false));
    {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let start = Instant::now();
            while !done.load(Ordering::Relaxed) {
                if start.elapsed() > Duration::from_secs(120) {
                    eprintln!("cpu_stress: no progress in 120 s: a deadlock");
                    std::process::abort();
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
    }
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_millis(200))
        .cpu_sampling(1000)
        .build()
        .unwrap();
    tracing_subscriber::registry().with(layer).init();
    let start = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|i| {
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9 + i as u64 * 7919);
                let outer = tracing::info_span!("cs_outer");
                let inner = tracing::info_span!(parent: &outer, "cs_inner");
                start.wait();
                start.wait();
                let mut expected = [(0u64, 0u64); 3];
                let t = Instant::now();
                let mut round = 0u64;
                while t.elapsed() < RUN {
                    let add = |e: &mut (u64, u64), (o, b): (u64, u64)| {
                        e.0 += o;
                        e.1 += b;
                    };
                    let got = outer.in_scope(|| churn(&mut rng, 64));
                    add(&mut expected[0], got);
                    let got = outer.in_scope(|| inner.in_scope(|| churn(&mut rng, 64)));
                    add(&mut expected[1], got);
                    round += 1;
                    if round.is_multiple_of(32) {
                        // A thread that is armed, allocates in a span and ends.
                        let seed = rng.next();
                        let got = std::thread::spawn(move || {
                            tracing::info_span!("cs_short")
                                .in_scope(|| churn(&mut Rng(seed | 1), 64))
                        })
                        .join()
                        .unwrap();
                        add(&mut expected[2], got);
                    }
                }
                expected
            })
        })
        .collect();
    start.wait();
    let before = memory(&guard.profiler().snapshot());
    start.wait();
    let mut expected = [(0u64, 0u64); 3];
    for w in workers {
        for (e, got) in expected.iter_mut().zip(w.join().expect("worker panicked")) {
            e.0 += got.0;
            e.1 += got.1;
        }
    }
    let after = memory(&guard.profiler().snapshot());
    for (i, names) in PATHS.iter().enumerate() {
        let (b, a, e) = (before[i], after[i], expected[i]);
        assert_eq!((a.2, a.3), (b.2, b.3), "{names:?}: in-use did not return");
        assert_eq!(
            (a.0 - b.0, a.1 - b.1),
            e,
            "{names:?}: allocations lost or double counted"
        );
    }
    let stats = guard.profiler().stats();
    assert!(stats.cpu.samples > 500, "{:?}", stats.cpu);
    assert!(
        stats.cpu.threads_armed > 50,
        "short threads were armed: {:?}",
        stats.cpu
    );
    assert_eq!(stats.cpu.foreign_signals, 0);
    eprintln!("{:?}", stats.cpu);
    drop(guard);
    done.store(true, Ordering::Relaxed);
}
