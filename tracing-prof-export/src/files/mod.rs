//! Writing profiles to a directory, every interval and at shutdown.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;
use tracing_prof_core::{Sink, SinkError};

mod error;
mod incidents;
mod index;
mod names;
mod safe;

pub use error::FileError;
use error::io_error;
pub use incidents::{FLIGHT_DIR, INCIDENT_FILE, INCIDENTS_DIR, KEEP_INCIDENTS};

use names::{other_writer, run_id, utc_stamp};
use safe::{TMP_PREFIX, TMP_SUFFIX, os_error, tmp_builder, tmp_file, write_all};
use tracing_prof_model::{ModelError, ProfileKind, Snapshot};

/// Output directory.
pub const ENV_DIR: &str = "TRACING_PROF_DIR";
/// Exports of this run whose files are kept, `0` for all.
pub const ENV_KEEP_FILES: &str = "TRACING_PROF_KEEP_FILES";
/// Also write each interval's own numbers (`{kind}-delta.*` files): `1`/`0`, `true`/`false`, ...
pub const ENV_DELTAS: &str = "TRACING_PROF_DELTAS";
/// Also write flame graph SVGs beside the pprof files: `1`/`0`, `true`/`false`, ...
pub const ENV_FLAMEGRAPHS: &str = "TRACING_PROF_FLAMEGRAPHS";

/// Where profiles go: `./profiles`.
pub const DEFAULT_DIR: &str = "profiles";
/// Exports of this run whose files are kept (each export's files of every kind); older ones are
/// deleted: 100. `0` keeps everything.
pub const DEFAULT_KEEP_FILES: usize = 100;

/// The kinds written again at the heap's peak (when they are written at all), as
/// `{kind}_peak.*`: `heap_peak.latest.pb.gz`, `span_memory_peak.latest.pb.gz`. Written when a
/// new peak has been read since the last export.
pub const PEAK_KINDS: [ProfileKind; 2] = [ProfileKind::Heap, ProfileKind::SpanMemory];
/// What a peak's file names add to the kind's: `_peak`.
pub const PEAK_SUFFIX: &str = "_peak";

/// Kinds written by default: `spans`, `cpu` (when CPU sampling runs), `span_memory`, `heap`,
/// `lifetimes`, `threads` (`allocs` is `heap` with another default sample type).
pub const DEFAULT_KINDS: [ProfileKind; 6] = ProfileKind::DISTINCT;

/// Sample types drawn by [`FileExporter::flamegraphs`]`(true)`.
pub const DEFAULT_FLAMEGRAPHS: [(ProfileKind, &str); 5] = [
    (ProfileKind::Cpu, "cpu"),
    (ProfileKind::Spans, "wall_busy"),
    (ProfileKind::SpanMemory, "alloc_space"),
    (ProfileKind::Heap, "inuse_space"),
    (ProfileKind::Heap, "alloc_space"),
];

/// The subfolder of the profile directory that holds each export's timestamped files.
pub const CAPTURES_DIR: &str = "captures";
/// The file in the profile directory that says what each file is and what opens it (the
/// CLI, given a directory, reads only its `*.pb.gz` files).
pub const INDEX_FILE: &str = "README.txt";

/// A temporary file this old was left by an interrupted export.
const ORPHAN_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// A [`Sink`] that writes one gzip'd pprof file per kind and export. The directory reads at
/// a glance:
///
/// ```text
/// profiles/
///   README.txt                 what each file is and which command opens it
///   spans.latest.pb.gz         the newest profile of each kind
///   cpu.latest.pb.gz
///   heap.latest.pb.gz  ...
///   captures/                  every export's files, oldest pruned
///     heap.4242.20261122T120205.123456Z.k3x9q2.pb.gz  ...
/// ```
///
/// **Captures** are named `{kind}.{pid}.{UTC timestamp}.{run}.pb.gz`. Timestamps have
/// microseconds and strictly increase per exporter, so two exports never share a name and
/// names sort by time; `run` is six random characters drawn when the exporter is made, so that
/// two processes with one pid (two containers, each PID 1, sharing a volume) neither overwrite
/// nor prune each other's files. Each exporter prunes only its own run's files.
///
/// **The newest file of each kind** is also at a stable name in the directory itself,
/// `{kind}.latest.pb.gz` (and `{kind}-delta.latest.pb.gz`, `{kind}.latest.{sample_type}.svg`):
/// a hard link to the capture, replaced by a rename on each export, so
/// `go tool pprof profiles/heap.latest.pb.gz` always opens one whole, current profile. (A glob
/// over the captures would make pprof *add up* cumulative profiles.) Several processes writing
/// into one directory share the stable names: the last export wins. The index,
/// [`INDEX_FILE`], is rewritten by each run's first export.
///
/// Optionally, per export, `{kind}-delta.*.pb.gz` captures hold only what happened since the
/// previous export ([`Snapshot::window_since`]), and `{kind}.{pid}.{stamp}.{run}.{sample_type}.svg`
/// flame graphs sit beside the pprof captures.
///
/// Files are written under a temporary name (`.tracing-prof.{random}.tmp`, created with
/// `O_EXCL`: never through a link someone planted) and renamed, so a reader never sees half a
/// file; they keep the mode a plain create gives (`0666` less the umask: readable by a sidecar
/// that ships them). Temporary files an interrupted export left behind (the process was
/// killed) are deleted by the next exporter once they are ten minutes old. This run's oldest
/// files are deleted *before* each export writes (from the exporter's own list: the directory
/// is not read), so a disk filled by our own files makes room for the new ones. The directory
/// and its `captures/` are created if missing; [`check`](Self::check) tries them up front
/// ([`from_env`](Self::from_env) does), and refuses a directory another local user could swap
/// files in (see [`FileError::Unsafe`]), as every export does. An I/O error fails the export
/// (the profiler reports it once and tries again next interval); it never panics.
#[derive(Debug, Clone)]
pub struct FileExporter {
    dir: PathBuf,
    /// `dir/captures`.
    captures: PathBuf,
    kinds: Vec<ProfileKind>,
    keep: usize,
    pid: u32,
    /// Six random characters naming this exporter's run (see above).
    run: String,
    written: Vec<PathBuf>,
    /// Microseconds since the epoch of the last file name, to keep names unique.
    last_stamp_us: u64,
    /// Whether another process writing here was said (once).
    said_other_writer: bool,
    /// The files of this run's exports, oldest first: what pruning deletes, without reading
    /// the directory (whose listing grows with every process's files).
    stamps: std::collections::VecDeque<Vec<PathBuf>>,
    /// A stable name this exporter last pointed at its file, and that file's inode: another
    /// process writing here replaces it.
    latest_seen: Option<(PathBuf, u64)>,
    deltas: bool,
    /// The last exported snapshot, the base of the next delta.
    previous: Option<Snapshot>,
    /// The heap's peak as last written: written again only when a new one comes.
    peak_written: Option<std::sync::Arc<Snapshot>>,
    flamegraphs: Vec<(ProfileKind, &'static str)>,
}

impl FileExporter {
    /// Writes the [`DEFAULT_KINDS`] into `dir`, keeping the files of the last
    /// [`DEFAULT_KEEP_FILES`] exports.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        FileExporter {
            captures: dir.join(CAPTURES_DIR),
            dir,
            kinds: DEFAULT_KINDS.to_vec(),
            keep: DEFAULT_KEEP_FILES,
            pid: std::process::id(),
            run: run_id(),
            written: Vec::new(),
            last_stamp_us: 0,
            said_other_writer: false,
            stamps: std::collections::VecDeque::new(),
            latest_seen: None,
            deltas: false,
            previous: None,
            peak_written: None,
            flamegraphs: Vec::new(),
        }
    }

    /// Which kinds to write (default: spans and heap).
    pub fn kinds(mut self, kinds: impl IntoIterator<Item = ProfileKind>) -> Self {
        self.kinds = kinds.into_iter().collect();
        self
    }

    /// Exports of this run whose files are kept (each export's files of every kind); `0` keeps all.
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

    /// Where the timestamped captures go: [`CAPTURES_DIR`] in the output directory.
    pub fn captures_dir(&self) -> &Path {
        &self.captures
    }

    /// Creates the directory if missing and tries writing, renaming and deleting a file in it,
    /// as an export will: an error says why exports would fail (a regular file in the way, a
    /// read-only mount, `/proc`). Also deletes orphaned temporary files (see above).
    pub fn check(&self) -> Result<(), FileError> {
        // A file in the way: said as such (creating it said "File exists").
        if self.dir.exists() && !self.dir.is_dir() {
            return Err(FileError::Io {
                action: "use as a directory",
                path: self.dir.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    "a file is in the way",
                ),
            });
        }
        self.make_dirs()?;
        // A temporary file, written, renamed and deleted in each: what an export does.
        for dir in [&self.dir, &self.captures] {
            let probe = tmp_file(dir)?;
            let path = dir.join(format!(
                "{TMP_PREFIX}check.{}.{}{TMP_SUFFIX}",
                self.pid, self.run
            ));
            write_all(probe, b"tracing-prof", &path, dir)?;
            fs::remove_file(&path).map_err(io_error("delete a file in", dir))?;
        }
        self.remove_orphans();
        Ok(())
    }

    /// Creates the directory and its `captures/` where missing, and refuses either when
    /// another local user could swap files in it, or when something else is in the way.
    fn make_dirs(&self) -> Result<(), FileError> {
        for dir in [&self.dir, &self.captures] {
            match fs::create_dir(dir) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) if dir == &self.dir && e.kind() == std::io::ErrorKind::NotFound => {
                    fs::create_dir_all(dir).map_err(io_error("create directory", dir))?
                }
                other => other.map_err(io_error("create directory", dir))?,
            }
            safe::check_owner(dir)?;
            if !dir.is_dir() {
                return Err(FileError::Io {
                    action: "use as a directory",
                    path: dir.clone(),
                    source: std::io::Error::from(std::io::ErrorKind::NotADirectory),
                });
            }
        }
        Ok(())
    }

    /// Paths written by the last successful export, one per kind.
    pub fn last_written(&self) -> &[PathBuf] {
        &self.written
    }

    /// Encodes and writes every kind of `profile` now; returns the paths written.
    pub fn write(&mut self, profile: &Snapshot) -> Result<Vec<PathBuf>, FileError> {
        self.make_dirs()?;
        if self.last_stamp_us == 0 {
            self.remove_orphans();
            let index = index::text(&self.kinds, self.keep, self.deltas, &self.flamegraphs);
            self.write_file(&self.dir, INDEX_FILE, index.as_bytes())?;
        } else if !self.said_other_writer && self.latest_replaced() {
            self.notice_other_writer();
        }
        // Make room first: a disk our own files filled must not stop the export that would
        // prune them.
        self.prune_to(self.keep.saturating_sub(1).max(1));
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
        self.stamps.push_back(Vec::new());
        self.latest_seen = None;
        for kind in self.kinds.clone() {
            if !kind.is_available(profile) {
                continue;
            }
            let bytes = profile.encode(kind);
            let (path, latest) = self.write_export(kind.name(), &stamp, "pb.gz", &bytes)?;
            written.push(path);
            if self.latest_seen.is_none() {
                self.latest_seen = fs::symlink_metadata(&latest)
                    .ok()
                    .map(|m| (latest, m.ino()));
            }
            if let Some(window) = &window {
                let bytes = window.encode(kind);
                let stem = format!("{}-delta", kind.name());
                written.push(self.write_export(&stem, &stamp, "pb.gz", &bytes)?.0);
            }
        }
        if let Some(peak) = &profile.heap_peak
            && !self
                .peak_written
                .as_ref()
                .is_some_and(|w| std::sync::Arc::ptr_eq(w, peak))
        {
            for kind in PEAK_KINDS {
                if self.kinds.contains(&kind) && kind.is_available(peak) {
                    let stem = format!("{}{PEAK_SUFFIX}", kind.name());
                    let bytes = peak.encode(kind);
                    written.push(self.write_export(&stem, &stamp, "pb.gz", &bytes)?.0);
                }
            }
            self.peak_written = Some(std::sync::Arc::clone(peak));
        }
        for (kind, sample_type) in self.flamegraphs.clone() {
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
            let ext = format!("{sample_type}.svg");
            written.push(self.write_export(kind.name(), &stamp, &ext, &svg)?.0);
        }
        self.prune_to(self.keep);
        if self.deltas {
            self.previous = Some(profile.clone());
        }
        self.written.clone_from(&written);
        Ok(written)
    }

    /// Writes `bytes` as `captures/{stem}.{pid}.{stamp}.{run}.{ext}`, kept with this export's
    /// files for pruning, and points the stable name `{stem}.latest.{ext}` at it; returns both
    /// paths.
    fn write_export(
        &mut self,
        stem: &str,
        stamp: &str,
        ext: &str,
        bytes: &[u8],
    ) -> Result<(PathBuf, PathBuf), FileError> {
        let name = format!("{stem}.{}.{stamp}.{}.{ext}", self.pid, self.run);
        let path = self.write_file(&self.captures, &name, bytes)?;
        if let Some(files) = self.stamps.back_mut() {
            files.push(path.clone());
        }
        let latest = format!("{stem}.latest.{ext}");
        self.link_latest(&path, &latest, bytes)?;
        Ok((path, self.dir.join(latest)))
    }

    /// Writes `bytes` to `name` in `dir` through a temporary file and a rename.
    fn write_file(&self, dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf, FileError> {
        let path = dir.join(name);
        write_all(tmp_file(dir)?, bytes, &path, dir)?;
        Ok(path)
    }

    /// Points the stable name `latest` at the capture just written: a hard link made under
    /// a temporary name (`O_EXCL` semantics: `link` never replaces) and renamed over the old one
    /// (readers see the old file or the new one, never none); where the file system has no
    /// hard links, a copy of `bytes`, written the same way.
    fn link_latest(&self, capture: &Path, latest: &str, bytes: &[u8]) -> Result<(), FileError> {
        let target = self.dir.join(latest);
        let linked = tmp_builder().make_in(&self.dir, |tmp| fs::hard_link(capture, tmp));
        if let Ok(link) = linked {
            return link
                .persist(&target)
                .map(drop)
                .map_err(|e| io_error("rename a file in", &self.dir)(os_error(e.error)));
        }
        self.write_file(&self.dir, latest, bytes).map(|_| ())
    }

    /// Whether the stable name this exporter last pointed at its file now holds another file
    /// (one `stat`: the directory is read only when it does).
    fn latest_replaced(&self) -> bool {
        self.latest_seen
            .as_ref()
            .is_some_and(|(path, ino)| fs::symlink_metadata(path).is_ok_and(|m| m.ino() != *ino))
    }

    /// Says once, on stderr, when another process (another pid or run) has written profiles
    /// here since our last export: the stable names are then whichever exported last.
    fn notice_other_writer(&mut self) {
        let Ok(entries) = fs::read_dir(&self.captures) else {
            return;
        };
        let since = utc_stamp(self.last_stamp_us);
        let names = entries.filter_map(|e| e.ok()?.file_name().into_string().ok());
        if let Some((pid, run)) = other_writer(names, self.pid, &self.run, &since) {
            self.said_other_writer = true;
            eprintln!(
                "tracing-prof: another process (pid {pid}{}) writes profiles into {} too: \
                 each keeps its own timestamped files, but the stable names (*.latest.pb.gz) \
                 are whichever exported last; give each process a TRACING_PROF_DIR of its own",
                if run.is_empty() {
                    String::new()
                } else {
                    format!(", run {run}")
                },
                self.dir.display()
            );
        }
    }

    /// Deletes temporary files of ours older than [`ORPHAN_AGE`]: an export never takes that
    /// long, so their writer was killed. Best effort.
    fn remove_orphans(&self) {
        let entries = [&self.dir, &self.captures]
            .into_iter()
            .filter_map(|dir| fs::read_dir(dir).ok())
            .flatten();
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !(name.starts_with(TMP_PREFIX) && name.ends_with(TMP_SUFFIX)) {
                continue;
            }
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= ORPHAN_AGE);
            if old {
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    /// Deletes the files of all but this run's newest `keep` exports (a stamp's pprof files and
    /// flame graphs go together); nothing when this exporter keeps all files. Another run's
    /// files, even of the same pid, are not ours to delete. Best effort.
    fn prune_to(&mut self, keep: usize) {
        if self.keep == 0 {
            return;
        }
        while self.stamps.len() > keep {
            for path in self.stamps.pop_front().unwrap_or_default() {
                let _ = fs::remove_file(path);
            }
        }
    }
}

impl Sink for FileExporter {
    fn name(&self) -> &str {
        "pprof files"
    }

    fn export(&mut self, profile: &Snapshot) -> Result<(), SinkError> {
        self.write(profile).map(drop).map_err(Into::into)
    }

    fn incident(&mut self, incident: &tracing_prof_core::Incident) -> Result<(), SinkError> {
        self.write_incident(incident).map(drop).map_err(Into::into)
    }

    fn keeps_incidents(&self) -> bool {
        true
    }
}

/// The program's name, or `tracing-prof` when unknown.
fn profile_name(s: &Snapshot) -> &str {
    s.binary.as_ref().map_or("tracing-prof", |b| b.name())
}

#[cfg(test)]
mod tests;
