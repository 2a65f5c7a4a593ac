//! Exact per-span-path memory, read back from the pprof file by `go tool pprof`.
//!
//! One test per file: the global allocator and the global subscriber are the process's.

use tracing_prof_test_support as common;

use std::alloc::{Layout, alloc, alloc_zeroed, dealloc, realloc};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tracing::Instrument;
use tracing_prof::{ProfileKind, ProfileLayer};
use tracing_subscriber::prelude::*;

/// Blocks kept alive until the end, so they count as in use.
struct Kept(Vec<(usize, Layout)>);

impl Kept {
    fn alloc(&mut self, size: usize, align: usize) -> *mut u8 {
        let layout = Layout::from_size_align(size, align).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { alloc(layout) };
        assert!(!p.is_null() && (p as usize).is_multiple_of(align));
        self.0.push((p as usize, layout));
        p
    }
}

fn alloc_free(size: usize, align: usize) {
    let layout = Layout::from_size_align(size, align).unwrap();
    // SAFETY: non-zero size; freed with the same layout.
    unsafe {
        let p = alloc(layout);
        assert!(!p.is_null() && (p as usize).is_multiple_of(align));
        p.write_bytes(1, size);
        // Observed, so that the optimizer cannot drop the pair (it did, in one build of
        // this binary: the allocation never reached the allocator).
        dealloc(std::hint::black_box(p), layout);
    }
}

/// Allocates in every poll and yields, woken by another thread, so that a multi-thread
/// runtime may resume it on any worker.
#[allow(clippy::vec_box, reason = "one heap block per poll is the point")]
struct Polls {
    left: u32,
    kept: Vec<Box<[u8; 128]>>,
    waker: Arc<Mutex<Option<Waker>>>,
}

impl Future for Polls {
    type Output = Vec<Box<[u8; 128]>>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.kept.push(Box::new([7; 128]));
        drop(std::hint::black_box(vec![0u8; 32]));
        if self.left == 0 {
            return Poll::Ready(std::mem::take(&mut self.kept));
        }
        self.left -= 1;
        *self.waker.lock().unwrap() = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[test]
fn memory_per_span_path_is_exact_in_go_tool_pprof() {
    if crate::isolated(
        module_path!(),
        "memory_per_span_path_is_exact_in_go_tool_pprof",
    ) {
        return;
    }
    if !common::have_go() {
        return;
    }
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(ProfileLayer::new()),
    )
    .unwrap();
    let mut kept = Kept(Vec::with_capacity(64));

    // Warm-up: lets the registry and the thread-locals of this thread make their one-time
    // allocations, outside the spans measured below.
    let w = tracing::info_span!("em_warmup");
    w.in_scope(|| {
        tracing::info_span!("em_warmup").in_scope(|| tracing::info_span!("w").in_scope(|| ()))
    });

    // A thread that frees what it is sent, inside a span of its own.
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(16);
    let freer = std::thread::spawn(move || {
        let span = tracing::info_span!("em_freer");
        for v in rx {
            span.in_scope(|| drop(v));
        }
    });

    let root = tracing::info_span!("em_root");
    let child = tracing::info_span!(parent: &root, "em_child");
    let grand = tracing::info_span!(parent: &child, "em_grand");
    let (g1, g2);
    {
        let _r = root.enter();
        kept.alloc(100, 1); // root: kept 100
        alloc_free(200, 8); // root: 200 freed
        {
            let _c = child.enter();
            kept.alloc(48, 16);
            alloc_free(64, 64);
            kept.alloc(5000, 4096);
            let z = Layout::from_size_align(1000, 8).unwrap();
            // SAFETY: non-zero size; kept (freed at the end with `z`).
            let p = unsafe { alloc_zeroed(z) };
            // SAFETY: p points to 1000 initialised bytes.
            let zeroed = unsafe { std::slice::from_raw_parts(p, 1000) };
            assert!(zeroed.iter().all(|&b| b == 0));
            kept.0.push((p as usize, z));
            for _ in 0..10 {
                tx.send(vec![5u8; 256]).unwrap(); // freed on the other thread
            }
            {
                let _g = grand.enter();
                let l10 = Layout::from_size_align(10, 1).unwrap();
                // SAFETY: valid layouts; each realloc gets the block's current layout.
                unsafe {
                    let p = alloc(l10);
                    let p = realloc(p, l10, 1000); // grow: 1000 allocated, 10 freed
                    let p = realloc(p, Layout::from_size_align(1000, 1).unwrap(), 100); // shrink: 100 allocated, 1000 freed
                    g1 = (p as usize, Layout::from_size_align(100, 1).unwrap());
                    g2 = alloc(Layout::from_size_align(64, 8).unwrap());
                }
            }
        }
        // Grown while em_root is current: in resize mode the growth stays with em_grand.
        // SAFETY: g2 is live with size 64, align 8.
        let g2 = unsafe { realloc(g2, Layout::from_size_align(64, 8).unwrap(), 640) };
        kept.0.push(g1);
        kept.0
            .push((g2 as usize, Layout::from_size_align(640, 8).unwrap()));
    }
    drop(tx);
    freer.join().unwrap();

    // An instrumented future on a multi-thread runtime, woken from a third thread.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let waker: Arc<Mutex<Option<Waker>>> = Arc::new(Mutex::new(None));
    let kicker = {
        let waker = Arc::clone(&waker);
        std::thread::spawn(move || {
            for _ in 0..2000 {
                std::thread::sleep(Duration::from_micros(200));
                if let Some(w) = waker.lock().unwrap().take() {
                    w.wake();
                }
            }
        })
    };
    let polls = Polls {
        left: 19,
        kept: Vec::with_capacity(20),
        waker,
    };
    let async_kept = rt.block_on(async {
        tokio::spawn(polls.instrument(tracing::info_span!("em_async")))
            .await
            .unwrap()
    });
    assert_eq!(async_kept.len(), 20);

    // The same instrumented future polled on two different threads, for certain.
    let mut hop = Box::pin(
        async {
            let a = vec![1u8; 1000];
            Yield(false).await;
            let b = vec![2u8; 1000];
            (a, b)
        }
        .instrument(tracing::info_span!("em_hop")),
    );
    assert!(
        hop.as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending()
    );
    let hopped = std::thread::spawn(move || {
        match hop.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("second poll must finish"),
        }
    })
    .join()
    .unwrap();

    let profile = tracing_prof::core::capture(Duration::from_secs(1));
    let file = common::write_profile(&profile, ProfileKind::Heap, "exact_memory");
    let raw = common::raw(&file);
    let m = |names: &[&str]| {
        let stack: Vec<String> = names
            .iter()
            .map(|n| format!("end_to_end::exact_memory::{n} [span]"))
            .collect();
        let stack: Vec<&str> = stack.iter().map(String::as_str).collect();
        raw.get(&stack)
            .cloned()
            .unwrap_or_else(|| panic!("no sample for {names:?} in {raw:#?}"))
    };
    // alloc_objects, alloc_space, inuse_objects, inuse_space
    assert_eq!(
        raw.types,
        [
            "alloc_objects",
            "alloc_space",
            "inuse_objects",
            "inuse_space"
        ]
    );
    assert_eq!(m(&["em_root"]), [2, 300, 1, 100]);
    assert_eq!(
        m(&["em_root", "em_child"]),
        [14, 48 + 64 + 5000 + 1000 + 2560, 3, 48 + 5000 + 1000]
    );
    // Each realloc an allocation of the new size (and a free of the old): 10, 10 -> 1000,
    // 1000 -> 100, 64, 64 -> 640.
    assert_eq!(
        m(&["em_root", "em_child", "em_grand"]),
        [5, 10 + 1000 + 100 + 64 + 640, 2, 100 + 640]
    );
    assert_eq!(m(&["em_async"]), [40, 20 * 160, 20, 20 * 128]);
    assert_eq!(m(&["em_hop"]), [2, 2000, 2, 2000]);
    assert!(
        raw.get(&["end_to_end::exact_memory::em_freer [span]"])
            .is_none(),
        "the freeing thread's span holds nothing"
    );

    // -traces and -top with Go's sample index names work and show the same numbers.
    let traces = common::pprof(&["-traces", "-sample_index=inuse_space"], &file);
    assert!(
        traces.contains("end_to_end::exact_memory::em_grand [span]"),
        "{traces}"
    );
    let top = common::pprof(&["-top", "-sample_index=alloc_space"], &file);
    assert!(
        top.contains("end_to_end::exact_memory::em_child [span]"),
        "{top}"
    );

    drop((async_kept, hopped));
    kicker.join().unwrap();
    for (p, l) in kept.0 {
        // SAFETY: every kept block is live with the recorded layout.
        unsafe { dealloc(p as *mut u8, l) };
    }
}

/// Returns Pending once.
struct Yield(bool);

impl Future for Yield {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            Poll::Pending
        }
    }
}
