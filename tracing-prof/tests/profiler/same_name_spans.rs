//! Spans of the same name from different callsites: two `#[instrument] fn apply` in two
//! modules, under one parent, are two span paths everywhere a path is shown or keyed, each
//! with its own CPU and memory: the snapshot and its tables, the `span_path` label of the CPU
//! profile (`-tagfocus` separates them), the `spans` and `span_memory` profiles, the span-path
//! table of a decoded file (what the `tracing-prof` command prints). Their names carry the
//! module path because they share one; the parent, whose name is its own, does not.
//!
//! `TRACING_PROF_WRITE_FIXTURES=DIR` also writes the files to `DIR` (the `tracing-prof`
//! command's tests read them from `tracing-prof-cli/tests/fixtures/same_name`).

use tracing_prof_test_support as common;

use std::hint::black_box;
use std::time::Duration;
use tracing_prof::core::CpuTime;
use tracing_prof::model::Grouping;
use tracing_prof::{Profile, ProfileKind, Profiler};
use tracing_subscriber::prelude::*;

/// CPU time of one unit of work.
const UNIT: Duration = Duration::from_millis(100);

#[inline(always)]
fn spin(d: Duration, salt: u64) -> u64 {
    let start = common::thread_cpu_ns();
    let mut x = salt;
    while common::thread_cpu_ns() - start < d.as_nanos() as u64 {
        for _ in 0..20_000 {
            x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(salt));
        }
    }
    x
}

mod set {
    /// One unit of CPU; keeps 1 MiB.
    #[tracing::instrument(skip_all)]
    #[inline(never)]
    pub(crate) fn apply(kept: &mut Vec<Vec<u8>>) -> u64 {
        kept.push(vec![1; 1 << 20]);
        super::spin(super::UNIT, 1)
    }
}

mod get {
    /// Two units of CPU; keeps 3 MiB.
    #[tracing::instrument(skip_all)]
    #[inline(never)]
    pub(crate) fn apply(kept: &mut Vec<Vec<u8>>) -> u64 {
        kept.push(vec![2; 3 << 20]);
        super::spin(super::UNIT * 2, 2)
    }
}

const SET: &str = "profiler::same_name_spans::set::apply";
const GET: &str = "profiler::same_name_spans::get::apply";

#[test]
fn same_name_callsites_are_two_paths_everywhere() {
    if crate::isolated(
        module_path!(),
        "same_name_callsites_are_two_paths_everywhere",
    ) {
        return;
    }
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .cpu_time(CpuTime::Exact)
        .cpu_sampling(1000)
        .heap_sampling(64 << 10)
        .build()
        .unwrap();
    assert_eq!(guard.profiler().cpu_error(), None);
    tracing_subscriber::registry().with(layer).init();

    let mut kept = Vec::with_capacity(2);
    tracing::info_span!("run").in_scope(|| {
        black_box(set::apply(&mut kept));
        black_box(get::apply(&mut kept));
    });
    let snapshot = guard.profiler().snapshot();

    // The snapshot: two paths, named by their modules.
    let set_path = snapshot.path(&["run", SET]).expect("run -> set::apply");
    let get_path = snapshot.path(&["run", GET]).expect("run -> get::apply");
    assert_eq!(set_path.display_path(), format!("run -> {SET}"));
    assert_eq!(get_path.display_path(), format!("run -> {GET}"));
    assert_eq!(
        (set_path.memory.inuse_bytes, get_path.memory.inuse_bytes),
        (1 << 20, 3 << 20),
        "exact memory per callsite"
    );
    // CPU: the samples of each within 10% of its own exact measure.
    for (name, path) in [(SET, set_path), (GET, get_path)] {
        let exact = path.time.cpu_ns as f64;
        let sampled = snapshot.sampled_cpu_ns(&["run", name]) as f64;
        eprintln!(
            "{name}: exact {:.1} ms, sampled {:.1} ms",
            exact / 1e6,
            sampled / 1e6
        );
        assert!(
            (sampled - exact).abs() <= exact * 0.1,
            "{name}: sampled {sampled} ns against {exact} ns measured"
        );
    }
    // Sampled memory: each within sampling error of its exact in-use (about 16 and 48
    // samples at 64 KiB: 25% is over three standard deviations).
    for (name, exact) in [(SET, 1u64 << 20), (GET, 3 << 20)] {
        let m = snapshot.sampled_memory(&["run", name]);
        assert!(
            (m.inuse_bytes as f64 - exact as f64).abs() <= exact as f64 * 0.25,
            "{name}: sampled in-use {} against {exact}",
            m.inuse_bytes
        );
    }

    // Decoded files, as the command-line tool and `live` read them: two rows by span path.
    let dir = std::env::var_os("TRACING_PROF_WRITE_FIXTURES");
    let mut files = Vec::new();
    for kind in [
        ProfileKind::Cpu,
        ProfileKind::Spans,
        ProfileKind::SpanMemory,
    ] {
        let bytes = snapshot.encode(kind);
        if let Some(dir) = &dir {
            let path = std::path::Path::new(dir).join(format!("{}.pb.gz", kind.name()));
            std::fs::write(path, &bytes).unwrap();
        }
        let decoded = Profile::decode(&bytes).unwrap();
        let ty = match kind {
            ProfileKind::SpanMemory => "inuse_space",
            _ => "cpu",
        };
        let top = decoded
            .top(Some(ty), Grouping::SpanPath, false, 100)
            .unwrap();
        let flat = |p: &str| top.rows.iter().find(|r| r.name == p).map(|r| r.flat);
        let (set, get) = (
            flat(&format!("run -> {SET}")),
            flat(&format!("run -> {GET}")),
        );
        assert!(
            set.is_some_and(|v| v > 0) && get.is_some_and(|v| v > 0) && set < get,
            "{kind:?}: {set:?} and {get:?} in\n{}",
            top.render(false)
        );
        assert!(
            !top.rows.iter().any(|r| r.name == "run -> apply"),
            "{kind:?}: the two merged:\n{}",
            top.render(false)
        );
        files.push((kind, common::write_profile(&snapshot, kind, kind.name())));
    }

    if !common::have_go() {
        return;
    }
    // go tool pprof: the label separates the two, and each has its own function under it.
    let (_, cpu) = &files[0];
    let tags = common::pprof(&["-tags"], cpu);
    for name in [SET, GET] {
        assert!(tags.contains(&format!("run -> {name}")), "{tags}");
    }
    let focus = format!("-tagfocus=span_path=run -> {SET}");
    let top = common::pprof(&["-top", &focus], cpu);
    assert!(top.contains(&format!("{SET} [span]")), "{top}");
    assert!(!top.contains(&format!("{GET} [span]")), "{top}");
    // The spans profile: two span frames of their own.
    let (_, spans) = &files[1];
    let top = common::pprof(&["-top"], spans);
    for name in [SET, GET] {
        assert!(top.contains(&format!("{name} [span]")), "{top}");
    }
    drop(guard);
}
