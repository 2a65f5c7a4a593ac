//! How a setting's text is read and checked: durations, booleans, the span path cap, label
//! fields, the giant-allocation threshold.

use std::time::Duration;

/// Parses a duration as people type it, with [`humantime`]: `1.5s`, `250ms`, `100us`, `2m`,
/// `1m30s`, `1h`; a bare number is seconds (`10`, `1.5`). Zero and more than a day are refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let expected = || {
        format!(
            "expected a duration like 1.5s, 500ms, 1m30s or 1h (a bare number is seconds), got {s:?}"
        )
    };
    let bare_number = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    let d = if bare_number {
        humantime::parse_duration(&format!("{s}s"))
    } else {
        humantime::parse_duration(s)
    }
    .map_err(|e| match e {
        humantime::DurationError::NumberOverflow => format!("must be at most 24h, got {s:?}"),
        _ => expected(),
    })?;
    if d.is_zero() {
        Err("must be greater than zero".into())
    } else if d > MAX_DURATION {
        Err(format!("must be at most 24h, got {s:?}"))
    } else {
        Ok(d)
    }
}

/// An export interval: a duration from [`MIN_INTERVAL`] to [`MAX_DURATION`].
pub(super) fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    check_interval(d)?;
    Ok(d)
}

pub(super) fn check_interval(d: Duration) -> Result<(), String> {
    if (MIN_INTERVAL..=MAX_DURATION).contains(&d) {
        Ok(())
    } else {
        Err(format!("must be from 100ms to 24h, got {d:?}"))
    }
}

/// Captures the leak rule looks back over: `0` (off) to [`MAX_LEAK_SNAPSHOTS`].
pub(super) fn parse_leak_snapshots(s: &str) -> Result<usize, String> {
    let n = s.parse::<usize>().map_err(|_| {
        format!("expected a whole number from 0 (off) to {MAX_LEAK_SNAPSHOTS}, got {s:?}")
    })?;
    check_leak_snapshots(n)?;
    Ok(n)
}

pub(super) fn check_leak_snapshots(n: usize) -> Result<(), String> {
    if n > MAX_LEAK_SNAPSHOTS {
        return Err(format!(
            "at most {MAX_LEAK_SNAPSHOTS} captures (0 turns detection off), got {n}"
        ));
    }
    Ok(())
}

/// The most captures the leak rule looks back over: 1024.
pub const MAX_LEAK_SNAPSHOTS: usize = crate::leak::MAX_LEAK_SNAPSHOTS;

/// The longest duration any setting takes: a day.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
/// The shortest export interval: 100 ms (each export captures, symbolizes and encodes).
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The smallest giant-allocation threshold: 64 KiB. Below it ordinary allocations would take
/// the cold path (a stack capture each), and with refusal on the program could not run.
pub const MIN_GIANT_BYTES: usize = 64 << 10;

pub(super) fn check_giant_bytes(bytes: Option<usize>) -> Result<(), String> {
    match bytes {
        Some(n) if n < MIN_GIANT_BYTES => Err(format!(
            "must be at least {MIN_GIANT_BYTES} bytes (64 KiB), or 0 for off; got {n}"
        )),
        _ => Ok(()),
    }
}

/// Parses `1/0`, `true/false`, `on/off`, `yes/no` (any case).
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(format!(
            "expected 1/0, true/false, on/off or yes/no, got {s:?}"
        )),
    }
}

pub(super) fn parse_max_paths(s: &str) -> Result<usize, String> {
    let max = crate::span_path::MAX_SPAN_PATHS;
    match s.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a whole number from 1 to {max}, got {s:?}"
        )),
    }
}

/// `route,method` as field names: non-empty, made of letters, digits, `_` and `.`, none of
/// the profiles' own labels ([`tracing_prof_model::PROFILE_LABELS`]), at most
/// [`crate::labels::MAX_LABEL_FIELDS`].
pub(crate) fn parse_label_fields(s: &str) -> Result<Vec<String>, String> {
    let fields: Vec<String> = s
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    if let Some(bad) = fields.iter().find(|f| {
        !f.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    }) {
        return Err(format!(
            "{bad:?} is not a field name (letters, digits, _ and . only)"
        ));
    }
    if let Some(ours) = fields
        .iter()
        .find(|f| tracing_prof_model::PROFILE_LABELS.contains(&f.as_str()))
    {
        return Err(format!(
            "{ours:?} is a label the profiles set themselves; rename the field (reserved: {})",
            tracing_prof_model::PROFILE_LABELS.join(", ")
        ));
    }
    if fields.len() > crate::labels::MAX_LABEL_FIELDS {
        return Err(format!(
            "at most {} fields, got {}",
            crate::labels::MAX_LABEL_FIELDS,
            fields.len()
        ));
    }
    Ok(fields)
}
/// `80,90,95`: percentages from 1 to 100, ascending after sorting, without repeats; `off` or
/// `0`: none.
pub(crate) fn parse_thresholds(s: &str) -> Result<Vec<u8>, String> {
    if matches!(s.trim(), "off" | "0" | "") {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim().trim_end_matches('%');
        match part.parse::<u8>() {
            Ok(n) if (1..=100).contains(&n) => out.push(n),
            _ => {
                return Err(format!(
                    "expected percentages of the memory limit from 1 to 100, separated by \
                     commas (80,90,95), or off; got {part:?}"
                ));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}
