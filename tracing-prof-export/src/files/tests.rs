//! The file exporter's tests: names, pruning, orphans, full disks, planted links, modes,
//! directories others control, runs that share a pid.

use super::*;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, SystemTime};

/// ENOSPC and EDQUOT, as the OS reports them, are a full disk; a read-only mount or a
/// permission is a setting.
#[test]
fn a_full_disk_is_known_from_a_setting() {
    let err = |errno| FileError::Io {
        action: "write a profile in",
        path: PathBuf::from("/x"),
        source: std::io::Error::from_raw_os_error(errno),
    };
    assert!(err(libc::ENOSPC).is_out_of_space());
    assert!(err(libc::EDQUOT).is_out_of_space());
    assert!(!err(libc::EROFS).is_out_of_space());
    assert!(!err(libc::EACCES).is_out_of_space());
}

#[test]
fn timestamps() {
    assert_eq!(utc_stamp(0), "19700101T000000.000000Z");
    assert_eq!(utc_stamp(1_795_348_925_123_456), "20261122T120205.123456Z");
    assert_eq!(utc_stamp(951_825_600_000_000), "20000229T120000.000000Z"); // leap day
}

/// The directory reads at a glance: the index and the newest file of each kind at the top,
/// every export's files in `captures/`, and nothing else.
#[test]
fn the_directory_holds_the_index_the_newest_files_and_captures() {
    let scratch = scratch("layout");
    let dir = scratch.path().to_owned();
    let kinds = [ProfileKind::Spans, ProfileKind::Heap];
    let mut e = FileExporter::new(&dir).kinds(kinds).keep(2).deltas(true);
    let profile = Snapshot::new(SystemTime::now(), Duration::ZERO);
    for _ in 0..3 {
        e.write(&profile).unwrap();
    }
    let list = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        list(&dir),
        [
            "README.txt",
            "captures",
            "heap-delta.latest.pb.gz",
            "heap.latest.pb.gz",
            "spans-delta.latest.pb.gz",
            "spans.latest.pb.gz",
        ]
    );
    // Two exports kept, each of two kinds and their deltas.
    let captures = list(&dir.join(CAPTURES_DIR));
    assert_eq!(captures.len(), 8, "{captures:?}");
    let newest = |stem: &str| {
        let mut of: Vec<_> = captures
            .iter()
            .filter(|n| n.starts_with(&format!("{stem}.")))
            .collect();
        of.sort();
        dir.join(CAPTURES_DIR).join(of.last().unwrap())
    };
    for stem in ["heap", "heap-delta", "spans", "spans-delta"] {
        let latest = std::fs::metadata(dir.join(format!("{stem}.latest.pb.gz"))).unwrap();
        assert_eq!(
            latest.ino(),
            std::fs::metadata(newest(stem)).unwrap().ino(),
            "{stem}.latest.pb.gz is the newest capture"
        );
    }
    let index = std::fs::read_to_string(dir.join(INDEX_FILE)).unwrap();
    for line in [
        "  spans.latest.pb.gz             time per span path: count, wall, busy, idle, CPU, off-CPU",
        "  KIND-delta.latest.pb.gz        the last interval only: counters over it, memory at its end",
        "captures/ holds every export's files, KIND.PID.TIMESTAMP.RUN.pb.gz (the newest 2 \
         exports of each run are kept).",
        "  tracing-prof leaks captures/heap.*.pb.gz                    the code that holds it",
    ] {
        assert!(index.lines().any(|l| l == line), "{line:?} not in\n{index}");
    }
    assert!(!index.contains("cpu.latest"), "a kind not written: {index}");
    assert!(
        !index.contains(".svg"),
        "no flame graphs asked for: {index}"
    );
}

#[test]
fn names_stay_unique_and_ordered_within_one_microsecond() {
    let scratch = scratch("names");
    let dir = scratch.path().to_owned();
    let mut e = FileExporter::new(&dir).keep(0).kinds([ProfileKind::Heap]);
    let profile = Snapshot::new(SystemTime::now(), Duration::ZERO);
    let names: Vec<PathBuf> = (0..5).flat_map(|_| e.write(&profile).unwrap()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(
        sorted, names,
        "five exports of one instant: five names, in order"
    );
}

#[test]
fn an_unwritable_directory_gives_one_message_at_every_export() {
    // /proc/self exists and refuses new files, for root too.
    let mut e = FileExporter::new("/proc/self").kinds([ProfileKind::Heap]);
    assert!(e.check().is_err());
    let profile = Snapshot::new(SystemTime::now(), Duration::ZERO);
    let first = e.write(&profile).unwrap_err().to_string();
    std::thread::sleep(Duration::from_millis(2));
    let second = e.write(&profile).unwrap_err().to_string();
    assert_eq!(
        first, second,
        "the profiler reports a changed message again"
    );
    assert!(
        // (/proc answers mkdir with ENOENT.)
        first.starts_with("cannot create directory /proc/self/captures: "),
        "{first}"
    );
}

#[test]
fn orphaned_temporary_files_are_deleted_once_old() {
    let scratch = scratch("orphans");
    let dir = scratch.path().to_owned();
    std::fs::create_dir_all(&dir).unwrap();
    let touch = |name: &str, age: Duration| {
        let path = dir.join(name);
        let f = std::fs::File::create(&path).unwrap();
        f.set_modified(SystemTime::now() - age).unwrap();
        path
    };
    let old = touch(
        ".tracing-prof.1.heap.1.20261122T120205.123456Z.pb.gz.tmp",
        ORPHAN_AGE * 2,
    );
    let fresh = touch(
        ".tracing-prof.2.heap.2.20261122T120205.123456Z.pb.gz.tmp",
        Duration::ZERO,
    );
    let foreign = touch(".someone-else.tmp", ORPHAN_AGE * 2);
    FileExporter::new(&dir).check().unwrap();
    assert!(!old.exists(), "an old temporary file of ours stays");
    assert!(
        fresh.exists(),
        "another exporter's file in progress was deleted"
    );
    assert!(foreign.exists(), "a file that is not ours was deleted");
    assert_eq!(
        files_named(&dir, |_| true),
        3,
        "check leaves its probe behind (beside the two files and captures/)"
    );
    assert_eq!(files_named(&dir.join(CAPTURES_DIR), |_| true), 0);
}

#[test]
fn a_failing_export_never_leaves_more_than_keep_files() {
    let scratch = scratch("room");
    let dir = scratch.path().to_owned();
    let mut e = FileExporter::new(&dir).keep(3).kinds([ProfileKind::Heap]);
    let profile = Snapshot::new(SystemTime::now(), Duration::ZERO);
    let stamps = || {
        files_named(&dir.join(CAPTURES_DIR), |n| {
            n.starts_with(&format!("heap.{}.", std::process::id()))
        })
    };
    for _ in 0..5 {
        e.write(&profile).unwrap();
    }
    assert_eq!(stamps(), 3);
    // Every export now fails after writing its file (the stable name is a directory):
    // pruning only after success left one more file per failed export, so a disk our own
    // files had filled could never be freed by us.
    std::fs::remove_file(dir.join("heap.latest.pb.gz")).unwrap();
    std::fs::create_dir_all(dir.join("heap.latest.pb.gz/x")).unwrap();
    for _ in 0..3 {
        assert!(e.write(&profile).is_err());
        assert_eq!(stamps(), 3);
    }
}

/// Files in `dir` whose name passes `keep`.
fn files_named(dir: &Path, keep: impl Fn(&str) -> bool) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|f| keep(&f.file_name().to_string_lossy()))
        .count()
}

/// A directory of this test's own, made with an unpredictable name (`/tmp` is shared),
/// deleted when dropped.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("tracing-prof-{name}-"))
        .tempdir()
        .unwrap()
}

/// Links planted at every name an attacker could guess (the start-up check's probe, the
/// temporary names, the stable name) never make the exporter write outside its directory:
/// found in an attack on today's main, where the check's pid-named probe truncated the
/// file a link pointed to.
#[test]
fn planted_links_never_lead_a_write_outside_the_directory() {
    let scratch = scratch("links");
    let root = scratch.path().to_owned();
    let (dir, out) = (root.join("p"), root.join("out"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let victim = out.join("victim");
    std::fs::write(&victim, b"PRECIOUS").unwrap();
    let pid = std::process::id();
    for name in [
        format!(".tracing-prof-check.{pid}"),
        format!(".tracing-prof.{pid}.heap.latest.pb.gz.tmp"),
        format!(".tracing-prof.{pid}.heap.{pid}.tmp"),
        "heap.latest.pb.gz".to_owned(),
    ] {
        std::os::unix::fs::symlink(&victim, dir.join(name)).unwrap();
    }
    let mut e = FileExporter::new(&dir).kinds([ProfileKind::Heap]);
    e.check().unwrap();
    e.write(&Snapshot::new(SystemTime::now(), Duration::ZERO))
        .unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"PRECIOUS");
    let latest = std::fs::symlink_metadata(dir.join("heap.latest.pb.gz")).unwrap();
    assert!(
        latest.is_file(),
        "the planted link was replaced, not followed"
    );
}

/// Profiles keep the mode a plain create gives (`0666` less the umask), not `tempfile`'s
/// `0600`: a sidecar running as another user ships them.
#[test]
fn profiles_are_as_readable_as_a_plain_create_makes_them() {
    let scratch = scratch("mode");
    let dir = scratch.path().to_owned();
    let mut e = FileExporter::new(&dir).kinds([ProfileKind::Heap]);
    let written = e
        .write(&Snapshot::new(SystemTime::now(), Duration::ZERO))
        .unwrap();
    let plain = dir.join("plain");
    std::fs::File::create(&plain).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&written[0]), mode(&plain));
    assert_eq!(mode(&dir.join("heap.latest.pb.gz")), mode(&plain));
}

/// A directory any local user could swap files in is refused, with what to do; the sticky
/// bit (as on `/tmp`) makes it safe; one owned by another user (as root only) is refused.
#[test]
fn a_directory_others_control_is_refused() {
    let scratch = scratch("shared");
    let dir = scratch.path().to_owned();
    let set = |mode: u32| std::fs::set_permissions(&dir, fs::Permissions::from_mode(mode));
    set(0o777).unwrap();
    let e = FileExporter::new(&dir).check().unwrap_err().to_string();
    assert!(e.contains("refusing") && e.contains("sticky"), "{e}");
    let mut w = FileExporter::new(&dir);
    assert!(matches!(
        w.write(&Snapshot::new(SystemTime::now(), Duration::ZERO)),
        Err(FileError::Unsafe { .. })
    ));
    set(0o1777).unwrap();
    FileExporter::new(&dir).check().unwrap();
    set(0o755).unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(&dir, Some(65534), None).unwrap();
        let e = FileExporter::new(&dir).check().unwrap_err().to_string();
        assert!(e.contains("owned by user 65534"), "{e}");
        // Through a link of ours to it: the target's owner still counts.
        let link = dir.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(FileExporter::new(&link).check().is_err());
        let _ = std::fs::remove_file(&link);
    } else {
        eprintln!("not root: the other-owner case is not tried here (CI runs as root)");
    }
}

/// Two exporters of one pid (two containers, each PID 1, on one volume) keep their own
/// files: each run prunes only its own, and no name is shared.
#[test]
fn two_runs_with_one_pid_never_prune_each_other() {
    let scratch = scratch("runs");
    let dir = scratch.path().to_owned();
    let profile = Snapshot::new(SystemTime::now(), Duration::ZERO);
    let mut a = FileExporter::new(&dir).keep(2).kinds([ProfileKind::Heap]);
    let mut b = FileExporter::new(&dir).keep(2).kinds([ProfileKind::Heap]);
    assert_ne!(a.run, b.run);
    for _ in 0..4 {
        a.write(&profile).unwrap();
        b.write(&profile).unwrap();
    }
    let of = |e: &FileExporter| {
        files_named(&dir.join(CAPTURES_DIR), |n| {
            n.contains(&format!(".{}.", e.run))
        })
    };
    assert_eq!((of(&a), of(&b)), (2, 2));
}

/// Another process's profile stamped after our last export is another writer; ours, older
/// ones, the stable names and other files are not.
#[test]
fn another_writer_is_known_by_a_newer_profile_not_ours() {
    let since = "20261127T100000.000000Z";
    let find =
        |names: &[&str]| other_writer(names.iter().map(|n| n.to_string()), 7, "abc123", since);
    assert_eq!(
        find(&[
            "heap.7.20261127T100001.000000Z.abc123.pb.gz",
            "heap.8.20261127T095959.000000Z.zzz999.pb.gz",
            "heap.latest.pb.gz",
            "heap.7.20261127T100001.000000Z.abc123.inuse_space.svg",
            "notes.txt",
        ]),
        None
    );
    assert_eq!(
        find(&["heap.1.20261127T100002.000000Z.zzz999.pb.gz"]),
        Some(("1".into(), "zzz999".into()))
    );
    // Same pid, another run (two containers, each PID 1).
    assert_eq!(
        find(&["cpu.7.20261127T100002.000000Z.qqq111.pb.gz"]),
        Some(("7".into(), "qqq111".into()))
    );
    // Named before runs were.
    assert_eq!(
        find(&["spans.9.20261127T100002.000000Z.pb.gz"]),
        Some(("9".into(), String::new()))
    );
}
