//! Suspected leaks: span paths and sampled code stacks whose in-use memory keeps growing.
//!
//! Every capture of the aggregator (each interval, and each flush) is compared with the previous
//! one. A span path (exact in-use bytes) or a sampled stack under a span path (estimated in-use
//! bytes) whose in-use bytes grew in each of the last `snapshots` captures, by at least
//! `min_bytes` in all, is a suspected leak until its in-use bytes stop growing. A sampled stack
//! tells which code holds the memory; its estimate moves only when a sample is taken or freed,
//! so a slow leak is found at the span path first. A steady working
//! set (allocations freed at the pace they are made) never qualifies, however large it is. It is
//! a heuristic: a cache still warming up looks the same as a leak until it stops growing.

use std::collections::HashMap;
use tracing_prof_model::{CodeFrame, PathKind, Snapshot, SpanFrame, SuspectedLeak};

/// Consecutive growing captures before a path is suspected: 5.
pub const DEFAULT_LEAK_SNAPSHOTS: usize = 5;
/// Least total growth over those captures: 64 KiB.
pub const DEFAULT_LEAK_MIN_BYTES: u64 = 64 * 1024;

#[derive(Debug)]
struct Track {
    last: u64,
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
            let t = self.tracks.entry(key).or_insert(Track {
                last: inuse,
                base: inuse,
                rises: 0,
                reported: false,
            });
            if inuse > t.last {
                t.rises += 1;
            } else if inuse < t.last || t.rises > 0 {
                *t = Track {
                    last: inuse,
                    base: inuse,
                    rises: 0,
                    reported: false,
                };
            }
            t.last = inuse;
            if t.rises >= self.snapshots && inuse - t.base >= self.min_bytes {
                let leak = SuspectedLeak::new(
                    kind,
                    frames.clone(),
                    code.to_vec(),
                    inuse,
                    inuse - t.base,
                    t.rises,
                );
                if !t.reported {
                    t.reported = true;
                    new.push(leak.clone());
                }
                now.push(leak);
            }
        }
        // A path gone from the capture holds nothing now: forget it (bounded by the path count).
        self.tracks.retain(|k, _| seen.contains(k));
        (now, new)
    }
}
