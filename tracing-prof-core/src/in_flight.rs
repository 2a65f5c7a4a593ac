//! What is running now: the span path each thread is in, and every open span (see
//! [`InFlight`]).
//!
//! Each thread that enters a span is listed in its thread record (`tracing-prof-thread`: its
//! OS id, read once, and a cache line only it writes) from its first enter, and on every enter
//! and exit stores there the path it is in and since when: two relaxed stores. Its record is
//! given back when the thread exits. Open spans come from the span table (see `span_index`),
//! read without a lock.

use crate::span_path::PathIndex;
use std::collections::HashMap;
use std::time::{Duration, SystemTime};
use tracing_prof_alloc::Tag;
use tracing_prof_model::{InFlight, LISTED_PER_PATH, OpenPath, OpenSpan, ThreadNow};

/// Reads what is running now; `paths` resolves tags to span paths, `now_ns` is the monotonic
/// clock now.
pub(crate) fn read(paths: &PathIndex, now_ns: u64) -> InFlight {
    let frames = |tag: Tag| {
        paths
            .get(&tag)
            .filter(|(kind, _)| *kind == tracing_prof_model::PathKind::Span)
            .map(|(_, f)| f.clone())
            .unwrap_or_default()
    };
    let age = |t: u64| Duration::from_nanos(now_ns.saturating_sub(t));
    // Where `/proc` shows this process's threads, a record whose thread is not among them is
    // left out: a record of a parent's thread, in a child of a `fork` that no handler saw.
    let proc = std::path::Path::new("/proc/self/task").is_dir();
    let mut threads = Vec::new();
    tracing_prof_thread::for_each(|r| {
        if !r.is_listed() {
            return;
        }
        let (tag, since) = r.now();
        let tid = r.tid();
        let name = match thread_name(tid) {
            Some(name) => name,
            None if proc => return,
            None => r.name(),
        };
        threads.push(ThreadNow::new(
            tid,
            name,
            frames(Tag::new(tag)),
            (since != 0).then(|| age(since)),
        ));
    });
    // Oldest thread first, as the kernel numbers them.
    threads.sort_by_key(|t| t.tid);
    // Per path: the count, and the oldest LISTED_PER_PATH creation times.
    let mut open: HashMap<Tag, (u64, Vec<(u64, u64)>)> = HashMap::new();
    crate::span_index::for_each_open(|tag, created_ns, busy_ns| {
        let (count, oldest) = open.entry(tag).or_default();
        *count += 1;
        oldest.push((created_ns, busy_ns));
        if oldest.len() >= 2 * LISTED_PER_PATH {
            oldest.sort_unstable();
            oldest.truncate(LISTED_PER_PATH);
        }
    });
    let mut paths: Vec<OpenPath> = open
        .into_iter()
        .map(|(tag, (count, mut oldest))| {
            oldest.sort_unstable();
            oldest.truncate(LISTED_PER_PATH);
            let spans = oldest
                .into_iter()
                .map(|(created, busy)| OpenSpan::new(age(created), Duration::from_nanos(busy)))
                .collect();
            OpenPath::new(frames(tag), count, spans)
        })
        .collect();
    paths.sort_by(|a, b| {
        let oldest = |p: &OpenPath| p.oldest.first().map(|s| s.age).unwrap_or_default();
        oldest(b).cmp(&oldest(a)).then(b.open.cmp(&a.open))
    });
    let mut out = InFlight::default();
    out.time = Some(SystemTime::now());
    out.binary = crate::binary::current();
    out.threads = threads;
    out.paths = paths;
    out.unlisted = crate::span_index::spans_outside();
    out
}

/// `/proc/self/task/TID/comm`: the name now, renames included (`None` when the thread is not
/// in this process, or there is no `/proc`: the record's name, read at the thread's first
/// enter, is shown then).
fn thread_name(tid: u64) -> Option<String> {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_owned())
}
