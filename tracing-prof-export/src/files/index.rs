//! The index written into the profile directory: what each file is and which command opens
//! it, for whoever opens the folder first.

use super::{CAPTURES_DIR, INDEX_FILE};
use tracing_prof_model::ProfileKind;

/// The text of [`INDEX_FILE`] for an exporter of `kinds` that keeps `keep` exports (`0`: all),
/// with deltas or not, drawing `flamegraphs`.
pub(super) fn text(
    kinds: &[ProfileKind],
    keep: usize,
    deltas: bool,
    flamegraphs: &[(ProfileKind, &str)],
) -> String {
    let mut t = String::new();
    let mut line = |s: &str| {
        t.push_str(s);
        t.push('\n');
    };
    line("Profiles written by tracing-prof, gzip'd pprof (https://github.com/google/pprof).");
    line("");
    line("The newest of each kind, replaced at every export:");
    for kind in kinds {
        let name = format!("{}.latest.pb.gz", kind.name());
        line(&format!("  {name:<31}{}", kind.description()));
    }
    for kind in super::PEAK_KINDS.iter().filter(|k| kinds.contains(k)) {
        let name = format!("{}{}.latest.pb.gz", kind.name(), super::PEAK_SUFFIX);
        line(&format!(
            "  {name:<31}the same at the heap's highest since the start"
        ));
    }
    if kinds.contains(&ProfileKind::Cpu) {
        line("  (cpu only while CPU sampling runs)");
    }
    if deltas {
        line(
            "  KIND-delta.latest.pb.gz        the last interval only: counters over it, memory at its end",
        );
    }
    if !flamegraphs.is_empty() {
        line("  KIND.latest.TYPE.svg           flame graphs of one sample type, for a browser");
    }
    line("");
    let kept = match keep {
        0 => "all exports are kept".to_owned(),
        1 => "the newest export of each run is kept".to_owned(),
        n => format!("the newest {n} exports of each run are kept"),
    };
    line(&format!(
        "{CAPTURES_DIR}/ holds every export's files, KIND.PID.TIMESTAMP.RUN.pb.gz ({kept})."
    ));
    line(&format!(
        "{}/ holds incidents, a folder each (TIMESTAMP-CAUSE-RUN, {} says why): the working",
        super::INCIDENTS_DIR,
        super::INCIDENT_FILE
    ));
    line(
        "set near the cgroup's memory limit, a slow span, a first long poll, a doubled heap peak,",
    );
    line("the flight signal (TRACING_PROF_FLIGHT_SIGNAL) when one is set.");
    line("");
    line("Open them:");
    let mut cmd = |c: &str, what: &str| line(&format!("  {c:<60}{what}"));
    if let Some(first) = kinds.first() {
        cmd(
            &format!("go tool pprof -http=: {}.latest.pb.gz", first.name()),
            "flame graph and tables in a browser",
        );
    }
    if kinds.contains(&ProfileKind::Spans) {
        cmd(
            "tracing-prof top --by span spans.latest.pb.gz",
            "the span paths that take the time",
        );
    }
    if kinds.contains(&ProfileKind::Cpu) {
        cmd(
            "tracing-prof top cpu.latest.pb.gz",
            "the hottest functions, span frames marked",
        );
    }
    if kinds.contains(&ProfileKind::SpanMemory) {
        cmd(
            &format!("tracing-prof leaks --by span {CAPTURES_DIR}/span_memory.*.pb.gz"),
            "span paths whose memory kept growing",
        );
    }
    if kinds.contains(&ProfileKind::Heap) {
        cmd(
            &format!("tracing-prof leaks {CAPTURES_DIR}/heap.*.pb.gz"),
            "the code that holds it",
        );
    }
    cmd(
        "tracing-prof report . -o report.html",
        "every kind on one page",
    );
    line("");
    line("Each run rewrites this file. Given a directory, `tracing-prof report` and `sqlite`");
    line(&format!(
        "read only the *.pb.gz files in it, never {INDEX_FILE}."
    ));
    t
}
