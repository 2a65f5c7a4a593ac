//! `tracing-prof live` driven in a real terminal (tmux: `send-keys`, `capture-pane`) against
//! the running example: the top span path appears, the five views switch, a span path drills
//! down to its code stacks, the service going away is said on screen, `q` exits with the
//! terminal restored, and what was recorded with `-o` replays. Then what `live` says, without
//! a terminal, to a wrong token and to a server that is not ours.

use crate::running;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Whether tmux can be run (under `CI=true` it must).
fn have_tmux() -> bool {
    tracing_prof_test_support::have("tmux", "-V", "tmux", "the live view's terminal tests")
}

/// A tmux server of its own (`-L`), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// Runs `command` in a new 120x40 session.
    fn start(command: &str) -> Tmux {
        let t = Tmux {
            socket: format!("tracing-prof-live-{}", std::process::id()),
        };
        t.run(&[
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            "120",
            "-y",
            "40",
            command,
        ]);
        t
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        for k in keys {
            self.run(&["send-keys", "-t", "t", k]);
            std::thread::sleep(Duration::from_millis(150));
        }
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "t"])
    }

    /// The screen once `ready` holds for it, within `secs`.
    fn wait(&self, secs: u64, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if ready(&s) {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(secs),
                "no {what} within {secs} s:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_for(&self, secs: u64, text: &str) -> String {
        self.wait(secs, text, |s| s.contains(text))
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

/// The first row of the table on `screen`: the line after the header.
fn first_row(screen: &str) -> &str {
    let mut lines = screen.lines().skip_while(|l| !l.contains("span path"));
    lines.nth(1).unwrap_or("")
}

#[test]
fn live_in_a_terminal_against_the_running_example() {
    let _serial = crate::serial();
    if !have_tmux() {
        return;
    }
    let (service, base) = running::start(120, &[("TRACING_PROF_HTTP_TOKEN", "t0ken")]);
    let dir = std::env::temp_dir().join(format!("tracing-prof-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rec = dir.join("rec.tplive");
    let cli = running::cli();
    // After `live` exits, the shell prints its status and the terminal's modes: raw mode must
    // be gone (`icanon`, `echo`, not `-icanon`, `-echo`).
    let command = format!(
        "TRACING_PROF_HTTP_TOKEN=t0ken {} live {base} -o {}; echo LIVE-EXIT=$?; \
         stty -a | tr ' ;' '\\n\\n' | grep -E '^-?(icanon|echo)$' | tr '\\n' ' '; echo; sleep 60",
        cli.display(),
        rec.display()
    );
    let tmux = Tmux::start(&command);

    // View 1: the example's CPU-heavy path comes first once a few windows are in.
    let s = tmux.wait(30, "the render path on top", |s| {
        first_row(s).contains("request -> render") && s.contains("request -> db_query")
    });
    assert!(s.contains("● profiling"), "{s}");
    assert!(s.contains("● rec "), "recording is shown: {s}");
    for header in [
        "calls/s",
        "p99",
        "errors",
        "cpu",
        "alloc",
        "in use",
        "in use trend",
    ] {
        assert!(s.contains(header), "{header}: {s}");
    }
    assert!(
        s.contains("q quit") && s.contains("Enter stacks"),
        "the keys are shown: {s}"
    );

    tmux.keys(&["2"]);
    tmux.wait_for(10, "tracing_prof_examples::render");
    tmux.keys(&["3"]);
    tmux.wait_for(10, "tokio-rt-worker");
    tmux.keys(&["4"]);
    let s = tmux.wait_for(10, "memory in use:");
    assert!(s.contains("CPU: "), "{s}");
    tmux.keys(&["5"]);
    let s = tmux.wait_for(10, "Open spans:");
    assert!(s.contains("Threads: ") && s.contains("Long polls"), "{s}");

    // Drill down into the top path: its code stacks, with lines.
    tmux.keys(&["1", "Home", "Enter"]);
    let s = tmux.wait_for(10, "request -> render: code stacks");
    assert!(
        s.contains("tracing_prof_examples::render (examples/workload.rs:"),
        "{s}"
    );
    tmux.keys(&["Escape", "/", "d", "b", "Enter"]);
    let s = tmux.wait_for(10, "filter: db");
    assert!(first_row(&s).contains("request -> db_query"), "{s}");

    // The service goes away: said on screen, and the view stays.
    drop(service);
    tmux.wait_for(15, "cannot reach");
    tmux.keys(&["q"]);
    let s = tmux.wait_for(10, "LIVE-EXIT=");
    assert!(s.contains("LIVE-EXIT=0"), "{s}");
    let modes = s.lines().find(|l| l.contains("icanon")).unwrap_or("");
    assert!(
        modes.split_whitespace().any(|m| m == "icanon")
            && modes.split_whitespace().any(|m| m == "echo"),
        "the terminal is back in cooked mode with echo: {modes:?}\n{s}"
    );
    assert!(
        !s.contains("tracing-prof live "),
        "the view is gone from the screen:\n{s}"
    );
    drop(tmux);

    // The recording replays.
    let bytes = std::fs::read(&rec).unwrap();
    let recording = tracing_prof::model::Recording::decode(&bytes).unwrap();
    assert!(
        recording.frames.len() >= 2,
        "{} frames",
        recording.frames.len()
    );
    assert!(!recording.truncated);
    let replay = Tmux::start(&format!(
        "{} live {}; echo LIVE-EXIT=$?; sleep 60",
        cli.display(),
        rec.display()
    ));
    let s = replay.wait(10, "the replay", |s| {
        s.contains("recording ") && first_row(s).contains("request")
    });
    assert!(s.contains("(←→ move)"), "{s}");
    replay.keys(&["q"]);
    replay.wait_for(10, "LIVE-EXIT=0");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn live_says_what_is_wrong_before_taking_the_terminal() {
    let _serial = crate::serial();
    let (_service, base) = running::start(30, &[("TRACING_PROF_HTTP_TOKEN", "t0ken")]);
    let live = |source: &str, token: Option<&str>| {
        let mut cmd = Command::new(running::cli());
        cmd.args(["live", source])
            .env_remove("TRACING_PROF_HTTP_TOKEN");
        if let Some(t) = token {
            cmd.env("TRACING_PROF_HTTP_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = live(&base, None);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("401 Unauthorized: set TRACING_PROF_HTTP_TOKEN"),
        "{err}"
    );
    let (code, err) = live(&format!("{base}/heap"), Some("t0ken"));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("404") && err.contains("not a tracing-prof endpoint"),
        "{err}"
    );
    let (code, err) = live("127.0.0.1:9", None);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("cannot reach") && err.contains("refused"),
        "{err}"
    );
    // With the token and no terminal: the first window arrives, then the terminal is refused.
    let (code, err) = live(&base, Some("t0ken"));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("live needs a terminal"), "{err}");
    let not = std::env::temp_dir().join(format!("not-a-recording-{}", std::process::id()));
    std::fs::write(&not, "hello").unwrap();
    let (code, err) = live(not.to_str().unwrap(), None);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("not a tracing-prof live recording"), "{err}");
    let _ = std::fs::remove_file(&not);
    assert!(!Path::new("rec.tplive").exists());
}
