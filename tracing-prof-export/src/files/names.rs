//! How the exporter names its files: a UTC timestamp with microseconds, the run's six random
//! characters, and how another process's files are told from ours.

/// Length of the timestamp in file names: `YYYYMMDDTHHMMSS.uuuuuuZ`.
pub(super) const STAMP_LEN: usize = 23;

/// The pid and run of a profile among `names` (`{kind}.{pid}.{stamp}.{run}.pb.gz`, or without
/// the run as written before runs were named) that is not ours and is stamped after `since`.
pub(super) fn other_writer(
    names: impl Iterator<Item = String>,
    pid: u32,
    run: &str,
    since: &str,
) -> Option<(String, String)> {
    names.into_iter().find_map(|name| {
        let stem = name.strip_suffix(".pb.gz")?;
        let mut parts = stem.splitn(3, '.');
        let (_kind, their_pid, rest) = (parts.next()?, parts.next()?, parts.next()?);
        their_pid.parse::<u32>().ok()?;
        let stamp = rest.get(..STAMP_LEN)?;
        let their_run = rest.get(STAMP_LEN..)?.strip_prefix('.').unwrap_or("");
        let ours = their_pid == pid.to_string() && their_run == run;
        (!ours && stamp > since).then(|| (their_pid.to_owned(), their_run.to_owned()))
    })
}

/// Six characters, random enough that two processes started at once with one pid (two
/// containers, each PID 1) do not draw the same: std's per-process random hash keys over the
/// time and the pid.
pub(super) fn run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.write_u32(std::process::id());
    let mut n = h.finish();
    (0..6)
        .map(|_| {
            let c = b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize];
            n /= 36;
            c as char
        })
        .collect()
}

/// `YYYYMMDDTHHMMSS.uuuuuuZ` in UTC, from microseconds since the epoch.
pub(super) fn utc_stamp(us: u64) -> String {
    let secs = us / 1_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = tracing_prof_model::units::civil_date(days as i64);
    format!(
        "{y:04}{m:02}{day:02}T{:02}{:02}{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        us % 1_000_000
    )
}
