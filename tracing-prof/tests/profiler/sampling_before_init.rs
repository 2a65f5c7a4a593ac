//! Threads that were running before the profiler started (a `#[tokio::main]` runtime's workers,
//! which almost every tokio service starts before it sets the profiler up) sample their heap
//! from the start, unbiased: a new user's server held 16 KiB per connection, and the heap
//! profile read 0.45-0.84x of the exact counters (pooled 0.74x over eight captures, z = -6.8),
//! because such a thread looked at the rate again only every 16 MiB while sampling was off.
//!
//! Each round: four threads allocate before the profiler is built (seeded, as a thread's
//! sampler is before it ever samples), the profiler starts at the default rate, each thread
//! then allocates and holds 256 blocks of 16 KiB (4 MiB) under a span; the sampled in-use
//! estimate of that span path is compared with its exact counter. Over 24 rounds (24 seeds),
//! the mean ratio must be within three standard errors of 1, and within 5% of it.

use std::sync::{Arc, Barrier};
use std::time::Duration;
use tracing_prof::Profiler;
use tracing_subscriber::prelude::*;

const THREADS: usize = 4;
const BLOCKS: usize = 256;
const BLOCK: usize = 16 * 1024;
const ROUNDS: u64 = 24;

/// One round: the sampled estimate of what the threads hold, over the exact bytes held.
fn round(seed: u64) -> f64 {
    // As in a new process: sampling off (a profiler dropped leaves its rate in place).
    tracing_prof::alloc::__private::set_sample_rate(0);
    let built = Arc::new(Barrier::new(THREADS + 1));
    let held = Arc::new(Barrier::new(THREADS + 1));
    let freed = Arc::new(Barrier::new(THREADS + 1));
    let dispatch: Arc<std::sync::OnceLock<tracing::Dispatch>> = Arc::default();
    let threads: Vec<_> = (0..THREADS as u64)
        .map(|i| {
            let (built, held, freed, dispatch) = (
                Arc::clone(&built),
                Arc::clone(&held),
                Arc::clone(&freed),
                Arc::clone(&dispatch),
            );
            std::thread::spawn(move || {
                tracing_prof::alloc::__private::seed_this_thread(seed * 1000 + i);
                // Running before the profiler: allocations at rate 0.
                for _ in 0..64 {
                    drop(std::hint::black_box(vec![0u8; 1024]));
                }
                built.wait();
                let dispatch = dispatch.get().expect("the round's subscriber").clone();
                let blocks: Vec<Vec<u8>> = tracing::dispatcher::with_default(&dispatch, || {
                    tracing::info_span!("held_before_init").in_scope(|| {
                        (0..BLOCKS)
                            .map(|_| std::hint::black_box(vec![1u8; BLOCK]))
                            .collect()
                    })
                });
                held.wait();
                freed.wait();
                drop(blocks);
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(20)); // they allocate before the profiler
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .build()
        .expect("a profiler");
    let _ = dispatch.set(tracing::Dispatch::new(
        tracing_subscriber::registry().with(layer),
    ));
    built.wait();
    held.wait();
    let snapshot = guard.profiler().snapshot();
    let exact = snapshot
        .path(&["held_before_init"])
        .expect("the span path")
        .memory
        .inuse_bytes;
    let sampled: u64 = snapshot
        .stacks
        .iter()
        .filter(|s| {
            s.frames
                .last()
                .is_some_and(|f| &*f.name == "held_before_init")
        })
        .map(|s| s.memory.inuse_bytes)
        .sum();
    freed.wait();
    for t in threads {
        t.join().unwrap();
    }
    drop(guard);
    assert!(exact >= (THREADS * BLOCKS * BLOCK) as u64, "{exact}");
    sampled as f64 / exact as f64
}

/// The mean of `ratios`, and how many standard errors it is from 1.
fn mean_and_z(ratios: &[f64]) -> (f64, f64) {
    let n = ratios.len() as f64;
    let mean = ratios.iter().sum::<f64>() / n;
    let sd = (ratios.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    (mean, (mean - 1.0) / (sd / n.sqrt()).max(1e-9))
}

#[test]
fn threads_started_before_init_sample_from_the_start() {
    if crate::isolated(
        module_path!(),
        "threads_started_before_init_sample_from_the_start",
    ) {
        return;
    }
    let ratios: Vec<f64> = (1..=ROUNDS).map(round).collect();
    let (mean, z) = mean_and_z(&ratios);
    eprintln!("sampled / exact per round {ratios:.3?}\nmean {mean:.4}, z {z:.2}");
    assert!(
        z.abs() < 3.0 && (mean - 1.0).abs() < 0.05,
        "biased: mean {mean:.4} of sampled over exact, z = {z:.2} over {ROUNDS} seeds"
    );
}
