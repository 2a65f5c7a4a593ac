//! Memory incidents: the heap's peak, kept with its span paths' exact bytes and its sampled
//! stacks after the memory is freed, written as `heap_peak` and `span_memory_peak`, served at
//! `?peak=1`, read back by `go tool pprof`; and what the resident set is made of.

use tracing_prof_test_support as common;

use std::time::Duration;
use tracing_prof::{FileExporter, Profiler, TaggingAllocator};
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: TaggingAllocator<std::alloc::System> = TaggingAllocator::new(std::alloc::System);

const MIB: usize = 1 << 20;

/// One profiler at a time in this process.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[inline(never)]
fn spike_buffer() -> Vec<u8> {
    let v = vec![1u8; 64 * MIB];
    std::hint::black_box(&v);
    v
}

/// A 64 MiB spike under one span, held 300 ms (15 readings at 20 ms) and freed; then a
/// 16 MiB plateau under another, held. The peak names the spike's span with its exact bytes,
/// the plateau's span with none; its sampled stack is the function that allocated; the files
/// and the endpoint's `?peak=1` carry it, with when and how much.
#[test]
fn the_peak_keeps_the_spike_after_it_is_freed() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .peak_every(Some(Duration::from_millis(20)))
        .sink(FileExporter::new(dir.path()))
        .build()
        .unwrap();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    let plateau = tracing::dispatcher::with_default(&dispatch, || {
        tracing::info_span!("peak_spike").in_scope(|| {
            let spike = spike_buffer();
            std::thread::sleep(Duration::from_millis(300));
            drop(spike);
        });
        tracing::info_span!("peak_plateau").in_scope(|| {
            let v = vec![2u8; 16 * MIB];
            std::thread::sleep(Duration::from_millis(100));
            v
        })
    });
    let profiler = guard.profiler().clone();
    let now = profiler.snapshot();
    assert_eq!(
        now.path(&["peak_spike"]).unwrap().memory.inuse_bytes,
        0,
        "freed by now"
    );
    let at_peak = profiler.peak().expect("a peak was read");
    let peak = at_peak.peak.expect("the peak's mark");
    let spike = at_peak.path(&["peak_spike"]).expect("the spike's path");
    assert_eq!(spike.memory.inuse_bytes, (64 * MIB) as u64, "exact");
    assert_eq!(
        at_peak
            .path(&["peak_plateau"])
            .map_or(0, |p| p.memory.inuse_bytes),
        0,
        "the plateau came after"
    );
    assert!(
        peak.inuse_bytes >= (64 * MIB) as u64 && peak.inuse_bytes < (80 * MIB) as u64,
        "{peak:?}"
    );
    // The sampled stack: a 64 MiB block is always sampled, and its estimate is within a few
    // of the 128 sample points (512 KiB apart) it covers.
    let stack = at_peak
        .stacks
        .iter()
        .find(|s| s.frames.iter().any(|f| &*f.name == "peak_spike") && s.memory.inuse_bytes > 0)
        .expect("the spike's sampled stack");
    assert!(
        stack
            .code
            .iter()
            .any(|f| f.function.ends_with("spike_buffer")),
        "{:?}",
        stack.code
    );
    let estimate = stack.memory.inuse_bytes as f64 / (64 * MIB) as f64;
    assert!((0.95..1.05).contains(&estimate), "{estimate}");

    // Files: written at the next export, read back by go tool pprof, with the comment.
    guard.flush(Duration::from_secs(30)).unwrap();
    for kind in ["heap_peak", "span_memory_peak"] {
        let file = dir.path().join(format!("{kind}.latest.pb.gz"));
        assert!(file.exists(), "{kind}: {:?}", std::fs::read_dir(dir.path()));
        let decoded = tracing_prof::model::Profile::decode(&std::fs::read(&file).unwrap()).unwrap();
        assert!(
            decoded
                .comments
                .iter()
                .any(|c| c.starts_with("tracing-prof: at the peak of 64.")),
            "{:?}",
            decoded.comments
        );
    }
    if common::have_go() {
        let top = common::pprof(
            &["-top", "-sample_index=inuse_space"],
            dir.path().join("span_memory_peak.latest.pb.gz"),
        );
        assert!(
            top.lines()
                .any(|l| l.contains("64MB") && l.contains("peak_spike")),
            "{top}"
        );
    }
    // The endpoint: the same peak, in pprof and as text.
    let handler = tracing_prof::export::PprofHandler::new(profiler.clone());
    let text = handler.handle("GET", "/debug/pprof/span_memory?peak=1&debug=1", None);
    assert_eq!(text.status, 200);
    let body = String::from_utf8_lossy(&text.body);
    assert!(body.contains("at the peak of "), "{body}");
    assert!(body.contains("peak_spike"), "{body}");
    let bad = handler.handle("GET", "/debug/pprof/cpu?peak=1", None);
    assert_eq!(bad.status, 400);
    let pprof = handler.handle("GET", "/debug/pprof/heap?peak=1", None);
    assert_eq!(pprof.status, 200);
    let decoded = tracing_prof::model::Profile::decode(&pprof.body).unwrap();
    assert!(
        decoded
            .comments
            .iter()
            .any(|c| c.contains("at the peak of"))
    );

    // A reset forgets it: the next readings find the plateau's level.
    profiler.reset_peak();
    std::thread::sleep(Duration::from_millis(200));
    let after = profiler.peak().expect("read again");
    assert_eq!(
        after.path(&["peak_plateau"]).unwrap().memory.inuse_bytes,
        (16 * MIB) as u64
    );
    assert!(
        after
            .path(&["peak_spike"])
            .is_none_or(|p| p.memory.inuse_bytes == 0)
    );
    drop(plateau);
    drop(guard);
}

/// `VmRSS` of `/proc/self/status`, in bytes: the kernel's own count, read independently.
fn vm_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// 32 MiB mapped directly with `mmap` and touched: the resident set and its anonymous part
/// grow by it, the heap does not, and the breakdown says it is memory the heap (and glibc's
/// allocator) does not explain.
#[test]
fn memory_the_allocator_never_saw_is_what_the_heap_does_not_explain() {
    let _serial = serial();
    let (_layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .allocator_stats(tracing_prof::GlibcMalloc)
        .build()
        .unwrap();
    let profiler = guard.profiler().clone();
    let before = profiler.process_memory().expect("Linux 4.14 or later");
    let len = 32 * MIB;
    // SAFETY: an anonymous private mapping of `len` bytes, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping above is `len` bytes, readable and writable.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 1, len) };
    let after = profiler.process_memory().unwrap();
    let rss = vm_rss();
    let grew = |a: u64, b: u64| b as i64 - a as i64;
    let mib = |v: i64| v as f64 / MIB as f64;
    assert!(
        (31.0..34.0).contains(&mib(grew(before.rss_bytes, after.rss_bytes))),
        "{before:?} {after:?}"
    );
    assert!(
        (31.0..34.0).contains(&mib(grew(before.anon_bytes, after.anon_bytes))),
        "{before:?} {after:?}"
    );
    assert!(
        mib(grew(before.heap_inuse_bytes, after.heap_inuse_bytes)).abs() < 1.0,
        "the heap did not see it: {before:?} {after:?}"
    );
    assert!(
        (31.0..34.0).contains(&mib(after.unexplained_bytes() - before.unexplained_bytes())),
        "{before:?} {after:?}"
    );
    // The same resident set as the kernel's other count, read just after.
    assert!(
        mib(grew(after.rss_bytes, rss)).abs() < 2.0,
        "smaps_rollup {} against VmRSS {rss}",
        after.rss_bytes
    );
    if cfg!(target_env = "gnu") {
        let a = after.allocator.as_ref().expect("glibc 2.33 or later");
        assert!(a.held_bytes >= after.heap_inuse_bytes, "{after:?}");
        let text = after.describe();
        assert!(text.contains("glibc malloc (mallinfo2) holds"), "{text}");
    }
    // Every snapshot carries it, and the memory profiles say it.
    let snapshot = profiler.snapshot();
    assert!(snapshot.process_memory.is_some());
    let heap = snapshot.profile(tracing_prof::ProfileKind::SpanMemory);
    assert!(
        heap.comments
            .iter()
            .any(|c| c.starts_with("tracing-prof: process memory: RSS ")),
        "{:?}",
        heap.comments
    );
    // SAFETY: the mapping made above, `len` bytes, used no more.
    assert_eq!(unsafe { libc::munmap(p, len) }, 0);
    drop(guard);
}
