//! [`LiveFrame`]: one short window of a running process, as `/debug/pprof/live?seconds=N`
//! answers it and `tracing-prof live` shows it, and the recordings `tracing-prof live -o` writes.
//!
//! A frame holds the window's profiles (span time, exact memory per span path and per thread,
//! sampled CPU and heap stacks when those samplers run) and what runs at its end
//! ([`InFlight`]), all taken from one pair of snapshots. Windows hold only what happened in
//! them, so a frame of a quiet second is small however long the process has run.
//!
//! On the wire a frame is a gzip'd protobuf message whose profiles are pprof `Profile`
//! messages, read back with the same checks as any pprof file:
//!
//! ```text
//! message LiveFrame {
//!   string format = 1;          // "tracing-prof live 1"
//!   int64 time_nanos = 2;       // the window's end, Unix nanoseconds
//!   int64 duration_nanos = 3;   // the window's length
//!   bool paused = 4;            // the profiler is paused (no sampling, no exports)
//!   repeated Part parts = 5;    // kind "spans", "span_memory", "threads", "cpu", "heap", "goroutine"
//!   repeated string notes = 6;  // why a part is missing ("CPU sampling is not running: ...")
//! }
//! message Part { string kind = 1; perftools.profiles.Profile profile = 2; }
//! ```
//!
//! A recording is [`RECORDING_MAGIC`] and then, per frame, its length (4 bytes, little endian)
//! and its bytes as they came. A recording cut short (the recorder was killed) reads up to its
//! last whole frame.

use crate::in_flight::InFlight;
use crate::kind::ProfileKind;
use crate::pprof::{self, DecodeError, MAX_DECODED_BYTES, proto};
use crate::profile::Profile;
use crate::snapshot::Snapshot;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The `format` every frame carries.
const FORMAT: &str = "tracing-prof live 1";
/// The part that holds [`InFlight::profile`].
const IN_FLIGHT_PART: &str = "goroutine";

/// The first bytes of a recording.
pub const RECORDING_MAGIC: &[u8] = b"tracing-prof live recording 1\n";

/// One window of a running process.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct LiveFrame {
    /// The end of the window.
    pub time: SystemTime,
    /// Its length.
    pub duration: Duration,
    /// Whether the profiler was paused (no sampling, no exports; exact counters still count).
    pub paused: bool,
    /// The window's profiles, in [`ProfileKind::ALL`] order: spans, span memory and threads
    /// always; CPU when CPU sampling runs; heap when heap sampling does.
    pub profiles: Vec<(ProfileKind, Profile)>,
    /// What ran at the window's end.
    pub in_flight: InFlight,
    /// Why something is missing, in words (`CPU sampling is not running: ...`).
    pub notes: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct FrameMessage {
    #[prost(string, tag = "1")]
    format: String,
    #[prost(int64, tag = "2")]
    time_nanos: i64,
    #[prost(int64, tag = "3")]
    duration_nanos: i64,
    #[prost(bool, tag = "4")]
    paused: bool,
    #[prost(message, repeated, tag = "5")]
    parts: Vec<PartMessage>,
    #[prost(string, repeated, tag = "6")]
    notes: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PartMessage {
    #[prost(string, tag = "1")]
    kind: String,
    #[prost(message, optional, tag = "2")]
    profile: Option<proto::Profile>,
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn from_nanos(n: i64) -> Duration {
    Duration::from_nanos(u64::try_from(n).unwrap_or(0))
}

impl LiveFrame {
    /// The frame of `window` (see [`Snapshot::window_since`]) with `in_flight` read at its
    /// end.
    pub fn new(window: &Snapshot, in_flight: InFlight, paused: bool) -> LiveFrame {
        let profiles = ProfileKind::ALL
            .into_iter()
            .filter(|&k| match k {
                ProfileKind::Spans | ProfileKind::SpanMemory | ProfileKind::Threads => true,
                ProfileKind::Cpu => k.is_available(window),
                ProfileKind::Heap => k.is_sampled(window),
                _ => false,
            })
            .map(|k| (k, window.profile(k)))
            .collect();
        LiveFrame {
            time: window.time,
            duration: window.duration,
            paused,
            profiles,
            in_flight,
            notes: Vec::new(),
        }
    }

    /// The profile of `kind`, when the frame has one.
    pub fn profile(&self, kind: ProfileKind) -> Option<&Profile> {
        self.profiles
            .iter()
            .find_map(|(k, p)| (*k == kind).then_some(p))
    }

    /// The frame as the endpoint sends it: a gzip'd message (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut parts: Vec<PartMessage> = self
            .profiles
            .iter()
            .map(|(k, p)| PartMessage {
                kind: k.name().to_owned(),
                profile: Some(p.to_proto()),
            })
            .collect();
        parts.push(PartMessage {
            kind: IN_FLIGHT_PART.to_owned(),
            profile: Some(self.in_flight.profile().to_proto()),
        });
        let message = FrameMessage {
            format: FORMAT.to_owned(),
            time_nanos: nanos(self.time.duration_since(UNIX_EPOCH).unwrap_or_default()),
            duration_nanos: nanos(self.duration),
            paused: self.paused,
            parts,
            notes: self.notes.clone(),
        };
        pprof::gzip_message(&message)
    }

    /// Reads a frame that [`LiveFrame::encode`] wrote, checking its profiles as
    /// [`Profile::decode`] does. Parts of kinds this version does not know are skipped.
    ///
    /// # Errors
    /// When the bytes are not a frame (a pprof file is not one), or a profile in it is invalid.
    pub fn decode(bytes: &[u8]) -> Result<LiveFrame, DecodeError> {
        if bytes.is_empty() {
            return Err(DecodeError::Empty);
        }
        let raw = pprof::gunzip(bytes)?;
        let message: FrameMessage = prost::Message::decode(&raw[..])
            .map_err(|e| DecodeError::Invalid(format!("not a tracing-prof live frame ({e})")))?;
        if message.format != FORMAT {
            return Err(DecodeError::Invalid(format!(
                "not a tracing-prof live frame (format {:?}, expected {FORMAT:?})",
                message.format
            )));
        }
        let mut frame = LiveFrame {
            time: UNIX_EPOCH + from_nanos(message.time_nanos),
            duration: from_nanos(message.duration_nanos),
            paused: message.paused,
            profiles: Vec::new(),
            in_flight: InFlight::default(),
            notes: message.notes,
        };
        for part in &message.parts {
            let Some(p) = &part.profile else {
                return Err(DecodeError::Invalid(format!(
                    "the {:?} part has no profile",
                    part.kind
                )));
            };
            let profile = Profile::from_proto(p)?;
            if part.kind == IN_FLIGHT_PART {
                frame.in_flight = InFlight::from_profile(&profile)
                    .map_err(|e| DecodeError::Invalid(e.to_string()))?;
            } else if let Some(kind) = ProfileKind::from_name(&part.kind) {
                frame.profiles.push((kind, profile));
            }
        }
        frame.profiles.sort_by_key(|(k, _)| *k);
        Ok(frame)
    }
}

/// Appends one encoded frame (as [`LiveFrame::encode`] wrote it) to a recording whose
/// [`RECORDING_MAGIC`] the caller wrote first.
///
/// # Errors
/// When writing fails, or the frame is larger than [`MAX_DECODED_BYTES`].
pub fn record_frame(out: &mut impl Write, encoded: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(encoded.len())
        .ok()
        .filter(|&n| u64::from(n) <= MAX_DECODED_BYTES)
        .ok_or_else(|| std::io::Error::other("a live frame larger than 256 MiB"))?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(encoded)
}

/// The frames of a recording.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Recording {
    /// The frames, oldest first.
    pub frames: Vec<LiveFrame>,
    /// Bytes at the end that were not a whole frame (the recorder stopped mid-frame).
    pub truncated: bool,
}

impl Recording {
    /// Reads a recording (see the module docs); a last frame cut short is left out and
    /// reported in [`Recording::truncated`]. Every frame is held at once: to read a long
    /// recording, see [`Recording::for_each_frame`].
    ///
    /// # Errors
    /// When `bytes` do not start with [`RECORDING_MAGIC`], or a whole frame does not decode.
    pub fn decode(bytes: &[u8]) -> Result<Recording, DecodeError> {
        let mut frames = Vec::new();
        let truncated = Recording::for_each_frame(bytes, |_, f| frames.push(f))?;
        Ok(Recording { frames, truncated })
    }

    /// Hands the frames of a recording to `f` one at a time, oldest first, each as its bytes
    /// (as [`LiveFrame::encode`] wrote them) and decoded; returns whether the recording ended
    /// mid-frame (that frame left out).
    ///
    /// # Errors
    /// When `bytes` do not start with [`RECORDING_MAGIC`], or a whole frame does not decode
    /// (the frames before it were handed over).
    pub fn for_each_frame(
        bytes: &[u8],
        mut f: impl FnMut(&[u8], LiveFrame),
    ) -> Result<bool, DecodeError> {
        let Some(mut rest) = bytes.strip_prefix(RECORDING_MAGIC) else {
            return Err(DecodeError::Invalid(
                "not a tracing-prof live recording (it does not start with the recording's first line)"
                    .into(),
            ));
        };
        let mut n = 0;
        while !rest.is_empty() {
            let Some((len, tail)) = rest.split_first_chunk::<4>() else {
                return Ok(true);
            };
            let len = u32::from_le_bytes(*len) as usize;
            if len > tail.len() {
                return Ok(true);
            }
            let (frame, tail) = tail.split_at(len);
            n += 1;
            let decoded = LiveFrame::decode(frame)
                .map_err(|e| DecodeError::Invalid(format!("frame {n} of the recording: {e}")))?;
            f(frame, decoded);
            rest = tail;
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::in_flight::{OpenPath, OpenSpan, ThreadNow};
    use crate::snapshot::{CpuSource, CpuStack, PathKind, PathProfile, SpanFrame};

    fn frame() -> LiveFrame {
        let request = vec![SpanFrame::new(
            "app",
            "request",
            Some("src/main.rs"),
            Some(3),
        )];
        let base = Snapshot::new(
            UNIX_EPOCH + Duration::from_secs(100),
            Duration::from_secs(9),
        );
        let mut end = Snapshot::new(
            UNIX_EPOCH + Duration::from_secs(101),
            Duration::from_secs(10),
        );
        end.cpu = CpuSource::Sampled { hz: 100 };
        let mut path = PathProfile::new(PathKind::Span, request.clone());
        path.time.spans = 12;
        path.memory.alloc_bytes = 4096;
        path.memory.inuse_bytes = 1024;
        end.paths.push(path);
        let mut cpu = CpuStack::new(PathKind::Span, request.clone(), Vec::new());
        cpu.samples = 3;
        cpu.cpu_ns = 30_000_000;
        end.cpu_stacks.push(cpu);
        let now = InFlight {
            time: Some(end.time),
            binary: None,
            threads: vec![ThreadNow::new(
                7,
                "worker".into(),
                request.clone(),
                Some(Duration::from_millis(2)),
            )],
            paths: vec![OpenPath::new(
                request,
                2,
                vec![OpenSpan::new(Duration::from_secs(5), Duration::ZERO)],
            )],
            unlisted: 0,
        };
        let mut f = LiveFrame::new(&end.window_since(&base), now, true);
        f.notes.push("heap sampling is off".into());
        f
    }

    #[test]
    fn a_frame_reads_back_as_it_was() {
        let f = frame();
        let kinds: Vec<ProfileKind> = f.profiles.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            kinds,
            [
                ProfileKind::Spans,
                ProfileKind::Cpu,
                ProfileKind::SpanMemory,
                ProfileKind::Threads
            ]
        );
        let back = LiveFrame::decode(&f.encode()).unwrap();
        assert_eq!(back, f);
        assert_eq!(back.duration, Duration::from_secs(1));
        assert_eq!(back.profile(ProfileKind::Spans).unwrap().total(0), 12);
        assert_eq!(back.profile(ProfileKind::Cpu).unwrap().total(1), 30_000_000);
        assert_eq!(back.in_flight.open(), 2);
        assert!(back.profile(ProfileKind::Heap).is_none());
    }

    #[test]
    fn what_is_not_a_frame_is_an_error() {
        let pprof = Profile::decode(&frame().profiles[0].1.encode()).unwrap();
        let err = LiveFrame::decode(&pprof.encode()).unwrap_err().to_string();
        assert!(err.contains("not a tracing-prof live frame"), "{err}");
        assert!(LiveFrame::decode(b"").is_err());
        assert!(LiveFrame::decode(b"<html>not found</html>").is_err());
        let bytes = frame().encode();
        assert!(LiveFrame::decode(&bytes[..bytes.len() / 2]).is_err());
    }

    #[test]
    fn a_recording_cut_short_reads_to_its_last_whole_frame() {
        let one = frame().encode();
        let mut rec = RECORDING_MAGIC.to_vec();
        record_frame(&mut rec, &one).unwrap();
        record_frame(&mut rec, &one).unwrap();
        let whole = Recording::decode(&rec).unwrap();
        assert_eq!(whole.frames.len(), 2);
        assert!(!whole.truncated);
        let cut = Recording::decode(&rec[..rec.len() - 10]).unwrap();
        assert_eq!(cut.frames.len(), 1);
        assert!(cut.truncated);
        let cut = Recording::decode(&rec[..rec.len() - one.len() - 2]).unwrap();
        assert_eq!((cut.frames.len(), cut.truncated), (1, true));
        assert!(Recording::decode(b"tracing-prof live recording 9\n").is_err());
        let mut bad = RECORDING_MAGIC.to_vec();
        record_frame(&mut bad, b"garbage!").unwrap();
        let err = Recording::decode(&bad).unwrap_err().to_string();
        assert!(err.contains("frame 1 of the recording"), "{err}");
    }
}
