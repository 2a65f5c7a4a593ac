//! Writing profiles to a directory, every interval and at shutdown.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;
use tracing_prof_core::config::{ConfigError, env_var, parse_bool};
use tracing_prof_core::{Sink, SinkError};
use tracing_prof_model::{ModelError, ProfileKind, Snapshot};

/// Where profiles go: `./profiles`.
pub const DEFAULT_DIR: &str = "profiles";
/// Files kept per kind and process; older ones are deleted: 100. `0` keeps everything.
pub const DEFAULT_KEEP_FILES: usize = 100;
/// Output directory.
pub const ENV_DIR: &str = "TRACING_PROF_DIR";
/// Files kept per kind and process, `0` for all.
pub const ENV_KEEP_FILES: &str = "TRACING_PROF_KEEP_FILES";
/// Also write each interval's own numbers (`{kind}-delta.*` files): `1`/`0`, `true`/`false`, ...
pub const ENV_DELTAS: &str = "TRACING_PROF_DELTAS";
/// Also write flame graph SVGs beside the pprof files: `1`/`0`, `true`/`false`, ...
pub const ENV_FLAMEGRAPHS: &str = "TRACING_PROF_FLAMEGRAPHS";

/// Kinds written by default: `spans`, `cpu` (when CPU sampling runs), `span_memory`, `heap`,
/// `lifetimes`, `threads` (`allocs` is `heap` with another default sample type).
pub const DEFAULT_KINDS: [ProfileKind; 6] = [
    ProfileKind::Spans,
    ProfileKind::Cpu,
    ProfileKind::SpanMemory,
    ProfileKind::Heap,
    ProfileKind::Lifetimes,
    ProfileKind::Threads,
];

/// Sample types drawn by [`FileExporter::flamegraphs`]`(true)`.
pub const DEFAULT_FLAMEGRAPHS: [(ProfileKind, &str); 5] = [
    (ProfileKind::Cpu, "cpu"),
    (ProfileKind::Spans, "wall_busy"),
    (ProfileKind::SpanMemory, "alloc_space"),
    (ProfileKind::Heap, "inuse_space"),
    (ProfileKind::Heap, "alloc_space"),
];

/// Length of the timestamp in file names: `YYYYMMDDTHHMMSS.uuuuuuZ`.
const STAMP_LEN: usize = 23;

/// A file export that failed; says what was being done to which path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// A flame graph could not be drawn.
    #[error("cannot draw the {kind} flame graph: {source}")]
    Flamegraph {
        /// The profile kind.
        kind: ProfileKind,
        /// Why.
        #[source]
        source: ModelError,
    },
    /// A file-system operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done ("create directory", "write", "rename", ...).
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// A [`Sink`] that writes one gzip'd pprof file per kind, named
/// `{kind}.{pid}.{UTC timestamp}.pb.gz`, e.g. `heap.4242.20261122T120205.123456Z.pb.gz`.
/// Timestamps have microseconds and strictly increase per exporter, so two exports never share
/// a name and names sort by time.
///
/// The newest file of each kind is also at a **stable name**, `{kind}.latest.pb.gz` (and
/// `{kind}-delta.latest.pb.gz`, `{kind}.latest.{sample_type}.svg`): a hard link to it, replaced
/// by a rename on each export, so `go tool pprof profiles/heap.latest.pb.gz` always opens one
/// whole, current profile. (A glob over the timestamped files would make pprof *add up*
/// cumulative profiles.) Several processes writing into one directory share the stable names:
/// the last export wins.
///
/// Optionally, per export, `{kind}-delta.*.pb.gz` files hold only what happened since the
/// previous export ([`Snapshot::window_since`]), and `{kind}.{pid}.{stamp}.{sample_type}.svg`
/// flame graphs sit beside the pprof files.
///
/// Files are written under a temporary name and renamed, so a reader never sees half a file.
/// The directory is created if missing. An I/O error fails the export (the profiler reports it
/// once and tries again next interval); it never panics.
#[derive(Debug, Clone)]
pub struct FileExporter {
    dir: PathBuf,
    kinds: Vec<ProfileKind>,
    keep: usize,
    pid: u32,
    written: Vec<PathBuf>,
    /// Microseconds since the epoch of the last file name, to keep names unique.
    last_stamp_us: u64,
    deltas: bool,
    /// The last exported snapshot, the base of the next delta.
    previous: Option<Snapshot>,
    flamegraphs: Vec<(ProfileKind, &'static str)>,
}

impl FileExporter {
    /// Writes the [`DEFAULT_KINDS`] into `dir`, keeping [`DEFAULT_KEEP_FILES`] of each.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FileExporter {
            dir: dir.into(),
            kinds: DEFAULT_KINDS.to_vec(),
            keep: DEFAULT_KEEP_FILES,
            pid: std::process::id(),
            written: Vec::new(),
            last_stamp_us: 0,
            deltas: false,
            previous: None,
            flamegraphs: Vec::new(),
        }
    }

    /// [`DEFAULT_DIR`] and [`DEFAULT_KEEP_FILES`], overridden by `TRACING_PROF_DIR` and
    /// `TRACING_PROF_KEEP_FILES` when set.
    pub fn from_env() -> Result<Self, ConfigError> {
        let dir = env_var(ENV_DIR, |s| Ok(PathBuf::from(s)))?.unwrap_or_else(|| DEFAULT_DIR.into());
        let mut exporter = FileExporter::new(dir);
        if let Some(keep) = env_var(ENV_KEEP_FILES, |s| {
            s.parse::<usize>()
                .map_err(|_| format!("expected a whole number (0 keeps all), got {s:?}"))
        })? {
            exporter.keep = keep;
        }
        if let Some(on) = env_var(ENV_DELTAS, parse_bool)? {
            exporter = exporter.deltas(on);
        }
        if let Some(on) = env_var(ENV_FLAMEGRAPHS, parse_bool)? {
            exporter = exporter.flamegraphs(on);
        }
        Ok(exporter)
    }

    /// Which kinds to write (default: spans and heap).
    pub fn kinds(mut self, kinds: impl IntoIterator<Item = ProfileKind>) -> Self {
        self.kinds = kinds.into_iter().collect();
        self
    }

    /// Files kept per kind; `0` keeps all.
    pub fn keep(mut self, n: usize) -> Self {
        self.keep = n;
        self
    }

    /// Also write, per export, `{kind}-delta.*` files with what happened since the previous
    /// export: counters over the interval, in-use memory at its end. The first export has no
    /// previous one and writes no delta.
    pub fn deltas(mut self, on: bool) -> Self {
        self.deltas = on;
        self
    }

    /// Also write flame graph SVGs of [`DEFAULT_FLAMEGRAPHS`] beside the pprof files (`false`
    /// removes all flame graphs).
    pub fn flamegraphs(mut self, on: bool) -> Self {
        self.flamegraphs = if on {
            DEFAULT_FLAMEGRAPHS.to_vec()
        } else {
            Vec::new()
        };
        self
    }

    /// Also write a flame graph SVG of `sample_type` in the `kind` profile.
    pub fn flamegraph(mut self, kind: ProfileKind, sample_type: &'static str) -> Self {
        self.flamegraphs.push((kind, sample_type));
        self
    }

    /// The output directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Paths written by the last successful export, one per kind.
    pub fn last_written(&self) -> &[PathBuf] {
        &self.written
    }

    /// Encodes and writes every kind of `profile` now; returns the paths written.
    pub fn write(&mut self, profile: &Snapshot) -> Result<Vec<PathBuf>, FileError> {
        fs::create_dir_all(&self.dir).map_err(io_error("create directory", &self.dir))?;
        let us = profile
            .time
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros() as u64;
        self.last_stamp_us = us.max(self.last_stamp_us + 1);
        let stamp = utc_stamp(self.last_stamp_us);
        let window = match (&self.previous, self.deltas) {
            (Some(previous), true) => Some(profile.window_since(previous)),
            _ => None,
        };
        let mut written = Vec::new();
        for &kind in &self.kinds {
            if !kind.is_available(profile) {
                continue;
            }
            let name = format!("{}.{}.{stamp}.pb.gz", kind.name(), self.pid);
            let bytes = profile.profile(kind).encode();
            written.push(self.write_file(&name, &bytes)?);
            self.link_latest(&name, &format!("{}.latest.pb.gz", kind.name()), &bytes)?;
            if let Some(window) = &window {
                let name = format!("{}-delta.{}.{stamp}.pb.gz", kind.name(), self.pid);
                let bytes = window.profile(kind).encode();
                written.push(self.write_file(&name, &bytes)?);
                self.link_latest(
                    &name,
                    &format!("{}-delta.latest.pb.gz", kind.name()),
                    &bytes,
                )?;
            }
        }
        for &(kind, sample_type) in &self.flamegraphs {
            if !kind.is_available(profile) {
                continue;
            }
            let p = profile.profile(kind);
            if p.sample_type_index(sample_type).is_none() {
                continue; // not measured in this snapshot (CPU time off, say)
            }
            let title = format!("{} {} profile", profile_name(profile), kind.name());
            let svg = match p.flamegraph_svg(Some(sample_type), &title) {
                Ok(svg) => svg,
                Err(ModelError::Empty(_)) => continue, // nothing to draw yet
                Err(source) => return Err(FileError::Flamegraph { kind, source }),
            };
            let name = format!("{}.{}.{stamp}.{sample_type}.svg", kind.name(), self.pid);
            written.push(self.write_file(&name, &svg)?);
            self.link_latest(
                &name,
                &format!("{}.latest.{sample_type}.svg", kind.name()),
                &svg,
            )?;
        }
        for &kind in &self.kinds {
            self.prune(&format!("{}.{}.", kind.name(), self.pid));
            self.prune(&format!("{}-delta.{}.", kind.name(), self.pid));
        }
        if self.deltas {
            self.previous = Some(profile.clone());
        }
        self.written.clone_from(&written);
        Ok(written)
    }

    /// Writes `bytes` to `name` in the directory through a temporary file and a rename.
    fn write_file(&self, name: &str, bytes: &[u8]) -> Result<PathBuf, FileError> {
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let result = fs::File::create(&tmp)
            .map_err(io_error("create", &tmp))
            .and_then(|mut f| f.write_all(bytes).map_err(io_error("write", &tmp)))
            .and_then(|()| fs::rename(&tmp, &path).map_err(io_error("rename into place", &path)));
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map(|()| path)
    }

    /// Points the stable name `latest` at the file `name` just written: a hard link made under
    /// a temporary name and renamed over the old one (readers see the old file or the new one,
    /// never none); where the file system has no hard links, a copy of `bytes`, written the
    /// same way.
    fn link_latest(&self, name: &str, latest: &str, bytes: &[u8]) -> Result<(), FileError> {
        let tmp = self.dir.join(format!(".{latest}.{}.tmp", self.pid));
        let _ = fs::remove_file(&tmp);
        let target = self.dir.join(latest);
        if fs::hard_link(self.dir.join(name), &tmp).is_ok() {
            return fs::rename(&tmp, &target).map_err(|e| {
                let _ = fs::remove_file(&tmp);
                io_error("rename into place", &target)(e)
            });
        }
        self.write_file(latest, bytes).map(|_| ())
    }

    /// Deletes this process's files named `{prefix}{stamp}...` of all but the newest `keep`
    /// stamps (a stamp's pprof file and its flame graphs go together). Best effort.
    fn prune(&self, prefix: &str) {
        if self.keep == 0 {
            return;
        }
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let ours: Vec<(String, PathBuf)> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter_map(|p| {
                let name = p.file_name()?.to_str()?;
                let stamp = name.strip_prefix(prefix)?.get(..STAMP_LEN)?.to_owned();
                Some((stamp, p))
            })
            .collect();
        let mut stamps: Vec<&str> = ours.iter().map(|(s, _)| s.as_str()).collect();
        stamps.sort_unstable(); // fixed-width timestamps sort by time
        stamps.dedup();
        if stamps.len() <= self.keep {
            return;
        }
        let oldest_kept = stamps[stamps.len() - self.keep].to_owned();
        for (stamp, path) in &ours {
            if *stamp < oldest_kept {
                let _ = fs::remove_file(path);
            }
        }
    }
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FileError {
    let path = path.to_owned();
    move |source| FileError::Io {
        action,
        path,
        source,
    }
}

impl Sink for FileExporter {
    fn name(&self) -> &str {
        "pprof files"
    }

    fn export(&mut self, profile: &Snapshot) -> Result<(), SinkError> {
        self.write(profile).map(drop).map_err(Into::into)
    }
}

/// The program's name, or `tracing-prof` when unknown.
fn profile_name(s: &Snapshot) -> &str {
    s.binary.as_ref().map_or("tracing-prof", |b| b.name())
}

/// `YYYYMMDDTHHMMSS.uuuuuuZ` in UTC, from microseconds since the epoch.
fn utc_stamp(us: u64) -> String {
    let secs = us / 1_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}{m:02}{day:02}T{:02}{:02}{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        us % 1_000_000
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn timestamps() {
        assert_eq!(utc_stamp(0), "19700101T000000.000000Z");
        assert_eq!(utc_stamp(1_795_348_925_123_456), "20261122T120205.123456Z");
        assert_eq!(utc_stamp(951_825_600_000_000), "20000229T120000.000000Z"); // leap day
    }

    #[test]
    fn names_stay_unique_and_ordered_within_one_microsecond() {
        let dir = std::env::temp_dir().join(format!("tracing-prof-names-{}", std::process::id()));
        let mut e = FileExporter::new(&dir).keep(0).kinds([ProfileKind::Heap]);
        let profile = Snapshot::new(SystemTime::now(), Duration::ZERO);
        let names: Vec<PathBuf> = (0..5).flat_map(|_| e.write(&profile).unwrap()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            sorted, names,
            "five exports of one instant: five names, in order"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
