//! Names a reader can trust at every debug level: two `async fn`s and an inlined helper are
//! three rows in `go tool pprof -top`, never one, whatever `debug` the program was built with;
//! qualified where the build carries paths (`limited`, `full`); and no frame of the caller
//! under the child's span, with or without debug information.
//!
//! This file is the test of each package of this folder; each builds `program.rs` with its own
//! `debug` setting. The `limited` package's test also runs a copy of its program without debug
//! information (`objcopy --strip-debug`, what `cargo build --release` leaves) and a stripped
//! one (`--strip-all`).

use std::path::{Path, PathBuf};
use std::process::Command;
use tracing_prof_test_support as common;

const SOURCE: &str = include_str!("program.rs");
const PROGRAM: &str = match option_env!("CARGO_BIN_EXE_debug_full") {
    Some(p) => p,
    None => match option_env!("CARGO_BIN_EXE_debug_limited") {
        Some(p) => p,
        None => match option_env!("CARGO_BIN_EXE_debug_line_tables_only") {
            Some(p) => p,
            None => panic!("no program"),
        },
    },
};

/// What the build carries.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Level {
    /// Namespaces: every name qualified.
    Paths,
    /// `line-tables-only`: inlined functions by their short names.
    LineTables,
    /// No DWARF: the symbol table's names of physical functions only.
    SymbolsOnly,
    /// Nothing: addresses.
    Stripped,
}

fn crate_name() -> String {
    Path::new(PROGRAM)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The 1-based line of the first line of `SOURCE` containing `needle`.
fn line_of(needle: &str) -> u32 {
    SOURCE
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle} not in program.rs")) as u32
        + 1
}

/// A sized constant of `program.rs` (`pub const NAME: usize = N;`).
fn bytes(name: &str) -> i64 {
    let line = SOURCE
        .lines()
        .find(|l| l.starts_with(&format!("const {name}: usize = ")))
        .unwrap();
    line.trim_end_matches(';')
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Runs `program` and returns its heap profile.
fn run(program: &Path, dir: &Path) -> PathBuf {
    let out = Command::new(program).arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("heap.pb.gz")
}

/// `go tool pprof -top`'s rows: function name -> flat bytes allocated.
fn top(profile: &Path) -> Vec<(String, i64)> {
    let text = common::pprof(
        &[
            "-top",
            "-sample_index=alloc_space",
            "-unit=B",
            "-nodecount=1000",
        ],
        profile,
    );
    text.lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let flat = cols.first()?.trim_end_matches('B').parse().ok()?;
            // flat flat% sum% cum cum% name...
            Some((cols.get(5..)?.join(" "), flat))
        })
        .collect()
}

/// Checks the profile of a program of `level`.
fn check(profile: &Path, level: Level) {
    let krate = crate_name();
    let raw = common::raw(profile);
    let outer = format!("{krate}::compute::outer [span]");
    let apply = format!("{krate}::orders::apply");
    // Exact: everything the three functions allocated, under both spans.
    let under_outer = raw.sum("alloc_space", |stack| stack.contains(&outer));
    assert_eq!(
        under_outer,
        bytes("MIDDLE_BYTES") + bytes("INNER_BYTES") + 2 * bytes("ROW_BYTES"),
        "{:#?}",
        raw.samples
    );
    // No frame of the caller's code under the child's span.
    for stack in raw.samples.keys() {
        if let Some(i) = stack.iter().position(|f| *f == outer) {
            assert!(
                !stack[i + 1..]
                    .iter()
                    .any(|f| f.starts_with(&apply) && !f.ends_with("[span]")),
                "{level:?}: the caller's frame under the child's span: {stack:?}"
            );
        }
    }
    if level == Level::Stripped || level == Level::SymbolsOnly {
        return; // inlined functions have no frames of their own
    }
    // Each function is a row of its own, holding exactly its own bytes.
    let rows = top(profile);
    let row = |what: &str, qualified: &str, from: &str, to: &str| -> (String, i64) {
        let (first, last) = (line_of(from), line_of(to));
        let found: Vec<&(String, i64)> = rows
            .iter()
            .filter(|(name, _)| {
                name.starts_with(&format!("{krate}::{qualified}"))
                    || name.split_once(" at ").is_some_and(|(_, at)| {
                        at.strip_prefix("program.rs:")
                            .and_then(|l| l.parse::<u32>().ok())
                            .is_some_and(|l| (first..last).contains(&l))
                    })
            })
            .collect();
        assert_eq!(found.len(), 1, "{level:?}: {what}: {found:?} in {rows:#?}");
        found[0].clone()
    };
    let middle = row(
        "middle",
        "orders::middle",
        "async fn middle(",
        "async fn inner(",
    );
    let inner = row("inner", "orders::inner", "async fn inner(", "mod compute");
    let helper = row("the helper", "row", "fn row(", "mod orders");
    assert_eq!(middle.1, bytes("MIDDLE_BYTES"), "{rows:#?}");
    assert_eq!(inner.1, bytes("INNER_BYTES"), "{rows:#?}");
    assert_eq!(helper.1, 2 * bytes("ROW_BYTES"), "{rows:#?}");
    if level == Level::Paths {
        for (name, _) in [&middle, &inner, &helper] {
            assert!(name.starts_with(&format!("{krate}::")), "{name}");
        }
    }
}

/// A copy of the program with `objcopy FLAG`, or `None` without objcopy (outside CI).
fn stripped_copy(dir: &Path, flag: &str) -> Option<PathBuf> {
    if !common::have(
        "objcopy",
        "--version",
        "binutils",
        "the no-debug-info names test",
    ) {
        return None;
    }
    let copy = dir.join(format!("program{flag}"));
    let ok = Command::new("objcopy")
        .arg(flag)
        .arg(PROGRAM)
        .arg(&copy)
        .status()
        .unwrap()
        .success();
    assert!(ok, "objcopy {flag}");
    Some(copy)
}

#[test]
fn names_are_distinct_and_stacks_cut_at_the_span() {
    if !common::have_go() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let level = match crate_name().as_str() {
        "debug_line_tables_only" => Level::LineTables,
        _ => Level::Paths,
    };
    check(&run(Path::new(PROGRAM), dir.path()), level);
    if crate_name() == "debug_limited" {
        for (flag, level) in [
            ("--strip-debug", Level::SymbolsOnly),
            ("--strip-all", Level::Stripped),
        ] {
            let Some(copy) = stripped_copy(dir.path(), flag) else {
                return;
            };
            check(&run(&copy, dir.path()), level);
        }
    }
}
