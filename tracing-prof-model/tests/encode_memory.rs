//! What writing a profile costs in allocations and memory: [`Snapshot::encode`] streams the
//! samples, [`Snapshot::profile`] then [`Profile::encode`] builds them first. Counted by this
//! test binary's own allocator, on a CPU profile shaped like a service's after a while: many
//! stacks, deep, over a few hundred distinct functions.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, SystemTime};
use tracing_prof_model::{
    CodeFrame, CpuSource, CpuStack, PathKind, Profile, ProfileKind, Snapshot, SpanFrame,
};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments, which meet
// `GlobalAlloc`'s contract because the caller's do; the counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        let now = IN_USE.fetch_add(layout.size(), Relaxed) + layout.size();
        PEAK.fetch_max(now, Relaxed);
        // SAFETY: forwarded as given (see the impl's comment).
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        IN_USE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        let now = IN_USE.fetch_add(new_size, Relaxed) + new_size;
        PEAK.fetch_max(now, Relaxed);
        IN_USE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: forwarded as given.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

const STACKS: usize = 2000;
const DEPTH: usize = 40;
const FUNCTIONS: usize = 300;

/// `STACKS` CPU stacks of `DEPTH` code frames under two spans; frames drawn from `FUNCTIONS`
/// shared ones (as the symbolizer's interned names are).
fn snapshot() -> Snapshot {
    let mut s = Snapshot::new(SystemTime::now(), Duration::from_secs(60));
    s.cpu = CpuSource::Sampled { hz: 99 };
    s.cpu_sampling_hz = 99;
    let functions: Vec<CodeFrame> = (0..FUNCTIONS)
        .map(|i| {
            // Names as a service's stacks have them: generic, in trait impls, closures.
            let mut f = CodeFrame::named(&format!(
                "<my_service::module{}::Handler{i}<T> as tower_service::Service<R>>::call::{{{{closure}}}}",
                i % 17
            ));
            f.file = Some(Arc::from(format!("src/module{}.rs", i % 17).as_str()));
            f.line = Some(10 + i as u32);
            f
        })
        .collect();
    let spans = vec![
        SpanFrame::new("tower_http::trace", "request", None, None),
        SpanFrame::new("my_service", "handler", Some("src/main.rs"), Some(40)),
    ];
    for i in 0..STACKS {
        let code: Vec<CodeFrame> = (0..DEPTH)
            .map(|d| functions[(i * 7 + d * 13 + d * d) % FUNCTIONS].clone())
            .collect();
        let mut c = CpuStack::new(PathKind::Span, spans.clone(), code);
        c.samples = 1 + i as u64 % 5;
        c.cpu_ns = c.samples * 10_101_010;
        s.cpu_stacks.push(c);
    }
    s
}

/// Allocations made and the peak of memory in use above what was in use before, while `f` ran.
fn measure<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    let before = IN_USE.load(Relaxed);
    PEAK.store(before, Relaxed);
    let allocations = ALLOCATIONS.load(Relaxed);
    let out = f();
    (
        out,
        ALLOCATIONS.load(Relaxed) - allocations,
        PEAK.load(Relaxed) - before,
    )
}

#[test]
fn streaming_a_profile_allocates_per_distinct_frame_not_per_frame() {
    let s = snapshot();
    let (built, built_allocations, built_peak) = measure(|| s.profile(ProfileKind::Cpu).encode());
    let (streamed, allocations, peak) = measure(|| s.encode(ProfileKind::Cpu));
    eprintln!(
        "built then encoded: {built_allocations} allocations, peak {} KiB; streamed: \
         {allocations} allocations, peak {} KiB; {} KiB written",
        built_peak >> 10,
        peak >> 10,
        streamed.len() >> 10
    );
    assert_eq!(
        Profile::decode(&streamed).unwrap(),
        Profile::decode(&built).unwrap()
    );
    // Per stack: its span path label's string (the labels themselves are borrowed). The rest
    // is per distinct frame (a function, a location, their strings; the maps that find them)
    // and the compressor's buffers: a few hundred of each here.
    assert!(
        allocations <= STACKS + 20 * FUNCTIONS,
        "{allocations} allocations"
    );
    // Built, every sample's frames are held twice over (the profile's, then the message's
    // location ids): about 40 bytes a frame at the least.
    assert!(built_peak > STACKS * DEPTH * 40, "{built_peak}");
    assert!(peak * 8 < built_peak, "streamed {peak}, built {built_peak}");
}
