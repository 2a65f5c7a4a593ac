//! Heap sampling: which *code* allocated, by random sample points laid over the bytes a thread
//! allocates.
//!
//! Each thread counts the bytes it requests down to the next *sample point*; an allocation that
//! covers one or more points is sampled. The distance between two points is random with a
//! mean of [`sample_rate`] bytes, so every allocated byte has the same chance to be sampled
//! whatever the sizes and the order of the allocations around it, and a sample that covered
//! `k` points stands for `k * rate` bytes (`k * rate / size` allocations): an unbiased estimate
//! for any allocation sequence, periodic ones included. At rate 1 every allocation is sampled
//! with weight 1 and the numbers are exact.
//!
//! Go and jemalloc draw exponential distances (a Poisson process) and scale each sample by
//! `1 / (1 - e^(-size/rate))`. We draw them uniformly from `[rate/2, 3*rate/2)` instead: the
//! estimate stays unbiased, and its spread over a stretch of small allocations is 3.5 times
//! smaller (the count of points in `B` bytes varies by `sqrt(B/rate/12)` instead of
//! `sqrt(B/rate)`): at the default 512 KiB, 2.5% instead of 8.8% for a span path that
//! allocated 64 MiB. The jitter of ±50% keeps the points from locking onto a periodic
//! allocation pattern.
//!
//! The countdown is one subtraction and one compare on the hot path; only when it runs out
//! does the slow path run: it captures the code stack (see `unwind`), finds or adds the stack's
//! *bucket* (stack and span path tag) in a fixed table, adds the sample there with its weight,
//! and gives the block the sampled layout (see [`crate::header`]) whose sample header holds the
//! bucket, the weight and the birth time.
//! A free reads the header anyway: only blocks flagged as live samples come here, to credit
//! the bucket and record the block's lifetime.
//!
//! Memory is bounded: the stack table (`stacks`) holds [`MAX_STACKS`] buckets, and becomes
//! memory only as stacks fill it. Samples whose stack finds no bucket are counted in one
//! overflow bucket.
//!
//! `realloc` counts, for the samples only, as a free of the old block and an allocation of the
//! new size (as jemalloc's profiler does), so growing vectors are sampled by their new sizes.

mod stacks;

use crate::Tag;
use crate::header::SampleHeader;
use crate::tag::{STATE, ThreadState};

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(crate) use stacks::hash;
pub use stacks::{
    HeapSamplerStats, MAX_HEAP_FRAMES, MAX_STACKS, StackTotals, read_stacks, sampler_stats,
};

/// Go's and jemalloc's default: one sample per 512 KiB allocated, on average.
pub const DEFAULT_SAMPLE_RATE: u64 = 512 * 1024;
/// Upper bounds of the lifetime histogram's buckets, in nanoseconds; the last bucket holds the
/// rest: `<1µs, <10µs, <100µs, <1ms, <10ms, <100ms, <1s, <10s, >=10s`.
pub const LIFETIME_BOUNDS_NS: [u64; LIFETIME_BUCKETS - 1] = [
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
    1_000_000_000,
    10_000_000_000,
];
/// Buckets of the lifetime histogram.
pub const LIFETIME_BUCKETS: usize = 9;

/// The bucket of a duration `ns` long: the first of [`LIFETIME_BOUNDS_NS`] above it, or the
/// last (a block's lifetime here, an enter..exit interval in the span layer's histogram).
#[inline]
pub fn lifetime_bucket(ns: u64) -> usize {
    LIFETIME_BOUNDS_NS
        .iter()
        .position(|&bound| ns < bound)
        .unwrap_or(LIFETIME_BUCKETS - 1)
}
/// Blocks freed sooner than this after their allocation count as temporary by default.
pub const DEFAULT_TEMPORARY_THRESHOLD: Duration = Duration::from_millis(1);

/// Mean bytes between samples; 0: off.
static RATE: AtomicU64 = AtomicU64::new(0);
/// Bumped by every rate change, so each thread redraws its countdown for the new rate.
static GENERATION: AtomicU32 = AtomicU32::new(1);
static TEMPORARY_NS: AtomicU64 = AtomicU64::new(1_000_000);

/// While sampling is off (or paused), threads look at the rate again after this many bytes:
/// 64 KiB, at most that much of a thread's allocation unsampled once sampling starts (16 MiB
/// left a `#[tokio::main]` worker's first connections unsampled: 0.74x of the exact in-use),
/// for one call of the cold path per 64 KiB allocated while off (about 10 ns: 0.01 ns per
/// 64-byte allocation).
const OFF_RECHECK: i64 = 64 << 10;
/// Starts heap sampling with a mean of one sample per `rate` bytes allocated (1: every
/// allocation; 0: off, the default). Process-wide. Threads that allocate pick the new rate up
/// at their next sample, and at most 64 KiB of allocation later when sampling was off: a thread
/// started before the profiler (a `#[tokio::main]` worker) samples from its first 64 KiB at
/// most, not from its first 16 MiB as it once did.
///
/// Enabling it the first time maps the sample table (a mapping of its own, whose pages become
/// memory only as stacks fill it: `calloc` may hand back reused memory and clear all 6 MiB);
/// if the kernel refuses, sampling stays off and `false` is returned.
pub fn set_sample_rate(rate: u64) -> bool {
    if rate > 0 && !stacks::make_table() {
        return false;
    }
    // Only a new rate starts the threads' countdowns afresh: at the same rate, a countdown
    // running is already the right process, and redrawing it would leave each thread's bytes
    // up to its next point unsampled (the point that ends them is not drawn).
    if RATE.swap(rate, Ordering::Relaxed) != rate {
        GENERATION.fetch_add(1, Ordering::Relaxed);
        // The calling thread takes the new rate at once.
        let _ = STATE.try_with(|s| s.sample_left.set(-1));
    }
    true
}

/// Restarts the calling thread's sampler from `seed`: the same seed and the same allocations
/// on this thread give the same samples. For reproducible tests; threads seed themselves from
/// the clock and their address otherwise.
pub fn seed_this_thread(seed: u64) {
    let _ = STATE.try_with(|s| {
        s.rng.set(splitmix(seed));
        s.sample_gen.set(GENERATION.load(Ordering::Relaxed));
        let rate = RATE.load(Ordering::Relaxed);
        s.sample_left.set(if rate == 0 {
            OFF_RECHECK
        } else {
            next_distance(s, rate)
        });
    });
}

/// The current sampling rate in bytes (0: off).
pub fn sample_rate() -> u64 {
    RATE.load(Ordering::Relaxed)
}

/// Blocks freed sooner than `threshold` after their allocation count as temporary (default
/// [`DEFAULT_TEMPORARY_THRESHOLD`]).
pub fn set_temporary_threshold(threshold: Duration) {
    let ns = u64::try_from(threshold.as_nanos()).unwrap_or(u64::MAX);
    TEMPORARY_NS.store(ns, Ordering::Relaxed);
}

/// The current temporary-allocation threshold.
pub fn temporary_threshold() -> Duration {
    Duration::from_nanos(TEMPORARY_NS.load(Ordering::Relaxed))
}

/// The hot path's countdown ran out: this request covers one or more sample points. Counts
/// them for `record_alloc` and draws the distance to the next one.
#[cold]
#[inline(never)]
pub(crate) fn countdown_ran_out(s: &ThreadState, size: usize) -> bool {
    if s.in_sample.get() {
        return false;
    }
    let recorder = s.recorder.get();
    if !recorder.is_null() {
        // The profiler's own allocations are not the code's.
        if s.tag.get() != Tag::PROFILER.get() {
            s.in_sample.set(true);
            // SAFETY: `record_sites` set this pointer from a `&mut SiteRecorder` that stays
            // borrowed, and unused otherwise, until it resets the pointer; only this thread
            // reads it, and `in_sample` keeps this from re-entering.
            unsafe { (*recorder).add(size) };
            s.in_sample.set(false);
        }
        // Keep every allocation coming here; no heap samples while recording.
        s.sample_left.set(-1);
        return false;
    }
    let rate = RATE.load(Ordering::Relaxed);
    if rate == 0 {
        s.sample_left.set(OFF_RECHECK);
        return false;
    }
    let generation = GENERATION.load(Ordering::Relaxed);
    if s.sample_gen.get() != generation {
        // A fresh countdown for this rate, started in the process's steady state; this
        // request was not drawn (except at rate 1: all are).
        s.sample_gen.set(generation);
        s.sample_left.set(first_distance(s, rate));
        s.sample_points.set(1);
        return rate == 1;
    }
    s.sample_points.set(take_points(s, rate));
    // The profiler's own allocations are not sampled: their exact counts are under their own
    // tag, and sampling them would have the symbolizer chase its own stacks.
    s.tag.get() != Tag::PROFILER.get()
}

/// Counts the sample points the countdown has run past (it is negative) and leaves it at the
/// distance to the next point after them.
fn take_points(s: &ThreadState, rate: u64) -> u32 {
    if rate <= 1 {
        s.sample_left.set(0);
        return 1;
    }
    let mut left = s.sample_left.get();
    let mut points = 0u32;
    // A request of many times the rate (a `try_reserve` of an untrusted length, say) covers
    // that many points: skip over all but the last few at the mean distance, rather than draw
    // them one by one (2^37 draws for 2^56 bytes at the default rate).
    let rate_i = i64::try_from(rate).unwrap_or(i64::MAX);
    if left < SKIP_AFTER.saturating_mul(rate_i).saturating_neg() {
        let skip = left.unsigned_abs() / rate - SKIP_AFTER as u64 / 2;
        points = u32::try_from(skip).unwrap_or(u32::MAX);
        left = left.saturating_add(i64::try_from(skip.saturating_mul(rate)).unwrap_or(i64::MAX));
    }
    while left < 0 {
        points = points.saturating_add(1);
        left += next_distance(s, rate);
    }
    s.sample_left.set(left);
    points
}

/// Points drawn one by one at most, roughly, before the rest are skipped at the mean distance.
const SKIP_AFTER: i64 = 64;

/// A distance between two sample points: uniform in `[rate/2, 3*rate/2)`, mean `rate`.
fn next_distance(s: &ThreadState, rate: u64) -> i64 {
    if rate <= 1 {
        return 0;
    }
    let d = rate as f64 * (0.5 + uniform(s));
    d.min((i64::MAX / 2) as f64) as i64
}

/// The distance to the first point from an arbitrary position: the forward recurrence time
/// of the process above, so that counting starts in its steady state.
fn first_distance(s: &ThreadState, rate: u64) -> i64 {
    if rate <= 1 {
        return 0;
    }
    let r = rate as f64;
    let d = if uniform(s) < 0.5 {
        uniform(s) * r / 2.0
    } else {
        1.5 * r - r * uniform(s).sqrt()
    };
    d.min((i64::MAX / 2) as f64) as i64
}

/// A uniform number in `[0, 1)` from this thread's xorshift64* state.
fn uniform(s: &ThreadState) -> f64 {
    let mut x = s.rng.get();
    if x == 0 {
        x = seed(s);
    }
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    s.rng.set(x);
    let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
    (r >> 11) as f64 / (1u64 << 53) as f64
}

fn seed(s: &ThreadState) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    splitmix(nanos ^ (std::ptr::from_ref(s) as u64).rotate_left(32))
}

/// splitmix64, never 0 (0 means "not seeded").
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

/// How many allocations of `size` bytes a sample that covered `points` sample points stands
/// for: it stands for `points * rate` bytes (1 allocation at rate 1).
fn weight_for(size: usize, rate: u64, points: u32) -> f32 {
    if rate <= 1 || size == 0 {
        return 1.0;
    }
    (f64::from(points) * rate as f64 / size as f64) as f32
}

fn fixed(w: f64) -> u64 {
    (w * crate::FP).round() as u64
}

/// Estimated bytes of a sample of `size` bytes and weight `w`: the same at allocation and at
/// free, so that a freed sample takes back exactly what it added.
fn weighted_bytes(w: f64, size: usize) -> u64 {
    (w * size as f64).round() as u64
}

/// Records a sampled allocation of `size` bytes by `tag` whose block has the sampled layout and
/// `user` pointer: captures the stack, adds the sample to its bucket and writes the sample
/// header. Returns whether the block is a live sample (false when sampling has no table).
///
/// # Safety
/// `user` must be the user pointer of a live block with the sampled layout.
#[cold]
#[inline(never)]
pub(crate) unsafe fn record_alloc(user: *mut u8, size: usize, tag: u32) -> bool {
    let Some(table) = stacks::table() else {
        return false;
    };
    let (points, word) = STATE
        .try_with(|s| {
            s.in_sample.set(true);
            (s.sample_points.get(), s.instance.get())
        })
        .unwrap_or((1, 0));
    // SAFETY: the word is one `set_current_span` was given, under its contract: a lazy
    // word's cell lives while its span is current on this thread.
    let instance = unsafe { crate::instances::instance_of(word) };
    let weight = weight_for(size, RATE.load(Ordering::Relaxed), points);
    let mut ips = [0usize; MAX_HEAP_FRAMES];
    let depth = crate::unwind::capture(&mut ips);
    let index = table.find_or_insert(tag, &ips[..depth]);
    let w = f64::from(weight);
    let bytes = weighted_bytes(w, size);
    table.bucket(index).add_alloc(size, fixed(w), bytes);
    crate::instances::track(instance, fixed(w), bytes, true);
    let sample = SampleHeader {
        born: Instant::now(),
        bucket: index as u32,
        weight,
        instance,
    };
    // SAFETY: the caller guarantees `user` has the sampled layout.
    unsafe { crate::header::write_sample(user, sample) };
    let _ = STATE.try_with(|s| s.in_sample.set(false));
    true
}

/// Records the free of a live sample of `size` bytes (or the old part of a realloc).
///
/// # Safety
/// `user` must be a live block of ours flagged as a live sample.
#[cold]
#[inline(never)]
pub(crate) unsafe fn record_free(user: *const u8, size: usize) {
    let Some(table) = stacks::table() else {
        return;
    };
    // SAFETY: the caller guarantees a live sample, whose sample header `record_alloc` wrote.
    let sample = unsafe { crate::header::read_sample(user) };
    let lifetime = Instant::now().saturating_duration_since(sample.born);
    let ns = u64::try_from(lifetime.as_nanos()).unwrap_or(u64::MAX);
    let w = f64::from(sample.weight);
    let (objects, bytes) = (fixed(w), weighted_bytes(w, size));
    crate::instances::track(sample.instance, objects, bytes, false);
    let temporary = ns < TEMPORARY_NS.load(Ordering::Relaxed);
    table.bucket(sample.bucket as usize).add_free(
        size,
        objects,
        bytes,
        lifetime_bucket(ns),
        temporary,
    );
}

#[cfg(test)]
mod tests {

    /// Setting the rate it has already leaves every thread's countdown running (a profiler
    /// built again at the same rate redrew them all, which left each thread's bytes up to its
    /// next point unsampled); a new rate starts them afresh.
    #[test]
    fn the_same_rate_again_leaves_countdowns_running() {
        assert!(set_sample_rate(777_777));
        let generation = GENERATION.load(Ordering::Relaxed);
        assert!(set_sample_rate(777_777));
        assert_eq!(GENERATION.load(Ordering::Relaxed), generation);
        assert!(set_sample_rate(888_888));
        assert_eq!(GENERATION.load(Ordering::Relaxed), generation + 1);
        assert!(set_sample_rate(0));
    }

    use super::*;

    #[test]
    fn weights_stand_for_the_points_covered() {
        assert_eq!(weight_for(100, 1, 1), 1.0);
        assert_eq!(weight_for(100, 0, 1), 1.0);
        assert_eq!(weight_for(64, 512 << 10, 1), 8192.0);
        // 64 MiB covers about 128 points: about one allocation.
        assert_eq!(weight_for(64 << 20, 512 << 10, 128), 1.0);
    }

    /// Runs the sampler over `sizes` repeated `n` times and returns, per size, the estimated
    /// bytes over the true bytes.
    fn estimate(s: &ThreadState, rate: u64, sizes: &[usize], n: usize) -> Vec<f64> {
        s.sample_left.set(first_distance(s, rate));
        let mut est = vec![0.0; sizes.len()];
        for _ in 0..n {
            for (i, &size) in sizes.iter().enumerate() {
                let left = s.sample_left.get() - size as i64;
                s.sample_left.set(left);
                if left < 0 {
                    let points = take_points(s, rate);
                    est[i] += f64::from(weight_for(size, rate, points)) * size as f64;
                }
            }
        }
        sizes
            .iter()
            .zip(est)
            .map(|(&size, e)| e / (size * n) as f64)
            .collect()
    }

    #[test]
    fn estimates_are_unbiased_on_periodic_patterns() {
        STATE.with(|s| {
            s.rng.set(splitmix(7));
            // A period that divides the rate, a systematic sampler's worst case.
            let r = estimate(s, 4096, &[64, 960, 3072], 200_000);
            for (i, x) in r.iter().enumerate() {
                // The smallest classes get about 1200 and 3100 points: 3% and 2% spread.
                assert!((x - 1.0).abs() < 0.1, "size class {i}: {x}");
            }
            // Sizes around and above the rate.
            let r = estimate(s, 4096, &[100, 5000, 20_000], 50_000);
            for (i, x) in r.iter().enumerate() {
                // The smallest classes get about 1200 and 3100 points: 3% and 2% spread.
                assert!((x - 1.0).abs() < 0.1, "size class {i}: {x}");
            }
        });
    }

    #[test]
    fn a_huge_request_counts_its_points_without_drawing_each() {
        STATE.with(|s| {
            let rate = 512 * 1024;
            for bytes in [1i64 << 40, 1 << 48, 1 << 56, i64::MAX / 2] {
                s.sample_left.set(-bytes);
                let points = take_points(s, rate);
                let expected = (bytes as u64 / rate).min(u64::from(u32::MAX));
                let err = (u64::from(points)).abs_diff(expected);
                assert!(
                    err <= 64,
                    "{bytes} bytes: {points} points, expected about {expected}"
                );
                let left = s.sample_left.get();
                assert!((0..=(rate as i64 * 3 / 2)).contains(&left), "{left}");
            }
        });
    }

    #[test]
    fn distances_have_the_right_mean() {
        STATE.with(|s| {
            let n = 200_000;
            let rate = 4096;
            let sum: i64 = (0..n).map(|_| next_distance(s, rate)).sum();
            let mean = sum as f64 / n as f64;
            assert!((mean / rate as f64 - 1.0).abs() < 0.02, "mean {mean}");
        });
    }
}
