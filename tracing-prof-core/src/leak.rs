//! Suspected leaks: span paths and sampled code stacks whose in-use memory keeps growing.
//!
//! Every capture of the aggregator (each interval, and each flush) adds one value to each span
//! path's (exact in-use bytes) and each sampled stack's (estimated in-use bytes) series. A
//! series is a suspected leak by the rule `tracing-prof leaks` applies to files too
//! ([`is_suspected_leak`]): over the last `snapshots` captures it never fell, rose in at least
//! half of them, and by at least `min_bytes` in all. A sampled stack tells which code holds the
//! memory; its estimate moves only when a sample is taken or freed (hence "half of them"), so a
//! slow leak is found at the span path first. A steady working set (allocations freed at the
//! pace they are made) never qualifies, however large it is. It is a heuristic: a cache still
//! warming up looks the same as a leak until it stops growing.
//!
//! Once suspected, a series stays suspected (and is reported once) until it falls or rises in
//! none of the last `snapshots` captures: a leak that rises every other capture would
//! otherwise meet the rule at one capture and miss it at the next. A suspected leak reports its
//! growth and its rises since the series last fell (or since it was first seen), which may be
//! longer ago than the window the rule looks at.

use std::collections::HashMap;
use std::collections::VecDeque;
use tracing_prof_model::series::is_suspected_leak;
use tracing_prof_model::{CodeStack, PathKind, Snapshot, SpanFrame, SuspectedLeak};

/// Captures the rule looks back over: 5.
pub const DEFAULT_LEAK_SNAPSHOTS: usize = 5;
/// The most captures the rule looks back over (each series keeps that many values); a larger
/// setting is an error (`Config::validate`).
pub(crate) const MAX_LEAK_SNAPSHOTS: usize = 1024;
/// Least growth over those captures: 64 KiB.
pub const DEFAULT_LEAK_MIN_BYTES: u64 = 64 * 1024;

#[derive(Debug)]
struct Track {
    /// The last `snapshots + 1` values, oldest first: what the rule reads.
    recent: VecDeque<i64>,
    /// The value when the series last fell (or was first seen), and the rises since.
    base: u64,
    rises: usize,
    /// Suspected since the rule last held; it stays so until the series falls or rises in
    /// none of the window's steps, so that a leak whose rises come every other capture is not
    /// suspected, cleared and reported again at every other capture.
    suspected: bool,
}

/// Compares each capture with the previous ones; see the module docs.
#[derive(Debug)]
pub(crate) struct LeakDetector {
    snapshots: usize,
    min_bytes: u64,
    /// By path, and code stack for a sampled stack (shared with the capture it was first seen
    /// in, not copied: each capture looks every stack up).
    tracks: HashMap<(PathKind, Vec<SpanFrame>, Option<CodeStack>), Track>,
}

impl LeakDetector {
    pub(crate) fn new(snapshots: usize, min_bytes: u64) -> Self {
        LeakDetector {
            snapshots: snapshots.clamp(1, MAX_LEAK_SNAPSHOTS),
            min_bytes,
            tracks: HashMap::new(),
        }
    }

    /// Takes in a capture; returns every suspected leak now, and separately the ones new since
    /// the previous capture.
    pub(crate) fn observe(
        &mut self,
        profile: &Snapshot,
    ) -> (Vec<SuspectedLeak>, Vec<SuspectedLeak>) {
        let (mut now, mut new) = (Vec::new(), Vec::new());
        let mut seen = std::collections::HashSet::new();
        let paths = profile
            .paths
            .iter()
            .filter(|p| p.kind != PathKind::Profiler)
            .map(|p| (p.kind, &p.frames, None, p.memory.inuse_bytes));
        let stacks = profile
            .stacks
            .iter()
            .filter(|s| s.kind != PathKind::Profiler)
            .map(|s| (s.kind, &s.frames, Some(&s.code), s.memory.inuse_bytes));
        for (kind, frames, code, inuse) in paths.chain(stacks) {
            let key = (kind, frames.clone(), code.cloned());
            seen.insert(key.clone());
            let window = self.snapshots + 1;
            let t = self.tracks.entry(key).or_insert(Track {
                recent: VecDeque::new(),
                base: inuse,
                rises: 0,
                suspected: false,
            });
            let value = i64::try_from(inuse).unwrap_or(i64::MAX);
            match t.recent.back().map(|last| value.cmp(last)) {
                Some(std::cmp::Ordering::Greater) => t.rises += 1,
                Some(std::cmp::Ordering::Less) => {
                    t.base = inuse;
                    t.rises = 0;
                    t.suspected = false;
                }
                _ => {}
            }
            if t.recent.len() == window {
                t.recent.pop_front();
            }
            t.recent.push_back(value);
            let min = i64::try_from(self.min_bytes).unwrap_or(i64::MAX);
            let recent = t.recent.make_contiguous();
            let held = is_suspected_leak(recent, self.snapshots, min);
            let still_rising = recent.windows(2).any(|w| w[1] > w[0]);
            let was = t.suspected;
            t.suspected = held || (was && still_rising);
            if !t.suspected {
                continue;
            }
            let leak = SuspectedLeak::new(
                kind,
                frames.clone(),
                code.map_or_else(Vec::new, |c| c.to_vec()),
                inuse,
                inuse.saturating_sub(t.base),
                t.rises,
            );
            if !was {
                new.push(leak.clone());
            }
            now.push(leak);
        }
        // A path gone from the capture holds nothing now: forget it (bounded by the path count).
        self.tracks.retain(|k, _| seen.contains(k));
        (now, new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};
    use tracing_prof_model::PathProfile;

    /// Feeds one span path's in-use bytes, capture by capture; returns, per capture, whether
    /// it was suspected and whether it was new.
    fn run(detector: &mut LeakDetector, values: &[u64]) -> Vec<(bool, bool)> {
        values
            .iter()
            .map(|&inuse| {
                let mut s = Snapshot::new(SystemTime::UNIX_EPOCH, Duration::ZERO);
                let mut p = PathProfile::new(
                    PathKind::Span,
                    vec![SpanFrame::new("app", "cache", None, None)],
                );
                p.memory.inuse_bytes = inuse;
                s.paths.push(p);
                let (now, new) = detector.observe(&s);
                (!now.is_empty(), !new.is_empty())
            })
            .collect()
    }

    #[test]
    fn a_leak_rising_every_other_capture_is_reported_once() {
        const K: u64 = 64 * 1024;
        let mut d = LeakDetector::new(5, K);
        // 0, K, K, 2K, 2K, 3K, ...: 3 rises in one window of 5 steps, 2 in the next.
        let values: Vec<u64> = (0..16u64).map(|i| i.div_ceil(2) * K).collect();
        let seen = run(&mut d, &values);
        let first = seen.iter().position(|s| s.0).unwrap();
        assert_eq!(first, 5, "{seen:?}");
        assert!(seen[first..].iter().all(|s| s.0), "{seen:?}");
        assert_eq!(seen.iter().filter(|s| s.1).count(), 1, "{seen:?}");
        // It stops: suspected while the window still holds a rise, then not; and a fall clears
        // it at once.
        let top = values[15];
        let seen = run(&mut d, &[top; 6]);
        assert_eq!(
            seen.iter().map(|s| s.0).collect::<Vec<_>>(),
            [true, true, true, true, false, false]
        );
        let mut d = LeakDetector::new(2, 1);
        let seen = run(&mut d, &[1, 2, 3, 2]);
        assert_eq!(
            seen.iter().map(|s| s.0).collect::<Vec<_>>(),
            [false, false, true, false]
        );
    }

    #[test]
    fn a_huge_window_setting_is_capped() {
        let d = LeakDetector::new(usize::MAX, 1);
        assert_eq!(d.snapshots, MAX_LEAK_SNAPSHOTS);
    }
}
