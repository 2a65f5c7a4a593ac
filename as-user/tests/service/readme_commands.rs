//! Every `go tool pprof` and `tracing-prof` command of the README, taken from the README as
//! written, runs on what the example service wrote and served: the ones on files against its
//! profile directory, the ones on `http://127.0.0.1:6060` against it while it runs.
//!
//! Only what a test cannot do as written is changed, each change said here: `profiles/` is
//! the example's directory and `127.0.0.1:6060` its address; a window of 10 or 30 seconds is 1
//! (`?seconds=1`); `go tool pprof` without an output flag gets `-top` (it would wait for
//! commands); `-base OLD.pb.gz NEW.pb.gz` and `before/`, `after/` name two captures; a
//! `curl` is a plain GET. Left to
//! other tests: `-http` (a browser: the CLI's report test), `live` (`live.rs`), `cargo`
//! commands (CI runs them: the test command, `.ci/run`'s install of the CLI; the OTLP one
//! also `otlp.rs` and the Pyroscope one `pyroscope.rs`, with their variables as written), `./my-service` (an illustration), the SQL (`tracing-prof-cli`'s
//! `cli.rs` runs it as written).

use crate::running;
use tracing_prof_test_support as common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;

/// The README's command lines: each line of its `sh` blocks, and each `$ ` line of its `text`
/// blocks, less its trailing comment.
fn readme_commands() -> Vec<String> {
    let readme = common::documentation();
    let mut out = Vec::new();
    let mut lang: Option<&str> = None;
    for line in readme.lines() {
        if let Some(l) = line.strip_prefix("```") {
            lang = if lang.is_some() { None } else { Some(l) };
            continue;
        }
        let command = match lang {
            Some("sh") => line,
            Some("text") => match line.strip_prefix("$ ") {
                Some(c) => c,
                None => continue,
            },
            _ => continue,
        };
        // A comment starts with `  #` (after the command) or the line with `#`.
        let command = command.split("  #").next().unwrap().trim();
        if !command.is_empty() && !command.starts_with('#') {
            out.push(command.to_owned());
        }
    }
    out
}

/// Splits a command line as the shell would: words, quoted parts whole.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in line.chars() {
        match (quote, c) {
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, ' ') => {
                if any {
                    out.push(std::mem::take(&mut word));
                    any = false;
                }
            }
            (_, c) => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(word);
    }
    out
}

/// A `profiles/...` argument in `dir`, globs expanded (in name order: by time).
fn expand(arg: &str, dir: &Path) -> Vec<String> {
    // Two runs' files (`before/heap.latest.pb.gz`): the first capture of the kind and the
    // newest.
    if let Some(name) = arg.strip_prefix("before/") {
        let kind = name.split('.').next().unwrap();
        return expand(&format!("profiles/captures/{kind}.*.pb.gz"), dir)[..1].to_vec();
    }
    if let Some(name) = arg.strip_prefix("after/") {
        return expand(&format!("profiles/{name}"), dir);
    }
    if arg == "profiles" || arg == "profiles/" {
        return vec![dir.to_string_lossy().into_owned()];
    }
    let Some(rest) = arg.strip_prefix("profiles/") else {
        return vec![arg.to_owned()];
    };
    let (sub, rest) = match rest.rsplit_once('/') {
        Some((sub, rest)) => (dir.join(sub), rest),
        None => (dir.to_owned(), rest),
    };
    if let Some((head, tail)) = rest.split_once('*') {
        let mut names: Vec<String> = std::fs::read_dir(&sub)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(head) && n.ends_with(tail))
            .collect();
        names.sort();
        return names
            .into_iter()
            .map(|n| sub.join(n).to_string_lossy().into_owned())
            .collect();
    }
    vec![sub.join(rest).to_string_lossy().into_owned()]
}

/// A plain GET: the status line and the body (as text, lossily).
fn get(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut s = std::net::TcpStream::connect(host).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
    // Bodies may be binary (a profile, the flight recorder's tar.gz).
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

#[test]
fn every_command_of_the_readme_runs() {
    let _serial = crate::serial();
    let commands = readme_commands();
    assert!(commands.len() > 40, "{commands:?}");
    // The example, with the label field the README slices by, serving /debug/pprof.
    let (service, base) = running::start(60, &[("TRACING_PROF_LABEL_FIELDS", "route")]);
    let addr = base
        .trim_start_matches("http://")
        .trim_end_matches("/debug/pprof")
        .to_owned();
    let dir = service.dir().to_owned();
    // Two exports (every 2 s) for the commands that compare captures.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::fs::read_dir(dir.join("captures")).map_or(0, |d| {
        d.filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("span_memory."))
        })
        .count()
    }) < 4
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let have_go = common::have_go();
    let work = std::env::temp_dir().join(format!("tracing-prof-readme-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let mut ran = 0;
    for line in &commands {
        let mut w = words(&line.replace("127.0.0.1:6060", &addr));
        let program = w[0].clone();
        let skip = w
            .iter()
            .any(|a| a.starts_with("-http") || a == "live" || a == "install")
            || !matches!(program.as_str(), "go" | "tracing-prof" | "curl");
        if skip || (program == "go" && !have_go) {
            continue;
        }
        if program == "curl" {
            let (status, body) = get(&w[1]);
            assert!(
                status.contains("200") && !body.is_empty(),
                "{line}: {status}"
            );
            ran += 1;
            continue;
        }
        // Windows of 1 s; `go tool pprof` printing rather than waiting for commands.
        for a in w.iter_mut() {
            *a = a.replace("?seconds=10", "?seconds=1");
            if a.ends_with("/debug/pprof/profile") {
                a.push_str("?seconds=1");
            }
        }
        if let Some(i) = w.iter().position(|a| a == "-seconds") {
            w[i + 1] = "1".into();
        }
        if program == "go"
            && !w
                .iter()
                .any(|a| ["-top", "-traces", "-tags", "-raw"].contains(&a.as_str()))
        {
            w.insert(3, "-top".into());
        }
        // -base OLD.pb.gz NEW.pb.gz: the first and the newest span_memory capture.
        if let Some(i) = w.iter().position(|a| a == "OLD.pb.gz") {
            let captures = expand("profiles/captures/span_memory.*.pb.gz", &dir);
            w[i] = captures[0].clone();
            w[i + 1] = captures[captures.len() - 1].clone();
        }
        let args: Vec<String> = w[1..].iter().flat_map(|a| expand(a, &dir)).collect();
        let mut cmd = if program == "tracing-prof" {
            Command::new(running::cli())
        } else {
            Command::new("go")
        };
        let out = cmd.args(&args).current_dir(&work).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && (!stdout.trim().is_empty() || stderr.contains("wrote")),
            "{line}\n(ran {program} {args:?})\n{stdout}\n{stderr}"
        );
        ran += 1;
    }
    eprintln!("ran {ran} of the README's {} command lines", commands.len());
    // Every go and tracing-prof command but those left to other tests ran.
    assert!(ran >= if have_go { 40 } else { 10 }, "ran {ran}");
    let _ = std::fs::remove_dir_all(&work);
}
