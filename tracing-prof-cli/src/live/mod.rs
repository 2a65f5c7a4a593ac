//! `tracing-prof live`: a terminal view of a running service's `/debug/pprof/live`, one window
//! a second, or of a recording of one (`-o`).
//!
//! The service pays for one window a second what it pays for `/debug/pprof/heap?seconds=1`:
//! two snapshots and the encoding of what changed. A live view holds one of the endpoint's
//! `?seconds=` windows while it runs.

mod app;
mod data;
mod draw;
mod source;

use app::{App, Origin};
use ratatui::crossterm::event::{self, Event, KeyEventKind};
use source::Message;
use std::time::Duration;

/// What `live` was asked.
#[derive(Debug)]
pub(crate) struct Options {
    /// A service (`http://host:6060`, `host:6060`, its `/debug/pprof`) or a recording.
    pub(crate) source: String,
    /// Record every frame here.
    pub(crate) output: Option<String>,
    /// Seconds per window.
    pub(crate) seconds: u64,
}

/// Runs the view until `q`. Errors before the view starts (the service cannot be reached,
/// answers 401, is not a tracing-prof endpoint; the recording cannot be read; there is no
/// terminal) are returned, and the terminal is left as it was.
pub(crate) fn run(options: &Options) -> Result<(), String> {
    let (mut app, frames) = if crate::input::is_url(&options.source) {
        let url = source::live_url(&options.source);
        // The first window is fetched before the terminal is taken, so that a wrong address,
        // token or server is an error message on a normal terminal.
        let (bytes, first) = source::fetch(&url, options.seconds)?;
        let mut recorder = options
            .output
            .as_deref()
            .map(source::Recorder::create)
            .transpose()?;
        if let Some(r) = &mut recorder {
            r.record(&bytes)?;
        }
        let mut app = App::new(Origin::Url(url.clone()));
        app.recording_to = options.output.clone();
        app.on_frame(bytes, first);
        (app, Some(source::poll(url, options.seconds, recorder)))
    } else {
        if options.output.is_some() {
            return Err("-o records a running service; this is a recording already".into());
        }
        let mut app = App::new(Origin::Recording(options.source.clone()));
        let truncated = source::replay(&options.source, |bytes, f| app.on_frame(bytes, f))?;
        app.follow = false;
        if truncated {
            app.on_error("the recording ends mid-frame (its recorder was stopped); the whole frames before are shown".into());
        }
        (app, None)
    };
    let mut terminal = ratatui::try_init().map_err(|e| format!("live needs a terminal: {e}"))?;
    let result = event_loop(&mut terminal, &mut app, frames.as_ref());
    ratatui::restore();
    result.map_err(|e| format!("the terminal failed: {e}"))
}

fn event_loop(
    terminal: &mut ratatui::DefaultTerminal,
    app: &mut App,
    frames: Option<&std::sync::mpsc::Receiver<Message>>,
) -> std::io::Result<()> {
    let mut dirty = true;
    while !app.quit {
        if dirty {
            terminal.draw(|f| draw::draw(f, app))?;
            dirty = false;
        }
        if event::poll(Duration::from_millis(100))? {
            match event::read()? {
                Event::Key(key) if key.kind != KeyEventKind::Release => {
                    let names: Vec<String> = draw::table(app)
                        .map(|t| t.rows.into_iter().map(|r| r.name).collect())
                        .unwrap_or_default();
                    let selected = names.get(app.selected).cloned();
                    app.on_key(key, names.len(), selected);
                    dirty = true;
                }
                Event::Resize(..) => dirty = true,
                _ => {}
            }
        }
        while let Some(message) = frames.and_then(|rx| rx.try_recv().ok()) {
            match message {
                Message::Frame(bytes, f) => app.on_frame(bytes, *f),
                Message::Error(e) => app.on_error(e),
            }
            dirty = true;
        }
    }
    Ok(())
}
