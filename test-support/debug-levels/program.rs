//! The program the debug-level tests profile (`check.rs`), built once per debug level: each
//! package of this folder builds this file with the `debug` setting its name says (the
//! workspace's `Cargo.toml` sets it per package).
//!
//! Two `async fn`s and a helper that is always inlined, each allocating a size of its own, under
//! two nested `#[instrument]` spans: `apply` awaits `outer`, which awaits `middle`, which awaits
//! `inner`. Each function's code is small enough to be inlined into its caller's, as a
//! service's usually is. Every allocation is sampled (heap sampling rate 1): the heap profile,
//! written to the folder given as the only argument, is exact.

use std::time::Duration;
use tracing_prof::{ProfileKind, Profiler, TaggingAllocator};
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: TaggingAllocator<std::alloc::System> = TaggingAllocator::new(std::alloc::System);

/// Bytes each function allocates: `middle`'s own, `inner`'s own, and the helper's (called once
/// by each of them).
const MIDDLE_BYTES: usize = 800;
const INNER_BYTES: usize = 2400;
const ROW_BYTES: usize = 400;

/// What `middle` returns: its own block, the helper's, and `inner`'s helper's.
type Rows = (Vec<u64>, Vec<u64>, Vec<u64>);

/// A helper every caller inlines.
#[inline(always)]
fn row(seed: u64) -> Vec<u64> {
    (0..ROW_BYTES as u64 / 8).map(|i| i ^ seed).collect()
}

/// Pending once, so `inner` is polled twice (tokio's `yield_now` allocates in the runtime).
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if std::mem::replace(&mut self.0, true) {
            return std::task::Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

mod orders {
    /// The parent span: the child's span is entered inside its code.
    #[tracing::instrument(skip_all)]
    pub(crate) async fn apply(n: u64) -> usize {
        let rows = super::compute::outer(n).await;
        std::hint::black_box(&rows);
        rows.0.len() + rows.1.len() + rows.2.len()
    }

    pub(crate) async fn middle(n: u64) -> super::Rows {
        let mut own: Vec<u64> = Vec::with_capacity(super::MIDDLE_BYTES / 8);
        own.push(n);
        let helper = super::row(n);
        (std::hint::black_box(own), helper, inner(n + 1).await)
    }

    pub(crate) async fn inner(n: u64) -> Vec<u64> {
        let mut own: Vec<u64> = Vec::with_capacity(super::INNER_BYTES / 8);
        own.push(n);
        std::hint::black_box(own);
        super::YieldOnce(false).await;
        super::row(n)
    }
}

mod compute {
    /// The child span, awaited by `apply`.
    #[tracing::instrument(skip_all)]
    pub(crate) async fn outer(n: u64) -> super::Rows {
        let rows = super::orders::middle(n).await;
        std::hint::black_box(rows)
    }
}

fn main() {
    let dir = std::env::args().nth(1).expect("a folder to write into");
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .heap_sampling(1)
        .cpu_sampling(0)
        .build()
        .expect("the profiler");
    tracing_subscriber::registry().with(layer).init();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    std::hint::black_box(rt.block_on(orders::apply(std::hint::black_box(7))));
    let snapshot = guard.profiler().snapshot();
    std::fs::write(
        std::path::Path::new(&dir).join("heap.pb.gz"),
        snapshot.encode(ProfileKind::Heap),
    )
    .expect("write the heap profile");
    drop(guard);
}
