//! Memory incidents: the cgroup's working set crossing a share of its limit, watched by the
//! aggregator thread; each crossing writes the evidence once (see [`crate::Sink::incident`]).

/// How far below a threshold the working set must fall before its crossing counts again, in
/// points of the limit.
const REARM_POINTS: f64 = 5.0;

/// Which thresholds are armed.
#[derive(Debug)]
pub(crate) struct OomWatch {
    /// Percentages, ascending, each with whether its next crossing counts.
    thresholds: Vec<(u8, bool)>,
}

impl OomWatch {
    /// Watches `percent` (sorted, repeats and values outside 1 to 100 dropped).
    pub(crate) fn new(percent: &[u8]) -> Self {
        let mut t: Vec<u8> = percent
            .iter()
            .copied()
            .filter(|p| (1..=100).contains(p))
            .collect();
        t.sort_unstable();
        t.dedup();
        OomWatch {
            thresholds: t.into_iter().map(|p| (p, true)).collect(),
        }
    }

    pub(crate) fn is_on(&self) -> bool {
        !self.thresholds.is_empty()
    }

    /// The highest threshold crossed since it was armed, for a working set at `used` of the
    /// limit (1.0: at it); every threshold at or below `used` is then disarmed, and those 5
    /// points above `used` or more are armed again.
    pub(crate) fn check(&mut self, used: f64) -> Option<u8> {
        let pct = used * 100.0;
        let mut crossed = None;
        for (t, armed) in &mut self.thresholds {
            let at = f64::from(*t);
            if pct >= at {
                if *armed {
                    crossed = Some(*t);
                }
                *armed = false;
            } else if pct < at - REARM_POINTS {
                *armed = true;
            }
        }
        crossed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_crossing_again_after_falling_five_points() {
        let mut w = OomWatch::new(&[80, 90, 95]);
        assert_eq!(w.check(0.5), None);
        assert_eq!(w.check(0.80), Some(80));
        assert_eq!(w.check(0.85), None, "80% already said");
        assert_eq!(w.check(0.78), None);
        assert_eq!(w.check(0.81), None, "not 5 points below in between");
        assert_eq!(w.check(0.912), Some(90));
        assert_eq!(w.check(0.99), Some(95));
        assert_eq!(w.check(0.74), None);
        assert_eq!(w.check(0.80), Some(80), "armed again below 75%");
        // A jump past several says the highest, and the lower ones are spent.
        let mut w = OomWatch::new(&[80, 90, 95]);
        assert_eq!(w.check(0.97), Some(95));
        assert_eq!(w.check(0.97), None);
        assert!(!OomWatch::new(&[]).is_on());
        assert!(!OomWatch::new(&[0, 101]).is_on());
        let mut w = OomWatch::new(&[95, 80, 90, 80]);
        assert_eq!(w.check(0.92), Some(90), "sorted whatever the order given");
    }
}

/// What the flight recorder's triggers remember: when each cause last wrote an incident, the
/// slow-span counts and the heap peak last seen.
#[derive(Debug, Default)]
pub(crate) struct Triggers {
    last: std::collections::HashMap<&'static str, std::time::Instant>,
    /// Per span path with a slow-span threshold: its slow spans so far.
    slow: std::collections::HashMap<String, u64>,
    /// The heap peak of the last peak-growth incident.
    peak_written: u64,
}

/// A heap peak writes an incident when it is at least this many times the last one written...
const PEAK_GROWTH: u64 = 2;
/// ...and at least this large.
const PEAK_MIN_BYTES: u64 = 64 << 20;

impl Triggers {
    /// Whether `cause` may write an incident now: not within `gap` of its last.
    pub(crate) fn may(&mut self, cause: &'static str, gap: std::time::Duration) -> bool {
        let now = std::time::Instant::now();
        match self.last.get(cause) {
            Some(t) if now.duration_since(*t) < gap => false,
            _ => {
                self.last.insert(cause, now);
                true
            }
        }
    }

    /// The span paths of `snapshot` with more spans slower than their threshold than last
    /// seen: `(path, new slow spans, the threshold's bucket bound in nanoseconds)`.
    pub(crate) fn slow_spans(
        &mut self,
        snapshot: &tracing_prof_model::Snapshot,
        thresholds: &[crate::SlowSpan],
    ) -> Vec<(String, u64, u64)> {
        let mut out = Vec::new();
        if thresholds.is_empty() {
            return out;
        }
        for p in &snapshot.paths {
            let label = p.display_path();
            let Some(t) = crate::SlowSpan::for_path(thresholds, &label) else {
                continue;
            };
            let ns = t.threshold.as_nanos().min(u128::from(u64::MAX)) as u64;
            let count = tracing_prof_model::spans_slower_than(&p.time.durations, ns);
            let seen = self.slow.entry(label.clone()).or_insert(0);
            if count > *seen {
                out.push((label, count - *seen, tracing_prof_model::slow_bound(ns)));
            }
            *seen = count;
        }
        out
    }

    /// Whether a heap peak of `bytes` is a growth worth an incident: twice the last written
    /// (the first peak seen is the start, not a growth).
    pub(crate) fn peak_grew(&mut self, bytes: u64) -> bool {
        if self.peak_written == 0 {
            self.peak_written = bytes.max(1);
            return false;
        }
        if bytes >= PEAK_MIN_BYTES && bytes >= self.peak_written.saturating_mul(PEAK_GROWTH) {
            self.peak_written = bytes;
            return true;
        }
        false
    }
}
