//! Start-up refuses what would hurt later: a second profiler in the process (two aggregators
//! wrote the same files and pruned each other's), an output directory exports could never write
//! to (every interval then failed), a giant-allocation threshold so small that refusal aborted
//! the process before `init_from_env` returned. Each error names what to change. (Its own
//! process: environment variables and the running profiler are process-wide.)

use tracing_prof::{Error, Profiler, core::BuildError};

const VARS: [&str; 4] = [
    "TRACING_PROF_DIR",
    "TRACING_PROF_GIANT_BYTES",
    "TRACING_PROF_GIANT_REFUSE",
    "TRACING_PROF_INTERVAL",
];

fn init_with(vars: &[(&str, &str)]) -> Result<tracing_prof::ProfilerGuard, String> {
    for v in VARS {
        // SAFETY: this test binary has one test, which alone touches the environment.
        unsafe { std::env::remove_var(v) };
    }
    for (k, v) in vars {
        // SAFETY: as above.
        unsafe { std::env::set_var(k, v) };
    }
    tracing_prof::init_from_env()
        .map(|(_layer, guard)| guard)
        .map_err(|e| e.to_string())
}

#[test]
fn init_refuses_what_would_fail_later() {
    if crate::isolated(module_path!(), "init_refuses_what_would_fail_later") {
        return;
    }
    let root = std::env::temp_dir().join(format!("tracing-prof-init-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let dir = root.join("profiles");
    let dir_var = ("TRACING_PROF_DIR", dir.to_str().unwrap());

    // One profiler at a time; the second init fails and writes nothing.
    let first = init_with(&[dir_var, ("TRACING_PROF_INTERVAL", "1h")]).unwrap();
    assert!(Profiler::running());
    let files_before = std::fs::read_dir(&dir).unwrap().count();
    match tracing_prof::init_from_env() {
        Err(Error::Build(BuildError::AlreadyRunning)) => {}
        other => panic!("expected AlreadyRunning, got {:?}", other.map(|_| ())),
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), files_before);
    drop(first);
    assert!(!Profiler::running(), "the guard's drop ends the profiler");
    drop(init_with(&[dir_var]).expect("a new profiler once the first is gone"));

    // An output directory that cannot be written: an error naming the variable.
    let file = root.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for bad in [file.to_str().unwrap(), "/proc", "/proc/self"] {
        let e = init_with(&[("TRACING_PROF_DIR", bad)]).unwrap_err();
        assert!(
            e.contains("TRACING_PROF_DIR") && e.contains(bad),
            "{bad}: {e}"
        );
    }
    // A file in the way is said as such (it read "File exists").
    let e = init_with(&[("TRACING_PROF_DIR", file.to_str().unwrap())]).unwrap_err();
    assert!(
        e.contains("a file is in the way") && !e.contains("File exists"),
        "{e}"
    );
    assert!(!Profiler::running(), "a failed init leaves nothing running");

    // Giant allocations: a threshold below 64 KiB is refused with its reason; before, 1 byte
    // with refusal aborted the process inside init.
    let e = init_with(&[
        dir_var,
        ("TRACING_PROF_GIANT_BYTES", "1"),
        ("TRACING_PROF_GIANT_REFUSE", "1"),
    ])
    .unwrap_err();
    assert!(
        e.contains("TRACING_PROF_GIANT_BYTES") && e.contains("64 KiB"),
        "{e}"
    );
    let e = Profiler::builder()
        .giant_allocations(4096, true)
        .build()
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("giant_bytes"), "{e}");
    let guard = init_with(&[
        dir_var,
        ("TRACING_PROF_GIANT_BYTES", "65536"),
        ("TRACING_PROF_GIANT_REFUSE", "1"),
    ])
    .unwrap();
    let mut v: Vec<u8> = Vec::new();
    assert!(
        v.try_reserve(1 << 20).is_err(),
        "a giant request is refused"
    );
    assert!(v.try_reserve(1 << 10).is_ok(), "and a small one is not");
    drop(guard);
    let _ = std::fs::remove_dir_all(&root);
}
