//! The tests that run the example service as a child process, one test binary for all of them
//! (each test binary of this crate links the whole profiler with axum, OpenTelemetry and
//! mini-redis: one link instead of six saves a minute of CI's cores). They run one at a time,
//! as they did as separate binaries: each holds [`serial`]'s lock, so that a service, a terminal
//! driven by tmux, or a timing, never shares the machine's two cores with another test's.

mod running;

mod http_pprof;
mod live;
mod otlp;
mod prometheus;
mod pyroscope;
mod readme_commands;
mod service_output;

/// Held for the whole of each test: one at a time. (A test that failed poisons nothing: the
/// lock is taken again by the next.)
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
