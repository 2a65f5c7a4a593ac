//! Runs a benchmark variant in a child process (this same binary) and reads back its wall time,
//! CPU time, peak RSS and final flush time, so that whole-process costs can be compared.
//!
//! The child prints `wall_ns=N flush_ns=N` on stdout; `wait4` gives its rusage.

use std::io::Read;
use std::process::{Command, Stdio};

/// This process's user and system time so far (`getrusage`).
pub fn cpu_time() -> (std::time::Duration, std::time::Duration) {
    use std::time::Duration;
    // SAFETY: an all-zero rusage is valid; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF and a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// The global subscriber of an unprofiled variant: a registry with the span layer alone
/// (`layer_only`), or with a no-op layer (a registry with no layer at all never frees a closed
/// span: see BENCHMARKS.md's method).
pub fn init_unprofiled(layer_only: bool) {
    use tracing_subscriber::prelude::*;
    if layer_only {
        tracing_subscriber::registry()
            .with(tracing_prof::ProfileLayer::new())
            .init();
    } else {
        tracing_subscriber::registry()
            .with(tracing_subscriber::layer::Identity::new())
            .init();
    }
}

/// The value of environment variable `name`, read without allocating (usable from a global
/// allocator before its first allocation returns); empty when unset.
pub fn env_bytes(name: &'static std::ffi::CStr) -> &'static [u8] {
    // SAFETY: getenv with a NUL-terminated name; it allocates nothing. The result is only read,
    // and the benchmarks never change their environment.
    let v = unsafe { libc::getenv(name.as_ptr()) };
    if v.is_null() {
        return b"";
    }
    // SAFETY: a non-null result points to a NUL-terminated string that lives as long as the
    // environment, which the benchmarks never modify.
    unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes()
}

/// A numeric setting from the environment (`TRACING_PROF_BENCH_ROUNDS`...), or `default`.
pub fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The cheap-request workload as a child of the cheap benchmarks runs it:
/// `TRACING_PROF_BENCH_REQUESTS` requests (default 400 000), 256 in flight, on a tokio runtime
/// with one worker per CPU (tokio's default); returns its wall time, the runtime's shutdown
/// included.
pub fn run_cheap() -> std::time::Duration {
    let requests = setting("TRACING_PROF_BENCH_REQUESTS", 400_000);
    let start = std::time::Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // The requests are spawned from a task on the runtime, as a server's connection tasks do,
    // not from outside it (each spawn from outside wakes a worker: context switches dominate).
    let total = rt.block_on(async move {
        tokio::spawn(crate::run_cheap(requests, 256))
            .await
            .expect("the request loop")
    });
    std::hint::black_box(total);
    drop(rt);
    start.elapsed()
}

/// One child's numbers.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Wall time of its request loop, in seconds.
    pub wall_s: f64,
    /// CPU time of the whole child (user and system), in seconds.
    pub cpu_s: f64,
    /// Its peak resident memory, in MiB.
    pub maxrss_mib: f64,
    /// Its final flush, in milliseconds.
    pub flush_ms: f64,
}

/// The line a child prints for [`spawn`] to read.
pub fn report(wall: std::time::Duration, flush: std::time::Duration) {
    println!("wall_ns={} flush_ns={}", wall.as_nanos(), flush.as_nanos());
}

/// Runs this binary again with `env=mode` and returns what the child reported.
pub fn spawn(env: &str, mode: &str) -> Run {
    spawn_with(env, mode, None)
}

/// [`spawn`], with one more environment variable set in the child.
pub fn spawn_with(env: &str, mode: &str, extra: Option<(&str, &str)>) -> Run {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.env(env, mode).stdout(Stdio::piped());
    if let Some((k, v)) = extra {
        command.env(k, v);
    }
    #[allow(
        clippy::zombie_processes,
        reason = "reaped below by wait4, which also returns its rusage"
    )]
    let mut c = command.spawn().expect("spawn the benchmark child");
    let mut out = String::new();
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pid is our child's; status and ru are valid, writable locals.
    let pid = unsafe { libc::wait4(c.id() as libc::pid_t, &mut status, 0, &mut ru) };
    assert!(
        pid > 0 && status == 0,
        "child {mode} failed (status {status}): {out}"
    );
    let field = |k: &str| -> f64 {
        out.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Run {
        wall_s: field("wall_ns=") / 1e9,
        cpu_s: tv(ru.ru_utime) + tv(ru.ru_stime),
        maxrss_mib: ru.ru_maxrss as f64 / 1024.0,
        flush_ms: field("flush_ns=") / 1e6,
    }
}

/// Runs every mode `rounds` times, rotating the order each round; runs per mode, in `modes` order.
pub fn rotate(env: &str, modes: &[&str], rounds: usize) -> Vec<Vec<Run>> {
    rotate_with(env, modes, rounds, &|_| None)
}

/// [`rotate`], with `extra(mode)` naming one more environment variable for that mode's child.
pub fn rotate_with(
    env: &str,
    modes: &[&str],
    rounds: usize,
    extra: &dyn Fn(&str) -> Option<(&'static str, &'static str)>,
) -> Vec<Vec<Run>> {
    rotate_runs(modes, rounds, |mode| spawn_with(env, mode, extra(mode)))
}

/// `run(mode)` for every mode, `rounds` times, rotating the order each round; the results per
/// mode, in `modes` order.
pub fn rotate_runs<T>(
    modes: &[&str],
    rounds: usize,
    mut run: impl FnMut(&str) -> T,
) -> Vec<Vec<T>> {
    let mut runs: Vec<Vec<T>> = modes.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for j in 0..modes.len() {
            let i = (round + j) % modes.len();
            runs[i].push(run(modes[i]));
        }
    }
    runs
}

/// The median of `v`.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median of `f` over `runs`.
pub fn med<T>(runs: &[T], f: &dyn Fn(&T) -> f64) -> f64 {
    median(runs.iter().map(f).collect())
}

/// Median of the per-round ratios of `f` between `runs` and `base`.
pub fn ratio<T>(runs: &[T], base: &[T], f: &dyn Fn(&T) -> f64) -> f64 {
    median(runs.iter().zip(base).map(|(a, b)| f(a) / f(b)).collect())
}

/// One row of [`print_table`]: its name, its unit and the value of a run.
pub type Row<'a, T> = (&'a str, &'a str, &'a dyn Fn(&T) -> f64);

/// Prints a markdown table comparing each variant with the first: per row, the median of
/// each variant and its median per-round ratio to the first; then, where given, the final
/// flush's median per variant but the first.
pub fn print_table<T>(
    names: &[&str],
    runs: &[Vec<T>],
    rows: &[Row<'_, T>],
    flush_ms: Option<&dyn Fn(&T) -> f64>,
) {
    let mut head = "| | ".to_owned() + names[0];
    for n in &names[1..] {
        head += &format!(" | {n} | ratio");
    }
    println!("{head} |");
    println!("|---|---:{}|", "|---:|---:".repeat(names.len() - 1));
    for (name, unit, f) in rows {
        let mut line = format!("| {name} | {:.3} {unit}", med(&runs[0], *f));
        for r in &runs[1..] {
            line += &format!(
                " | {:.3} {unit} | {:.3}",
                med(r, *f),
                ratio(r, &runs[0], *f)
            );
        }
        println!("{line} |");
    }
    let Some(flush_ms) = flush_ms else { return };
    let mut flush = "| final flush at shutdown |".to_owned();
    for r in &runs[1..] {
        flush += &format!(" | {:.2} ms |", med(r, flush_ms));
    }
    println!("{flush} |");
}

/// Prints a markdown table comparing each variant with the first (`off`).
pub fn table(names: &[&str], runs: &[Vec<Run>]) {
    print_table(
        names,
        runs,
        &[
            ("wall time", "s", &|r: &Run| r.wall_s),
            ("CPU time (user+sys)", "s", &|r: &Run| r.cpu_s),
            ("peak RSS", "MiB", &|r: &Run| r.maxrss_mib),
        ],
        Some(&|r| r.flush_ms),
    );
}
