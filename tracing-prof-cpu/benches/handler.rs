//! What one CPU sample costs the sampled thread, and how deep its stack walk gets: a thread
//! burns CPU at the bottom of a chain of `depth` non-inlined calls while the sampler runs at
//! 1000 Hz; the handler times itself (`CpuSamplerStats::handler_ns` and its histogram) and counts
//! the frames it found. Rounds alternate between the unwinders and depths; the table gives the
//! median over rounds of each round's mean and of each round's median.
//!
//! `cargo bench -p tracing-prof-cpu --bench handler` measures DWARF unwinding on a default
//! release build. Frame-pointer unwinding needs a binary built with frame pointers:
//! `RUSTFLAGS="-C force-frame-pointers=yes" CARGO_TARGET_DIR=target/frame-pointers cargo bench
//! -p tracing-prof-cpu --bench handler` measures both (std and the libc stay without them, so
//! frame-pointer walks stop at the first frame outside this binary's code: the depth column
//! shows where).

use std::hint::black_box;
use tracing_prof_cpu::Unwind;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[inline(never)]
fn burn(ms: u64) -> u64 {
    let start = thread_cpu_ns();
    let mut x = 1u64;
    while thread_cpu_ns() - start < ms * 1_000_000 {
        for _ in 0..10_000 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

/// `burn` at the bottom of `depth` frames of this function.
#[inline(never)]
fn chain(depth: u32, ms: u64) -> u64 {
    if depth == 0 {
        burn(ms)
    } else {
        black_box(chain(black_box(depth - 1), ms)) + 1
    }
}

struct Round {
    ns_per_sample: f64,
    median_ns: f64,
    depth: f64,
    truncated: u64,
}

fn round(unwind: Unwind, depth: u32, ms: u64) -> Round {
    tracing_prof_cpu::start(1000, unwind).expect("start the sampler");
    let before = tracing_prof_cpu::stats();
    black_box(chain(depth, ms));
    let after = tracing_prof_cpu::stats();
    tracing_prof_cpu::stop();
    while !tracing_prof_cpu::drain(|_| {}) {}
    let runs = (after.handler_runs - before.handler_runs).max(1) as f64;
    let mut delta = after;
    for (d, b) in delta
        .handler_ns_histogram
        .iter_mut()
        .zip(&before.handler_ns_histogram)
    {
        *d -= b;
    }
    Round {
        ns_per_sample: (after.handler_ns - before.handler_ns) as f64 / runs,
        median_ns: delta.handler_ns_quantile(0.5).unwrap_or(0) as f64,
        depth: (after.frames - before.frames) as f64 / runs,
        truncated: after.truncated - before.truncated,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with("--") && !"handler".contains(a.as_str()))
    {
        return; // filtered out by `cargo bench -- NAME`
    }
    let rounds: usize = std::env::var("TRACING_PROF_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let ms = 400;
    let depths = [8u32, 32, 96];
    let modes = [
        ("dwarf", Unwind::Dwarf),
        ("frame pointers", Unwind::FramePointers),
    ];
    let mut results: Vec<Vec<Round>> = (0..modes.len() * depths.len())
        .map(|_| Vec::new())
        .collect();
    for _ in 0..rounds {
        for (m, &(_, unwind)) in modes.iter().enumerate() {
            for (d, &depth) in depths.iter().enumerate() {
                results[m * depths.len() + d].push(round(unwind, depth, ms));
            }
        }
    }
    println!(
        "\n### One CPU sample: handler time on the sampled thread and depth reached ({rounds} rounds of {ms} ms of CPU at 1000 Hz each)\n"
    );
    println!(
        "| unwinder | calls below main | mean ns per sample | median ns per sample (within 20%) | frames found | truncated |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (m, &(name, _)) in modes.iter().enumerate() {
        for (d, &depth) in depths.iter().enumerate() {
            let r = &results[m * depths.len() + d];
            println!(
                "| {name} | {depth} | {:.0} | {:.0} | {:.1} | {} |",
                median(r.iter().map(|x| x.ns_per_sample).collect()),
                median(r.iter().map(|x| x.median_ns).collect()),
                median(r.iter().map(|x| x.depth).collect()),
                r.iter().map(|x| x.truncated).sum::<u64>(),
            );
        }
    }
}
