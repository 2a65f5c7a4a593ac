//! Test binaries whose tests need a process each (the global subscriber and allocator, a
//! profiler started once, its threads, signal handlers and environment), gathered into one
//! binary so that what they share is compiled and linked once: each test runs in a child
//! process of its own (the binary again, running that test alone), one at a time, as they did
//! as separate binaries. A test begins with
//! `if isolated(module_path!(), "its_name") { return; }`.

/// The environment variable naming the one test a child process of this binary runs.
const CHILD: &str = "TRACING_PROF_TEST_ISOLATED";

/// The name libtest gives test `name` of the module whose `module_path!()` is `module`
/// (`fork::children_of_a_busy_profiler_never_hang`): what `--exact` takes.
pub fn test_name(module: &str, name: &str) -> String {
    let module = module.split_once("::").map_or("", |(_, m)| m);
    format!("{module}::{name}")
}

/// Runs test `name` of `module` (its `module_path!()`) in a child process of its own and
/// checks that it passed there; returns `true` when it did so (the caller then returns), and
/// `false` in that child, where the caller goes on to run the test's body. The children run
/// one at a time: tests that time CPU or count threads never share the machine with another.
pub fn isolated(module: &str, name: &str) -> bool {
    let full = test_name(module, name);
    if std::env::var(CHILD).is_ok_and(|t| t == full) {
        return false;
    }
    let _serial = serial();
    let out = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", &full, "--nocapture"])
        .env(CHILD, &full)
        .output()
        .expect("a child process running the test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Shown with a failure (libtest keeps what a test prints until then).
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{full} failed in its process: {}",
        out.status
    );
    // A name that matched no test would pass, having run nothing.
    assert!(
        stdout.contains("test result: ok. 1 passed"),
        "{full} did not run in its process"
    );
    true
}

/// Held while a child process runs a test.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
