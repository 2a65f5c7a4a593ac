//! What one export costs the aggregator's thread, by exporter: the example's workload (20 000
//! requests, 2 workers), one snapshot, then that snapshot exported by 7 fresh exporters of each
//! kind, alternating (a first export covers everything since the start, the largest window an
//! exporter makes). OTLP goes to the stand-in receiver, Pyroscope to a closed port (the push
//! itself is on the sender's thread either way), files to a temporary directory. Prints the
//! median, minimum and maximum per exporter, and the OTLP request's size.
//!
//! `cargo bench -p tracing-prof-as-user --bench export_cost`

use std::time::{Duration, Instant};
use tracing_prof::export::otlp::{OtlpConfig, OtlpExporter};
use tracing_prof::export::{PyroscopeConfig, PyroscopeExporter};
use tracing_prof::{FileExporter, Profiler, Sink, TaggingAllocator};
use tracing_prof_examples::{App, Workload, run};
use tracing_prof_test_support::otlp_receiver::OtlpReceiver;
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: TaggingAllocator<tikv_jemallocator::Jemalloc> =
    TaggingAllocator::new(tikv_jemallocator::Jemalloc);

fn main() {
    let (layer, guard) = Profiler::builder()
        .interval(Duration::from_secs(3600))
        .build()
        .expect("a profiler");
    tracing_subscriber::registry().with(layer).init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let app = App::new(200);
    rt.block_on(run(
        &app,
        &Workload {
            requests: 20_000,
            ..Workload::default()
        },
    ));
    let snapshot = guard.profiler().snapshot();
    let receiver = OtlpReceiver::start();
    let dir = std::env::temp_dir().join(format!("tracing-prof-export-cost-{}", std::process::id()));
    let mut times: [(&str, Vec<f64>); 3] =
        [("otlp", vec![]), ("pyroscope", vec![]), ("files", vec![])];
    let ms = |start: Instant| start.elapsed().as_secs_f64() * 1e3;
    for _ in 0..7 {
        let mut otlp =
            OtlpExporter::start(OtlpConfig::with_base_url(&receiver.url())).expect("otlp");
        let mut pyroscope = PyroscopeExporter::start(
            PyroscopeConfig::new("http://127.0.0.1:9", "bench").retries(0, Duration::ZERO),
        )
        .expect("pyroscope");
        let mut files = FileExporter::new(&dir);
        let start = Instant::now();
        otlp.export(&snapshot).expect("export");
        times[0].1.push(ms(start));
        let start = Instant::now();
        pyroscope.export(&snapshot).expect("export");
        times[1].1.push(ms(start));
        let start = Instant::now();
        files.export(&snapshot).expect("export");
        times[2].1.push(ms(start));
    }
    std::thread::sleep(Duration::from_secs(1));
    println!(
        "one snapshot: {} span paths, {} CPU stacks",
        snapshot.paths.len(),
        snapshot.cpu_stacks.len()
    );
    for (name, mut t) in times {
        t.sort_by(f64::total_cmp);
        println!(
            "{name:>9}: median {:.1} ms, min {:.1}, max {:.1} (on the aggregator's thread)",
            t[t.len() / 2],
            t[0],
            t[t.len() - 1]
        );
    }
    if let Some(r) = receiver.taken().first() {
        println!("OTLP request: {} bytes gzip'd", r.body.len());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
