//! The flight recorder: the last minutes of the aggregator's exports kept in memory as windows
//! (what each interval added, memory as at its end), encoded and compressed, bounded in age and
//! in bytes; written with every incident, and served on demand
//! ([`Profiler::flight_recording`](crate::Profiler::flight_recording)).
//!
//! Each export is compared with the one before (kept: one snapshot), the window's kinds are
//! encoded as gzip'd pprof, and windows older than the recorder's length, or past its bytes,
//! are dropped oldest first. Nothing is done on an application thread.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tracing_prof_model::{ProfileKind, Snapshot};

/// How far back the flight recorder reaches, by default: 5 minutes.
pub const DEFAULT_FLIGHT_LENGTH: Duration = Duration::from_secs(300);
/// The most the flight recorder's windows hold, by default: 8 MiB of compressed profiles.
pub const DEFAULT_FLIGHT_BYTES: usize = 8 << 20;

/// The kinds each window keeps.
const KINDS: [ProfileKind; 6] = ProfileKind::DISTINCT;

/// One recorded file: its name in a recording (`20261128T010203.456Z-7/heap.pb.gz`: the
/// window's end and number, the kind) and its bytes, shared with the recorder: a recording
/// handed out (to an incident, to `/debug/pprof/flightrecorder`) copies no profile.
pub type FlightFile = (String, Arc<[u8]>);

/// The recorder (the aggregator's; read by the profiler's handle).
#[derive(Debug)]
pub(crate) struct FlightRecorder {
    length: Duration,
    max_bytes: usize,
    /// The last export: the base of the next window.
    base: Option<Snapshot>,
    windows: VecDeque<Arc<FlightWindow>>,
    bytes: usize,
    /// Windows recorded so far: the last part of each window's name.
    recorded: u64,
}

/// One window's files, and when it ended.
#[derive(Debug)]
pub(crate) struct FlightWindow {
    end: SystemTime,
    files: Vec<FlightFile>,
    bytes: usize,
}

/// Windows in `windows`, and their bytes.
pub(crate) fn held(windows: &[Arc<FlightWindow>]) -> (usize, usize) {
    (windows.len(), windows.iter().map(|w| w.bytes).sum())
}

/// The files of `windows`, oldest window first.
pub(crate) fn files(windows: &[Arc<FlightWindow>]) -> Vec<FlightFile> {
    windows
        .iter()
        .flat_map(|w| w.files.iter().cloned())
        .collect()
}

impl FlightRecorder {
    pub(crate) fn new(length: Duration, max_bytes: usize) -> Self {
        FlightRecorder {
            length,
            max_bytes,
            base: None,
            windows: VecDeque::new(),
            bytes: 0,
            recorded: 0,
        }
    }

    /// Records the window from the last export to `snapshot` (cumulative), then keeps
    /// `snapshot` (moved, not copied) as the next base.
    pub(crate) fn record(&mut self, snapshot: Snapshot) {
        if let Some(base) = &self.base {
            let window = snapshot.window_since(base);
            // The window's end, and its number: two exports in one millisecond (a flush
            // beside the interval's) are two windows.
            self.recorded += 1;
            let stamp = format!(
                "{}-{}",
                tracing_prof_model::units::format_utc_compact(snapshot.time),
                self.recorded
            );
            let files: Vec<FlightFile> = KINDS
                .into_iter()
                .filter(|k| k.is_available(&window))
                .map(|k| {
                    (
                        format!("{stamp}/{}.pb.gz", k.name()),
                        window.encode(k).into(),
                    )
                })
                .collect();
            let bytes = files.iter().map(|f| f.1.len()).sum::<usize>();
            self.bytes += bytes;
            self.windows.push_back(Arc::new(FlightWindow {
                end: snapshot.time,
                files,
                bytes,
            }));
        }
        let end = snapshot.time;
        // The old base goes before the new one is kept: one snapshot held, not two.
        self.base = None;
        self.base = Some(snapshot);
        self.evict(end);
    }

    /// The last export recorded (the next window's base).
    pub(crate) fn last(&self) -> Option<&Snapshot> {
        self.base.as_ref()
    }

    /// Drops windows that ended more than the recorder's length before `now`, then the
    /// oldest while over its bytes.
    fn evict(&mut self, now: SystemTime) {
        while let Some(w) = self.windows.front() {
            let old = now.duration_since(w.end).unwrap_or_default() > self.length;
            if !old && self.bytes <= self.max_bytes {
                break;
            }
            self.bytes -= w.bytes;
            self.windows.pop_front();
        }
    }

    /// The windows kept, oldest first (shared, not copied).
    pub(crate) fn windows(&self) -> Vec<Arc<FlightWindow>> {
        self.windows.iter().cloned().collect()
    }

    /// How far back it reaches.
    pub(crate) fn length(&self) -> Duration {
        self.length
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn at(secs: u64) -> Snapshot {
        Snapshot::new(
            UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs),
            Duration::from_secs(secs),
        )
    }

    #[test]
    fn windows_of_the_last_minutes_and_nothing_older_or_past_its_bytes() {
        let mut r = FlightRecorder::new(Duration::from_secs(30), 1 << 20);
        for s in (0..=100).step_by(10) {
            r.record(at(s));
        }
        // Windows ending at 70, 80, 90 and 100 s are within 30 s of the last (100 s).
        let files = files(&r.windows());
        let stamps: Vec<&str> = files
            .iter()
            .map(|f| f.0.split('/').next().unwrap())
            .collect();
        assert_eq!(stamps.first(), Some(&"20270115T080110.000Z-7"));
        assert_eq!(held(&r.windows()).0, 4);
        assert!(files.iter().any(|f| f.0.ends_with("/spans.pb.gz")));
        assert!(
            !files.iter().any(|f| f.0.ends_with("/cpu.pb.gz")),
            "no CPU sampling here"
        );
        // Bytes: a bound of one window's keeps only the newest.
        let one = held(&r.windows()).1 / 4;
        let mut r = FlightRecorder::new(Duration::from_secs(30), one);
        for s in (0..=100).step_by(10) {
            r.record(at(s));
        }
        assert_eq!(held(&r.windows()).0, 1);
        assert!(held(&r.windows()).1 <= one);
    }
}
