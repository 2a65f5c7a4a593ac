//! The giant-allocation ring under concurrent writers and a reader: every record the reader
//! accepts is whole (its size and its tag come from the same request), and every request is
//! either read or counted as missed. (Its own process: the giant policy is process-wide.)
//!
//! The ring's ordering is what makes this hold on any CPU; on x86 a torn record needs the
//! compiler or a preempted writer to interleave, so this is a stress check of the protocol, not a
//! proof: the proof is the sequence lock's fences, documented in `giant.rs`.

use tracing_prof_alloc::__private::{giant_allocations_since, set_giant_policy};
use tracing_prof_alloc::{Tag, TagGuard, TaggingAllocator};

#[global_allocator]
static GLOBAL: TaggingAllocator<std::alloc::System> = TaggingAllocator::new(std::alloc::System);

const THRESHOLD: usize = 1 << 40;
const WRITERS: u32 = 4;
const PER_WRITER: u32 = 10_000;

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

#[test]
fn concurrent_giant_records_are_never_torn() {
    set_giant_policy(Some(THRESHOLD), true);
    let per_writer = shrunk(PER_WRITER as usize) as u32;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            std::thread::spawn(move || {
                let tag = 100 + w;
                let _g = TagGuard::new(Tag::new(tag));
                for i in 0..per_writer {
                    // The size names the tag: a record mixing two requests shows it.
                    let size = THRESHOLD + (tag as usize) * 4096 + (i as usize % 4096);
                    let mut v: Vec<u8> = Vec::new();
                    assert!(v.try_reserve_exact(size).is_err());
                    // Paced so the reader reads most records while others are written.
                    for _ in 0..2000 {
                        std::hint::spin_loop();
                    }
                }
            })
        })
        .collect();
    let (mut read, mut missed, mut next) = (0u64, 0u64, 0u64);
    let mut finished = false;
    while !finished {
        finished = writers.iter().all(|w| w.is_finished());
        let (records, m, n) = giant_allocations_since(next);
        missed += m;
        next = n;
        for r in &records {
            let named = (r.size - THRESHOLD) / 4096;
            assert_eq!(named as u32, r.tag.get(), "torn record: {r:?}");
            assert!(r.refused, "{r:?}");
        }
        read += records.len() as u64;
    }
    for w in writers {
        w.join().unwrap();
    }
    set_giant_policy(None, false);
    let total = u64::from(WRITERS * per_writer);
    eprintln!("read {read}, missed {missed}");
    assert!(read > 0, "the reader read nothing");
    assert_eq!(read + missed, total, "read {read}, missed {missed}");
}
