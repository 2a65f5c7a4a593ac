//! Function names as viewers show them.
//!
//! A demangled Rust name carries generic arguments and qualified paths:
//! `<alloc::vec::Vec<T,A> as core::iter::traits::collect::FromIterator<T>>::from_iter`,
//! `core::slice::cmp::<impl core::cmp::PartialEq<[U]> for [T]>::eq`. pprof takes any name
//! with `::` or `<` for demangled C++ and, unless the profile already names the function
//! differently from its system name, removes every `<...>` group from it
//! (`internal/symbolizer/symbolizer.go` in google/pprof: `demangleSingleFunction`,
//! `looksLikeDemangledCPlusPlus`, `removeMatching`), which leaves `core::slice::cmp::::eq` and
//! `::from_iter`.
//!
//! [`short_function_name`] writes the name the way pprof means to show C++ names, without
//! generic arguments, but keeps what makes a Rust name readable: the `<X as Trait>` and
//! `<impl Trait for X>` brackets, the self type's path in full and the trait by its own name:
//! `<alloc::vec::Vec as FromIterator>::from_iter`, `core::slice::cmp::<impl PartialEq for
//! [T]>::eq`. pprof files carry it as the function's `name` and the full name as its
//! `system_name`, so pprof leaves the short one alone (`go tool pprof -raw` lists the full one
//! beside it).

use std::borrow::Cow;

/// `name` without generic arguments, qualified paths kept readable (see the module docs).
/// Names without `<` come back as they are; so does a name whose brackets do not match.
pub fn short_function_name(name: &str) -> Cow<'_, str> {
    if !name.contains('<') {
        return Cow::Borrowed(name);
    }
    match shorten(name) {
        Some(s) if s != name => Cow::Owned(s),
        _ => Cow::Borrowed(name),
    }
}

/// The index of the `>` closing the `<` at `open`, or `None` when unbalanced. `->` is an
/// arrow, not a bracket.
fn closing(s: &str, open: usize) -> Option<usize> {
    let b = s.as_bytes();
    let mut depth = 0usize;
    for i in open..b.len() {
        match b[i] {
            b'<' => depth += 1,
            b'>' if i > 0 && b[i - 1] == b'-' => {}
            b'>' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether the `<` at `i` opens a qualified path (`<X as T>::f`, `<impl T for X>`) rather
/// than generic arguments (`Vec<T>`): it starts the name or follows `::`, a space or another
/// bracket.
fn opens_qualified_path(s: &str, i: usize) -> bool {
    let before = &s[..i];
    before.is_empty()
        || before.ends_with("::")
        || before.ends_with(' ')
        || before.ends_with('<')
        || before.ends_with('(')
        || before.ends_with('&')
        || before.ends_with('[')
        || before.ends_with(',')
}

/// `s` with generic arguments removed and qualified paths rewritten; `None` if unbalanced.
fn shorten(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while let Some(rel) = s[i..].find('<') {
        let open = i + rel;
        if open > 0 && s.as_bytes()[open - 1] == b'-' {
            // `-<`: not a Rust construct; keep as it is.
            out.push_str(&s[i..=open]);
            i = open + 1;
            continue;
        }
        out.push_str(&s[i..open]);
        let close = closing(s, open)?;
        if opens_qualified_path(s, open) {
            let inner = &s[open + 1..close];
            if inner.starts_with("impl ") || split_top(inner, " as ").is_some() {
                out.push('<');
                out.push_str(&qualified(inner)?);
                out.push('>');
            } else if s[..open].ends_with("::") && !s[..open].ends_with(">::") && open > 2 {
                // A turbofish (`collect::<Vec<u8>>`, `lang_start::<()>`): generic arguments,
                // dropped with the `::` before them.
                out.truncate(out.len() - 2);
            } else {
                // `<u64>::wrapping_add`, `<Vec<T>>::push`: a type's own method.
                out.push_str(&shorten(inner)?);
            }
        }
        i = close + 1;
    }
    out.push_str(&s[i..]);
    Some(out)
}

/// The inside of a qualified-path bracket: `X as Trait`, `impl Trait for X`, `impl X`.
fn qualified(inner: &str) -> Option<String> {
    if let Some(rest) = inner.strip_prefix("impl ") {
        return Some(match split_top(rest, " for ") {
            Some((t, x)) => format!("impl {} for {}", last_segment(&shorten(t)?), shorten(x)?),
            None => format!("impl {}", last_segment(&shorten(rest)?)),
        });
    }
    let (x, t) = split_top(inner, " as ")?;
    Some(format!("{} as {}", shorten(x)?, last_segment(&shorten(t)?)))
}

/// `s` split at the first `sep` (ASCII) outside every bracket.
fn split_top<'a>(s: &'a str, sep: &str) -> Option<(&'a str, &'a str)> {
    let b = s.as_bytes();
    let mut depth = 0i32;
    for i in 0..b.len() {
        match b[i] {
            b'<' | b'(' | b'[' => depth += 1,
            b'>' if i > 0 && b[i - 1] == b'-' => {}
            b'>' | b')' | b']' => depth -= 1,
            // Bytes, not a slice of `s`: `i` may be inside a character.
            _ if depth == 0 && b[i..].starts_with(sep.as_bytes()) => {
                return Some((&s[..i], &s[i + sep.len()..]));
            }
            _ => {}
        }
    }
    None
}

/// The last `::` segment of a path, outside brackets (`core::cmp::PartialEq` → `PartialEq`);
/// a path that is not a plain path (`&T`, `dyn Fn()`) as it is.
fn last_segment(path: &str) -> String {
    if path.starts_with(['&', '*', '[', '(', '<']) || path.starts_with("dyn ") {
        return path.to_owned();
    }
    let b = path.as_bytes();
    let mut depth = 0i32;
    let mut cut = 0;
    for i in 0..b.len() {
        match b[i] {
            b'<' | b'(' | b'[' => depth += 1,
            b'>' | b')' | b']' => depth -= 1,
            b':' if depth == 0 && b.get(i + 1) == Some(&b':') => cut = i + 2,
            _ => {}
        }
    }
    path[cut..].to_owned()
}

#[cfg(test)]
mod tests {
    use super::short_function_name as short;

    #[test]
    fn rust_names_read_well_without_generic_arguments() {
        for (full, want) in [
            (
                "core::slice::cmp::<impl core::cmp::PartialEq<[U]> for [T]>::eq",
                "core::slice::cmp::<impl PartialEq for [T]>::eq",
            ),
            (
                "<alloc::vec::Vec<T,A> as core::iter::traits::collect::FromIterator<T>>::from_iter",
                "<alloc::vec::Vec as FromIterator>::from_iter",
            ),
            (
                "tokio::runtime::scheduler::multi_thread::worker::<impl tokio::runtime::scheduler::multi_thread::handle::Handle>::schedule_local",
                "tokio::runtime::scheduler::multi_thread::worker::<impl Handle>::schedule_local",
            ),
            (
                "<tracing::instrument::Instrumented<T> as core::future::future::Future>::poll",
                "<tracing::instrument::Instrumented as Future>::poll",
            ),
            (
                "alloc::vec::Vec<T,A>::extend_desugared",
                "alloc::vec::Vec::extend_desugared",
            ),
            ("<&T as core::fmt::Display>::fmt", "<&T as Display>::fmt"),
            ("<u64>::wrapping_add", "u64::wrapping_add"),
            ("<alloc::vec::Vec<T>>::push", "alloc::vec::Vec::push"),
            (
                "<fn() -> core::result::Result<(), alloc::string::String> as core::ops::function::FnOnce<()>>::call_once",
                "<fn() -> core::result::Result as FnOnce>::call_once",
            ),
            (
                "<<A as x::Y>::Out as core::clone::Clone>::clone",
                "<<A as Y>::Out as Clone>::clone",
            ),
            ("in_scope<app::handle::{closure_env#0}, ()>", "in_scope"),
            (
                "mini_redis::cmd::set::Set::apply::{{closure}}",
                "mini_redis::cmd::set::Set::apply::{{closure}}",
            ),
            ("clock_gettime", "clock_gettime"),
            // Turbofish (std is mangled v0, which writes them).
            (
                "core::iter::traits::iterator::Iterator::collect::<alloc::vec::Vec<u8>>",
                "core::iter::traits::iterator::Iterator::collect",
            ),
            ("std::rt::lang_start::<()>", "std::rt::lang_start"),
            (
                "<core::str::<impl str>>::trim_start_matches::<&str>",
                "core::str::<impl str>::trim_start_matches",
            ),
            (
                "app::handle::{closure#0}::{closure#1}",
                "app::handle::{closure#0}::{closure#1}",
            ),
            // Non-ASCII names are cut by bytes, never inside a character.
            ("<é as ö::T>::f", "<é as T>::f"),
            ("‹é as T>::f", "‹é as T>::f"),
            ("<broken", "<broken"),
            ("a>b<", "a>b<"),
        ] {
            assert_eq!(short(full), want, "{full}");
            // Shortening twice changes nothing: decoded names stay as written.
            assert_eq!(short(want), want, "{want}");
        }
    }

    /// Any name, however broken, comes back without a panic: decoding runs every file's
    /// names through it.
    #[test]
    fn never_panics() {
        const PIECES: [&str; 14] = [
            "<", ">", "::", " as ", "impl ", " for ", "é", "‹", "(", ")", "[", "-", "a", "&",
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..20_000 {
            let mut name = String::new();
            for _ in 0..(x % 12) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                name.push_str(PIECES[(x % PIECES.len() as u64) as usize]);
            }
            let _ = short(&name);
            x = x.wrapping_add(1);
        }
    }
}
