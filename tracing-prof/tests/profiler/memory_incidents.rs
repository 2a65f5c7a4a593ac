//! Memory incidents: the heap's peak, kept with its span paths' exact bytes and its sampled
//! stacks after the memory is freed, written as `heap_peak` and `span_memory_peak`, served at
//! `?peak=1`, read back by `go tool pprof`; and what the resident set is made of.

use tracing_prof_test_support as common;

use std::time::Duration;
use tracing_prof::{FileExporter, Profiler};
use tracing_subscriber::prelude::*;

const MIB: usize = 1 << 20;

/// One profiler at a time in this process.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[inline(never)]
fn spike_buffer() -> Vec<u8> {
    let v = vec![1u8; 64 * MIB];
    std::hint::black_box(&v);
    v
}

/// A 64 MiB spike under one span, held 300 ms (15 readings at 20 ms) and freed; then a
/// 16 MiB plateau under another, held. The peak names the spike's span with its exact bytes,
/// the plateau's span with none; its sampled stack is the function that allocated; the files
/// and the endpoint's `?peak=1` carry it, with when and how much.
#[test]
fn the_peak_keeps_the_spike_after_it_is_freed() {
    if crate::isolated(module_path!(), "the_peak_keeps_the_spike_after_it_is_freed") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .peak_every(Some(Duration::from_millis(20)))
        .sink(FileExporter::new(dir.path()))
        .build()
        .unwrap();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    let plateau = tracing::dispatcher::with_default(&dispatch, || {
        tracing::info_span!("peak_spike").in_scope(|| {
            let spike = spike_buffer();
            std::thread::sleep(Duration::from_millis(300));
            drop(spike);
        });
        tracing::info_span!("peak_plateau").in_scope(|| {
            let v = vec![2u8; 16 * MIB];
            std::thread::sleep(Duration::from_millis(100));
            v
        })
    });
    let profiler = guard.profiler().clone();
    let now = profiler.snapshot();
    assert_eq!(
        now.path(&["peak_spike"]).unwrap().memory.inuse_bytes,
        0,
        "freed by now"
    );
    let at_peak = profiler.peak().expect("a peak was read");
    let peak = at_peak.peak.expect("the peak's mark");
    let spike = at_peak.path(&["peak_spike"]).expect("the spike's path");
    assert_eq!(spike.memory.inuse_bytes, (64 * MIB) as u64, "exact");
    assert_eq!(
        at_peak
            .path(&["peak_plateau"])
            .map_or(0, |p| p.memory.inuse_bytes),
        0,
        "the plateau came after"
    );
    assert!(
        peak.inuse_bytes >= (64 * MIB) as u64 && peak.inuse_bytes < (80 * MIB) as u64,
        "{peak:?}"
    );
    // The sampled stack: a 64 MiB block is always sampled, and its estimate is within a few
    // of the 128 sample points (512 KiB apart) it covers.
    let stack = at_peak
        .stacks
        .iter()
        .find(|s| s.frames.iter().any(|f| &*f.name == "peak_spike") && s.memory.inuse_bytes > 0)
        .expect("the spike's sampled stack");
    assert!(
        stack
            .code
            .iter()
            .any(|f| f.function.ends_with("spike_buffer")),
        "{:?}",
        stack.code
    );
    let estimate = stack.memory.inuse_bytes as f64 / (64 * MIB) as f64;
    assert!((0.95..1.05).contains(&estimate), "{estimate}");

    // Files: written at the next export, read back by go tool pprof, with the comment.
    guard.flush(Duration::from_secs(30)).unwrap();
    for kind in ["heap_peak", "span_memory_peak"] {
        let file = dir.path().join(format!("{kind}.latest.pb.gz"));
        assert!(file.exists(), "{kind}: {:?}", std::fs::read_dir(dir.path()));
        let decoded = tracing_prof::model::Profile::decode(&std::fs::read(&file).unwrap()).unwrap();
        assert!(
            decoded
                .comments
                .iter()
                .any(|c| c.starts_with("tracing-prof: at the peak of 64.")),
            "{:?}",
            decoded.comments
        );
    }
    if common::have_go() {
        let top = common::pprof(
            &["-top", "-sample_index=inuse_space"],
            dir.path().join("span_memory_peak.latest.pb.gz"),
        );
        assert!(
            top.lines()
                .any(|l| l.contains("64MB") && l.contains("peak_spike")),
            "{top}"
        );
    }
    // The endpoint: the same peak, in pprof and as text.
    let handler = tracing_prof::export::PprofHandler::new(profiler.clone());
    let text = handler.handle("GET", "/debug/pprof/span_memory?peak=1&debug=1", None);
    assert_eq!(text.status, 200);
    let body = String::from_utf8_lossy(&text.body);
    assert!(body.contains("at the peak of "), "{body}");
    assert!(body.contains("peak_spike"), "{body}");
    let bad = handler.handle("GET", "/debug/pprof/cpu?peak=1", None);
    assert_eq!(bad.status, 400);
    let pprof = handler.handle("GET", "/debug/pprof/heap?peak=1", None);
    assert_eq!(pprof.status, 200);
    let decoded = tracing_prof::model::Profile::decode(&pprof.body).unwrap();
    assert!(
        decoded
            .comments
            .iter()
            .any(|c| c.contains("at the peak of"))
    );

    // A reset forgets it: the next readings find the plateau's level.
    profiler.reset_peak();
    std::thread::sleep(Duration::from_millis(200));
    let after = profiler.peak().expect("read again");
    assert_eq!(
        after.path(&["peak_plateau"]).unwrap().memory.inuse_bytes,
        (16 * MIB) as u64
    );
    assert!(
        after
            .path(&["peak_spike"])
            .is_none_or(|p| p.memory.inuse_bytes == 0)
    );
    drop(plateau);
    drop(guard);
}

/// `VmRSS` of `/proc/self/status`, in bytes: the kernel's own count, read independently.
fn vm_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// 32 MiB mapped directly with `mmap` and touched: the resident set and its anonymous part
/// grow by it, the heap does not, and the breakdown says it is memory the heap (and glibc's
/// allocator) does not explain.
#[test]
fn memory_the_allocator_never_saw_is_what_the_heap_does_not_explain() {
    if crate::isolated(
        module_path!(),
        "memory_the_allocator_never_saw_is_what_the_heap_does_not_explain",
    ) {
        return;
    }
    let _serial = serial();
    let (_layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .allocator_stats(tracing_prof::GlibcMalloc)
        .build()
        .unwrap();
    let profiler = guard.profiler().clone();
    let before = profiler.process_memory().expect("Linux 4.14 or later");
    let len = 32 * MIB;
    // SAFETY: an anonymous private mapping of `len` bytes, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping above is `len` bytes, readable and writable.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 1, len) };
    let after = profiler.process_memory().unwrap();
    let rss = vm_rss();
    let grew = |a: u64, b: u64| b as i64 - a as i64;
    let mib = |v: i64| v as f64 / MIB as f64;
    assert!(
        (31.0..34.0).contains(&mib(grew(before.rss_bytes, after.rss_bytes))),
        "{before:?} {after:?}"
    );
    assert!(
        (31.0..34.0).contains(&mib(grew(before.anon_bytes, after.anon_bytes))),
        "{before:?} {after:?}"
    );
    assert!(
        mib(grew(before.heap_inuse_bytes, after.heap_inuse_bytes)).abs() < 1.0,
        "the heap did not see it: {before:?} {after:?}"
    );
    assert!(
        (31.0..34.0).contains(&mib(after.unexplained_bytes() - before.unexplained_bytes())),
        "{before:?} {after:?}"
    );
    // The same resident set as the kernel's other count, read just after.
    assert!(
        mib(grew(after.rss_bytes, rss)).abs() < 2.0,
        "smaps_rollup {} against VmRSS {rss}",
        after.rss_bytes
    );
    if cfg!(target_env = "gnu") {
        let a = after.allocator.as_ref().expect("glibc 2.33 or later");
        assert!(a.held_bytes >= after.heap_inuse_bytes, "{after:?}");
        let text = after.describe();
        assert!(text.contains("glibc malloc (mallinfo2) holds"), "{text}");
    }
    // Every snapshot carries it, and the memory profiles say it.
    let snapshot = profiler.snapshot();
    assert!(snapshot.process_memory.is_some());
    let heap = snapshot.profile(tracing_prof::ProfileKind::SpanMemory);
    assert!(
        heap.comments
            .iter()
            .any(|c| c.starts_with("tracing-prof: process memory: RSS ")),
        "{:?}",
        heap.comments
    );
    // SAFETY: the mapping made above, `len` bytes, used no more.
    assert_eq!(unsafe { libc::munmap(p, len) }, 0);
    drop(guard);
}

/// The v1 memory hierarchy's directory of this process's cgroup, when this host has one we
/// can make cgroups in (root on a host with cgroup v1's memory controller, as this project's
/// machines are); why not otherwise.
fn v1_memory_cgroup() -> Result<std::path::PathBuf, String> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
    let ours = cgroup
        .lines()
        .find_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, c, path) = (p.next()?, p.next()?, p.next()?);
            c.split(',').any(|c| c == "memory").then(|| path.to_owned())
        })
        .ok_or("no cgroup v1 memory controller on this host (cgroup v2 only)")?;
    let dir = std::path::Path::new("/sys/fs/cgroup/memory").join(ours.trim_start_matches('/'));
    let probe = dir.join(format!("tracing-prof-probe-{}", std::process::id()));
    std::fs::create_dir(&probe)
        .map_err(|e| format!("cannot make a cgroup in {}: {e}", dir.display()))?;
    let _ = std::fs::remove_dir(&probe);
    Ok(dir)
}

/// What a child does in its cgroup (`TRACING_PROF_TEST_OOM_CHILD`): `heap` grows its heap
/// to 232 MiB under one span; `cache` writes 230 MiB to a file (page cache only).
fn oom_child(mode: &str, profiles: &str) {
    // Wait to be moved into the test's cgroup, so that what follows is charged there.
    while !std::fs::read_to_string("/proc/self/cgroup")
        .unwrap()
        .contains("tracing-prof-oom-")
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .sink(FileExporter::new(profiles))
        .build()
        .unwrap();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    tracing::dispatcher::with_default(&dispatch, || {
        tracing::info_span!("oom_grow").in_scope(|| match mode {
            "heap" => {
                let mut held = Vec::new();
                for _ in 0..29 {
                    held.push(vec![1u8; 8 * MIB]);
                    std::thread::sleep(Duration::from_millis(40));
                }
                std::thread::sleep(Duration::from_millis(500));
                held.len()
            }
            _ => {
                use std::io::Write;
                let path = std::path::Path::new(profiles).join("cache.bin");
                let mut f = std::fs::File::create(&path).unwrap();
                let block = vec![7u8; MIB];
                for _ in 0..230 {
                    f.write_all(&block).unwrap();
                }
                drop(f);
                std::thread::sleep(Duration::from_millis(500));
                let _ = std::fs::remove_file(path);
                0
            }
        })
    });
    drop(guard);
}

/// A child process in a v1 memory cgroup of 256 MiB made by the test: its heap growing to
/// 232 MiB under one span writes an incident at 80% and at 90% of the limit, each holding
/// the profiles of that moment (the span with its bytes) and saying why; a child that only
/// fills the page cache with 230 MiB writes none (the working set leaves inactive file pages
/// out). Files under a test root cover v2 and mixed hosts (`tracing-prof-core`'s cgroup
/// tests).
#[test]
fn an_incident_is_written_as_the_cgroup_limit_nears_and_none_for_page_cache() {
    if crate::isolated(
        module_path!(),
        "an_incident_is_written_as_the_cgroup_limit_nears_and_none_for_page_cache",
    ) {
        return;
    }
    if let (Ok(mode), Ok(dir)) = (
        std::env::var("TRACING_PROF_TEST_OOM_CHILD"),
        std::env::var("TRACING_PROF_TEST_OOM_DIR"),
    ) {
        return oom_child(&mode, &dir);
    }
    let _serial = serial();
    let parent = match v1_memory_cgroup() {
        Ok(dir) => dir,
        Err(why) => {
            eprintln!("SKIPPED: the real-cgroup incident test: {why}");
            return;
        }
    };
    for mode in ["heap", "cache"] {
        let cgroup = parent.join(format!("tracing-prof-oom-{}-{mode}", std::process::id()));
        std::fs::create_dir(&cgroup).unwrap();
        std::fs::write(
            cgroup.join("memory.limit_in_bytes"),
            (256 * MIB).to_string(),
        )
        .unwrap();
        let profiles = tempfile::Builder::new()
            .prefix("tracing-prof-oom-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &crate::test_name(
                    module_path!(),
                    "an_incident_is_written_as_the_cgroup_limit_nears_and_none_for_page_cache",
                ),
                "--nocapture",
            ])
            .env("TRACING_PROF_TEST_OOM_CHILD", mode)
            .env("TRACING_PROF_TEST_OOM_DIR", profiles.path())
            .spawn()
            .unwrap();
        std::fs::write(cgroup.join("cgroup.procs"), child.id().to_string()).unwrap();
        let status = child.wait().unwrap();
        // The usage counting page cache went past 80% all the same.
        let max_usage: usize = std::fs::read_to_string(cgroup.join("memory.max_usage_in_bytes"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let _ = std::fs::remove_dir(&cgroup);
        assert!(max_usage > 220 * MIB, "{mode}: max usage {max_usage}");
        assert!(status.success(), "{mode}: {status:?}");
        let incidents = profiles.path().join("incidents");
        let mut found: Vec<String> = std::fs::read_dir(&incidents)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        found.sort();
        if mode == "cache" {
            assert!(found.is_empty(), "page cache is no incident: {found:?}");
            continue;
        }
        let with = |cause: &str| found.iter().find(|f| f.contains(cause)).cloned();
        let at90 = with("-memory-90pct-").unwrap_or_else(|| panic!("{found:?}"));
        assert!(with("-memory-80pct-").is_some(), "{found:?}");
        let folder = incidents.join(at90);
        let text = std::fs::read_to_string(folder.join("incident.txt")).unwrap();
        assert!(
            text.contains("the working set reached 9") && text.contains("256.0 MiB memory limit"),
            "{text}"
        );
        assert!(text.contains("cgroup v1 /"), "{text}");
        let span_memory = tracing_prof::model::Profile::decode(
            &std::fs::read(folder.join("span_memory.pb.gz")).unwrap(),
        )
        .unwrap();
        let k = span_memory.sample_type_index("inuse_space").unwrap();
        let grow = span_memory
            .filtered(|s| matches!(&s.stack[..], [f] if f.function.ends_with("oom_grow")))
            .total(k);
        assert!(
            // The chunks so far, and the vector that holds them.
            grow >= (200 * MIB) as i64 && grow <= (232 * MIB) as i64 + 1024,
            "{grow} bytes under oom_grow at 90%"
        );
        assert!(folder.join("heap_peak.pb.gz").exists());
    }
}

/// The flight recorder keeps the windows of its last length and nothing older, served as a
/// tar.gz that `tar` lists and whose profiles `go tool pprof` reads; a slow span writes an
/// incident holding them.
#[test]
fn the_flight_recorder_keeps_the_last_windows_and_a_slow_span_writes_them() {
    if crate::isolated(
        module_path!(),
        "the_flight_recorder_keeps_the_last_windows_and_a_slow_span_writes_them",
    ) {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .flight_recorder(Some((Duration::from_millis(1500), 8 << 20)))
        .slow_span("fr_request", Duration::from_millis(20))
        .sink(FileExporter::new(dir.path()))
        .build()
        .unwrap();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    let request = |ms: u64| {
        tracing::dispatcher::with_default(&dispatch, || {
            tracing::info_span!("fr_request").in_scope(|| {
                std::hint::black_box(vec![3u8; 4096]);
                std::thread::sleep(Duration::from_millis(ms));
            })
        })
    };
    // Six exports 500 ms apart, fast requests only: five windows made, the last 1.5 s kept.
    for _ in 0..6 {
        request(1);
        guard.flush(Duration::from_secs(30)).unwrap();
        std::thread::sleep(Duration::from_millis(500));
    }
    let profiler = guard.profiler().clone();
    let files = profiler.flight_recording();
    let windows: std::collections::BTreeSet<&str> = files
        .iter()
        .map(|f| f.0.split('/').next().unwrap())
        .collect();
    assert!(
        (3..=4).contains(&windows.len()),
        "the windows of the last 1.5 s: {windows:?}"
    );
    let (kept, bytes) = profiler.stats().flight_recorder;
    assert_eq!(kept, windows.len());
    assert_eq!(bytes, files.iter().map(|f| f.1.len()).sum::<usize>());
    // Each window has its own numbers: one request of the path in each.
    let spans: Vec<_> = files
        .iter()
        .filter(|f| f.0.ends_with("/spans.pb.gz"))
        .collect();
    assert_eq!(spans.len(), windows.len());
    for (name, bytes) in spans {
        let p = tracing_prof::model::Profile::decode(bytes).unwrap();
        let k = p.sample_type_index("spans").unwrap();
        let n = p
            .filtered(|s| matches!(&s.stack[..], [f] if f.function.ends_with("fr_request")))
            .total(k);
        assert_eq!(n, 1, "one request in the window {name}");
    }
    assert!(
        !dir.path().join("incidents").exists(),
        "no trigger yet: no span slower than 20 ms"
    );

    // Served as a tar.gz.
    let handler = tracing_prof::export::PprofHandler::new(profiler.clone());
    let tgz = handler.handle("GET", "/debug/pprof/flightrecorder", None);
    assert_eq!(tgz.status, 200);
    let archive = dir.path().join("flight.tar.gz");
    std::fs::write(&archive, &tgz.body).unwrap();
    let listing = std::process::Command::new("tar")
        .arg("tzf")
        .arg(&archive)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert_eq!(listing.lines().count(), files.len(), "{listing}");
    assert!(
        listing.lines().all(|l| l.starts_with("flightrecorder/")),
        "{listing}"
    );
    if common::have_go() {
        let out = std::process::Command::new("tar")
            .arg("xzf")
            .arg(&archive)
            .arg("-C")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(out.success());
        let first = dir.path().join("flightrecorder").join(&files[0].0);
        let top = common::pprof(&["-top"], &first);
        assert!(!top.is_empty());
    }

    // A slow span: at the next export, an incident with the recording.
    request(30);
    guard.flush(Duration::from_secs(30)).unwrap();
    let incidents: Vec<std::path::PathBuf> = std::fs::read_dir(dir.path().join("incidents"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(incidents.len(), 1, "{incidents:?}");
    let folder = &incidents[0];
    assert!(
        folder.to_string_lossy().contains("-slow-span-"),
        "{folder:?}"
    );
    let text = std::fs::read_to_string(folder.join("incident.txt")).unwrap();
    // 20 ms is a bucket bound (ten per decade: 20 ms is 2 x 10^7 ns).
    assert!(
        text.contains("1 spans of `fr_request` slower than 20.0 ms"),
        "{text}"
    );
    let flight: Vec<_> = std::fs::read_dir(folder.join("flight")).unwrap().collect();
    assert!((3..=5).contains(&flight.len()), "{flight:?}");
    // Once per recorder length: another slow span right away writes none.
    request(30);
    guard.flush(Duration::from_secs(30)).unwrap();
    assert_eq!(
        std::fs::read_dir(dir.path().join("incidents"))
            .unwrap()
            .count(),
        1
    );
    assert_eq!(profiler.stats().incidents, 1);
    drop(guard);
}

/// The flight signal, when the user names one: each `SIGUSR1` writes an incident (cause
/// `signal`) with the recording as it is, from the aggregator thread; the toggle signal cannot
/// be the same one.
#[test]
fn the_flight_signal_writes_the_recording_on_demand() {
    if crate::isolated(
        module_path!(),
        "the_flight_signal_writes_the_recording_on_demand",
    ) {
        return;
    }
    let _serial = serial();
    use tracing_prof::core::UserSignal;
    let same = Profiler::builder()
        .toggle_signal(Some(UserSignal::Usr1))
        .flight_signal(Some(UserSignal::Usr1))
        .build();
    let Err(e) = same else {
        panic!("one signal for both the toggle and the flight recorder was accepted")
    };
    assert!(
        e.to_string().contains("SIGUSR1 is the toggle signal"),
        "{e}"
    );

    let dir = tempfile::tempdir().unwrap();
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .flight_recorder(Some((Duration::from_secs(60), 8 << 20)))
        .flight_signal(Some(UserSignal::Usr1))
        .sink(FileExporter::new(dir.path()))
        .build()
        .unwrap();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    // Three exports: three windows.
    for _ in 0..3 {
        tracing::dispatcher::with_default(&dispatch, || {
            tracing::info_span!("fs_request").in_scope(|| std::hint::black_box(vec![5u8; 4096]));
        });
        guard.flush(Duration::from_secs(30)).unwrap();
    }
    // Whole incidents: one being written is `NAME.partial` until renamed.
    let incidents = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir.path().join("incidents"))
            .map(|d| {
                d.map(|e| e.unwrap().path())
                    .filter(|p| p.extension().is_none_or(|x| x != "partial"))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(incidents().is_empty());
    for n in 1..=2 {
        // SAFETY: kill to this process; our handler for SIGUSR1 only adds to a counter.
        assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) }, 0);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while incidents().len() < n && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let found = incidents();
        assert_eq!(found.len(), n, "{found:?}");
    }
    for folder in incidents() {
        assert!(folder.to_string_lossy().contains("-signal-"), "{folder:?}");
        let text = std::fs::read_to_string(folder.join("incident.txt")).unwrap();
        assert!(
            text.contains("SIGUSR1 received: the flight recorder's recording, on demand"),
            "{text}"
        );
        let windows: Vec<_> = std::fs::read_dir(folder.join("flight")).unwrap().collect();
        assert_eq!(
            windows.len(),
            2,
            "two windows between three exports: {windows:?}"
        );
        assert!(folder.join("heap.pb.gz").exists() && folder.join("span_memory.pb.gz").exists());
    }
    assert_eq!(guard.profiler().stats().incidents, 2);
    drop(guard);
}
