//! Where frames come from: a running service's `/debug/pprof/live`, asked for one window after
//! another on a thread of its own (which records each frame as it arrives, with `-o`), or a
//! recording read whole.

use crate::input::{HttpFailure, MAX_INPUT_BYTES, http_get};
use std::io::Write as _;
use std::sync::mpsc::{Receiver, SyncSender};
use std::time::Duration;
use tracing_prof_model::{LiveFrame, RECORDING_MAGIC, Recording, record_frame};

/// What the polling thread reports.
#[derive(Debug)]
pub(crate) enum Message {
    /// A frame as it arrived, and decoded.
    Frame(Vec<u8>, Box<LiveFrame>),
    Error(String),
}

/// The endpoint for what the user typed: a service's address (`http://host:6060`), its
/// `/debug/pprof` or `/debug/pprof/live`; a missing scheme means `http://`.
pub(crate) fn live_url(given: &str) -> String {
    let given = given.trim().trim_end_matches('/');
    let url = crate::input::with_scheme(given);
    let url = url.split('?').next().unwrap_or(&url).to_owned();
    if url.ends_with("/debug/pprof/live") {
        url
    } else if url.ends_with("/debug/pprof") {
        format!("{url}/live")
    } else {
        format!("{url}/debug/pprof/live")
    }
}

/// Asks for one window of `seconds`.
pub(crate) fn fetch(url: &str, seconds: u64) -> Result<(Vec<u8>, LiveFrame), String> {
    let timeout = Duration::from_secs(seconds + 30);
    let bytes =
        http_get(&format!("{url}?seconds={seconds}"), timeout).map_err(|f| explain(url, &f))?;
    let frame = LiveFrame::decode(&bytes).map_err(|e| {
        format!(
            "{url} does not answer tracing-prof live frames ({e}); is it a tracing-prof endpoint?"
        )
    })?;
    Ok((bytes, frame))
}

/// A failed fetch in words that say what to do.
fn explain(url: &str, f: &HttpFailure) -> String {
    match f {
        HttpFailure::Status(401, _) => format!(
            "{url} answered 401 Unauthorized: set TRACING_PROF_HTTP_TOKEN to the service's token"
        ),
        HttpFailure::Status(404, body) => format!(
            "{url} answered 404 ({body}): not a tracing-prof endpoint, or one older than `live`"
        ),
        HttpFailure::Status(429, body) => format!("{url} is busy: {body}"),
        HttpFailure::Status(code, body) => format!("{url} answered HTTP {code}: {body}"),
        HttpFailure::Transport(e) => {
            format!("cannot reach {url}: {e} (is the service running with TRACING_PROF_HTTP_ADDR?)")
        }
        HttpFailure::TooLarge => {
            format!(
                "{url} answered more than {} MiB: not a live frame",
                MAX_INPUT_BYTES >> 20
            )
        }
    }
}

/// Where frames are recorded.
#[derive(Debug)]
pub(crate) struct Recorder {
    path: String,
    file: std::io::BufWriter<std::fs::File>,
}

impl Recorder {
    /// Creates (or empties) `path` and writes the recording's first line.
    pub(crate) fn create(path: &str) -> Result<Recorder, String> {
        let file = std::fs::File::create(path).map_err(|e| format!("cannot write {path}: {e}"))?;
        let mut r = Recorder {
            path: path.to_owned(),
            file: std::io::BufWriter::new(file),
        };
        r.file
            .write_all(RECORDING_MAGIC)
            .and_then(|()| r.file.flush())
            .map_err(|e| format!("cannot write {path}: {e}"))?;
        Ok(r)
    }

    /// Appends a frame as it came, flushed so that a killed `live` leaves whole frames.
    pub(crate) fn record(&mut self, bytes: &[u8]) -> Result<(), String> {
        record_frame(&mut self.file, bytes)
            .and_then(|()| self.file.flush())
            .map_err(|e| format!("recording to {} stopped: {e}", self.path))
    }
}

/// Starts the thread that fetches window after window from `url` and sends each frame (or
/// why there is none) until the receiver is dropped. Failures are retried every second.
pub(crate) fn poll(url: String, seconds: u64, mut recorder: Option<Recorder>) -> Receiver<Message> {
    let (tx, rx) = std::sync::mpsc::sync_channel(4);
    let spawned = std::thread::Builder::new()
        .name("tprof-live".into())
        .spawn(move || poll_loop(&url, seconds, &mut recorder, &tx));
    if let Err(e) = spawned {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let _ = tx.send(Message::Error(format!(
            "cannot start the fetching thread: {e}"
        )));
        return rx;
    }
    rx
}

fn poll_loop(url: &str, seconds: u64, recorder: &mut Option<Recorder>, tx: &SyncSender<Message>) {
    loop {
        let message = match fetch(url, seconds) {
            Ok((bytes, frame)) => {
                if let Some(r) = recorder
                    && let Err(e) = r.record(&bytes)
                {
                    *recorder = None;
                    if tx.send(Message::Error(e)).is_err() {
                        return;
                    }
                }
                Message::Frame(bytes, Box::new(frame))
            }
            Err(e) => {
                if tx.send(Message::Error(format!("{e}; retrying"))).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        if tx.send(message).is_err() {
            return;
        }
    }
}

/// Reads a recording, handing its frames to `f` one at a time (so that an hour of frames is
/// never held at once); returns whether it ended mid-frame.
pub(crate) fn replay(path: &str, mut f: impl FnMut(Vec<u8>, LiveFrame)) -> Result<bool, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(format!(
            "{path} is larger than {} MiB",
            MAX_INPUT_BYTES >> 20
        ));
    }
    let mut frames = 0;
    let mut count = |bytes: &[u8], frame| {
        frames += 1;
        f(bytes.to_vec(), frame)
    };
    let truncated =
        Recording::for_each_frame(&bytes, &mut count).map_err(|e| format!("{path}: {e}"))?;
    if frames == 0 {
        return Err(format!("{path} holds no frame"));
    }
    Ok(truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_user_types_becomes_the_live_endpoint() {
        for given in [
            "127.0.0.1:6060",
            "http://127.0.0.1:6060",
            "http://127.0.0.1:6060/",
            "http://127.0.0.1:6060/debug/pprof/",
            "http://127.0.0.1:6060/debug/pprof/live?seconds=3",
        ] {
            assert_eq!(
                live_url(given),
                "http://127.0.0.1:6060/debug/pprof/live",
                "{given}"
            );
        }
        use crate::input::is_url;
        assert!(is_url("http://x") && is_url("localhost:6060"));
        assert!(is_url("127.0.0.1:6060/debug/pprof/heap"));
        assert!(!is_url("Cargo.toml") && !is_url("rec.tplive") && !is_url("C:notaport"));
    }
}
