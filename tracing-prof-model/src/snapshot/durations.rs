//! Span durations as a histogram: the buckets every closed span is counted in (creation to
//! close), fine enough that a quantile read from them is within about 12% of the true value,
//! and the quantiles read back.
//!
//! The bounds are the Renard R10 series (1, 1.25, 1.6, 2, 2.5, 3.15, 4, 5, 6.3, 8, ten per
//! decade, each about 1.26 times the one before) from 1 µs to 800 s: 90 bounds, so 91 buckets
//! with the one past the last. A value is in the first bucket whose bound is at least it
//! (Prometheus's `le`). Quantiles interpolate linearly inside the bucket, as Prometheus's
//! `histogram_quantile` does, so a quantile is never further from the truth than a bucket's
//! width: 26% of its value at worst, about half that on spread-out data.

/// Buckets of the duration histogram: [`DURATION_BOUNDS_NS`] and one past the last.
pub const DURATION_BUCKETS: usize = DURATION_BOUNDS_NS.len() + 1;

/// The R10 mantissas, in nanoseconds for the first decade (1 µs to 8 µs).
const R10: [u64; 10] = [1000, 1250, 1600, 2000, 2500, 3150, 4000, 5000, 6300, 8000];

/// Upper bounds (inclusive) of the duration buckets, in nanoseconds: 1 µs to 800 s, ten per
/// decade. A span longer than the last is counted in the last bucket.
pub const DURATION_BOUNDS_NS: [u64; 90] = {
    let mut b = [0u64; 90];
    let mut i = 0;
    let mut scale = 1u64;
    while i < 90 {
        b[i] = R10[i % 10] * scale;
        i += 1;
        if i % 10 == 0 {
            scale *= 10;
        }
    }
    b
};

/// For each power of two `2^e`, the number of bounds below it: where [`duration_bucket`]
/// starts looking.
const FIRST_AT_OR_ABOVE: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut e = 0;
    while e < 64 {
        let p = 1u64 << e;
        let mut n = 0;
        while n < DURATION_BOUNDS_NS.len() && DURATION_BOUNDS_NS[n] < p {
            n += 1;
        }
        t[e] = n as u8;
        e += 1;
    }
    t
};

/// The bucket of a span of `ns` nanoseconds: the first whose bound is at least `ns`. A few
/// instructions (the power of two of `ns`, then at most four comparisons); never panics.
#[inline]
pub fn duration_bucket(ns: u64) -> usize {
    let e = 63 - (ns | 1).leading_zeros() as usize;
    let mut i = FIRST_AT_OR_ABOVE[e & 63] as usize;
    // Between 2^e and 2^(e+1) lie at most four bounds (ten per 3.3 doublings).
    while i < DURATION_BOUNDS_NS.len() && DURATION_BOUNDS_NS[i] < ns {
        i += 1;
    }
    i
}

/// A recent span of a path that closed in `bucket` of its latency histogram, and its trace:
/// what a Prometheus exemplar on that bucket shows (the `opentelemetry` feature, spans linked
/// to a trace; the link is the one CPU samples carry, so a child span's is its local root's
/// unless links are kept for all spans).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurationExemplar {
    /// The bucket of [`DURATION_BOUNDS_NS`] (the last: past the last bound).
    pub bucket: usize,
    /// The span's trace.
    pub link: crate::TraceLink,
    /// The span's wall time, creation to close.
    pub duration_ns: u64,
}

/// The index in [`DURATION_BOUNDS_NS`] of the bound nearest `ns` (on a log scale): where a
/// duration someone asks for (a threshold, the first bucket shown) stands.
pub fn nearest_duration_bound(ns: u64) -> usize {
    let ratio = |b: u64| (b as f64 / ns.max(1) as f64).ln().abs();
    (0..DURATION_BOUNDS_NS.len())
        .min_by(|&a, &b| ratio(DURATION_BOUNDS_NS[a]).total_cmp(&ratio(DURATION_BOUNDS_NS[b])))
        .unwrap_or(0)
}

/// The bucket bound a slow-span threshold stands at: the bound nearest `threshold_ns` (see
/// [`nearest_duration_bound`]). Spans are counted as slow by bucket, so a threshold is as fine
/// as the buckets.
pub fn slow_bound(threshold_ns: u64) -> u64 {
    DURATION_BOUNDS_NS[nearest_duration_bound(threshold_ns)]
}

/// Spans counted in `buckets` that took longer than [`slow_bound`]`(threshold_ns)`: those
/// of the buckets above it.
pub fn spans_slower_than(buckets: &[u64; DURATION_BUCKETS], threshold_ns: u64) -> u64 {
    let bound = slow_bound(threshold_ns);
    let first = DURATION_BOUNDS_NS.partition_point(|&b| b <= bound);
    buckets[first.min(DURATION_BUCKETS)..].iter().sum()
}

/// The `q` quantile (0 to 1) of the spans counted in `buckets`, in nanoseconds, interpolated
/// linearly inside its bucket as Prometheus's `histogram_quantile` does (the first bucket's
/// lower bound is 0; a quantile in the last, unbounded bucket is the last bound). `None` when
/// nothing was counted.
pub fn duration_quantile(buckets: &[u64; DURATION_BUCKETS], q: f64) -> Option<u64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let mut below = 0u64;
    for (i, &n) in buckets.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let Some(&hi) = DURATION_BOUNDS_NS.get(i) else {
                return DURATION_BOUNDS_NS.last().copied();
            };
            let lo = if i == 0 { 0 } else { DURATION_BOUNDS_NS[i - 1] };
            let into = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
            return Some(lo + ((hi - lo) as f64 * into).round() as u64);
        }
        below += n;
    }
    DURATION_BOUNDS_NS.last().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_r10_from_a_microsecond() {
        assert_eq!(DURATION_BOUNDS_NS[0], 1_000);
        assert_eq!(DURATION_BOUNDS_NS[5], 3_150);
        assert_eq!(DURATION_BOUNDS_NS[10], 10_000);
        assert_eq!(DURATION_BOUNDS_NS[30], 1_000_000); // 1 ms
        assert_eq!(DURATION_BOUNDS_NS[60], 1_000_000_000); // 1 s
        assert_eq!(DURATION_BOUNDS_NS[89], 800_000_000_000); // 800 s
        assert!(DURATION_BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(DURATION_BUCKETS, 91);
    }

    /// The fast bucket equals the definition (the first bound at least the value) everywhere
    /// it could differ: at every bound, one either side of it, and at every power of two.
    #[test]
    fn the_bucket_is_the_first_bound_at_least_the_value() {
        let slow = |ns: u64| DURATION_BOUNDS_NS.partition_point(|&b| b < ns);
        let mut values = vec![0, 1, 2, 999, u64::MAX - 1, u64::MAX];
        for &b in &DURATION_BOUNDS_NS {
            values.extend([b - 1, b, b + 1]);
        }
        for e in 0..64 {
            let p = 1u64 << e;
            values.extend([p - 1, p, p.saturating_add(1)]);
        }
        for v in values {
            assert_eq!(duration_bucket(v), slow(v), "{v} ns");
        }
        assert_eq!(duration_bucket(1_000), 0);
        assert_eq!(duration_bucket(1_001), 1);
        assert_eq!(duration_bucket(u64::MAX), 90);
    }

    #[test]
    fn slow_spans_are_counted_above_the_nearest_bound() {
        let mut b = [0u64; DURATION_BUCKETS];
        for ns in [
            40_000_000,
            50_000_000,
            50_000_001,
            70_000_000,
            9_000_000_000,
        ] {
            b[duration_bucket(ns)] += 1;
        }
        // 50 ms is a bound: spans over it are the last three.
        assert_eq!(slow_bound(50_000_000), 50_000_000);
        assert_eq!(spans_slower_than(&b, 50_000_000), 3);
        // 55 ms stands at the 50 ms bound (the nearest): the same count.
        assert_eq!(slow_bound(55_000_000), 50_000_000);
        assert_eq!(spans_slower_than(&b, 55_000_000), 3);
        assert_eq!(spans_slower_than(&b, 5_000_000_000), 1);
        assert_eq!(spans_slower_than(&b, 1), 5);
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        let mut b = [0u64; DURATION_BUCKETS];
        assert_eq!(duration_quantile(&b, 0.5), None);
        // 100 spans of 1.1 ms: all in the bucket (1 ms, 1.25 ms].
        b[duration_bucket(1_100_000)] = 100;
        assert_eq!(duration_bucket(1_100_000), 31);
        assert_eq!(duration_quantile(&b, 0.5), Some(1_125_000));
        assert_eq!(duration_quantile(&b, 1.0), Some(1_250_000));
        // One slow span of 3 s in a thousand: the p99 stays in the fast bucket, the p999 not.
        b[31] = 999;
        b[duration_bucket(3_000_000_000)] = 1;
        assert_eq!(duration_quantile(&b, 0.99), Some(1_247_748));
        assert_eq!(duration_quantile(&b, 1.0), Some(3_150_000_000));
        // Past the last bound: the last bound.
        let mut c = [0u64; DURATION_BUCKETS];
        c[90] = 3;
        assert_eq!(duration_quantile(&c, 0.5), Some(800_000_000_000));
    }
}
