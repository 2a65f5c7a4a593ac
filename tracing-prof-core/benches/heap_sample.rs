//! What one heap sample costs the thread that allocates: each allocation sampled (rate 1), a
//! 64-byte box made and dropped, timed one by one, 8 and 40 frames below the benchmark's main;
//! the time of the same pair unsampled is subtracted. Three ways to walk the stack:
//! - the platform unwinder (`_Unwind_Backtrace`), what the allocator uses on its own;
//! - the CPU sampler's DWARF unwinder (framehop, cached rules), which the profiler installs
//!   for the threads the CPU sampler armed;
//! - frame pointers (the CPU sampler's other mode): correct only in a build with them
//!   (`RUSTFLAGS="-C force-frame-pointers=yes"`), where its depth matches DWARF's.
//!
//! Rounds alternate the walkers; reported: the median and the 99th percentile per sample over
//! every round, and the frames each walker found.
//!
//! `heap_sample/pair` then times what the samples cost the allocator's alloc+free pair at the
//! default rate (512 KiB) over jemalloc, with the walker the profiler installs (DWARF) and with
//! the platform unwinder, which is all the allocator's own `alloc_pair` benchmark can use (the
//! DWARF walker is the CPU sampler's, a crate above the allocator).
//!
//! `cargo bench -p tracing-prof-core --bench heap_sample` (`-- heap_sample/one`,
//! `-- heap_sample/pair` for one part)

use std::alloc::System;
use std::hint::black_box;
use std::time::Instant;
use tikv_jemallocator::Jemalloc;
use tracing_prof_alloc::__private::{StackWalker, set_sample_rate, set_stack_walker};
use tracing_prof_alloc::{DEFAULT_SAMPLE_RATE, Tag, TagGuard, TaggingAllocator};
use tracing_prof_cpu::Unwind;
use tracing_prof_test_support::bench::{ab, pairs::pairs as alloc_pairs};

#[global_allocator]
static GLOBAL: TaggingAllocator<System> = TaggingAllocator::new(System);

const PER_ROUND: usize = 2_000;
const ROUNDS: usize = 15;

/// Runs `f` `depth` calls further down the stack.
#[inline(never)]
fn deep(depth: u32, f: &mut dyn FnMut()) {
    if depth == 0 {
        f();
    } else {
        deep(depth - 1, f);
        black_box(depth);
    }
}

/// Nanoseconds of each of `PER_ROUND` box+drop pairs, `depth` frames down, appended to `out`.
fn pairs(depth: u32, out: &mut Vec<f64>) {
    deep(depth, &mut || {
        for _ in 0..PER_ROUND {
            let t = Instant::now();
            drop(black_box(Box::new([0u8; 64])));
            out.push(t.elapsed().as_nanos() as f64);
        }
    });
}

/// Frames the installed walker finds `depth` frames down (0: the platform unwinder's count is
/// not visible from here).
fn frames(depth: u32, walker: bool) -> usize {
    let mut n = 0;
    deep(depth, &mut || {
        let mut ips = [0usize; 64];
        n = if walker {
            tracing_prof_cpu::walk_own_stack(&mut ips).unwrap_or(0)
        } else {
            0
        };
    });
    n
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q) as usize]
}

static TAG_JEMALLOC: TaggingAllocator<Jemalloc> = TaggingAllocator::new(Jemalloc);

fn main() {
    let _span = TagGuard::new(Tag::new(10));
    // CPU sampling at 1 Hz: its unwinder and this thread's stack extent, hardly any signal.
    tracing_prof_cpu::start(1, Unwind::Dwarf).expect("the CPU sampler starts");
    if ab::wanted("heap_sample/one") {
        one_sample();
    }
    if ab::wanted("heap_sample/pair") {
        pair_at_the_default_rate();
    }
    tracing_prof_cpu::stop();
}

/// The alloc+free pair over jemalloc with heap sampling at the default rate, by walker.
fn pair_at_the_default_rate() {
    let walker = |w: Option<StackWalker>, rate: u64| {
        move |n| {
            set_stack_walker(w);
            set_sample_rate(rate);
            alloc_pairs(&TAG_JEMALLOC, n);
            set_sample_rate(0);
        }
    };
    tracing_prof_cpu::start(1, Unwind::Dwarf).expect("the CPU sampler starts");
    ab::compare(
        "alloc+free pair, 8..1024 B, 1 thread, over jemalloc: heap sampling at the default rate (512 KiB) by walker",
        41,
        vec![
            ab::variant("Jemalloc", |n| alloc_pairs(&Jemalloc, n)),
            ab::variant("Tagging<Jemalloc>, sampling off", walker(None, 0)),
            ab::variant(
                "Tagging<Jemalloc>, 512 KiB, DWARF (the profiler's)",
                walker(Some(tracing_prof_cpu::walk_own_stack), DEFAULT_SAMPLE_RATE),
            ),
            ab::variant(
                "Tagging<Jemalloc>, 512 KiB, platform unwinder",
                walker(None, DEFAULT_SAMPLE_RATE),
            ),
        ],
    );
}

/// What one sample costs, by walker and depth.
fn one_sample() {
    let walkers: [(&str, Option<Unwind>); 3] = [
        ("platform unwinder", None),
        ("DWARF (the profiler's)", Some(Unwind::Dwarf)),
        ("frame pointers", Some(Unwind::FramePointers)),
    ];
    println!(
        "\n### One heap sample on the allocating thread ({ROUNDS} alternating rounds of {PER_ROUND} sampled pairs per walker and depth)\n"
    );
    println!(
        "| walker | calls below main | median ns per sample | p99 ns per sample | frames found |"
    );
    println!("|---|---:|---:|---:|---:|");
    for depth in [8, 40] {
        let mut base = Vec::new();
        let mut times = vec![Vec::new(); walkers.len()];
        let mut found = vec![0; walkers.len()];
        for v in &mut times {
            v.reserve(ROUNDS * PER_ROUND);
        }
        base.reserve(ROUNDS * PER_ROUND);
        for round in 0..ROUNDS {
            set_sample_rate(0);
            pairs(depth, &mut base);
            for k in 0..walkers.len() {
                let k = (k + round) % walkers.len();
                let (_, unwind) = walkers[k];
                match unwind {
                    None => set_stack_walker(None),
                    Some(u) => {
                        tracing_prof_cpu::start(1, u).expect("the CPU sampler starts");
                        set_stack_walker(Some(tracing_prof_cpu::walk_own_stack));
                    }
                }
                found[k] = frames(depth, unwind.is_some());
                set_sample_rate(1);
                pairs(depth, &mut times[k]);
                set_sample_rate(0);
            }
        }
        let unsampled = quantile(&mut base, 0.5);
        for (k, (name, _)) in walkers.iter().enumerate() {
            let t = &mut times[k];
            let (median, p99) = (quantile(t, 0.5), quantile(t, 0.99));
            let frames = match (walkers[k].1, found[k]) {
                (None, _) => "-".to_owned(),
                // Fewer than two frames: the walker declines, the platform unwinder walks.
                (Some(_), 0) => "none: the platform unwinder walks".to_owned(),
                (Some(_), n) => n.to_string(),
            };
            println!(
                "| {name} | {depth} | {:.0} | {:.0} | {frames} |",
                median - unsampled,
                p99 - unsampled
            );
        }
    }
}
