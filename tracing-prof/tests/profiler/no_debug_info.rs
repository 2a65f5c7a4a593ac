//! A program built without debug information, as `cargo build --release` builds it by default
//! (Cargo strips the debug information and keeps the symbol table), and a stripped one.
//!
//! This test binary copies itself, takes the copy's DWARF away with `objcopy --strip-debug`
//! (and everything with `--strip-all`), and runs the copy as a child that profiles an
//! `#[instrument] async fn` allocating under its span. Without DWARF, the heap profile still
//! has the code frames under the span frame, named from the symbol table, without file and
//! line, and its comments say so. Stripped, the frames are addresses, and the child says so
//! once on stderr and in the profile's comments. Before, the first case showed the span frame
//! and nothing under it, with no word.

use tracing_prof_test_support as common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tracing_prof::{ProfileKind, Profiler};
use tracing_subscriber::prelude::*;

const CHILD: &str = "NO_DEBUG_INFO_CHILD_DIR";

#[inline(never)]
fn build_table(n: usize) -> Vec<Vec<u64>> {
    let t: Vec<Vec<u64>> = (0..n).map(|i| vec![i as u64; 256]).collect();
    std::hint::black_box(&t);
    t
}

#[tracing::instrument(skip_all)]
async fn handler(n: usize) -> usize {
    tokio::task::yield_now().await;
    build_table(n).len()
}

/// The child: profile the handler, write the heap profile into `dir`.
fn child(dir: &Path) {
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .heap_sampling(1)
        .cpu_sampling(0)
        .build()
        .unwrap();
    tracing_subscriber::registry().with(layer).init();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    std::hint::black_box(rt.block_on(handler(64)));
    let snapshot = guard.profiler().snapshot();
    std::fs::write(dir.join("heap.pb.gz"), snapshot.encode(ProfileKind::Heap)).unwrap();
    // A second capture: the stderr message is said once.
    let _ = guard.profiler().snapshot();
    drop(guard);
}

/// This binary, copied to `dir` and passed through `objcopy flag`.
fn stripped_copy(dir: &Path, flag: &str) -> Option<PathBuf> {
    let me = std::env::current_exe().unwrap();
    let copy = dir.join(format!("copy{flag}"));
    let ok = Command::new("objcopy")
        .arg(flag)
        .arg(&me)
        .arg(&copy)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "objcopy (binutils) is needed, and CI=true"
        );
        eprintln!("SKIPPED: objcopy is not available");
        return None;
    }
    Some(copy)
}

/// Runs `copy` as the child; returns its stderr.
fn run_child(copy: &Path, dir: &Path) -> String {
    let out = Command::new(copy)
        .args([
            "--exact",
            &crate::test_name(module_path!(), "a_build_without_debug_info_is_still_named"),
            "--nocapture",
        ])
        .env(CHILD, dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the child failed:\n{stderr}");
    stderr
}

#[test]
fn a_build_without_debug_info_is_still_named() {
    if crate::isolated(module_path!(), "a_build_without_debug_info_is_still_named") {
        return;
    }
    if let Some(dir) = std::env::var_os(CHILD) {
        child(Path::new(&dir));
        return;
    }
    if !common::have_go() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tracing-prof-no-debug-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // Symbol table, no DWARF: the release profile's default.
    let Some(copy) = stripped_copy(&dir, "--strip-debug") else {
        return;
    };
    let stderr = run_child(&copy, &dir);
    let file = dir.join("heap.pb.gz");
    let traces = common::pprof(&["-traces", "-sample_index=alloc_space"], &file);
    // The 64 rows of 2 KiB each and the table, allocated by build_table in the body of the
    // async fn, right under the span frame: the instrumented future's `poll` was inlined into
    // tokio's, so the stack is cut above the function the span was made for.
    let frames = common::traces(&traces)
        .into_iter()
        .find(|t| {
            t.iter()
                .any(|f| f == "profiler::no_debug_info::build_table")
        })
        .unwrap_or_else(|| panic!("no trace of the table under the span:\n{traces}"));
    // The async fn's body is a function of its own, or inlined into the `poll` above it
    // (then no symbol names it), as the compiler chose for this binary.
    let body = ["profiler::no_debug_info::handler::{{closure}}::{{closure}}"];
    assert!(
        frames.first().map(String::as_str) == Some("profiler::no_debug_info::build_table")
            && frames.last().map(String::as_str) == Some("profiler::no_debug_info::handler [span]")
            && (frames.len() == 2 || (frames.len() == 3 && frames[1] == body[0])),
        "{traces}"
    );
    // The code frame has no file (the span frame's comes from the span's own metadata).
    let raw = common::pprof(&["-raw"], &file);
    let location = raw
        .lines()
        .find(|l| l.contains("profiler::no_debug_info::build_table"))
        .unwrap_or_else(|| panic!("{raw}"));
    assert!(
        !location.contains(".rs"),
        "a file without debug information? {location}"
    );
    let comments = common::pprof(&["-comments"], &file);
    assert!(
        comments.contains("no debug information: code frames are named from its symbol table"),
        "{comments}"
    );
    assert!(!stderr.contains("stripped"), "{stderr}");

    // Stripped: addresses, said once on stderr and in the comments.
    let Some(copy) = stripped_copy(&dir, "--strip-all") else {
        return;
    };
    let stderr = run_child(&copy, &dir);
    assert_eq!(
        stderr.matches("is stripped (no symbol table").count(),
        1,
        "{stderr}"
    );
    let comments = common::pprof(&["-comments"], &file);
    assert!(comments.contains("the program is stripped"), "{comments}");
    let _ = std::fs::remove_dir_all(&dir);
}
