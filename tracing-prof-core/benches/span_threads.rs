//! Thread scaling of span enter+exit and of a span's life, the way a service has them: a global
//! subscriber (`init()`, not a scoped `with_default`, whose dispatcher is reference-counted on
//! every span's creation and serializes threads on that count) and long-lived threads that took
//! their thread ids one after another, as a runtime's workers do.
//!
//! Each subscriber runs in a child process of its own (a process has one global subscriber):
//! `registry` (a registry with a no-op layer) and `layer` (with `ProfileLayer::new()`). In
//! each, a pool of threads is started once, each thread in turn taking its ids (the `tracing`
//! registry's per-thread slots, sharded-slab's shard, ours) by creating and entering a span;
//! then 1, 2, 4, ... of them (up to the CPUs there are, at most 16) run the operation at once,
//! rounds alternating, time per operation per thread measured from the moment they are woken
//! to the last one's end (the wake-up of the pool, well under 1% of a measurement, included). With no cache line written by two threads, it stays the 1-thread figure.
//!
//! Each thread count runs twice: on threads whose ids are consecutive (what a runtime's workers
//! have), and on threads whose ids are 4 apart (every fourth thread of the pool). The second
//! shows what sharing a cache line with a neighbour's per-thread data costs: tracing-subscriber
//! keeps each thread's span stack in a slot of about 40 bytes next to the other threads' (the
//! `thread_local` crate's per-thread array), and every enter and exit writes it.
//!
//! `cargo bench -p tracing-prof-core --bench span_threads`
//! (`TRACING_PROF_BENCH_ROUNDS`, default 15; a name filter picks `enter` or `life`).

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tracing_prof_core::ProfileLayer;
use tracing_subscriber::prelude::*;

const ENV: &str = "TRACING_PROF_BENCH_CHILD";
/// Ids of the threads that run "4 apart" differ by this much.
const SPREAD: usize = 4;
/// Time per measurement, at least.
const TARGET: Duration = Duration::from_millis(20);

#[derive(Clone, Copy, PartialEq)]
enum Op {
    /// One span, made once, entered and exited `n` times.
    EnterExit,
    /// Inside an entered parent, `n` spans created, entered, exited and closed.
    Life,
}

fn run_op(op: Op, n: u64) {
    match op {
        Op::EnterExit => {
            let span = tracing::info_span!("bench_span");
            for _ in 0..n {
                let _g = black_box(&span).enter();
            }
        }
        Op::Life => {
            let parent = tracing::info_span!("bench_parent");
            let _p = parent.enter();
            for _ in 0..n {
                tracing::info_span!("bench_child").in_scope(|| black_box(()));
            }
        }
    }
}

/// The job the pool runs next: which threads, what, how often.
#[derive(Clone, Copy)]
struct Job {
    serial: u64,
    threads: usize,
    stride: usize,
    op: Op,
    n: u64,
}

struct Pool {
    job: Mutex<(Job, bool)>,
    start: Condvar,
    done: AtomicUsize,
    finished: Mutex<usize>,
    all_done: Condvar,
}

impl Pool {
    /// `size` threads, started one after another: thread `i` takes its ids before thread `i+1`
    /// starts.
    fn start(size: usize) -> Arc<Pool> {
        let pool = Arc::new(Pool {
            job: Mutex::new((
                Job {
                    serial: 0,
                    threads: 0,
                    stride: 1,
                    op: Op::EnterExit,
                    n: 0,
                },
                false,
            )),
            start: Condvar::new(),
            done: AtomicUsize::new(0),
            finished: Mutex::new(0),
            all_done: Condvar::new(),
        });
        for i in 0..size {
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let pool = Arc::clone(&pool);
            std::thread::Builder::new()
                .name(format!("bench-{i}"))
                .spawn(move || {
                    run_op(Op::EnterExit, 10);
                    run_op(Op::Life, 10);
                    let _ = ready_tx.send(());
                    pool.work(i);
                })
                .expect("spawn");
            ready_rx.recv().expect("thread ready");
        }
        pool
    }

    fn work(&self, me: usize) {
        let mut seen = 0;
        loop {
            let job = {
                let mut g = self.job.lock().unwrap();
                while g.0.serial == seen && !g.1 {
                    g = self.start.wait(g).unwrap();
                }
                if g.1 {
                    return;
                }
                g.0
            };
            seen = job.serial;
            if me.is_multiple_of(job.stride) && me / job.stride < job.threads {
                // A panic would leave the count short and the measuring thread waiting: end
                // the child instead, which fails the bench.
                if std::panic::catch_unwind(|| run_op(job.op, job.n)).is_err() {
                    std::process::abort();
                }
                if self.done.fetch_add(1, Ordering::AcqRel) + 1 == job.threads {
                    *self.finished.lock().unwrap() = job.serial as usize;
                    self.all_done.notify_one();
                }
            }
        }
    }

    /// Runs `op` `n` times on `threads` threads whose ids are `stride` apart; the time from
    /// their start to the last one's end.
    fn run(&self, threads: usize, stride: usize, op: Op, n: u64) -> Duration {
        self.done.store(0, Ordering::Relaxed);
        let serial = {
            let mut g = self.job.lock().unwrap();
            g.0 = Job {
                serial: g.0.serial + 1,
                threads,
                stride,
                op,
                n,
            };
            g.0.serial
        };
        let t = Instant::now();
        self.start.notify_all();
        let mut f = self.finished.lock().unwrap();
        while *f != serial as usize {
            f = self.all_done.wait(f).unwrap();
        }
        t.elapsed()
    }

    fn stop(&self) {
        self.job.lock().unwrap().1 = true;
        self.start.notify_all();
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn child(mode: &str) {
    match mode {
        "registry" => tracing_subscriber::registry()
            .with(tracing_subscriber::layer::Identity::new())
            .init(),
        "layer" => tracing_subscriber::registry()
            .with(ProfileLayer::new())
            .init(),
        other => panic!("unknown mode {other}"),
    }
    let rounds = std::env::var("TRACING_PROF_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15usize)
        .max(1);
    let cpus = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(16);
    let counts: Vec<usize> = (0..5).map(|i| 1 << i).filter(|&t| t <= cpus).collect();
    let pool = Pool::start(cpus * SPREAD);
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    for (op, name, what) in [
        (Op::EnterExit, "enter", "enter+exit"),
        (Op::Life, "life", "create+enter+exit+close in a parent"),
    ] {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        // Operations per measurement: about TARGET on one thread.
        let mut n = 1u64;
        loop {
            let t = pool.run(1, 1, op, n);
            if t >= TARGET / 4 || n >= 1 << 30 {
                n = ((TARGET.as_secs_f64() / (t.as_secs_f64() / n as f64)) as u64).max(1);
                break;
            }
            n *= 2;
        }
        let variants: Vec<(usize, usize)> = counts
            .iter()
            .flat_map(|&t| [(t, 1), (t, SPREAD)])
            .filter(|&(t, s)| t > 1 || s == 1)
            .collect();
        let mut ns = vec![Vec::with_capacity(rounds); variants.len()];
        for round in 0..rounds {
            for j in 0..variants.len() {
                let i = (round + j) % variants.len();
                let (t, s) = variants[i];
                ns[i].push(pool.run(t, s, op, n).as_nanos() as f64 / n as f64);
            }
        }
        println!(
            "\n### span {what} with `{mode}`, on 1..{cpus} threads at once (ns per operation per thread)\n"
        );
        println!("{rounds} alternating rounds of {n} operations per thread and variant.\n");
        println!("| threads | ids | median ns/op | ratio to 1 thread (median) | ratio IQR |");
        println!("|---:|---|---:|---:|---:|");
        for (i, &(t, s)) in variants.iter().enumerate() {
            let mut ratios: Vec<f64> = ns[i].iter().zip(&ns[0]).map(|(b, a)| b / a).collect();
            let r = median(&mut ratios);
            ratios.sort_by(|a, b| a.total_cmp(b));
            let (q1, q3) = (ratios[ratios.len() / 4], ratios[ratios.len() * 3 / 4]);
            let ids = if t == 1 {
                "-"
            } else if s == 1 {
                "consecutive"
            } else {
                "4 apart"
            };
            println!(
                "| {t} | {ids} | {:.2} | {r:.3} | {q1:.3}..{q3:.3} |",
                median(&mut ns[i].clone())
            );
        }
    }
    pool.stop();
}

fn main() {
    if let Ok(mode) = std::env::var(ENV) {
        return child(&mode);
    }
    let exe = std::env::current_exe().expect("the bench's own path");
    for mode in ["registry", "layer"] {
        let status = std::process::Command::new(&exe)
            .args(std::env::args().skip(1))
            .env(ENV, mode)
            .status()
            .expect("run a child");
        assert!(status.success(), "the {mode} child failed: {status}");
    }
}
