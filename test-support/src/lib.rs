//! What the tests of tracing-prof share (a crate of their own, never published, instead of a
//! module each test binary includes by path): reading profiles back with the real client,
//! `go tool pprof`, and this thread's CPU clock, which the CPU tests burn time by; and a stub
//! HTTP server for the exporters' stand-in receivers ([`stub_server`]); (feature `otlp`)
//! `otlp_receiver`, a stand-in OTLP profiles receiver written from the Collector's and
//! Pyroscope's rules; and (feature `pyroscope`) `pyroscope_server`, a stand-in Pyroscope
//! written from Pyroscope's own rules.

pub mod bench;
pub mod isolated;
#[cfg(feature = "otlp")]
pub mod otlp_receiver;
#[cfg(feature = "pyroscope")]
pub mod pyroscope_server;
pub mod stub_server;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// This thread's CPU time in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Forks; the child runs `child` and leaves with `_exit` and what it returned, without running
/// the parent's exit handlers; the parent waits for it and gets its wait status (for
/// `libc::WIFEXITED` and `libc::WEXITSTATUS`).
///
/// # Safety
/// `child` runs in the child of a process that may have other threads: it may only do what is
/// safe there (take no lock another thread may have held at the fork, and so on).
pub unsafe fn fork_and_wait(child: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the caller vouches for what the child runs; it leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = child();
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked, into a valid int.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    status
}

/// Burns `ms` milliseconds of this thread's CPU time in a multiply loop, reading the thread's
/// CPU clock seldom (it is a system call, and CPU timers fire as it returns: few samples land
/// in it). Returns the loop's value, so that it is not optimised away.
pub fn burn_cpu(ms: u64) -> u64 {
    let start = thread_cpu_ns();
    let mut x = 1u64;
    while thread_cpu_ns() - start < ms * 1_000_000 {
        for _ in 0..200_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

/// How many pages of the `len` bytes from `start` are memory now (`mincore`): for the tests
/// that check that a table's pages become memory only where it is written. The range must lie
/// in one live mapping.
pub fn resident_pages(start: *const u8, len: usize) -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let first = start as usize / page * page;
    let pages = (start as usize + len - first).div_ceil(page);
    let mut v = vec![0u8; pages];
    // SAFETY: the range (rounded down to its first page, mapped too) lies in one live mapping
    // (the caller's contract), and `v` has a byte per page.
    let r = unsafe {
        libc::mincore(
            first as *mut libc::c_void,
            pages * page,
            v.as_mut_ptr().cast(),
        )
    };
    assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
    v.iter().filter(|&&b| b & 1 == 1).count()
}

/// Whether `program` runs (`program version_arg` succeeds). Under `CI=true` a missing one fails
/// the test instead of skipping it: `package` names what to install, `needed_for` what would
/// not be tested.
pub fn have(program: &str, version_arg: &str, package: &str, needed_for: &str) -> bool {
    let ok = Command::new(program)
        .arg(version_arg)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "`{program}` is not installed, and CI=true: {needed_for} must run (install {package})"
        );
        eprintln!("SKIPPED: `{program}` is not installed, so {needed_for} cannot run");
    }
    ok
}

/// `promtool check metrics` on `text` (the Prometheus text format), where promtool runs (see
/// [`have`]; Debian's `prometheus` has it): panics with what it says of a problem.
pub fn promtool_check_metrics(text: &str) {
    use std::io::Write;
    if !have(
        "promtool",
        "--version",
        "prometheus",
        "the check of /metrics by promtool",
    ) {
        return;
    }
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child
        .stdin
        .take()
        .expect("promtool's stdin")
        .write_all(text.as_bytes())
        .expect("promtool reads the text");
    let out = child.wait_with_output().expect("promtool ends");
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether `go` can be run (see [`have`]).
pub fn have_go() -> bool {
    have(
        "go",
        "version",
        "golang-go",
        "the tests that read profiles back with go tool pprof",
    )
}

/// Runs `go tool pprof ARGS TARGET` (a file or a URL) and returns stdout; panics with stderr on
/// failure.
pub fn pprof(args: &[&str], target: impl AsRef<std::ffi::OsStr>) -> String {
    let file = Path::new(target.as_ref());
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .output()
        .expect("run go tool pprof");
    assert!(
        out.status.success(),
        "go tool pprof {args:?} {} failed:\n{}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// The test binary run again as the profiled server of a real-code test (its own allocations
/// and CPU stay out of the load generator's): `cmd` is the binary, or a wrapper that runs it
/// (`perf record ... -- BINARY`); it gets the arguments that run `test` alone, `child_var` set
/// to `dir` (the child's cue, and where it writes), its exports into `dir/files` at its end only
/// (`TRACING_PROF_INTERVAL=1h`), CPU sampled at 1000 Hz, and stdin and stdout piped.
pub fn server_child(mut cmd: Command, test: &str, child_var: &str, dir: &Path) -> ServerChild {
    use std::os::unix::process::CommandExt;
    cmd.args(["--exact", test, "--nocapture"])
        .env(child_var, dir)
        .env("TRACING_PROF_DIR", dir.join("files"))
        .env("TRACING_PROF_CPU_HZ", "1000")
        .env("TRACING_PROF_INTERVAL", "1h")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .process_group(0);
    ServerChild(cmd.spawn().expect("the server child starts"))
}

/// A [`server_child`], leader of a process group of its own (with `perf record` as `cmd`,
/// perf and the server under it). Dropped while it still runs, as when the test fails before
/// waiting for it, the whole group is killed and the child reaped: nothing is left running, or
/// writing its final export into the test's folder while that folder is removed.
#[derive(Debug)]
pub struct ServerChild(std::process::Child);

impl std::ops::Deref for ServerChild {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for ServerChild {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: kill(2) with a negative pid signals that process group; the child leads
            // its own group (`process_group(0)`) and is not reaped yet, so the group is its.
            unsafe { libc::kill(-(self.0.id() as libc::pid_t), libc::SIGKILL) };
            let _ = self.0.wait();
        }
    }
}

/// A profile as `go tool pprof -raw` prints it.
#[derive(Debug)]
pub struct Raw {
    /// Sample type names, e.g. `inuse_space`.
    pub types: Vec<String>,
    /// Stack (function names, root first) -> values, one per sample type, summed over samples.
    pub samples: BTreeMap<Vec<String>, Vec<i64>>,
}

impl Raw {
    /// The values of the sample whose stack (root first) is `stack`.
    pub fn get(&self, stack: &[&str]) -> Option<&Vec<i64>> {
        let key: Vec<String> = stack.iter().map(|s| s.to_string()).collect();
        self.samples.get(&key)
    }

    /// The value of sample type `ty` for `stack`, 0 if the stack is absent.
    pub fn value(&self, stack: &[&str], ty: &str) -> i64 {
        let i = self
            .types
            .iter()
            .position(|t| t == ty)
            .unwrap_or_else(|| panic!("no type {ty}"));
        self.get(stack).map_or(0, |v| v[i])
    }

    /// Sum of sample type `ty` over samples whose stack matches `keep`.
    pub fn sum(&self, ty: &str, keep: impl Fn(&[String]) -> bool) -> i64 {
        let i = self
            .types
            .iter()
            .position(|t| t == ty)
            .unwrap_or_else(|| panic!("no type {ty}"));
        self.samples
            .iter()
            .filter(|(k, _)| keep(k))
            .map(|(_, v)| v[i])
            .sum()
    }
}

/// One location of `go tool pprof -raw`'s table, as a frame.
#[derive(Clone, Debug)]
pub struct RawFrame {
    /// The function's name as viewers show it.
    pub name: String,
    /// Its full (system) name, which `-raw` prints in brackets after `s=N` where it differs
    /// from the shown one; the shown one otherwise.
    pub system_name: String,
    /// Whether the location names a source file (code frames from debug information have one;
    /// those named from a symbol table alone, `send :0`, do not).
    pub has_file: bool,
}

/// One sample of `go tool pprof -raw`: its values (one per sample type) and its frames, leaf
/// first.
pub type RawSample = (Vec<i64>, Vec<RawFrame>);

/// Parses `go tool pprof -raw TARGET` sample by sample: the sample type names, then each
/// sample.
pub fn raw_samples(file: impl AsRef<std::ffi::OsStr>) -> (Vec<String>, Vec<RawSample>) {
    let text = pprof(&["-raw"], file);
    let mut lines = text.lines();
    for l in lines.by_ref() {
        if l.trim() == "Samples:" {
            break;
        }
    }
    let header = lines.next().expect("sample types line");
    let types: Vec<String> = header
        .split_whitespace()
        .map(|t| t.split('/').next().unwrap().to_owned())
        .collect();
    let mut raw_samples = Vec::new();
    for l in lines.by_ref() {
        if l.trim() == "Locations" {
            break;
        }
        // "      1       1000: 1 2 " — values, then location ids after the colon.
        // Label lines ("bytes:[48 bytes]") do not parse as numbers and are skipped.
        if let Some((vals, locs)) = l.split_once(':') {
            let Ok(vals) = vals
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<Vec<i64>, _>>()
            else {
                continue;
            };
            let locs: Vec<u64> = locs
                .split_whitespace()
                .map(|v| v.parse().unwrap())
                .collect();
            if vals.len() == types.len() {
                raw_samples.push((vals, locs));
            }
        }
    }
    // "     1: 0x0 M=2 target::name [span] file.rs:10 s=0", "... send :0 s=0", or with the full
    // name after `s=0` in brackets.
    let mut frames = BTreeMap::new();
    for l in lines {
        let Some((id, rest)) = l.split_once(':') else {
            continue;
        };
        let Ok(id) = id.trim().parse::<u64>() else {
            continue;
        };
        // After "0x0 M=N ", the name (which may hold spaces: "(no span)", "app::request
        // [span]"), the "file:line" word when there is one, then " s=N" and the full name.
        let Some((_, rest)) = rest.split_once(" M=") else {
            continue;
        };
        let Some((_, rest)) = rest.split_once(' ') else {
            continue;
        };
        let (rest, system) = rest.rsplit_once(" s=").unwrap_or((rest, ""));
        let (name, file) = match rest.rsplit_once(' ') {
            Some((n, at))
                if at
                    .rsplit_once(':')
                    .is_some_and(|(_, line)| line.chars().all(|c| c.is_ascii_digit())) =>
            {
                (n, !at.starts_with(':'))
            }
            _ => (rest, false),
        };
        let name = name.trim().to_owned();
        let system_name = system
            .split_once('(')
            .and_then(|(_, s)| s.strip_suffix(')'))
            .map_or_else(|| name.clone(), str::to_owned);
        frames.insert(
            id,
            RawFrame {
                name,
                system_name,
                has_file: file,
            },
        );
    }
    let samples = raw_samples
        .into_iter()
        .map(|(vals, locs)| (vals, locs.iter().map(|id| frames[id].clone()).collect()))
        .collect();
    (types, samples)
}

/// Parses `go tool pprof -raw TARGET`: stacks by shown names, root first, values summed.
pub fn raw(file: impl AsRef<std::ffi::OsStr>) -> Raw {
    let (types, raw_samples) = raw_samples(file);
    let mut samples: BTreeMap<Vec<String>, Vec<i64>> = BTreeMap::new();
    for (vals, frames) in raw_samples {
        let stack: Vec<String> = frames.into_iter().rev().map(|f| f.name).collect();
        let entry = samples.entry(stack).or_insert_with(|| vec![0; vals.len()]);
        for (e, v) in entry.iter_mut().zip(vals) {
            *e += v;
        }
    }
    Raw { types, samples }
}

/// The stacks of `go tool pprof -traces` output: each one's frame names, leaf first, without
/// its value and its label lines.
pub fn traces(text: &str) -> Vec<Vec<String>> {
    text.split("-----------+")
        .skip(1)
        .map(|t| {
            t.lines()
                .filter_map(|l| {
                    let l = l.trim();
                    let first = l.split_whitespace().next()?;
                    if first.ends_with(':') || first.starts_with("---") {
                        return None; // a label line (`span_path:  request -> render`)
                    }
                    // The first line of a trace starts with its value (`44ms`, `1.55kB`).
                    Some(match l.split_once(char::is_whitespace) {
                        Some((v, rest)) if v.starts_with(|c: char| c.is_ascii_digit()) => {
                            rest.trim().to_owned()
                        }
                        _ => l.to_owned(),
                    })
                })
                .collect::<Vec<String>>()
        })
        .filter(|t| !t.is_empty())
        .collect()
}

/// A fresh folder `tracing-prof-NAME-*` in the system's temporary folder, removed with what
/// is in it when dropped, a failing test's too.
#[cfg(feature = "pprof")]
pub fn scratch_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("tracing-prof-{name}-"))
        .tempdir()
        .expect("a temporary folder")
}

/// Writes `profile` as `kind` into a fresh temporary file (`tracing-prof-NAME-*.pb.gz`) and
/// returns its path, which removes the file when dropped (a failing test's too: each test
/// process left a folder behind).
#[cfg(feature = "pprof")]
pub fn write_profile(
    profile: &tracing_prof_model::Snapshot,
    kind: tracing_prof_model::ProfileKind,
    name: &str,
) -> tempfile::TempPath {
    let mut file = tempfile::Builder::new()
        .prefix(&format!("tracing-prof-{name}-"))
        .suffix(".pb.gz")
        .tempfile()
        .expect("a temporary file");
    std::io::Write::write_all(&mut file, &profile.encode(kind)).expect("the profile written");
    file.into_temp_path()
}

/// The user documentation as one text: `README.md`, then each page of `docs/` in name order,
/// each page after a line `<!-- docs/NAME.md -->`. The tests that run what the documentation
/// shows read this, so a block moved from one page to another is still checked.
pub fn documentation() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut pages: Vec<_> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    let mut out = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    for page in pages {
        let name = page.file_name().expect("a file name").to_string_lossy();
        out.push_str(&format!("\n<!-- docs/{name} -->\n"));
        out.push_str(&std::fs::read_to_string(&page).expect("a docs/ page"));
    }
    out
}
