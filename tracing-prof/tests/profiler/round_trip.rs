//! Every profile kind we write decodes back to the same model, re-encodes to the same bytes,
//! and `go tool pprof` reads the re-encoded file with the same stacks and values (one test
//! per kind, on one real capture: spans on threads, sampled heap, CPU samples).

use tracing_prof_test_support as common;

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;
use tracing_prof::{Profile, ProfileKind, Snapshot};
use tracing_subscriber::prelude::*;

#[inline(never)]
fn burn(ms: u64) -> u64 {
    let start = std::time::Instant::now();
    let mut x = 1u64;
    while start.elapsed() < Duration::from_millis(ms) {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

/// One capture for every test of this binary (the profiler is process-wide).
fn snapshot() -> &'static Snapshot {
    static SNAPSHOT: OnceLock<Snapshot> = OnceLock::new();
    SNAPSHOT.get_or_init(|| {
        let (layer, guard) = tracing_prof::Profiler::builder()
            .interval(Duration::from_secs(3600))
            .heap_sampling(4096)
            .build()
            .unwrap();
        tracing_subscriber::registry().with(layer).init();
        let workers: Vec<_> = (0..2)
            .map(|i| {
                std::thread::Builder::new()
                    .name(format!("rt-worker-{i}"))
                    .spawn(move || {
                        let mut kept = Vec::new();
                        for _ in 0..50 {
                            tracing::info_span!("rt_request").in_scope(|| {
                                tracing::info_span!("rt_parse").in_scope(|| {
                                    kept.push(vec![i as u8; 3000]);
                                    std::hint::black_box(vec![0u8; 20_000]);
                                });
                                tracing::info_span!("rt_render").in_scope(|| burn(4));
                            });
                        }
                        kept.len()
                    })
                    .unwrap()
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let s = guard.profiler().snapshot();
        std::mem::forget(guard); // keep sampling state for the process's life
        s
    })
}

/// Per stack (display names, root first), the sum of each value. pprof shows names as
/// written: it shortens a name only when it equals the function's system name, and ours
/// differ wherever shortening would change them (see `tracing_prof::model::short_function_name`).
fn by_stack(p: &Profile) -> BTreeMap<Vec<String>, Vec<i64>> {
    let mut out: BTreeMap<Vec<String>, Vec<i64>> = BTreeMap::new();
    for s in &p.samples {
        let key: Vec<String> = s
            .stack
            .iter()
            .map(|f| f.display_name().into_owned())
            .collect();
        let e = out.entry(key).or_insert_with(|| vec![0; s.values.len()]);
        for (a, b) in e.iter_mut().zip(&s.values) {
            *a += b;
        }
    }
    out
}

fn round_trip(kind: ProfileKind) {
    let p = snapshot().profile(kind);
    assert!(!p.samples.is_empty(), "{kind:?}: no samples to check");
    let bytes = p.encode();
    let back = Profile::decode(&bytes).unwrap();
    assert_eq!(back, p, "{kind:?}: decode(encode(p)) differs");
    let again = back.encode();
    assert_eq!(
        again, bytes,
        "{kind:?}: re-encoding is not byte for byte the same"
    );
    if !common::have_go() {
        return;
    }
    let path = std::env::temp_dir().join(format!(
        "tracing-prof-round-trip-{}-{}.pb.gz",
        kind.name(),
        std::process::id()
    ));
    std::fs::write(&path, &again).unwrap();
    let raw = common::raw(&path);
    let names: Vec<String> = p.sample_types.iter().map(|t| t.name.clone()).collect();
    assert_eq!(raw.types, names, "{kind:?}: sample types as go reads them");
    let ours = by_stack(&p);
    // go -raw names frames by function; span frames keep their mark.
    assert_eq!(
        raw.samples.keys().collect::<Vec<_>>(),
        ours.keys().collect::<Vec<_>>(),
        "{kind:?}: stacks"
    );
    for (stack, values) in &ours {
        assert_eq!(&raw.samples[stack], values, "{kind:?}: values of {stack:?}");
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn spans() {
    if crate::isolated(module_path!(), "spans") {
        return;
    }
    round_trip(ProfileKind::Spans);
}

#[test]
fn cpu() {
    if crate::isolated(module_path!(), "cpu") {
        return;
    }
    round_trip(ProfileKind::Cpu);
}

#[test]
fn span_memory() {
    if crate::isolated(module_path!(), "span_memory") {
        return;
    }
    round_trip(ProfileKind::SpanMemory);
}

#[test]
fn heap() {
    if crate::isolated(module_path!(), "heap") {
        return;
    }
    round_trip(ProfileKind::Heap);
}

#[test]
fn allocs() {
    if crate::isolated(module_path!(), "allocs") {
        return;
    }
    round_trip(ProfileKind::Allocs);
}

#[test]
fn lifetimes() {
    if crate::isolated(module_path!(), "lifetimes") {
        return;
    }
    round_trip(ProfileKind::Lifetimes);
}

#[test]
fn threads() {
    if crate::isolated(module_path!(), "threads") {
        return;
    }
    round_trip(ProfileKind::Threads);
}

#[test]
fn every_kind_is_covered() {
    if crate::isolated(module_path!(), "every_kind_is_covered") {
        return;
    }
    assert_eq!(
        ProfileKind::ALL.len(),
        7,
        "a new kind needs its round-trip test here"
    );
}
