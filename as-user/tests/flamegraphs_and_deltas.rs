//! Flame graphs, folded stacks and delta files for the example workload, read back by inferno's
//! own parser and by `go tool pprof`.

use tracing_prof_test_support as common;

use std::path::{Path, PathBuf};
use std::time::Duration;
use tracing_prof::{FileExporter, ProfileKind, Profiler, TaggingAllocator};
use tracing_prof_examples::{App, Workload, run};
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: TaggingAllocator<std::alloc::System> = TaggingAllocator::new(std::alloc::System);

/// The captures in the profile directory `dir` named `{prefix}*{suffix}`, oldest first.
fn files(dir: &Path, prefix: &str, suffix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("captures"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.file_name().unwrap().to_str().unwrap();
            n.starts_with(prefix) && n.ends_with(suffix) && !n.contains(".latest.")
        })
        .collect();
    v.sort();
    v
}

#[test]
fn flamegraphs_folded_and_deltas() {
    let scratch = common::scratch_dir("flames");
    let dir = scratch.path().join("profiles");
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .sink(FileExporter::new(&dir).deltas(true).flamegraphs(true))
        .build()
        .unwrap();
    tracing_subscriber::registry().with(layer).init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let app = App::new(500);
    rt.block_on(run(
        &app,
        &Workload {
            requests: 600,
            ..Workload::default()
        },
    ));
    guard.flush(Duration::from_secs(30)).unwrap();
    rt.block_on(run(
        &app,
        &Workload {
            requests: 250,
            ..Workload::default()
        },
    ));
    guard.flush(Duration::from_secs(30)).unwrap();

    // Flame graphs: one SVG per default sample type per export, with the span names in them.
    let svgs = files(&dir, "spans.", ".wall_busy.svg");
    assert_eq!(svgs.len(), 2, "{svgs:?}");
    let svg = std::fs::read_to_string(&svgs[1]).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("</svg>"));
    for name in [
        "tracing_prof_examples::request [span]",
        "tracing_prof_examples::render [span]",
    ] {
        assert!(
            svg.contains(name),
            "{name} missing from the busy-time flame graph"
        );
    }
    // The CPU flame graph: code frames under the span frames.
    let cpu = files(&dir, "cpu.", ".cpu.svg");
    assert_eq!(cpu.len(), 2, "{cpu:?}");
    assert!(std::fs::read_to_string(&cpu[1]).unwrap().contains("[span]"));
    let heap_svg = std::fs::read_to_string(&files(&dir, "heap.", ".inuse_space.svg")[1]).unwrap();
    assert!(heap_svg.contains("tracing_prof_examples::cache_fill"));

    // Folded stacks: well-formed lines, accepted by inferno's own parser, whose total the SVG
    // states.
    let profile = guard.profiler().snapshot();
    let text = profile
        .profile(ProfileKind::SpanMemory)
        .folded(Some("alloc_space"))
        .unwrap();
    let mut total = 0u64;
    for line in text.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("`stack count`");
        assert!(!stack.is_empty() && !stack.contains('\n'));
        total += count.parse::<u64>().expect("numeric count");
    }
    assert!(
        text.contains(
            "tracing_prof_examples::request [span];tracing_prof_examples::render [span] "
        ),
        "{text}"
    );
    let mut options = inferno::flamegraph::Options::default();
    let mut out = Vec::new();
    inferno::flamegraph::from_reader(&mut options, text.as_bytes(), &mut out)
        .expect("inferno accepts it");
    let svg = String::from_utf8(
        profile
            .profile(ProfileKind::SpanMemory)
            .flamegraph_svg(Some("alloc_space"), "test")
            .unwrap(),
    )
    .unwrap();
    assert!(
        svg.contains(&format!("all ({} bytes, 100%)", thousands(total))),
        "total {total} not in the SVG"
    );
    assert!(
        profile
            .profile(ProfileKind::Heap)
            .flamegraph_svg(Some("no_such_type"), "test")
            .is_err()
    );
    // The sampled heap's folded stacks are its pprof stacks: code frames under the span frames.
    let heap = profile
        .profile(ProfileKind::Heap)
        .folded(Some("alloc_space"))
        .unwrap();
    // (Between them, the closure `handle` gives to `in_scope`: code that ran in the span.)
    assert!(
        heap.lines().any(|l| l.starts_with(
            "tracing_prof_examples::request [span];tracing_prof_examples::render [span];\
             tracing_prof_examples::handle::{{closure}}::{{closure}};tracing_prof_examples::render "
        )),
        "{heap}"
    );

    // Deltas: the second export's delta holds the second run alone, exactly.
    let deltas = files(&dir, "spans-delta.", ".pb.gz");
    assert_eq!(
        deltas.len(),
        1,
        "the first export has no base, the second has one delta"
    );
    if common::have_go() {
        let requests = |file: &Path| {
            common::raw(file).value(&["tracing_prof_examples::request [span]"], "spans")
        };
        assert_eq!(requests(&deltas[0]), 250);
        let cumulative = files(&dir, "spans.", ".pb.gz");
        assert_eq!(requests(&cumulative[1]), 850);
    }
    drop(guard);
}

/// inferno writes counts with thousands separators.
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
