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
}
