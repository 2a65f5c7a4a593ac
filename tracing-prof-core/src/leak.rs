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
//! A suspected leak reports its growth and its rises since the series last fell (or since it
//! was first seen), which may be longer ago than the window the rule looks at.

use std::collections::HashMap;
use std::collections::VecDeque;
use tracing_prof_model::series::is_suspected_leak;
use tracing_prof_model::{CodeFrame, PathKind, Snapshot, SpanFrame, SuspectedLeak};

/// Captures the rule looks back over: 5.
pub const DEFAULT_LEAK_SNAPSHOTS: usize = 5;
/// Least growth over those captures: 64 KiB.
pub const DEFAULT_LEAK_MIN_BYTES: u64 = 64 * 1024;

#[derive(Debug)]
struct Track {
    /// The last `snapshots + 1` values, oldest first: what the rule reads.
    recent: VecDeque<i64>,
    /// The value when the series last fell (or was first seen), and the rises since.
    base: u64,
    rises: usize,
    reported: bool,
}

/// Compares each capture with the previous ones; see the module docs.
#[derive(Debug)]
pub(crate) struct LeakDetector {
    snapshots: usize,
    min_bytes: u64,
    tracks: HashMap<(PathKind, Vec<SpanFrame>, Vec<CodeFrame>), Track>,
}

impl LeakDetector {
    pub(crate) fn new(snapshots: usize, min_bytes: u64) -> Self {
        LeakDetector {
            snapshots: snapshots.max(1),
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
            .map(|p| (p.kind, &p.frames, &[][..], p.memory.inuse_bytes));
        let stacks = profile
            .stacks
            .iter()
            .filter(|s| s.kind != PathKind::Profiler)
            .map(|s| (s.kind, &s.frames, s.code.as_slice(), s.memory.inuse_bytes));
        for (kind, frames, code, inuse) in paths.chain(stacks) {
            let key = (kind, frames.clone(), code.to_vec());
            seen.insert(key.clone());
            let window = self.snapshots + 1;
            let t = self.tracks.entry(key).or_insert(Track {
                recent: VecDeque::with_capacity(window),
                base: inuse,
                rises: 0,
                reported: false,
            });
            let value = i64::try_from(inuse).unwrap_or(i64::MAX);
            match t.recent.back().map(|last| value.cmp(last)) {
                Some(std::cmp::Ordering::Greater) => t.rises += 1,
                Some(std::cmp::Ordering::Less) => {
                    t.base = inuse;
                    t.rises = 0;
                }
                _ => {}
            }
            if t.recent.len() == window {
                t.recent.pop_front();
            }
            t.recent.push_back(value);
            let min = i64::try_from(self.min_bytes).unwrap_or(i64::MAX);
            if !is_suspected_leak(t.recent.make_contiguous(), self.snapshots, min) {
                t.reported = false;
                continue;
            }
            let leak = SuspectedLeak::new(
                kind,
                frames.clone(),
                code.to_vec(),
                inuse,
                inuse.saturating_sub(t.base),
                t.rises,
            );
            if !t.reported {
                t.reported = true;
                new.push(leak.clone());
            }
            now.push(leak);
        }
        // A path gone from the capture holds nothing now: forget it (bounded by the path count).
        self.tracks.retain(|k, _| seen.contains(k));
        (now, new)
    }
}
