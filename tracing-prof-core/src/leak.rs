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

use crate::profile::{Frame, PathKind, Profile};
use crate::symbolize::CodeFrame;
use std::collections::HashMap;

/// Consecutive growing captures before a path is suspected: 5.
pub const DEFAULT_LEAK_SNAPSHOTS: usize = 5;
/// Least total growth over those captures: 64 KiB.
pub const DEFAULT_LEAK_MIN_BYTES: u64 = 64 * 1024;

/// A span path whose in-use memory grew in every one of the last `snapshots` captures.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SuspectedLeak {
    /// What kind of path it is (a span path, or `(no span)`).
    pub kind: PathKind,
    /// The path, root first.
    pub frames: Vec<Frame>,
    /// The sampled code stack under the path, root first; empty when the whole span path is
    /// suspected.
    pub code: Vec<CodeFrame>,
    /// Its span names joined by ` -> `, then ` @ ` and the innermost code frame for a stack.
    pub path: String,
    /// In-use bytes now.
    pub inuse_bytes: u64,
    /// Growth since the captures began to rise.
    pub growth_bytes: u64,
    /// Consecutive growing captures so far.
    pub snapshots: usize,
}

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
    tracks: HashMap<(PathKind, Vec<Frame>, Vec<CodeFrame>), Track>,
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
        profile: &Profile,
    ) -> (Vec<SuspectedLeak>, Vec<SuspectedLeak>) {
        let (mut now, mut new) = (Vec::new(), Vec::new());
        let mut seen = std::collections::HashSet::new();
        let paths = profile
            .paths
            .iter()
            .filter(|p| p.kind != PathKind::Profiler)
            .map(|p| {
                (
                    p.kind,
                    &p.frames,
                    &[][..],
                    p.memory.inuse_bytes,
                    p.display_path(),
                )
            });
        let stacks = profile
            .stacks
            .iter()
            .filter(|s| s.kind != PathKind::Profiler)
            .map(|s| {
                let names: Vec<&str> = s.frames.iter().map(|f| f.name).collect();
                let leaf = s.code.last().map_or("?", |f| &*f.function);
                let display = format!("{} @ {leaf}", names.join(" -> "));
                (
                    s.kind,
                    &s.frames,
                    s.code.as_slice(),
                    s.memory.inuse_bytes,
                    display,
                )
            });
        for (kind, frames, code, inuse, display) in paths.chain(stacks) {
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
                let leak = SuspectedLeak {
                    kind,
                    frames: frames.clone(),
                    code: code.to_vec(),
                    path: display,
                    inuse_bytes: inuse,
                    growth_bytes: inuse - t.base,
                    snapshots: t.rises,
                };
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
