//! The registry reuses a closed span's slot, and once the slot's generation counter wraps, the
//! very same `span::Id`. Memory is tagged by span *path*, never by id, so a block allocated under
//! the first span and freed under a later span with the same id is credited to the first.

use tracing_prof::ProfileLayer;
use tracing_subscriber::prelude::*;

#[test]
fn a_reused_span_id_never_mixes_two_spans_memory() {
    if crate::isolated(
        module_path!(),
        "a_reused_span_id_never_mixes_two_spans_memory",
    ) {
        return;
    }
    tracing::subscriber::with_default(
        tracing_subscriber::registry().with(ProfileLayer::new()),
        || {
            let first = tracing::info_span!("reuse_first");
            let first_id = first.id().unwrap();
            let kept = first.in_scope(|| std::hint::black_box(vec![1u8; 500]));
            drop(first);
            // Cycle spans through the freed slot until its generation wraps and the id comes back.
            let mut cycles = 0;
            let second = loop {
                let s = tracing::info_span!("reuse_second");
                if s.id().unwrap() == first_id {
                    break s;
                }
                cycles += 1;
                assert!(
                    cycles < 1_000_000,
                    "the registry never reused the id; the test would be moot"
                );
            };
            second.in_scope(|| {
                drop(kept);
                std::mem::forget(std::hint::black_box(vec![2u8; 300]));
            });
        },
    );
    let p = tracing_prof::core::capture(Default::default());
    let (a, b) = (
        p.path(&["reuse_first"]).unwrap().memory,
        p.path(&["reuse_second"]).unwrap().memory,
    );
    assert_eq!((a.alloc_bytes, a.inuse_bytes, a.inuse_objects), (500, 0, 0));
    assert_eq!(
        (b.alloc_bytes, b.inuse_bytes, b.inuse_objects),
        (300, 300, 1)
    );
    assert!(p.path(&["reuse_second"]).unwrap().time.spans > 1000);
}
