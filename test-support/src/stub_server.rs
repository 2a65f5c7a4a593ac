//! A local HTTP server for the exporters' tests: records every request, and answers each as
//! the test's handler says (or never, to play a stalled server). One connection a request,
//! `Connection: close`: what the exporters' clients need, nothing more.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request as the server read it.
#[derive(Debug, Clone)]
pub struct Request {
    /// `POST`, `GET`...
    pub method: String,
    /// The path and query, as sent.
    pub target: String,
    /// The headers, in order.
    pub headers: Vec<(String, String)>,
    /// The body (as sent: compressed if it was).
    pub body: Vec<u8>,
}

impl Request {
    /// The first header named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The path, without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// Percent-decoded query parameter.
    pub fn query(&self, key: &str) -> Option<String> {
        let (_, q) = self.target.split_once('?')?;
        q.split('&')
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| percent_decode(v))
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

fn percent_decode(s: &str) -> String {
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

/// An answer: status, headers beside `Content-Length` and `Connection`, body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// More headers.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Answer {
    /// `status` with `body` as text.
    pub fn text(status: u16, body: impl Into<String>) -> Answer {
        Answer {
            status,
            headers: Vec::new(),
            body: body.into().into_bytes(),
        }
    }
}

/// What the handler decides for a request: an answer, or none (the connection stalls).
pub type Handler = dyn Fn(&Request) -> Option<Answer> + Send + Sync;

/// The server; it runs until the test process ends.
#[derive(Debug)]
pub struct StubServer {
    /// Where it listens (127.0.0.1, a free port).
    pub addr: SocketAddr,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl StubServer {
    /// Listens on a free port of 127.0.0.1 and answers with `handler`.
    pub fn start(handler: impl Fn(&Request) -> Option<Answer> + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let r = Arc::clone(&requests);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (r, h) = (Arc::clone(&r), Arc::clone(&handler));
                std::thread::spawn(move || serve(stream, &r, &*h));
            }
        });
        StubServer { addr, requests }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far, in order.
    pub fn taken(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(mut s: TcpStream, requests: &Mutex<Vec<Request>>, handler: &Handler) {
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
    match handler(&request) {
        Some(a) => {
            let mut head = format!(
                "HTTP/1.1 {} Answer\r\nContent-Length: {}\r\nConnection: close\r\n",
                a.status,
                a.body.len()
            );
            for (k, v) in &a.headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(&a.body);
        }
        None => std::thread::sleep(Duration::from_secs(30)), // stalled: never answers
    }
}
