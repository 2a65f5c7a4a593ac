//! `TRACING_PROF_CPU_TIME=exact` measures per-span CPU time with the thread clock, and the CPU
//! sampler still runs beside it: the files hold the `cpu` profile too (before, they did not,
//! though `/debug/pprof/profile` served its stacks), and, as Go's, it carries its duration
//! (`Duration:` in `go tool pprof`; before, none).

use tracing_prof_test_support as common;

use std::hint::black_box;
use std::time::{Duration, Instant};
use tracing_subscriber::prelude::*;

#[inline(never)]
fn burn(cpu: Duration) -> u64 {
    let start = common::thread_cpu_ns();
    let mut x = 3u64;
    while common::thread_cpu_ns() - start < cpu.as_nanos() as u64 {
        for _ in 0..10_000 {
            x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(7));
        }
    }
    x
}

#[test]
fn exact_cpu_time_still_writes_the_cpu_profile_with_its_duration() {
    if crate::isolated(
        module_path!(),
        "exact_cpu_time_still_writes_the_cpu_profile_with_its_duration",
    ) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tracing-prof-cpu-exact-{}", std::process::id()));
    // SAFETY: the first thing this one-test binary does, before any other thread runs.
    unsafe {
        std::env::set_var("TRACING_PROF_CPU_TIME", "exact");
        std::env::set_var("TRACING_PROF_CPU_HZ", "1000");
        std::env::set_var("TRACING_PROF_DIR", &dir);
        std::env::set_var("TRACING_PROF_INTERVAL", "1h");
    }
    let started = Instant::now();
    let (layer, guard) = tracing_prof::init_from_env().unwrap();
    tracing_subscriber::registry().with(layer).init();
    tracing::info_span!("exact_work").in_scope(|| black_box(burn(Duration::from_millis(200))));
    std::thread::sleep(Duration::from_millis(300));
    let ran = started.elapsed();
    drop(guard); // the final export

    let cpu = dir.join("cpu.latest.pb.gz");
    assert!(cpu.exists(), "no cpu profile in {}", dir.display());
    let spans = dir.join("spans.latest.pb.gz");
    if !common::have_go() {
        return;
    }
    let top = common::pprof(&["-top"], &cpu);
    assert!(top.contains("profiler::cpu_exact_files::burn"), "{top}");
    // The duration: since the profiler started, as long as the test ran (at most).
    let line = top
        .lines()
        .find(|l| l.starts_with("Duration:"))
        .unwrap_or_else(|| panic!("no Duration: line\n{top}"));
    let d = line
        .split_whitespace()
        .nth(1)
        .map(|d| d.trim_end_matches(','))
        .unwrap_or_else(|| panic!("{line}"));
    let secs: f64 = match d.strip_suffix("ms") {
        Some(ms) => ms.parse::<f64>().map(|v| v / 1e3),
        None => d.trim_end_matches('s').parse(),
    }
    .unwrap_or_else(|_| panic!("{line}"));
    assert!(
        secs >= 0.45 && secs <= ran.as_secs_f64() + 0.1,
        "{line}, ran {ran:?}"
    );
    // Per-span CPU is the exact clock's: the spans profile has it.
    let raw = common::raw(&spans);
    let measured = raw.value(&["profiler::cpu_exact_files::exact_work [span]"], "cpu");
    assert!(
        (200_000_000..230_000_000).contains(&measured),
        "exact cpu {measured} ns for 200 ms of work"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
