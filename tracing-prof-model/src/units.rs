//! Values as people read them: `12.3 MiB`, `2.25 s`, `1,234`.

/// `value` in `unit` as a short human-readable string: bytes in B/KiB/MiB/GiB, nanoseconds in
/// ns/µs/ms/s, anything else as a plain number.
pub fn format_value(value: i64, unit: &str) -> String {
    let neg = if value < 0 { "-" } else { "" };
    let v = value.unsigned_abs();
    match unit {
        "bytes" => format!("{neg}{}", format_bytes(v)),
        "nanoseconds" => format!("{neg}{}", format_nanos(v)),
        _ => format!("{neg}{v}"),
    }
}

/// Bytes in B, KiB, MiB or GiB.
pub fn format_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// Nanoseconds in ns, µs, ms or s.
pub fn format_nanos(ns: u64) -> String {
    match ns {
        n if n >= 1_000_000_000 => format!("{:.2} s", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1} ms", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1} µs", n as f64 / 1e3),
        n => format!("{n} ns"),
    }
}

/// `part` as a percentage of `whole` (`-` when `whole` is 0).
pub fn percent(part: i64, whole: i64) -> String {
    if whole == 0 {
        "-".to_owned()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

/// Days since 1970-01-01 (negative before it) to (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's `civil_from_days`): the dates of file names and of the command's
/// output.
pub fn civil_date(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `YYYY-MM-DD HH:MM:SS UTC`.
pub fn format_utc_seconds(t: std::time::SystemTime) -> String {
    let (date, secs, _) = utc_parts(t);
    format!("{date} {secs} UTC")
}

/// `YYYY-MM-DD HH:MM:SS.mmm UTC`.
pub fn format_utc(t: std::time::SystemTime) -> String {
    let (date, secs, ms) = utc_parts(t);
    format!("{date} {secs}.{ms:03} UTC")
}

/// `YYYYMMDDTHHMMSS.mmmZ`, for names of files and folders.
pub fn format_utc_compact(t: std::time::SystemTime) -> String {
    let (date, secs, ms) = utc_parts(t);
    format!(
        "{}T{}.{ms:03}Z",
        date.replace('-', ""),
        secs.replace(':', "")
    )
}

fn utc_parts(t: std::time::SystemTime) -> (String, String, u32) {
    let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_date(days);
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60),
        since.subsec_millis(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(format_value(1536, "bytes"), "1.5 KiB");
        assert_eq!(format_value(12_900_000, "bytes"), "12.3 MiB");
        assert_eq!(format_value(-2048, "bytes"), "-2.0 KiB");
        assert_eq!(format_value(2_250_000_000, "nanoseconds"), "2.25 s");
        assert_eq!(format_value(328_600_000, "nanoseconds"), "328.6 ms");
        assert_eq!(format_value(999, "nanoseconds"), "999 ns");
        assert_eq!(format_value(42, "count"), "42");
        assert_eq!(percent(1, 3), "33.3%");
        assert_eq!(percent(1, 0), "-");
    }

    #[test]
    fn civil_dates_across_leap_years_and_before_the_epoch() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(11_016), (2000, 2, 29));
        assert_eq!(civil_date(11_017), (2000, 3, 1));
        assert_eq!(civil_date(-1), (1969, 12, 31));
        assert_eq!(civil_date(20_782), (2026, 11, 25));
        assert_eq!(civil_date(-719_468), (0, 3, 1));
    }
}
