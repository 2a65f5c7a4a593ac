//! HTTP/1.1 on the wire: a request head read within a deadline and parsed strictly, an answer
//! written whole.

use super::MAX_HEAD_BYTES;
use super::handler::HttpResponse;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

pub(super) enum HeadError {
    TooLarge,
    Io,
}

/// Reads up to the blank line ending the head, within `within` in total.
pub(super) fn read_head(stream: &mut TcpStream, within: Duration) -> Result<Vec<u8>, HeadError> {
    let deadline = Instant::now() + within;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
        let Some(left) = time_left(deadline) else {
            return Err(HeadError::Io);
        };
        if stream.set_read_timeout(Some(left)).is_err() {
            return Err(HeadError::Io);
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return Err(HeadError::Io),
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Ok(head)
}

/// `(method, target, Authorization)` from a request head.
pub(super) fn parse_head(head: &[u8]) -> Option<(&str, &str, Option<&str>)> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let mut request = lines.next()?.split(' ');
    let (method, target, version) = (request.next()?, request.next()?, request.next()?);
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return None;
    }
    let auth = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.trim());
    Some((method, target, auth))
}

pub(super) fn write_response(
    stream: &mut TcpStream,
    r: &HttpResponse,
    head_only: bool,
) -> std::io::Result<()> {
    let reason = match r.status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    };
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        r.status,
        r.content_type,
        r.body.len()
    );
    for (k, v) in &r.headers {
        let _ = write!(head, "{k}: {v}\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    if !head_only {
        stream.write_all(&r.body)?;
    }
    stream.flush()
}

/// The time until `deadline`, if any is left.
pub(super) fn time_left(deadline: Instant) -> Option<Duration> {
    Some(deadline.saturating_duration_since(Instant::now())).filter(|d| !d.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_are_parsed_strictly() {
        let head =
            b"GET /debug/pprof/heap?debug=1 HTTP/1.1\r\nHost: x\r\nauthorization: Bearer t\r\n\r\n";
        assert_eq!(
            parse_head(head),
            Some(("GET", "/debug/pprof/heap?debug=1", Some("Bearer t")))
        );
        assert_eq!(
            parse_head(b"GET /x HTTP/1.0\r\n\r\n"),
            Some(("GET", "/x", None))
        );
        assert_eq!(
            parse_head(b"GET x HTTP/1.1\r\n\r\n"),
            None,
            "a target must be a path"
        );
        assert_eq!(parse_head(b"GET /x SPDY/3\r\n\r\n"), None);
        assert_eq!(parse_head(b"\xff\xfe\r\n\r\n"), None);
        assert_eq!(parse_head(b"GET\r\n\r\n"), None);
    }
}
