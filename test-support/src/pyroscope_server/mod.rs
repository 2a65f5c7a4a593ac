//! A local stand-in for a Pyroscope server: records every request and, when up, answers it as a
//! real server would by the rules of `rules.rs` (written from Pyroscope's source: 200, or the
//! status and reason of a refusal); or answers 500, or nothing at all (a stalled server), as the
//! test sets it.
pub mod rules;
pub mod storage;

pub use crate::stub_server::Request;
use crate::stub_server::{Answer, StubServer};
use prost::Message;
use rules::SeriesIn;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use storage::Ingester1x;
use tracing_prof_model::pprof::proto;

/// A [`Mock::mode`]: up, answering by the rules.
pub const OK: u8 = 0;
/// A [`Mock::mode`]: failing, every request answered 500.
pub const FAIL_500: u8 = 1;
/// A [`Mock::mode`]: stalled, no request ever answered.
pub const STALL: u8 = 2;

/// The stand-in server, listening on 127.0.0.1 until dropped.
#[derive(Debug)]
pub struct Mock {
    /// Where it listens.
    pub addr: SocketAddr,
    server: StubServer,
    /// How it answers now ([`OK`], [`FAIL_500`], [`STALL`]); the test may change it.
    pub mode: Arc<AtomicU8>,
    /// Per request answered in mode `OK`: the series the server accepted, or its refusal.
    pub verdicts: Arc<Verdicts>,
}

impl Mock {
    /// Starts a server answering as `mode` says.
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

    /// Its base URL, for an exporter's settings.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Every request received so far, in order.
    pub fn taken(&self) -> Vec<Request> {
        self.server.taken()
    }

    /// The server's verdicts so far, in order.
    pub fn verdicts(&self) -> Vec<Verdict> {
        self.verdicts.lock().unwrap().clone()
    }

    /// The series of every request so far, each accepted (a refusal fails the test).
    pub fn accepted(&self) -> Vec<Vec<SeriesIn>> {
        self.verdicts()
            .into_iter()
            .enumerate()
            .map(|(i, v)| v.unwrap_or_else(|r| panic!("request {i} refused: {r:?}")))
            .collect()
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

/// Every profile type of `requests` with the unit the UI shows it in, checked against its sample
/// unit; and no profile type twice for one label set within one request (it would be summed).
pub fn check_types_and_duplicates(requests: &[Vec<SeriesIn>]) -> BTreeSet<String> {
    let mut types = BTreeSet::new();
    for series in requests {
        let mut seen = BTreeSet::new();
        for s in series {
            let (pt, pu) = s.profile.period_type.clone().unwrap_or_default();
            let name = label(&s.labels, "__name__");
            let mut others: Vec<(String, String)> = s
                .labels
                .iter()
                .filter(|(k, _)| k != "__name__" && k != "__delta__")
                .cloned()
                .collect();
            others.sort();
            for (ty, unit) in &s.profile.sample_types {
                let id = format!("{name}:{ty}:{unit}:{pt}:{pu}");
                assert_eq!(
                    storage::ui_unit(&id),
                    storage::ui_unit_for(unit),
                    "{id}: the UI would show {unit} as {}",
                    storage::ui_unit(&id)
                );
                assert!(
                    seen.insert((id.clone(), others.clone())),
                    "{id} twice for {others:?}: counted twice"
                );
                types.insert(id);
            }
        }
    }
    types
}

/// The spans of `span` (a frame as the server names it, `target::name [span]`) the server
/// stored, over every profile of `spans:spans:count:spans:count`.
pub fn stored_spans(store: &Ingester1x, span: &str) -> i64 {
    store
        .stored
        .iter()
        .filter(|s| s.profile_type == "spans:spans:count:spans:count")
        .filter_map(|s| s.values.get(&vec![span.to_owned()]))
        .sum()
}

/// The value of label `name` (empty if none).
pub fn label<'a>(labels: &'a [(String, String)], name: &str) -> &'a str {
    labels
        .iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

/// The series of the `/ingest` requests grouped by their `from`/`until`.
pub fn group_by_interval(requests: &[Request], verdicts: &[Vec<SeriesIn>]) -> Vec<Vec<SeriesIn>> {
    let mut groups: BTreeMap<(String, String), Vec<SeriesIn>> = BTreeMap::new();
    for (r, series) in requests.iter().zip(verdicts) {
        let key = (r.query("from").unwrap(), r.query("until").unwrap());
        groups
            .entry(key)
            .or_default()
            .extend(series.iter().cloned());
    }
    groups.into_values().collect()
}
