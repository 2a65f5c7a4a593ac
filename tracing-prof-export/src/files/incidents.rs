//! Incidents as files: `incidents/TIMESTAMP-CAUSE/`, one folder per incident, holding
//! the profiles of that moment, the heap's peak and an `incident.txt` that says why.

use super::error::io_error;
use super::names::utc_stamp;
use super::{FileError, FileExporter, PEAK_KINDS, PEAK_SUFFIX, safe};
use std::fs;
use std::path::PathBuf;
use std::time::UNIX_EPOCH;
use tracing_prof_core::Incident;

/// The folder of incidents, in the profile directory.
pub const INCIDENTS_DIR: &str = "incidents";
/// Incident folders kept in the directory, of every run: the newest 16 (a service that keeps
/// crossing a threshold, or restarting after OOM kills, does not fill the disk).
pub const KEEP_INCIDENTS: usize = 16;
/// What an incident's folder says of it.
pub const INCIDENT_FILE: &str = "incident.txt";
/// The flight recorder's windows in an incident's folder: `flight/END-N/KIND.pb.gz`.
pub const FLIGHT_DIR: &str = "flight";

impl FileExporter {
    /// Writes `incident` into `incidents/TIMESTAMP-CAUSE/`: every kind this exporter writes as
    /// of that moment (`heap.pb.gz`, ...), the heap's peak (`heap_peak.pb.gz`,
    /// `span_memory_peak.pb.gz`), the flight recorder's windows (`flight/END-N/KIND.pb.gz`)
    /// and [`INCIDENT_FILE`]; returns the folder. Created and judged as the profile directory
    /// is; the newest [`KEEP_INCIDENTS`] folders, of every run, are kept. Written as
    /// `NAME.partial` and renamed when whole: a reader never sees half an incident, and one cut
    /// short (the process killed while writing it) stays, named so.
    pub fn write_incident(&mut self, incident: &Incident) -> Result<PathBuf, FileError> {
        self.make_dirs()?;
        let base = self.dir.join(INCIDENTS_DIR);
        match fs::create_dir(&base) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            other => other.map_err(io_error("create directory", &base))?,
        }
        safe::check_owner(&base)?;
        let snapshot = &incident.snapshot;
        let us = snapshot
            .time
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros() as u64;
        let cause: String = incident
            .cause
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let name = format!("{}-{cause}-{}", utc_stamp(us), self.run);
        let done = base.join(&name);
        let dir = base.join(format!("{name}.partial"));
        fs::create_dir(&dir).map_err(io_error("create directory", &dir))?;
        // Pruned with the others even when writing it fails half-way (a full disk).
        prune(&base, KEEP_INCIDENTS.saturating_sub(1));
        safe::check_owner(&dir)?;
        let mut files = Vec::new();
        for kind in self.kinds.clone() {
            if kind.is_available(snapshot) {
                let name = format!("{}.pb.gz", kind.name());
                self.write_file(&dir, &name, &snapshot.encode(kind))?;
                files.push((name, kind.description().to_owned()));
            }
        }
        if let Some(peak) = &snapshot.heap_peak {
            for kind in PEAK_KINDS {
                if self.kinds.contains(&kind) && kind.is_available(peak) {
                    let name = format!("{}{PEAK_SUFFIX}.pb.gz", kind.name());
                    self.write_file(&dir, &name, &peak.encode(kind))?;
                    files.push((name, format!("{}, at the heap's peak", kind.name())));
                }
            }
        }
        // The flight recorder's windows: flight/END/KIND.pb.gz.
        let flight = dir.join(FLIGHT_DIR);
        for (name, bytes) in &incident.flight {
            let Some((window, file)) = name.split_once('/') else {
                continue;
            };
            let into = flight.join(window);
            fs::create_dir_all(&into).map_err(io_error("create directory", &into))?;
            self.write_file(&into, file, bytes)?;
        }
        self.write_file(&dir, INCIDENT_FILE, text(incident, &files).as_bytes())?;
        fs::rename(&dir, &done).map_err(io_error("rename", &done))?;
        Ok(done)
    }
}

/// Deletes all but the newest `keep` incident folders in `base`, of every run (a service
/// restarted after each OOM kill writes its own; they must not fill the disk): the folders
/// whose names start with a timestamp, oldest first by name. Best effort.
fn prune(base: &std::path::Path, keep: usize) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    let mut folders: Vec<(String, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let stamped = name.len() > 16
                && name.as_bytes()[8] == b'T'
                && name.as_bytes()[..8].iter().all(u8::is_ascii_digit);
            stamped.then(|| (name, e.path()))
        })
        .collect();
    folders.sort();
    let extra = folders.len().saturating_sub(keep);
    for (_, path) in folders.into_iter().take(extra) {
        let _ = fs::remove_dir_all(path);
    }
}

/// [`INCIDENT_FILE`]'s text: why, the process's memory, the peak, and the files with a command
/// each.
fn text(incident: &Incident, files: &[(String, String)]) -> String {
    let s = &incident.snapshot;
    let mut t = format!(
        "Incident ({}) at {}: {}\n\n",
        incident.cause,
        tracing_prof_model::units::format_utc(s.time),
        incident.reason
    );
    if let Some(m) = &s.process_memory {
        t.push_str(&format!("Process memory: {}.\n\n", m.describe()));
    }
    if let Some(p) = s.heap_peak.as_ref().and_then(|p| p.peak) {
        t.push_str(&format!("The heap's peak so far: {}.\n\n", p.describe()));
    }
    t.push_str("Files (the profiles as of that moment, and the heap at its peak):\n");
    for (name, what) in files {
        t.push_str(&format!("  {name:<28} {what}\n"));
    }
    if incident.flight.is_empty() {
        t.push_str(
            "  (no flight recording: the recorder is off, or held no window yet; it keeps one \
             per export after the first)\n",
        );
    } else {
        let windows: std::collections::BTreeSet<&str> = incident
            .flight
            .iter()
            .filter_map(|(n, _)| n.split_once('/').map(|w| w.0))
            .collect();
        t.push_str(&format!(
            "  {:<28} the flight recorder: {} window{} before it, each interval's own numbers \
             (END-N/KIND.pb.gz)\n",
            format!("{FLIGHT_DIR}/"),
            windows.len(),
            if windows.len() == 1 { "" } else { "s" }
        ));
    }
    t.push_str(
        "\nOpen them:\n  tracing-prof top --by span span_memory.pb.gz      which span paths hold the memory\n  \
         go tool pprof -http=: heap.pb.gz                 the code that holds it\n  \
         tracing-prof top --by span span_memory_peak.pb.gz at the heap's peak\n",
    );
    t
}
