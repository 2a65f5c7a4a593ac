//! Writing profiles to a directory, every interval and at shutdown.

use crate::{ProfileKind, encode};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;
use tracing_prof_core::config::{ConfigError, env_var};
use tracing_prof_core::{Profile, Sink, SinkError};

/// Where profiles go: `./profiles`.
pub const DEFAULT_DIR: &str = "profiles";
/// Files kept per kind and process; older ones are deleted: 100. `0` keeps everything.
pub const DEFAULT_KEEP_FILES: usize = 100;
/// Output directory.
pub const ENV_DIR: &str = "TRACING_PROF_DIR";
/// Files kept per kind and process, `0` for all.
pub const ENV_KEEP_FILES: &str = "TRACING_PROF_KEEP_FILES";

/// A file export that failed; says what was being done to which path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// The profile could not be encoded.
    #[error(transparent)]
    Encode(#[from] crate::pprof::EncodeError),
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
}

impl FileExporter {
    /// Writes the `spans` and `heap` kinds into `dir`, keeping [`DEFAULT_KEEP_FILES`] of each.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FileExporter {
            dir: dir.into(),
            kinds: vec![ProfileKind::Spans, ProfileKind::Heap],
            keep: DEFAULT_KEEP_FILES,
            pid: std::process::id(),
            written: Vec::new(),
            last_stamp_us: 0,
        }
    }

    /// [`DEFAULT_DIR`] and [`DEFAULT_KEEP_FILES`], overridden by `TRACING_PROF_DIR` and
    /// `TRACING_PROF_KEEP_FILES` when set.
    pub fn from_env() -> Result<Self, ConfigError> {
        let dir = env_var(ENV_DIR, |s| Ok(PathBuf::from(s)))?.unwrap_or_else(|| DEFAULT_DIR.into());
        let mut exporter = FileExporter::new(dir);
        if let Some(keep) = env_var(ENV_KEEP_FILES, |s| {
            s.parse::<usize>().map_err(|_| format!("expected a whole number (0 keeps all), got {s:?}"))
        })? {
            exporter.keep = keep;
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

    /// The output directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Paths written by the last successful export, one per kind.
    pub fn last_written(&self) -> &[PathBuf] {
        &self.written
    }

    /// Encodes and writes every kind of `profile` now; returns the paths written.
    pub fn write(&mut self, profile: &Profile) -> Result<Vec<PathBuf>, FileError> {
        let io = |action, path: &Path| {
            let path = path.to_owned();
            move |source| FileError::Io { action, path, source }
        };
        fs::create_dir_all(&self.dir).map_err(io("create directory", &self.dir))?;
        let us = profile.time.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros() as u64;
        self.last_stamp_us = us.max(self.last_stamp_us + 1);
        let stamp = utc_stamp(self.last_stamp_us);
        let mut written = Vec::with_capacity(self.kinds.len());
        for &kind in &self.kinds {
            let bytes = encode(profile, kind)?;
            let name = format!("{}.{}.{stamp}.pb.gz", kind.name(), self.pid);
            let path = self.dir.join(&name);
            let tmp = self.dir.join(format!(".{name}.tmp"));
            let result = fs::File::create(&tmp)
                .map_err(io("create", &tmp))
                .and_then(|mut f| f.write_all(&bytes).map_err(io("write", &tmp)))
                .and_then(|()| fs::rename(&tmp, &path).map_err(io("rename into place", &path)));
            if let Err(e) = result {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
            self.prune(kind);
            written.push(path);
        }
        self.written.clone_from(&written);
        Ok(written)
    }

    /// Deletes this process's oldest files of `kind` beyond `keep`. Best effort.
    fn prune(&self, kind: ProfileKind) {
        if self.keep == 0 {
            return;
        }
        let prefix = format!("{}.{}.", kind.name(), self.pid);
        let Ok(entries) = fs::read_dir(&self.dir) else { return };
        let mut ours: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with(&prefix) && n.ends_with(".pb.gz")
                })
            })
            .collect();
        if ours.len() <= self.keep {
            return;
        }
        ours.sort(); // the timestamp is fixed-width, so names sort by time
        for old in &ours[..ours.len() - self.keep] {
            let _ = fs::remove_file(old);
        }
    }
}

impl Sink for FileExporter {
    fn name(&self) -> &str {
        "pprof files"
    }

    fn export(&mut self, profile: &Profile) -> Result<(), SinkError> {
        self.write(profile).map(drop).map_err(Into::into)
    }
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
        let profile = Profile { time: SystemTime::now(), duration: Duration::ZERO, paths: vec![], overflowed_spans: 0 };
        let names: Vec<PathBuf> = (0..5).flat_map(|_| e.write(&profile).unwrap()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, names, "five exports of one instant: five names, in order");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
