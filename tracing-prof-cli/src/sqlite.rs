//! Profiles in SQLite, to query with SQL, as rsprof does.
//!
//! A directory of our files holds, per kind, cumulative captures (each counting from the
//! profiler's start: summing two counts the first part twice), maybe window captures
//! (`-delta` files, `?seconds=` answers), and `KIND.latest.pb.gz`, a second name of the newest
//! capture. The database knows which is which, and its views make the natural query right:
//!
//! ```sql
//! profiles(id, source, kind, pid, scope, time_ns, duration_ns, end_ns, period, period_type,
//!          period_unit, default_sample_type, binary, build_id, comments, digest, duplicate_of)
//!     -- scope: 'cumulative' or 'window'; end_ns: the instant it describes (time + duration);
//!     -- duplicate_of: the profile loaded earlier with the same content (a `latest` file)
//! sample_types(profile_id, idx, name, unit, sample_points, relative_error)
//!     -- sample_points, relative_error: NULL for exact counts; for a sampled type, the sample
//!     -- points its total stands on and one standard error, relative (1/sqrt(points))
//! frames(id, kind, function, file, line)           -- kind: 'span', 'code' or 'thread'
//! samples(id, profile_id, span_path, leaf, stack)  -- stack: root;...;leaf, as folded stacks
//! sample_values(sample_id, sample_type, value)     -- one row per sample and sample type
//! sample_frames(sample_id, depth, frame_id)        -- depth 0 is the root
//! labels(sample_id, key, str, num, unit)
//!
//! captures   -- profiles less duplicates
//! newest     -- per kind and process, the newest cumulative capture
//! last_process(pid)  -- the pid of the newest capture (NULL for names without one)
//! totals(profile_id, kind, source, pid, sample_id, span_path, leaf, stack, sample_type, value)
//!            -- the values of `newest`: SUM over it is the process's total
//! over_time(profile_id, kind, source, pid, scope, time_ns, sample_id, span_path, leaf, stack,
//!           sample_type, value)  -- every capture's values at the instant it describes
//! ```
//!
//! `span_path` is the span frames' path names joined by ` -> ` (empty for a Go profile),
//! `leaf` the innermost code frame's name (as pprof shows it).

use crate::input::Loaded;
use rusqlite::{Connection, OpenFlags, params, types::ValueRef};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;
use tracing_prof_model::{FrameKind, LabelValue};

/// A database error, with the file it happened in.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub(crate) struct SqliteError {
    path: PathBuf,
    #[source]
    source: rusqlite::Error,
}

/// The schema's version, in `PRAGMA user_version`: a database of another version is not
/// appended to.
const SCHEMA_VERSION: i64 = 3;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS profiles (
    id INTEGER PRIMARY KEY,
    source TEXT NOT NULL,
    kind TEXT,
    pid INTEGER,
    scope TEXT NOT NULL,
    time_ns INTEGER,
    duration_ns INTEGER,
    end_ns INTEGER,
    period INTEGER NOT NULL,
    period_type TEXT,
    period_unit TEXT,
    default_sample_type TEXT,
    binary TEXT,
    build_id TEXT,
    comments TEXT NOT NULL,
    digest TEXT NOT NULL,
    duplicate_of INTEGER REFERENCES profiles(id)
);
CREATE TABLE IF NOT EXISTS sample_types (
    profile_id INTEGER NOT NULL REFERENCES profiles(id),
    idx INTEGER NOT NULL,
    name TEXT NOT NULL,
    unit TEXT NOT NULL,
    sample_points INTEGER,
    relative_error REAL,
    PRIMARY KEY (profile_id, idx)
);
CREATE TABLE IF NOT EXISTS frames (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    function TEXT NOT NULL,
    file TEXT,
    line INTEGER,
    UNIQUE (kind, function, file, line)
);
CREATE TABLE IF NOT EXISTS samples (
    id INTEGER PRIMARY KEY,
    profile_id INTEGER NOT NULL REFERENCES profiles(id),
    span_path TEXT NOT NULL,
    leaf TEXT,
    stack TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sample_values (
    sample_id INTEGER NOT NULL REFERENCES samples(id),
    sample_type TEXT NOT NULL,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sample_frames (
    sample_id INTEGER NOT NULL REFERENCES samples(id),
    depth INTEGER NOT NULL,
    frame_id INTEGER NOT NULL REFERENCES frames(id)
);
CREATE TABLE IF NOT EXISTS labels (
    sample_id INTEGER NOT NULL REFERENCES samples(id),
    key TEXT NOT NULL,
    str TEXT,
    num INTEGER,
    unit TEXT
);
CREATE INDEX IF NOT EXISTS samples_profile ON samples(profile_id);
CREATE INDEX IF NOT EXISTS values_sample ON sample_values(sample_id);
CREATE INDEX IF NOT EXISTS frames_sample ON sample_frames(sample_id);
CREATE INDEX IF NOT EXISTS labels_sample ON labels(sample_id);
CREATE INDEX IF NOT EXISTS profiles_digest ON profiles(digest);
CREATE VIEW IF NOT EXISTS captures AS
    SELECT * FROM profiles WHERE duplicate_of IS NULL;
CREATE VIEW IF NOT EXISTS newest AS
    SELECT c.* FROM captures c WHERE c.scope = 'cumulative' AND NOT EXISTS (
        SELECT 1 FROM captures d WHERE d.scope = 'cumulative' AND d.kind IS c.kind
        AND d.pid IS c.pid AND d.binary IS c.binary
        AND (d.end_ns > c.end_ns OR (d.end_ns IS c.end_ns AND d.id > c.id)));
CREATE VIEW IF NOT EXISTS last_process AS
    SELECT pid FROM captures WHERE end_ns IS NOT NULL ORDER BY end_ns DESC, id DESC LIMIT 1;
CREATE VIEW IF NOT EXISTS totals AS
    SELECT p.id AS profile_id, p.kind, p.source, p.pid, s.id AS sample_id, s.span_path,
        s.leaf, s.stack, v.sample_type, v.value
    FROM newest p JOIN samples s ON s.profile_id = p.id JOIN sample_values v ON v.sample_id = s.id;
CREATE VIEW IF NOT EXISTS over_time AS
    SELECT p.id AS profile_id, p.kind, p.source, p.pid, p.scope, p.end_ns AS time_ns,
        s.id AS sample_id, s.span_path, s.leaf, s.stack, v.sample_type, v.value
    FROM captures p JOIN samples s ON s.profile_id = p.id JOIN sample_values v ON v.sample_id = s.id;
";

/// A database being filled.
pub(crate) struct Db {
    path: PathBuf,
    conn: Connection,
}

impl Db {
    /// Opens (or creates) the database at `path` with the schema. A file that is no SQLite
    /// database, or one of another schema version, is an error, and is left as it was.
    pub(crate) fn open(path: &Path) -> Result<Db, SqliteError> {
        let err = |source| SqliteError {
            path: path.to_owned(),
            source,
        };
        let conn = Connection::open(path).map_err(err)?;
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(err)?;
        let tables: i64 = conn
            .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(err)?;
        if tables > 0 && version != SCHEMA_VERSION {
            return Err(err(rusqlite::Error::InvalidParameterName(format!(
                "a database of another schema (version {version}, this tool writes \
                 {SCHEMA_VERSION}): write a new one"
            ))));
        }
        conn.execute_batch(SCHEMA).map_err(err)?;
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(err)?;
        Ok(Db {
            path: path.to_owned(),
            conn,
        })
    }

    /// Adds `profiles` in one transaction: all of them or none; returns their ids, in the
    /// order given. Our timestamped captures go in before other names, so that of two names of
    /// one file (`profiles/heap.latest.pb.gz` and the capture in `profiles/captures/` it links
    /// to) the capture, whose name says its process, is the one kept and the other its
    /// duplicate, whatever order they were given in.
    pub(crate) fn add_all(&mut self, profiles: &[Loaded]) -> Result<Vec<i64>, SqliteError> {
        let path = self.path.clone();
        let err = |source| SqliteError {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(err)?;
        let mut order: Vec<usize> = (0..profiles.len()).collect();
        order.sort_by_key(|&i| profiles[i].process().is_none());
        let mut ids = vec![0; profiles.len()];
        for i in order {
            ids[i] = insert(&tx, &profiles[i]).map_err(err)?;
        }
        tx.commit().map_err(err)?;
        Ok(ids)
    }
}

/// Whether a profile counts since its process started (`cumulative`) or over a window:
/// ours say so in a comment; otherwise a profile with a duration is a window (Go's CPU
/// profiles), one without cumulative (Go's heap profiles).
fn scope(loaded: &Loaded) -> &'static str {
    let p = &loaded.profile;
    if loaded.is_our_cumulative() {
        "cumulative"
    } else if p
        .comments
        .iter()
        .any(|c| c.starts_with("tracing-prof: window"))
        || p.duration.is_some_and(|d| !d.is_zero())
    {
        "window"
    } else {
        "cumulative"
    }
}

/// FNV-1a of the profile as encoded: two names of one file (a `latest` link) are equal.
fn digest(p: &tracing_prof_model::Profile) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in p.encode() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn kind_name(k: FrameKind) -> &'static str {
    match k {
        FrameKind::Span => "span",
        FrameKind::Code => "code",
        FrameKind::Thread => "thread",
    }
}

fn insert(tx: &rusqlite::Transaction<'_>, loaded: &Loaded) -> rusqlite::Result<i64> {
    let p = &loaded.profile;
    let nanos = |d: std::time::Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    let time = p
        .time
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(nanos);
    let end = time.map(|t| t.saturating_add(p.duration.map_or(0, nanos)));
    let digest = digest(p);
    let duplicate_of: Option<i64> = tx
        .query_row(
            "SELECT MIN(id) FROM profiles WHERE digest = ?1",
            params![digest],
            |r| r.get(0),
        )
        .unwrap_or(None);
    tx.execute(
        "INSERT INTO profiles (source, kind, pid, scope, time_ns, duration_ns, end_ns, period, \
         period_type, period_unit, default_sample_type, binary, build_id, comments, digest, \
         duplicate_of) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
        params![
            loaded.name,
            loaded.kind(),
            loaded.pid(),
            scope(loaded),
            time,
            p.duration.map(nanos),
            end,
            p.period,
            p.period_type.as_ref().map(|t| t.name.clone()),
            p.period_type.as_ref().map(|t| t.unit.clone()),
            p.sample_types
                .get(p.default_index())
                .map(|t| t.name.clone()),
            p.binary.as_ref().map(|b| b.path.clone()),
            p.binary.as_ref().and_then(|b| b.build_id.clone()),
            p.comments.join("\n"),
            digest,
            duplicate_of,
        ],
    )?;
    let profile_id = tx.last_insert_rowid();
    let mut types = tx.prepare_cached(
        "INSERT INTO sample_types (profile_id, idx, name, unit, sample_points, relative_error) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for (i, t) in p.sample_types.iter().enumerate() {
        let estimate = p.estimate(i);
        types.execute(params![
            profile_id,
            i as i64,
            t.name,
            t.unit,
            estimate.as_ref().map(|e| e.points as i64),
            estimate.as_ref().map(|e| e.relative_error),
        ])?;
    }
    let mut find_frame = tx.prepare_cached(
        "SELECT id FROM frames WHERE kind = ?1 AND function = ?2 AND file IS ?3 AND line IS ?4",
    )?;
    let mut add_frame = tx.prepare_cached(
        "INSERT INTO frames (kind, function, file, line) VALUES (?1, ?2, ?3, ?4)",
    )?;
    let mut add_sample = tx.prepare_cached(
        "INSERT INTO samples (profile_id, span_path, leaf, stack) VALUES (?1, ?2, ?3, ?4)",
    )?;
    let mut add_value = tx.prepare_cached(
        "INSERT INTO sample_values (sample_id, sample_type, value) VALUES (?1, ?2, ?3)",
    )?;
    let mut add_at = tx.prepare_cached(
        "INSERT INTO sample_frames (sample_id, depth, frame_id) VALUES (?1, ?2, ?3)",
    )?;
    let mut add_label = tx.prepare_cached(
        "INSERT INTO labels (sample_id, key, str, num, unit) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    let mut frame_ids: HashMap<&tracing_prof_model::Frame, i64> = HashMap::new();
    for s in &p.samples {
        let stack: Vec<String> = s
            .stack
            .iter()
            .map(|f| f.display_name().into_owned())
            .collect();
        add_sample.execute(params![
            profile_id,
            s.span_path(),
            s.leaf_function().map(|f| f.display_name().into_owned()),
            stack.join(";"),
        ])?;
        let sample_id = tx.last_insert_rowid();
        for (t, v) in p.sample_types.iter().zip(&s.values) {
            add_value.execute(params![sample_id, t.name, v])?;
        }
        for (depth, f) in s.stack.iter().enumerate() {
            let id = match frame_ids.get(f) {
                Some(&id) => id,
                None => {
                    let key = params![kind_name(f.kind), &*f.function, f.file.as_deref(), f.line];
                    let id = match find_frame.query_row(key, |r| r.get::<_, i64>(0)) {
                        Ok(id) => id,
                        Err(rusqlite::Error::QueryReturnedNoRows) => {
                            add_frame.execute(key)?;
                            tx.last_insert_rowid()
                        }
                        Err(e) => return Err(e),
                    };
                    frame_ids.insert(f, id);
                    id
                }
            };
            add_at.execute(params![sample_id, depth as i64, id])?;
        }
        for l in &s.labels {
            match &l.value {
                LabelValue::Str(v) => {
                    add_label.execute(params![sample_id, l.key, v, None::<i64>, None::<String>])?
                }
                LabelValue::Num { value, unit } => {
                    add_label.execute(params![sample_id, l.key, None::<String>, value, unit])?
                }
            };
        }
    }
    Ok(profile_id)
}

/// Runs `sql` on the database at `db`, opened read-only, and returns the rows as an aligned
/// text table with a header (at most `MAX_ROWS` rows).
pub(crate) fn query(db: &Path, sql: &str) -> Result<String, SqliteError> {
    const MAX_ROWS: usize = 10_000;
    let err = |source| SqliteError {
        path: db.to_owned(),
        source,
    };
    if !db.exists() {
        return Err(err(rusqlite::Error::InvalidPath(db.to_owned())));
    }
    let conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(err)?;
    let mut stmt = conn.prepare(sql).map_err(err)?;
    let names: Vec<String> = stmt
        .column_names()
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut more = false;
    let mut result = stmt.query([]).map_err(err)?;
    while let Some(row) = result.next().map_err(err)? {
        if rows.len() == MAX_ROWS {
            more = true;
            break;
        }
        let mut cells = Vec::with_capacity(names.len());
        for i in 0..names.len() {
            cells.push(match row.get_ref(i).map_err(err)? {
                ValueRef::Null => "NULL".to_owned(),
                ValueRef::Integer(v) => v.to_string(),
                ValueRef::Real(v) => format!("{v}"),
                ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
                ValueRef::Blob(b) => format!("<{} bytes>", b.len()),
            });
        }
        rows.push(cells);
    }
    let numeric: Vec<bool> = (0..names.len())
        .map(|c| {
            rows.iter()
                .all(|r| r[c] == "NULL" || r[c].parse::<f64>().is_ok())
        })
        .collect();
    let width: Vec<usize> = (0..names.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain(std::iter::once(names[c].chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| -> String {
        let mut s = String::new();
        for (c, cell) in cells.iter().enumerate() {
            if c > 0 {
                s.push_str("  ");
            }
            let pad = width[c].saturating_sub(cell.chars().count());
            if numeric[c] {
                s.push_str(&" ".repeat(pad));
                s.push_str(cell);
            } else {
                s.push_str(cell);
                if c + 1 < cells.len() {
                    s.push_str(&" ".repeat(pad));
                }
            }
        }
        s.push('\n');
        s
    };
    let mut out = line(&names);
    for r in &rows {
        out.push_str(&line(r));
    }
    if more {
        out.push_str(&format!("... (stopped at {MAX_ROWS} rows)\n"));
    }
    Ok(out)
}
