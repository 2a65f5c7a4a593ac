//! A local stand-in for a Pyroscope server: records every request and, when up, answers it as a
//! real server would by the rules of `rules.rs` (written from Pyroscope's source: 200, or the
//! status and reason of a refusal); or answers 500, or nothing at all (a stalled server), as the
//! test sets it.
#![allow(
    dead_code,
    unreachable_pub,
    reason = "each test binary uses a part of this module"
)]

pub mod rules;

use prost::Message;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing_prof::model::pprof::proto;

pub const OK: u8 = 0;
pub const FAIL_500: u8 = 1;
pub const STALL: u8 = 2;

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Percent-decoded query parameter.
    pub fn query(&self, key: &str) -> Option<String> {
        let (_, q) = self.target.split_once('?')?;
        q.split('&')
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| decode(v))
    }

    /// The bytes of multipart form field `name`.
    pub fn form_field(&self, name: &str) -> Option<Vec<u8>> {
        let ct = self.header("content-type")?;
        let boundary = format!("--{}", ct.split("boundary=").nth(1)?);
        let body = &self.body;
        let mut starts: Vec<usize> = body
            .windows(boundary.len())
            .enumerate()
            .filter(|(_, w)| *w == boundary.as_bytes())
            .map(|(i, _)| i)
            .collect();
        starts.push(body.len());
        for pair in starts.windows(2) {
            let part = &body[pair[0] + boundary.len()..pair[1]];
            let split = part.windows(4).position(|w| w == b"\r\n\r\n")?;
            let head = String::from_utf8_lossy(&part[..split]);
            if head.contains(&format!("name=\"{name}\"")) {
                let data = &part[split + 4..];
                return Some(data.strip_suffix(b"\r\n").unwrap_or(data).to_vec());
            }
        }
        None
    }
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(if b[i] == b'+' { b' ' } else { b[i] });
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

pub struct Mock {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<Request>>>,
    pub mode: Arc<AtomicU8>,
    /// Per request answered in mode `OK`: the series the server accepted, or its refusal.
    pub verdicts: Arc<Verdicts>,
}

impl Mock {
    pub fn start(mode: u8) -> Mock {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let verdicts = Arc::new(Mutex::new(Vec::new()));
        let mode = Arc::new(AtomicU8::new(mode));
        let (r, m, v) = (
            Arc::clone(&requests),
            Arc::clone(&mode),
            Arc::clone(&verdicts),
        );
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (r, m, v) = (Arc::clone(&r), Arc::clone(&m), Arc::clone(&v));
                std::thread::spawn(move || serve(stream, &r, &m, &v));
            }
        });
        Mock {
            addr,
            requests,
            mode,
            verdicts,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn taken(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// The server's verdicts so far, in order.
    pub fn verdicts(&self) -> Vec<Verdict> {
        self.verdicts.lock().unwrap().clone()
    }
}

/// The rules' verdict on one request.
pub fn judge(r: &Request) -> Verdict {
    let now = std::time::SystemTime::now();
    match r.target.split('?').next().unwrap_or("") {
        "/push.v1.PusherService/Push" => rules::push(r, now),
        "/ingest" => rules::ingest(r, now),
        other => Err(rules::Refusal {
            status: 404,
            reason: format!("no handler for {other}"),
        }),
    }
}

/// The series a request brought, or the server's refusal.
pub type Verdict = Result<Vec<rules::SeriesIn>, rules::Refusal>;
type Verdicts = Mutex<Vec<Verdict>>;

fn serve(mut s: TcpStream, requests: &Mutex<Vec<Request>>, mode: &AtomicU8, verdicts: &Verdicts) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap().split(' ');
    let (method, target) = (
        first.next().unwrap().to_owned(),
        first.next().unwrap().to_owned(),
    );
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let request = Request {
        method,
        target,
        headers,
        body,
    };
    requests.lock().unwrap().push(request.clone());
    match mode.load(Ordering::SeqCst) {
        OK => {
            let verdict = judge(&request);
            let answer = match &verdict {
                Ok(_) => {
                    "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
                }
                Err(r) => format!(
                    "HTTP/1.1 {} Refused\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                    r.status,
                    r.reason.len(),
                    r.reason
                ),
            };
            verdicts.lock().unwrap().push(verdict);
            let _ = s.write_all(answer.as_bytes());
        }
        FAIL_500 => {
            let _ = s.write_all(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\nConnection: close\r\n\r\noops");
        }
        _ => std::thread::sleep(Duration::from_secs(30)), // stalled: never answers
    }
}

/// gunzip + decode a pprof.
pub fn pprof(bytes: &[u8]) -> proto::Profile {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut raw)
        .unwrap();
    proto::Profile::decode(&raw[..]).unwrap()
}

/// Sample types of a pprof, as names.
pub fn sample_types(p: &proto::Profile) -> Vec<String> {
    p.sample_type
        .iter()
        .map(|t| p.string_table[t.r#type as usize].clone())
        .collect()
}

/// Value of `sample_type` in the samples whose leaf function is `leaf`.
pub fn value(p: &proto::Profile, leaf: &str, sample_type: &str) -> i64 {
    let col = sample_types(p)
        .iter()
        .position(|t| t == sample_type)
        .unwrap();
    let f = p
        .function
        .iter()
        .find(|f| p.string_table[f.name as usize] == leaf);
    let Some(f) = f else { return 0 };
    p.sample
        .iter()
        .filter(|s| s.location_id.first() == Some(&f.id))
        .map(|s| s.value[col])
        .sum()
}
