//! A service set up as the README says, stopped the way systemd and Kubernetes stop services
//! (`kill -TERM`), keeps its profile up to the signal and ends by SIGTERM as it would have
//! (found in a new user's trial: exit 143 and an empty profile directory). An application that
//! handles SIGTERM itself with `tokio::signal`, registered after the profiler or before it,
//! keeps its graceful shutdown, uncut, and its guard's final export.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tracing_subscriber::prelude::*;

#[global_allocator]
static GLOBAL: tracing_prof::TaggingAllocator<tikv_jemallocator::Jemalloc> =
    tracing_prof::TaggingAllocator::new(tikv_jemallocator::Jemalloc);

const MODE: &str = "TRACING_PROF_TEST_SIGTERM";

#[tracing::instrument]
async fn handle(n: u64) -> u64 {
    let v: Vec<u64> = (0..1000 + n % 7).collect();
    tokio::task::yield_now().await;
    v.iter().sum()
}

/// The service: requests in spans, forever, until SIGTERM (the application's own handling,
/// where `mode` asks for it).
#[tokio::main]
async fn service(mode: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use tokio::signal::unix::{SignalKind, signal};
    let early = (mode == "app-before").then(|| signal(SignalKind::terminate()));
    let (layer, guard) = tracing_prof::init_from_env()?;
    tracing_subscriber::registry().with(layer).init();
    let mut term = match early {
        Some(s) => Some(s?),
        None if mode == "app-after" => Some(signal(SignalKind::terminate())?),
        None => None,
    };
    println!("ready");
    let work = async {
        for n in 0.. {
            std::hint::black_box(handle(n).await);
            if n % 64 == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    match &mut term {
        Some(term) => {
            tokio::select! {
                _ = term.recv() => {}
                () = work => {}
            }
            // The graceful shutdown: it takes a moment, and must not be cut short.
            tokio::time::sleep(Duration::from_millis(300)).await;
            println!("graceful shutdown ran");
        }
        None => work.await,
    }
    drop(guard);
    Ok(())
}

/// Runs this test binary as the service in `mode`, stops it with SIGTERM after 2 s; returns
/// how it ended and what it printed.
fn stop_with_sigterm(mode: &str, dir: &Path) -> (std::process::ExitStatus, String, String) {
    let _ = std::fs::remove_dir_all(dir);
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_sigterm_keeps_the_profile_and_the_applications_shutdown",
            "--nocapture",
        ])
        .env(MODE, mode)
        .env("TRACING_PROF_DIR", dir)
        .env("TRACING_PROF_INTERVAL", "1h") // nothing is exported but on the way out
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill to our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let start = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{mode}: took {:?}",
        start.elapsed()
    );
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The final profile in `dir`: whole, read by `go tool pprof`, with the service's span.
fn check_profile(mode: &str, dir: &Path) {
    let spans = dir.join("spans.latest.pb.gz");
    assert!(
        spans.exists(),
        "{mode}: no final profile in {}",
        dir.display()
    );
    if tracing_prof_test_support::have_go() {
        let top = tracing_prof_test_support::pprof(&["-top", "-sample_index=spans"], &spans);
        assert!(
            top.contains("handle"),
            "{mode}: the service's span is missing:\n{top}"
        );
    }
}

#[test]
fn a_sigterm_keeps_the_profile_and_the_applications_shutdown() {
    if let Ok(mode) = std::env::var(MODE) {
        service(&mode).unwrap();
        return;
    }
    let root = std::env::temp_dir().join(format!("tracing-prof-sigterm-{}", std::process::id()));
    // The README's set-up alone: the final profile, then the end SIGTERM would have made.
    let dir = root.join("plain");
    let (status, stdout, stderr) = stop_with_sigterm("plain", &dir);
    assert!(stdout.contains("ready"), "{stdout}\n{stderr}");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}\n{stderr}");
    check_profile("plain", &dir);
    // The application handles SIGTERM, registered after the profiler (its handler chains
    // ours) or before it: its shutdown runs whole, and the guard makes the final export.
    for mode in ["app-after", "app-before"] {
        let dir = root.join(mode);
        let (status, stdout, stderr) = stop_with_sigterm(mode, &dir);
        assert!(status.success(), "{mode}: {status:?}\n{stdout}\n{stderr}");
        assert!(
            stdout.contains("graceful shutdown ran"),
            "{mode}: {stdout}\n{stderr}"
        );
        check_profile(mode, &dir);
    }
    let _ = std::fs::remove_dir_all(&root);
}
