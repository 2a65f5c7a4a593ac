//! The example service and the `tracing-prof` CLI as tests run them: built by `cargo test`
//! beside the test binaries.

#![allow(
    dead_code,
    unreachable_pub,
    reason = "each test binary uses a part of this module"
)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// `target/<profile>`, where cargo puts the test binaries' `deps/`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_owned()
}

/// The example binary.
pub fn example() -> PathBuf {
    target_dir().join("examples").join("service")
}

/// The `tracing-prof` CLI (`cargo test --workspace` builds it).
pub fn cli() -> PathBuf {
    let path = target_dir().join("tracing-prof");
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test --workspace`",
        path.display()
    );
    path
}

/// The variables of the documentation's command line that sets `variable` and ends with
/// `command`: what a test runs the example with, as the reader would.
pub fn readme_variables(variable: &str, command: &str) -> Vec<(String, String)> {
    let docs = tracing_prof_test_support::documentation();
    let line = docs
        .lines()
        .find(|l| l.contains(&format!("{variable}=")) && l.ends_with(command))
        .unwrap_or_else(|| panic!("the documentation's command with {variable}"));
    // A `$ ` line of a `text` block, or a line of an `sh` block.
    let line = line.strip_prefix("$ ").unwrap_or(line);
    line.split_whitespace()
        .take_while(|w| *w != "cargo")
        .map(|w| {
            let (k, v) = w.split_once('=').expect("VAR=value");
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// A running example, killed when dropped, and its profile folder (a new one for each
/// service, removed with it: the tests share one process, so a folder named after it would
/// hold earlier services' files).
pub struct Service(pub Child, pub tempfile::TempDir);

impl Service {
    /// Where it writes its profiles (`TRACING_PROF_DIR`).
    pub fn dir(&self) -> &std::path::Path {
        self.1.path()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the example serving `/debug/pprof` on a free port for `seconds`, with `env` set;
/// returns it and its base URL (`http://127.0.0.1:PORT/debug/pprof`).
pub fn start(seconds: u64, env: &[(&str, &str)]) -> (Service, String) {
    let dir = tempfile::Builder::new()
        .prefix("tracing-prof-http-")
        .tempdir()
        .expect("a profile folder");
    let mut cmd = Command::new(example());
    cmd.env("TRACING_PROF_HTTP_ADDR", "127.0.0.1:0")
        .env("SERVICE_DURATION_SECS", seconds.to_string())
        .env("TRACING_PROF_DIR", dir.path())
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().expect("run the example (cargo test builds it)");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    // Keep reading what the service prints, so that it never writes into a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let base = line
        .trim()
        .strip_prefix("serving ")
        .unwrap_or_else(|| panic!("unexpected: {line}"))
        .to_owned();
    (Service(child, dir), base.trim_end_matches('/').to_owned())
}
