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
use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use tracing_prof::model::pprof::proto;
pub use tracing_prof_test_support::stub_server::Request;
use tracing_prof_test_support::stub_server::{Answer, StubServer};

pub const OK: u8 = 0;
pub const FAIL_500: u8 = 1;
pub const STALL: u8 = 2;

pub struct Mock {
    pub addr: SocketAddr,
    server: StubServer,
    pub mode: Arc<AtomicU8>,
    /// Per request answered in mode `OK`: the series the server accepted, or its refusal.
    pub verdicts: Arc<Verdicts>,
}

impl Mock {
    pub fn start(mode: u8) -> Mock {
        let verdicts = Arc::new(Mutex::new(Vec::new()));
        let mode = Arc::new(AtomicU8::new(mode));
        let (m, v) = (Arc::clone(&mode), Arc::clone(&verdicts));
        let server = StubServer::start(move |request| match m.load(Ordering::SeqCst) {
            OK => {
                let verdict = judge(request);
                let answer = match &verdict {
                    Ok(_) => Answer::text(200, ""),
                    Err(r) => Answer::text(r.status, r.reason.clone()),
                };
                v.lock().unwrap().push(verdict);
                Some(answer)
            }
            FAIL_500 => Some(Answer::text(500, "oops")),
            _ => None, // stalled: never answers
        });
        Mock {
            addr: server.addr,
            server,
            mode,
            verdicts,
        }
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn taken(&self) -> Vec<Request> {
        self.server.taken()
    }

    /// The server's verdicts so far, in order.
    pub fn verdicts(&self) -> Vec<Verdict> {
        self.verdicts.lock().unwrap().clone()
    }
}

/// The rules' verdict on one request.
pub fn judge(r: &Request) -> Verdict {
    let now = std::time::SystemTime::now();
    match r.path() {
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
