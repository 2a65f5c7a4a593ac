//! Giant allocations are reported with their span path; refused ones return an error to the
//! program and never reach the inner allocator, so its memory does not grow.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing_prof::{Profiler, TaggingAllocator};
use tracing_subscriber::Layer;
use tracing_subscriber::prelude::*;

thread_local! {
    /// Bytes the inner allocator holds for this thread's requests (header and padding
    /// included); per thread, so that other threads' work cannot move it.
    static INNER_BYTES: std::cell::Cell<i64> = const { std::cell::Cell::new(0) };
}

fn add_inner(n: i64) {
    let _ = INNER_BYTES.try_with(|c| c.set(c.get() + n));
}

fn inner_bytes() -> i64 {
    INNER_BYTES.with(std::cell::Cell::get)
}

struct Inner;

// SAFETY: forwards every call to System; the counter only observes.
unsafe impl GlobalAlloc for Inner {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: same contract.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            add_inner(l.size() as i64);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        add_inner(-(l.size() as i64));
        // SAFETY: same contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // SAFETY: same contract.
        let q = unsafe { System.realloc(p, l, n) };
        if !q.is_null() {
            add_inner(n as i64 - l.size() as i64);
        }
        q
    }
}

#[global_allocator]
static GLOBAL: TaggingAllocator<Inner> = TaggingAllocator::new(Inner);

static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Warnings;

impl<S: tracing::Subscriber> Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct M(String);
        impl Visit for M {
            fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = M(String::new());
        event.record(&mut m);
        if event.metadata().target() == "tracing_prof::giant" {
            WARNINGS.lock().unwrap().push(m.0);
        }
    }
}

const MIB: usize = 1 << 20;

#[test]
fn giant_allocations_are_reported_and_refused_without_leaking() {
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .giant_allocations(MIB, true)
        .build()
        .unwrap();
    tracing_subscriber::registry()
        .with(layer)
        .with(Warnings)
        .init();
    let profiler = guard.profiler().clone();

    let mut small = vec![7u8; 1024];
    tracing::info_span!("giant_refused").in_scope(|| {
        // Measured inside the entered span: creating it allocates (the registry's first use).
        let before = inner_bytes();
        // On an empty Vec, a fresh allocation; on `small`, a realloc.
        assert!(
            Vec::<u8>::new().try_reserve_exact(8 * MIB).is_err(),
            "a refused allocation must fail"
        );
        assert!(
            small.try_reserve_exact(4 * MIB).is_err(),
            "a refused growth must fail"
        );
        let after = inner_bytes();
        assert_eq!(
            after, before,
            "refused requests must not reach the inner allocator"
        );
    });
    assert!(
        small.iter().all(|&b| b == 7) && small.len() == 1024,
        "the block a refused realloc kept is intact"
    );

    tracing::info_span!("giant_below").in_scope(|| drop(std::hint::black_box(vec![0u8; MIB - 1])));
    guard.flush(Duration::from_secs(30)).unwrap();
    let reports = profiler.giant_allocations();
    for r in &reports {
        // The code that asked, under the span frames.
        assert!(
            r.site()
                .starts_with("giant::giant_allocations_are_reported_and_refused_without_leaking"),
            "{:?}",
            r.stack
        );
    }
    let got: Vec<(usize, String, bool)> = reports
        .into_iter()
        .map(|g| (g.size, g.span_path, g.refused))
        .collect();
    assert_eq!(
        got,
        [
            (8 * MIB, "giant_refused".to_owned(), true),
            (1024 + 4 * MIB, "giant_refused".to_owned(), true)
        ]
    );

    // Reported, not refused.
    tracing_prof_alloc::__private::set_giant_policy(Some(MIB), false);
    let big = tracing::info_span!("giant_allowed").in_scope(|| vec![1u8; 2 * MIB]);
    guard.flush(Duration::from_secs(30)).unwrap();
    let last = profiler.giant_allocations().pop().unwrap();
    assert_eq!(
        (last.size, last.span_path.as_str(), last.refused),
        (2 * MIB, "giant_allowed", false)
    );
    assert_eq!(big.len(), 2 * MIB);

    let warnings = WARNINGS.lock().unwrap().clone();
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(
        warnings[0].contains("8388608 bytes in span path `giant_refused`, refused"),
        "{}",
        warnings[0]
    );
    assert_eq!(profiler.stats().giant_allocations_missed, 0);
    drop(guard);
}

const CHILD: &str = "TRACING_PROF_GIANT_PANIC_CHILD";

/// A panic's backtrace allocates large buffers. Refusing them ran the allocation-error handler
/// inside the panic, which deadlocked on the backtrace lock; requests made while panicking are
/// now reported, never refused. Runs in a child process (with backtraces on) under a time limit.
#[test]
fn a_panic_with_a_backtrace_survives_refusal() {
    if std::env::var(CHILD).is_ok() {
        tracing_prof_alloc::__private::set_giant_policy(Some(16 * 1024), true);
        let r = std::thread::spawn(|| panic!("deliberate, to print a backtrace")).join();
        assert!(r.is_err());
        println!("survived");
        return;
    }
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_panic_with_a_backtrace_survives_refusal",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("RUST_BACKTRACE", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the child hung: a panic under giant-allocation refusal deadlocked");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert!(out.contains("survived"), "{out}");
}
