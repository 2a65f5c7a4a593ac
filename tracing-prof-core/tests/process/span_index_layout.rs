//! The span index keeps each thread's spans together by assuming tracing-subscriber's registry
//! keys spans with sharded-slab's default layout (the slot address in the low 38 bits, the
//! thread's shard in the 13 above). This checks that assumption against the registry in use:
//! spans open at once on one thread get consecutive addresses, and two threads get two shards.
//! Were it wrong, nothing would break but speed; this test says so.

use tracing_subscriber::prelude::*;

fn parts(id: u64) -> (u64, u64) {
    let key = id - 1;
    (key & ((1 << 38) - 1), (key >> 38) & ((1 << 13) - 1))
}

#[test]
fn registry_ids_carry_a_dense_address_and_the_thread() {
    if crate::isolated(
        module_path!(),
        "registry_ids_carry_a_dense_address_and_the_thread",
    ) {
        return;
    }
    let dispatch = tracing::Dispatch::new(
        tracing_subscriber::registry().with(tracing_prof_core::ProfileLayer::new()),
    );
    let ids = |dispatch: &tracing::Dispatch| {
        tracing::dispatcher::with_default(dispatch, || {
            let spans: Vec<tracing::Span> =
                (0..20).map(|_| tracing::info_span!("layout")).collect();
            spans
                .iter()
                .map(|s| s.id().unwrap().into_u64())
                .collect::<Vec<u64>>()
        })
    };
    let here = ids(&dispatch);
    let there = {
        let d = dispatch.clone();
        std::thread::spawn(move || ids(&d)).join().unwrap()
    };
    let (addr0, shard0) = parts(here[0]);
    for (i, &id) in here.iter().enumerate() {
        assert_eq!(parts(id), (addr0 + i as u64, shard0), "ids {here:?}");
    }
    let (_, shard1) = parts(there[0]);
    assert_ne!(
        shard0, shard1,
        "two threads, one shard: ids {here:?} and {there:?}"
    );
    assert!(
        addr0 < 64 && parts(there[0]).0 < 64,
        "addresses start small"
    );
}
