//! The state of `tracing-prof live` and what each key does to it; nothing here draws or
//! touches the terminal, so the keys are tested on their own.

use super::data::History;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use tracing_prof_model::LiveFrame;

/// The views, on keys `1` to `5`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum View {
    /// CPU, allocation rate and memory in use per span path.
    Spans,
    /// CPU per function, from the sampled stacks.
    Functions,
    /// Memory per thread.
    Threads,
    /// Memory in use and CPU over time.
    Chart,
    /// What runs now: open spans, threads, long polls.
    Now,
}

impl View {
    pub(crate) const ALL: [View; 5] = [
        View::Spans,
        View::Functions,
        View::Threads,
        View::Chart,
        View::Now,
    ];

    pub(crate) fn title(self) -> &'static str {
        match self {
            View::Spans => "Spans",
            View::Functions => "Functions",
            View::Threads => "Threads",
            View::Chart => "Chart",
            View::Now => "Now",
        }
    }

    /// The sort orders of the view's table, the first the default.
    pub(crate) fn sorts(self) -> &'static [Sort] {
        match self {
            View::Spans => &[
                Sort::Cpu,
                Sort::InUse,
                Sort::Alloc,
                Sort::Calls,
                Sort::P99,
                Sort::Name,
            ],
            View::Functions => &[Sort::Cpu, Sort::Total, Sort::Name],
            View::Threads => &[Sort::InUse, Sort::Alloc, Sort::Name],
            View::Chart | View::Now => &[Sort::Age],
        }
    }
}

/// What a table is sorted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sort {
    Cpu,
    Total,
    InUse,
    Alloc,
    Calls,
    P99,
    Name,
    Age,
}

impl Sort {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Sort::Cpu => "cpu",
            Sort::Total => "total cpu",
            Sort::InUse => "in use",
            Sort::Alloc => "alloc/s",
            Sort::Calls => "calls/s",
            Sort::P99 => "p99",
            Sort::Name => "name",
            Sort::Age => "age",
        }
    }
}

/// Widths of the chart, in ticks (seconds), for `+` and `-`.
pub(crate) const ZOOMS: [usize; 5] = [30, 60, 300, 900, 3600];

/// Where the frames come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A running service's endpoint.
    Url(String),
    /// A recording, replayed.
    Recording(String),
}

/// Everything `live` shows.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) origin: Origin,
    /// Where it records (`-o`), if anywhere.
    pub(crate) recording_to: Option<String>,
    pub(crate) history: History,
    pub(crate) view: View,
    /// The frame the tables end at.
    pub(crate) cursor: usize,
    /// Whether the cursor follows each new frame (`p` and the arrows stop it).
    pub(crate) follow: bool,
    /// Selected row of the view's table.
    pub(crate) selected: usize,
    /// Rows shown start here (kept so the selection stays on screen).
    pub(crate) offset: usize,
    /// The filter (a row shows when its name contains it, any case).
    pub(crate) filter: String,
    /// Whether keys go to the filter (after `/`).
    pub(crate) editing: bool,
    /// Index into the view's [`View::sorts`].
    pub(crate) sort: [usize; 5],
    /// The span path drilled into (Enter), if any.
    pub(crate) drill: Option<String>,
    /// Index into [`ZOOMS`].
    pub(crate) zoom: usize,
    /// The last error fetching, if the last fetch failed.
    pub(crate) error: Option<String>,
    pub(crate) quit: bool,
}

impl App {
    pub(crate) fn new(origin: Origin) -> App {
        App {
            origin,
            recording_to: None,
            history: History::default(),
            view: View::Spans,
            cursor: 0,
            follow: true,
            selected: 0,
            offset: 0,
            filter: String::new(),
            editing: false,
            sort: [0; 5],
            drill: None,
            zoom: 1,
            error: None,
            quit: false,
        }
    }

    /// A frame arrived.
    /// A frame arrived: `bytes` as received, `frame` decoded from them.
    pub(crate) fn on_frame(&mut self, bytes: Vec<u8>, frame: LiveFrame) {
        self.history.push(bytes, frame);
        self.error = None;
        if self.follow {
            self.cursor = self.history.end().saturating_sub(1);
        }
        self.history.focus(self.cursor);
    }

    /// A fetch failed: shown until the next frame arrives.
    pub(crate) fn on_error(&mut self, message: String) {
        self.error = Some(message);
    }

    pub(crate) fn sort(&self) -> Sort {
        let sorts = self.view.sorts();
        sorts[self.sort[self.view_index()] % sorts.len()]
    }

    fn view_index(&self) -> usize {
        View::ALL.iter().position(|v| *v == self.view).unwrap_or(0)
    }

    /// Whether `name` passes the filter.
    pub(crate) fn shows(&self, name: &str) -> bool {
        self.filter.is_empty() || name.to_lowercase().contains(&self.filter.to_lowercase())
    }

    /// Moves the cursor to frame `n` (clamped to what is kept), and stops following unless it
    /// is the last frame.
    fn seek(&mut self, n: usize) {
        let last = self.history.end().saturating_sub(1);
        self.cursor = n.clamp(self.history.first(), last);
        self.history.focus(self.cursor);
        self.follow = self.cursor == last && matches!(self.origin, Origin::Url(_));
    }

    /// One key press. `rows` is the number of rows the view's table has now (for the
    /// selection), `selected_name` the name of the selected row (for Enter).
    pub(crate) fn on_key(&mut self, key: KeyEvent, rows: usize, selected_name: Option<String>) {
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            self.quit = true;
            return;
        }
        if self.editing {
            match key.code {
                KeyCode::Enter => self.editing = false,
                KeyCode::Esc => {
                    self.editing = false;
                    self.filter.clear();
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) => self.filter.push(c),
                _ => {}
            }
            self.selected = 0;
            self.offset = 0;
            return;
        }
        match key.code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Esc | KeyCode::Backspace if self.drill.is_some() => self.drill = None,
            KeyCode::Esc => self.filter.clear(),
            KeyCode::Char(c @ '1'..='5') => {
                self.view = View::ALL[usize::from(c as u8 - b'1')];
                self.drill = None;
                self.selected = 0;
                self.offset = 0;
            }
            KeyCode::Tab => {
                self.view = View::ALL[(self.view_index() + 1) % View::ALL.len()];
                self.drill = None;
                self.selected = 0;
                self.offset = 0;
            }
            KeyCode::Char('/') => {
                self.editing = true;
                self.drill = None;
            }
            KeyCode::Char('s') => {
                let i = self.view_index();
                self.sort[i] = (self.sort[i] + 1) % self.view.sorts().len();
            }
            KeyCode::Char('p') | KeyCode::Char(' ') => {
                if self.follow {
                    self.follow = false;
                } else {
                    self.seek(usize::MAX);
                }
            }
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => {
                self.selected = (self.selected + 1).min(rows.saturating_sub(1));
            }
            KeyCode::PageUp => self.selected = self.selected.saturating_sub(10),
            KeyCode::PageDown => self.selected = (self.selected + 10).min(rows.saturating_sub(1)),
            KeyCode::Home => self.selected = 0,
            KeyCode::Enter if self.view == View::Spans => self.drill = selected_name,
            KeyCode::Left | KeyCode::Char('h') => {
                let step = if self.view == View::Chart {
                    ZOOMS[self.zoom] / 10
                } else {
                    1
                };
                self.seek(self.cursor.saturating_sub(step));
                self.follow = false;
            }
            KeyCode::Right | KeyCode::Char('l') => {
                let step = if self.view == View::Chart {
                    ZOOMS[self.zoom] / 10
                } else {
                    1
                };
                self.seek(self.cursor.saturating_add(step));
            }
            KeyCode::End => self.seek(usize::MAX),
            KeyCode::Char('+') | KeyCode::Char('=') => self.zoom = self.zoom.saturating_sub(1),
            KeyCode::Char('-') => self.zoom = (self.zoom + 1).min(ZOOMS.len() - 1),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::data::tests::frame;

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent::new(c, KeyModifiers::NONE)
    }

    #[test]
    fn keys_switch_views_filter_sort_drill_and_move_in_time() {
        let mut app = App::new(Origin::Url("http://x".into()));
        for i in 0..5 {
            let (bytes, f) = frame(i);
            app.on_frame(bytes, f);
        }
        assert_eq!((app.cursor, app.follow), (4, true));
        app.on_key(key(KeyCode::Char('3')), 0, None);
        assert_eq!(app.view, View::Threads);
        assert_eq!(app.sort(), Sort::InUse);
        app.on_key(key(KeyCode::Char('s')), 0, None);
        assert_eq!(app.sort(), Sort::Alloc);
        app.on_key(key(KeyCode::Char('1')), 2, None);
        assert_eq!(app.sort(), Sort::Cpu, "each view keeps its own order");
        app.on_key(key(KeyCode::Down), 2, None);
        app.on_key(key(KeyCode::Down), 2, None);
        assert_eq!(app.selected, 1, "the selection stops at the last row");
        app.on_key(key(KeyCode::Enter), 2, Some("request".into()));
        assert_eq!(app.drill.as_deref(), Some("request"));
        app.on_key(key(KeyCode::Esc), 2, None);
        assert_eq!(app.drill, None);
        for c in ['/', 'D', 'b'] {
            app.on_key(key(KeyCode::Char(c)), 2, None);
        }
        assert!(app.editing && app.shows("request -> db_query") && !app.shows("request"));
        app.on_key(key(KeyCode::Enter), 2, None);
        assert!(!app.editing);
        app.on_key(key(KeyCode::Char('q')), 2, None);
        assert!(app.quit, "q quits once the filter is not being typed");
        app.quit = false;
        app.on_key(key(KeyCode::Char('p')), 2, None);
        assert!(!app.follow);
        let (bytes, f) = frame(5);
        app.on_frame(bytes, f);
        assert_eq!(app.cursor, 4, "a paused view stays where it was");
        app.on_key(key(KeyCode::Left), 2, None);
        assert_eq!(app.cursor, 3);
        app.on_key(key(KeyCode::Right), 2, None);
        app.on_key(key(KeyCode::Right), 2, None);
        assert_eq!(
            (app.cursor, app.follow),
            (5, true),
            "back at the end, it follows"
        );
        app.on_key(key(KeyCode::Char('-')), 2, None);
        assert_eq!(ZOOMS[app.zoom], 300);
        app.on_key(
            KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL),
            2,
            None,
        );
        assert!(app.quit);
    }
}
