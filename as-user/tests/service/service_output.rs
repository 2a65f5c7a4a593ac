//! The example service as a new user runs it, with flame graphs on: every `go tool pprof`
//! command it prints to "look further" names one whole profile (a `.latest.pb.gz` file, never
//! a glob over cumulative files, never an SVG), and each of them runs.

use crate::running;
use tracing_prof_test_support as common;

use running::example;
use std::process::Command;

#[test]
fn the_commands_it_prints_open_whole_profiles() {
    let _serial = crate::serial();
    let dir = std::env::temp_dir().join(format!("tracing-prof-service-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(example())
        .env("SERVICE_REQUESTS", "3000")
        .env("TRACING_PROF_DIR", &dir)
        .env("TRACING_PROF_FLAMEGRAPHS", "1")
        .output()
        .expect("run the example (cargo test builds it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read_dir(&dir).unwrap().any(|e| e
            .unwrap()
            .path()
            .extension()
            .is_some_and(|x| x == "svg")),
        "flame graphs were asked for"
    );
    // The profiler's own work is listed like any path (it was filtered out of the summary
    // while smaller rows were shown): its memory in use ranks among the top 8 here.
    let tables = &stdout[..stdout.find("All paths:").unwrap_or(stdout.len())];
    assert!(tables.contains("(tracing-prof)"), "{stdout}");
    let commands: Vec<&str> = stdout
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("go tool pprof"))
        .collect();
    assert!(commands.len() >= 8, "{stdout}");
    for c in &commands {
        let file = c.rsplit(' ').next().unwrap();
        assert!(
            file.ends_with(".latest.pb.gz") && !file.contains('*'),
            "{c}: not one whole profile"
        );
        assert!(std::path::Path::new(file).exists(), "{c}: no such file");
    }
    if !common::have_go() {
        return;
    }
    for c in commands.iter().filter(|c| !c.contains("-http")) {
        // The shell's quoting of -tagfocus='...': the one quoted argument.
        let args: Vec<String> = match c.split_once('\'') {
            Some((head, rest)) => {
                let (quoted, tail) = rest.split_once('\'').unwrap();
                let mut v: Vec<String> = head.split_whitespace().map(str::to_owned).collect();
                let last = v.pop().unwrap();
                v.push(format!("{last}{quoted}"));
                v.extend(tail.split_whitespace().map(str::to_owned));
                v
            }
            None => c.split_whitespace().map(str::to_owned).collect(),
        };
        let out = Command::new(&args[0]).args(&args[1..]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("Showing nodes") || text.contains("-----"),
            "{c}:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The README's `main() -> Result<(), Box<dyn Error>>` with a bad setting: Rust prints the
/// returned error with `Debug`, which must read as the message (it printed
/// `Error: Config(Env { name: "TRACING_PROF_INTERVAL", ... })`). A misspelled variable is
/// said on stderr, with the setting it resembles, and the service runs.
#[test]
fn errors_and_misspelled_settings_read_as_sentences() {
    let _serial = crate::serial();
    let out = Command::new(example())
        .env("SERVICE_REQUESTS", "100")
        .env("TRACING_PROF_INTERVAL", "bogus")
        .output()
        .expect("run the example");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first
            .starts_with("Error: environment variable TRACING_PROF_INTERVAL=\"bogus\" is invalid:"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("Config(") && !stderr.contains("Env {"),
        "{stderr}"
    );

    let dir = std::env::temp_dir().join(format!("tracing-prof-misspelled-{}", std::process::id()));
    let out = Command::new(example())
        .env("SERVICE_REQUESTS", "100")
        .env("TRACING_PROF_DIR", &dir)
        .env("TRACING_PROF_INTERVALL", "1s")
        .output()
        .expect("run the example");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr
            .matches("tracing-prof: TRACING_PROF_INTERVALL is not a tracing-prof setting (did you mean TRACING_PROF_INTERVAL?); it is ignored")
            .count(),
        1,
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
