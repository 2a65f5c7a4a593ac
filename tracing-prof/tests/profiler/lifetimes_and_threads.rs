//! Lifetimes and temporary allocations are exact at sampling rate 1; the per-thread view names
//! threads and credits frees to the thread that allocated. Both read back by `go tool pprof`.

use tracing_prof_test_support as common;

use std::sync::mpsc;
use std::time::Duration;
use tracing_prof::{ProfileKind, Profiler};
use tracing_subscriber::prelude::*;

#[inline(never)]
fn scratch() {
    drop(std::hint::black_box(vec![0u8; 32]));
}

#[test]
fn lifetimes_temporaries_and_threads() {
    if crate::isolated(module_path!(), "lifetimes_temporaries_and_threads") {
        return;
    }
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .heap_sampling(1)
        .temporary_threshold(Duration::from_millis(100))
        .build()
        .unwrap();
    tracing_subscriber::registry().with(layer).init();
    let profiler = guard.profiler().clone();

    // Holders allocated outside the span, so that the span's own allocations are only these.
    let mut held: Vec<Vec<u8>> = Vec::with_capacity(20);
    let mut kept: Vec<Vec<u8>> = Vec::with_capacity(5);
    tracing::info_span!("lt_work").in_scope(|| {
        for _ in 0..300 {
            scratch();
        }
        for _ in 0..20 {
            held.push(vec![1u8; 64]);
        }
        for _ in 0..5 {
            kept.push(vec![2u8; 128]);
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    drop(held);

    let p = profiler.snapshot();
    let path = p.path(&["lt_work"]).unwrap();
    let l = p.lifetimes(path);
    assert_eq!((l.temporary_objects, l.temporary_bytes), (300, 300 * 32));
    assert_eq!(l.freed(), 320);
    assert_eq!(
        l.freed_objects.iter().take(6).sum::<u64>(),
        300,
        "under 100 ms"
    );
    assert_eq!(
        l.freed_objects[6], 20,
        "100 ms to 1 s: {:?}",
        l.freed_objects
    );
    assert_eq!(l.freed_bytes[6], 20 * 64);
    // Still live when lt_work closed: the 20 held and the 5 kept.
    assert_eq!(path.outlived, (25, 20 * 64 + 5 * 128));
    let m = p.sampled_memory(&["lt_work"]);
    assert_eq!((m.inuse_objects, m.inuse_bytes), (5, 5 * 128));
    assert_eq!(
        (m.alloc_objects, m.alloc_bytes),
        (325, 300 * 32 + 20 * 64 + 5 * 128)
    );

    // Per thread: a named thread allocates, this one frees.
    let (to_main, from_worker) = mpsc::channel();
    let (to_worker, from_main) = mpsc::channel::<()>();
    let worker = std::thread::Builder::new()
        .name("lt-worker".into())
        .spawn(move || {
            let blocks: Vec<Box<[u8; 1000]>> = (0..10).map(|_| Box::new([3u8; 1000])).collect();
            to_main.send(blocks).unwrap();
            from_main.recv().unwrap(); // stay alive, idle, while main looks
        })
        .unwrap();
    let blocks = from_worker.recv().unwrap();
    let find = |p: &tracing_prof::Snapshot| {
        p.threads
            .iter()
            .find(|t| t.name == "lt-worker")
            .cloned()
            .unwrap_or_else(|| panic!("no lt-worker in {:?}", p.threads))
    };
    let with_blocks = profiler.snapshot();
    let before = find(&with_blocks);
    assert!(before.alive && before.memory.alloc_bytes >= 10_000);
    drop(blocks);
    let after = find(&profiler.snapshot());
    // The ten boxes and the vector that held them.
    assert_eq!(
        before.memory.inuse_bytes - after.memory.inuse_bytes,
        10_000 + 10 * 8
    );
    assert_eq!(before.memory.inuse_objects - after.memory.inuse_objects, 11);

    if common::have_go() {
        let file = common::write_profile(&p, ProfileKind::Lifetimes, "lifetimes");
        let raw = common::raw(&file);
        let under = |k: &[String]| {
            k.first().map(String::as_str) == Some("profiler::lifetimes_and_threads::lt_work [span]")
        };
        assert_eq!(raw.sum("temporary_objects", under), 300);
        assert_eq!(raw.sum("freed_objects", under), 320);
        assert_eq!(
            raw.value(
                &["profiler::lifetimes_and_threads::lt_work [span]"],
                "outlived_objects"
            ),
            25
        );
        let top = common::pprof(&["-top", "-sample_index=temporary_space"], &file);
        assert!(
            top.contains("profiler::lifetimes_and_threads::scratch"),
            "{top}"
        );
        let tags = common::pprof(&["-tags", "-sample_index=freed_objects"], &file);
        assert!(tags.contains("lifetime") && tags.contains("<1s"), "{tags}");
        // Only buckets with blocks in them: no zero rows for the temporary and outlived
        // samples, whose sample types say what they are.
        assert!(
            !tags.contains("temporary") && !tags.contains("outlived") && !tags.contains(" 0 ("),
            "{tags}"
        );

        let file = common::write_profile(&with_blocks, ProfileKind::Threads, "threads");
        let top = common::pprof(
            &["-top", "-nodefraction=0", "-sample_index=inuse_space"],
            &file,
        );
        assert!(top.contains("thread lt-worker"), "{top}");
        let tags = common::pprof(&["-tags"], &file);
        assert!(tags.contains("lt-worker"), "{tags}");
    }
    to_worker.send(()).unwrap();
    worker.join().unwrap();
    drop(kept);
}
