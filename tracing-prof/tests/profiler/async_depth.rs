//! Async depth: an `#[instrument]`ed `async fn` awaiting an `async fn` awaiting an `async fn`
//! whose body burns CPU and allocates, driven on a multi-thread tokio runtime. The CPU
//! profile and the heap profile show all three bodies, in order, under the span frame (in
//! `go tool pprof -traces`): the span frame stands for the instrumentation, never for the
//! async functions below it. Before, every trailing `{{closure}}` frame (an async fn's body is
//! one) was cut at the span's entry point, and the samples sat directly under the span frame.

use tracing_prof_test_support as common;

use std::hint::black_box;
use std::time::Duration;
use tracing::instrument;
use tracing_prof::{ProfileKind, Profiler};
use tracing_subscriber::prelude::*;

#[instrument]
async fn outer_handler(rounds: u32) -> u64 {
    let mut total = 0;
    for _ in 0..rounds {
        total += middle_step().await;
    }
    total
}

#[inline(never)]
async fn middle_step() -> u64 {
    tokio::task::yield_now().await;
    black_box(inner_work().await)
}

#[inline(never)]
async fn inner_work() -> u64 {
    tokio::task::yield_now().await;
    let start = common::thread_cpu_ns();
    let mut x = 7u64;
    let mut kept = 0usize;
    while common::thread_cpu_ns() - start < 20_000_000 {
        for _ in 0..10_000 {
            x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(3));
        }
        // A heap sample taken here (every allocation is sampled at rate 1).
        let v: Vec<u64> = black_box(vec![x; 64]);
        kept += v.len();
    }
    x ^ kept as u64
}

/// The position of the first frame at or after `from` whose name starts with `prefix`.
fn find(frames: &[String], from: usize, prefix: &str) -> Option<usize> {
    frames[from..]
        .iter()
        .position(|f| f.starts_with(prefix))
        .map(|i| i + from)
}

/// Whether some trace has the three bodies, innermost first, then the span frame right above
/// the outermost body.
fn has_all_three(text: &str) -> bool {
    common::traces(text).iter().any(|frames| {
        let Some(i) = find(frames, 0, "profiler::async_depth::inner_work") else {
            return false;
        };
        let Some(m) = find(frames, i, "profiler::async_depth::middle_step") else {
            return false;
        };
        let Some(o) = find(frames, m, "profiler::async_depth::outer_handler") else {
            return false;
        };
        let Some(s) = find(frames, o, "profiler::async_depth::outer_handler [span]") else {
            return false;
        };
        // The span frame is the root, and the body right under it is outer_handler's.
        s == frames.len() - 1 && !frames[o].ends_with("[span]") && o < s
    })
}

#[test]
fn async_fn_bodies_stay_under_the_span_frame() {
    if crate::isolated(module_path!(), "async_fn_bodies_stay_under_the_span_frame") {
        return;
    }
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .cpu_sampling(1000)
        .heap_sampling(1)
        .build()
        .unwrap();
    assert_eq!(guard.profiler().cpu_error(), None);
    tracing_subscriber::registry().with(layer).init();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let total = rt.block_on(async { tokio::spawn(outer_handler(10)).await.unwrap() });
    black_box(total);
    drop(rt);

    let snapshot = guard.profiler().snapshot();
    // The model: a CPU stack and a heap stack under the span with the three bodies, root
    // first.
    let in_order = |code: &tracing_prof::model::CodeStack| {
        let names: Vec<&str> = code.iter().map(|f| &*f.function).collect();
        let at = |prefix: &str| names.iter().position(|n| n.starts_with(prefix));
        matches!(
            (at("profiler::async_depth::outer_handler"), at("profiler::async_depth::middle_step"), at("profiler::async_depth::inner_work")),
            (Some(0), Some(m), Some(i)) if 0 < m && m < i
        )
    };
    assert!(
        snapshot.cpu_stacks.iter().any(|s| s.frames.len() == 1
            && &*s.frames[0].name == "outer_handler"
            && in_order(&s.code)),
        "no CPU stack with the three bodies under the span"
    );
    assert!(
        snapshot.stacks.iter().any(|s| s.frames.len() == 1
            && &*s.frames[0].name == "outer_handler"
            && in_order(&s.code)),
        "no heap stack with the three bodies under the span"
    );
    if !common::have_go() {
        return;
    }
    let cpu = common::write_profile(&snapshot, ProfileKind::Cpu, "async_depth_cpu");
    let text = common::pprof(&["-traces"], &cpu);
    assert!(
        has_all_three(&text),
        "no CPU trace has inner_work, middle_step and outer_handler under the span frame:\n{text}"
    );
    let heap = common::write_profile(&snapshot, ProfileKind::Allocs, "async_depth_heap");
    let text = common::pprof(&["-traces", "-sample_index=alloc_space"], &heap);
    assert!(
        has_all_three(&text),
        "no heap trace has inner_work, middle_step and outer_handler under the span frame:\n{text}"
    );
    drop(guard);
}
