//! CPU profiling by span: three spans burn CPU in the ratio 1:2:3 in `#[inline(never)]`
//! functions, on plain threads, in an instrumented future on a tokio runtime, and in a future
//! polled on three different threads in turn. The `cpu` profile shows each function under its
//! span frame in `go tool pprof -traces`, with the code between them that ran in the span, and the sampled CPU per span is within
//! 10% of the exact thread-clock measurement of the same run.
//!
//! CI runs this file twice: in the normal build (no frame pointers), unwinding with DWARF; and
//! built with `-C force-frame-pointers=yes` and `TRACING_PROF_EXPECT_FRAME_POINTERS=1`,
//! unwinding with frame pointers.

use tracing_prof_test_support as common;

use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tracing::Instrument;
use tracing_prof::core::{CpuTime, Unwind};
use tracing_prof::{ProfileKind, Profiler};
use tracing_subscriber::prelude::*;

/// CPU time of one unit of work.
const UNIT: Duration = Duration::from_millis(150);

use common::thread_cpu_ns;

/// Burns `d` of this thread's CPU time in arithmetic, reading the clock rarely. Each caller
/// passes its own `salt`, so that the three burners stay three functions (identical ones
/// would be folded into one by the optimizer).
#[inline(always)]
fn spin(d: Duration, salt: u64) -> u64 {
    let start = thread_cpu_ns();
    let mut x = salt;
    while thread_cpu_ns() - start < d.as_nanos() as u64 {
        for _ in 0..20_000 {
            x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(salt));
        }
    }
    x
}

#[inline(never)]
fn burn_one(d: Duration) -> u64 {
    spin(d, 11)
}

#[inline(never)]
fn burn_two(d: Duration) -> u64 {
    spin(d, 22)
}

#[inline(never)]
fn burn_three(d: Duration) -> u64 {
    spin(d, 33)
}

/// A future that burns one unit per poll, `polls` times, returning `Pending` in between.
struct Hopper {
    polls: u32,
}

impl Future for Hopper {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        black_box(burn_three(UNIT));
        self.polls -= 1;
        if self.polls == 0 {
            Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

#[test]
fn functions_sit_under_their_spans_and_sampled_cpu_matches_the_thread_clock() {
    if crate::isolated(
        module_path!(),
        "functions_sit_under_their_spans_and_sampled_cpu_matches_the_thread_clock",
    ) {
        return;
    }
    let unwind = if std::env::var_os("TRACING_PROF_EXPECT_FRAME_POINTERS").is_some() {
        Unwind::FramePointers
    } else {
        Unwind::Dwarf
    };
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .cpu_time(CpuTime::Exact)
        .cpu_sampling(1000)
        .cpu_unwind(unwind)
        .build()
        .unwrap();
    assert_eq!(guard.profiler().cpu_error(), None);
    tracing_subscriber::registry().with(layer).init();

    // cpu_one: one unit, as two halves on two plain threads.
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| tracing::info_span!("cpu_one").in_scope(|| burn_one(UNIT / 2)));
        }
    });

    // cpu_two: two units in an instrumented future on a tokio runtime, in twenty slices. Each
    // slice hands its worker another task to run (a burn outside any span, until the future
    // runs again or for at most a second) and waits for a wake-up sent from outside the
    // runtime, which lands in the shared queue while that worker is busy: another worker takes
    // the future over. (A burn of a fixed 3 ms was not always long enough on two loaded cores:
    // the busy worker then took the future back every time.)
    static RESUMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let workers = rt
        .block_on(
            rt.spawn(
                async {
                    let mut threads = std::collections::HashSet::new();
                    for _ in 0..20 {
                        threads.insert(std::thread::current().id());
                        burn_two(UNIT * 2 / 20);
                        RESUMED.store(false, Ordering::SeqCst);
                        tokio::spawn(async {
                            let start = std::time::Instant::now();
                            while !RESUMED.load(Ordering::SeqCst)
                                && start.elapsed() < Duration::from_secs(1)
                            {
                                black_box(spin(Duration::from_millis(1), 44));
                            }
                        });
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        tokio::task::spawn_blocking(move || tx.send(()));
                        rx.await.unwrap();
                        RESUMED.store(true, Ordering::SeqCst);
                    }
                    threads.len()
                }
                .instrument(tracing::info_span!("cpu_two")),
            ),
        )
        .unwrap();
    drop(rt);
    assert!(workers >= 2, "the future stayed on one worker");

    // cpu_three: three units in a future polled once on each of three threads in turn.
    let mut hopper = Box::pin(Hopper { polls: 3 }.instrument(tracing::info_span!("cpu_three")));
    for _ in 0..3 {
        hopper = std::thread::spawn(move || {
            let _ = hopper
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()));
            hopper
        })
        .join()
        .unwrap();
    }
    drop(hopper);

    let snapshot = guard.profiler().snapshot();
    let exact = |name: &str| snapshot.path(&[name]).unwrap().time.cpu_ns as f64;
    let sampled = |name: &str| snapshot.sampled_cpu_ns(&[name]) as f64;
    for (name, units) in [("cpu_one", 1.0), ("cpu_two", 2.0), ("cpu_three", 3.0)] {
        let (e, s) = (exact(name), sampled(name));
        eprintln!("{name}: exact {:.1} ms, sampled {:.1} ms", e / 1e6, s / 1e6);
        // The exact clock sees the work (and a little of the span machinery).
        let work = units * UNIT.as_nanos() as f64;
        assert!(
            e >= work && e < work * 1.1,
            "{name}: exact {e} ns for {work} ns of work"
        );
        assert!(
            (s - e).abs() <= e * 0.1,
            "{name}: sampled {:.1} ms against {:.1} ms measured; sampler {:?}",
            s / 1e6,
            e / 1e6,
            guard.profiler().stats().cpu
        );
    }

    // In go tool pprof: each function under its span frame, which is under nothing else (these
    // spans are roots).
    if common::have_go() {
        let file = common::write_profile(&snapshot, ProfileKind::Cpu, "cpu_profile");
        let traces = common::pprof(&["-traces"], &file);
        assert!(traces.contains("Type: cpu"), "{traces}");
        // Innermost first: the burning function, what called it (the closure given to
        // `in_scope`, the instrumented async block: code that ran in the span), and the span
        // frame.
        const TEST: &str = "end_to_end::cpu_profile::functions_sit_under_their_spans_and_sampled_cpu_matches_the_thread_clock";
        let in_scope_closure = format!("{TEST}::{{{{closure}}}}::{{{{closure}}}}::{{{{closure}}}}");
        let async_block = format!("{TEST}::{{{{closure}}}}");
        for chain in [
            &[
                "end_to_end::cpu_profile::burn_one",
                &in_scope_closure,
                "end_to_end::cpu_profile::cpu_one [span]",
            ][..],
            &[
                "end_to_end::cpu_profile::burn_two",
                &async_block,
                "end_to_end::cpu_profile::cpu_two [span]",
            ],
            &[
                "end_to_end::cpu_profile::burn_three",
                "<end_to_end::cpu_profile::Hopper as Future>::poll",
                "end_to_end::cpu_profile::cpu_three [span]",
            ],
        ] {
            let found = common::traces(&traces).iter().any(|frames| {
                frames.len() >= chain.len()
                    && frames[frames.len() - chain.len()..]
                        .iter()
                        .zip(chain)
                        .all(|(f, c)| f == c)
            });
            assert!(found, "no trace ends with {chain:?}:\n{traces}");
        }
        // Names survive pprof's shortening of C++-looking names (which removes every `<..>`
        // group from a name equal to its system name): no empty path segment anywhere, in the
        // trait impls of core, alloc and tokio that these stacks run through.
        let all = common::pprof(&["-top", "-nodecount=100000"], &file);
        for line in traces.lines().chain(all.lines()) {
            assert!(
                !line.contains("::::") && !line.trim_start().starts_with("::"),
                "a name pprof shortened to nothing: {line}"
            );
        }
        assert!(
            all.contains(" as "),
            "no trait method in the profile:\n{all}"
        );

        // The span path label: -tagfocus picks one span's samples.
        let top = common::pprof(&["-top", "-tagfocus=span_path=cpu_three"], &file);
        assert!(top.contains("end_to_end::cpu_profile::burn_three"), "{top}");
        assert!(!top.contains("end_to_end::cpu_profile::burn_one"), "{top}");
    }
    drop(guard);
}
