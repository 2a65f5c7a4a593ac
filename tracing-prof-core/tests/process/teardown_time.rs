//! Span time of spans that live and die while a thread's thread-locals are torn down, after the
//! layer let go of the thread's record and its span-time table (the table goes with the record
//! to the next thread that takes it): every span still counted, exactly, in the shared table,
//! and the table the next threads take is theirs alone. A fake clock makes every number exact.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::Dispatch;
use tracing_prof_core::{Clock, CpuSample, ProfileLayer};
use tracing_subscriber::prelude::*;

static NOW: AtomicU64 = AtomicU64::new(1_000);

struct FakeClock;

impl Clock for FakeClock {
    fn now_ns(&self) -> u64 {
        NOW.load(Ordering::SeqCst)
    }
    fn thread_cpu(&self) -> CpuSample {
        CpuSample::default()
    }
}

static OURS: OnceLock<Dispatch> = OnceLock::new();

/// Its destructor runs during the thread's TLS teardown, after the layer's own (see the test).
struct Late;

impl Drop for Late {
    fn drop(&mut self) {
        let ours = OURS.get().expect("set before the threads start");
        tracing::dispatcher::with_default(ours, || {
            for _ in 0..10 {
                tracing::info_span!("teardown_late").in_scope(|| {
                    NOW.fetch_add(7, Ordering::SeqCst);
                });
            }
        });
    }
}

thread_local! {
    static LATE: Late = const { Late };
}

#[test]
fn spans_in_tls_teardown_are_counted_exactly() {
    if crate::isolated(module_path!(), "spans_in_tls_teardown_are_counted_exactly") {
        return;
    }
    let ours = OURS.get_or_init(|| {
        Dispatch::new(
            tracing_subscriber::registry().with(ProfileLayer::new().with_clock(FakeClock)),
        )
    });
    let plain = Dispatch::new(tracing_subscriber::registry());
    for _ in 0..3 {
        let plain = plain.clone();
        std::thread::spawn(move || {
            // Thread-exit destructors run in the reverse order of registration. First the
            // registry's thread id and tracing's dispatcher state (a span of a registry
            // without the layer registers them), so that they outlive `Late`; then `Late`;
            // then the layer's record and span-time table, on the first span entered with it,
            // so that they are let go before `Late` runs.
            tracing::dispatcher::with_default(&plain, || {
                tracing::info_span!("warm").in_scope(|| ());
            });
            LATE.with(|_| ());
            tracing::dispatcher::with_default(ours, || {
                tracing::info_span!("teardown_early").in_scope(|| {
                    NOW.fetch_add(5, Ordering::SeqCst);
                });
            });
        })
        .join()
        .unwrap();
    }
    let p = tracing_prof_core::capture(std::time::Duration::ZERO);
    let time = |name: &str| {
        let t = p.path(&[name]).expect(name).time;
        (t.spans, t.wall_ns, t.busy_ns, t.idle_ns)
    };
    // Each span: created, entered at once, `n` ns busy, exited, closed at once.
    assert_eq!(time("teardown_early"), (3, 3 * 5, 3 * 5, 0));
    assert_eq!(time("teardown_late"), (30, 30 * 7, 30 * 7, 0));
}
