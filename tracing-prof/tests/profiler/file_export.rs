//! The file exporter as a user meets it: files appear every interval and at shutdown, `go tool
//! pprof` opens them, old ones are pruned, and an I/O error is reported once, never panics, and
//! is recovered from.
//!
//! The error case runs in a child process (this same test binary) so that its stderr can be read.

use tracing_prof_test_support as common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tracing_prof::{FileExporter, Profiler};
use tracing_subscriber::prelude::*;

/// The captures of `kind` in the profile directory `dir`, oldest first.
fn files(dir: &Path, kind: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("captures"))
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.retain(|p| {
        p.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(&format!("{kind}."))
            && !p.to_str().unwrap().contains(".latest.")
    });
    v.sort();
    v
}

/// One profiler runs at a time in a process: the tests take turns, each waiting until the
/// previous one's aggregator has finished (a stuck sink's keeps it running past its guard).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let turn = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while Profiler::running() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    turn
}

/// A fresh folder, removed when the returned handle is dropped.
fn temp_dir(name: &str) -> (tempfile::TempDir, PathBuf) {
    let d = common::scratch_dir(name);
    let path = d.path().join("profiles");
    (d, path)
}

#[test]
fn files_every_interval_and_at_shutdown_pruned_and_readable() {
    if crate::isolated(
        module_path!(),
        "files_every_interval_and_at_shutdown_pruned_and_readable",
    ) {
        return;
    }
    let _turn = serial();
    let (_scratch, dir) = temp_dir("files");
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_millis(100))
        .sink(FileExporter::new(&dir).keep(3))
        .build()
        .unwrap();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    tracing::dispatcher::with_default(&dispatch, || {
        tracing::info_span!("fe_request").in_scope(|| std::hint::black_box(vec![1u8; 4096]));
    });
    // Several intervals (the first export symbolizes, which can take a while on a busy host).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while guard.profiler().stats().exports < 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        guard.profiler().stats().exports >= 4,
        "{:?}",
        guard.profiler().stats()
    );
    // Stopped, so that no export is half done (written, not yet pruned) while we count.
    drop(guard);
    assert_eq!(
        files(&dir, "spans").len(),
        3,
        "keep(3) must prune older files"
    );
    assert_eq!(files(&dir, "heap").len(), 3);
    // The stable name holds the newest file of each kind, whole.
    for kind in ["spans", "heap", "span_memory", "lifetimes", "threads"] {
        let newest = files(&dir, kind).pop().unwrap();
        let latest = dir.join(format!("{kind}.latest.pb.gz"));
        assert_eq!(
            std::fs::read(&latest).unwrap(),
            std::fs::read(&newest).unwrap(),
            "{} is not {}",
            latest.display(),
            newest.display()
        );
    }

    // The last profile is written when the guard drops, even if the interval is far away.
    let (_layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .sink(FileExporter::new(dir.join("final")))
        .build()
        .unwrap();
    assert!(files(&dir.join("final"), "heap").is_empty());
    drop(guard);
    let heap = files(&dir.join("final"), "heap");
    assert_eq!(
        heap.len(),
        1,
        "the guard's drop must write the final profile"
    );
    let name = heap[0].file_name().unwrap().to_str().unwrap().to_owned();
    let pid = std::process::id().to_string();
    let parts: Vec<&str> = name.split('.').collect();
    assert_eq!((parts[0], parts[1]), ("heap", pid.as_str()), "{name}");
    // `heap.PID.YYYYMMDDTHHMMSS.uuuuuuZ.RUN.pb.gz`: the run, six random characters.
    assert!(
        name.ends_with(".pb.gz")
            && parts[2].len() == 15
            && parts[2].contains('T')
            && parts[3].ends_with('Z')
            && parts[4].len() == 6,
        "{name}"
    );

    if common::have_go() {
        let memory = &files(&dir.join("final"), "span_memory")[0];
        let top = common::pprof(
            &["-top", "-nodefraction=0", "-sample_index=alloc_space"],
            memory,
        );
        assert!(
            top.contains("profiler::file_export::fe_request [span]"),
            "{top}"
        );
        // The sampled heap profile opens too (its small allocations may not be sampled).
        common::pprof(&["-top"], &heap[0]);
        let spans = &files(&dir.join("final"), "spans")[0];
        let top = common::pprof(&["-top", "-nodefraction=0", "-sample_index=spans"], spans);
        assert!(
            top.contains("profiler::file_export::fe_request [span]"),
            "{top}"
        );
        // The stable name opens as the one profile it is (a glob over the timestamped files
        // would add cumulative profiles up).
        let latest = dir.join("final").join("spans.latest.pb.gz");
        assert_eq!(
            common::pprof(&["-top", "-nodefraction=0", "-sample_index=spans"], &latest),
            top
        );
    }
}

const CHILD: &str = "TRACING_PROF_TEST_CHILD_DIR";

#[test]
fn io_errors_are_reported_once_and_recovered_from() {
    if crate::isolated(
        module_path!(),
        "io_errors_are_reported_once_and_recovered_from",
    ) {
        return;
    }
    if let Ok(dir) = std::env::var(CHILD) {
        return child(Path::new(&dir));
    }
    let (_scratch, dir) = temp_dir("ioerr");
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &crate::test_name(
                module_path!(),
                "io_errors_are_reported_once_and_recovered_from",
            ),
            "--nocapture",
        ])
        .env(CHILD, &dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stderr}");
    let failed = stderr.matches("export failed").count();
    assert_eq!(
        failed, 1,
        "the error must be reported exactly once:\n{stderr}"
    );
    assert!(
        stderr.contains("cannot create directory"),
        "the message must say what failed:\n{stderr}"
    );
    assert!(
        stderr.contains(&dir.join("blocked").display().to_string()),
        "and where:\n{stderr}"
    );
    assert_eq!(
        stderr.matches("exporting works again").count(),
        1,
        "{stderr}"
    );
}

/// Exports into a path whose parent is a regular file, then removes the obstacle.
fn child(dir: &Path) {
    let blocker = dir.join("blocked");
    std::fs::write(&blocker, b"not a directory").unwrap();
    let (_layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .sink(FileExporter::new(blocker.join("profiles")))
        .build()
        .unwrap();
    for _ in 0..5 {
        guard.flush(Duration::from_secs(10)).unwrap();
    }
    let stats = guard.profiler().stats();
    assert_eq!((stats.exports, stats.export_errors), (0, 5));
    std::fs::remove_file(&blocker).unwrap();
    guard.flush(Duration::from_secs(10)).unwrap();
    assert_eq!(guard.profiler().stats().exports, 1);
    assert_eq!(files(&blocker.join("profiles"), "heap").len(), 1);
}

/// A sink that never returns in time.
struct Stuck;

impl tracing_prof::Sink for Stuck {
    fn name(&self) -> &str {
        "stuck"
    }
    fn export(&mut self, _: &tracing_prof::Snapshot) -> Result<(), tracing_prof::core::SinkError> {
        std::thread::sleep(Duration::from_secs(3));
        Ok(())
    }
}

#[test]
fn a_stuck_sink_cannot_hold_shutdown_past_its_timeout() {
    if crate::isolated(
        module_path!(),
        "a_stuck_sink_cannot_hold_shutdown_past_its_timeout",
    ) {
        return;
    }
    let _turn = serial();
    let (_layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .shutdown_timeout(Duration::from_millis(300))
        .sink(Stuck)
        .build()
        .unwrap();
    assert!(
        guard.flush(Duration::from_millis(100)).is_err(),
        "a flush must time out, not hang"
    );
    let t = std::time::Instant::now();
    drop(guard);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "drop waited {:?}",
        t.elapsed()
    );
}

/// A sink that panics on every export.
struct Panics;

impl tracing_prof::Sink for Panics {
    fn name(&self) -> &str {
        "panics"
    }
    fn export(&mut self, _: &tracing_prof::Snapshot) -> Result<(), tracing_prof::core::SinkError> {
        panic!("deliberately broken sink");
    }
}

#[test]
fn a_panicking_sink_is_a_failed_export_and_profiling_goes_on() {
    if crate::isolated(
        module_path!(),
        "a_panicking_sink_is_a_failed_export_and_profiling_goes_on",
    ) {
        return;
    }
    let _turn = serial();
    let (_scratch, dir) = temp_dir("panics");
    let (_layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .sink(Panics)
        .sink(FileExporter::new(&dir))
        .build()
        .unwrap();
    for _ in 0..3 {
        guard
            .flush(Duration::from_secs(10))
            .expect("the aggregator must survive a panicking sink");
    }
    let stats = guard.profiler().stats();
    assert_eq!((stats.exports, stats.export_errors), (3, 3), "{stats:?}");
    drop(guard);
    assert_eq!(
        files(&dir, "heap").len(),
        4,
        "three flushes and the final export"
    );
}
