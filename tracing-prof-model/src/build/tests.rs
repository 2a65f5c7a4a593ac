//! [`Snapshot::encode`] against [`Snapshot::profile`]: the same message, kind by kind.

use crate::pprof::{gunzip, proto};
use crate::{
    Binary, CodeFrame, CpuSource, CpuStack, LinkedSamples, PathKind, PathProfile, ProfileKind,
    Snapshot, SpanFrame, StackProfile, SuspectedLeak, ThreadProfile, TraceLink,
};
use prost::Message;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A span frame with a label, its strings fresh copies: equal frames in different samples
/// live at different addresses, as they do when the capture clones them or not.
fn span(name: &str, route: &str) -> SpanFrame {
    let mut f = SpanFrame::new("app::http", name, Some("src/http.rs"), Some(12));
    f.fields = vec![(Arc::from("route"), Arc::from(route))];
    f
}

fn code(function: &str, line: u32) -> CodeFrame {
    let mut f = CodeFrame::named(function);
    f.file = Some(Arc::from("src/work.rs"));
    f.line = Some(line);
    f
}

/// Every kind has samples, labels of each sort, a leak, a trace link and a long poll; frames
/// repeat across samples, some as the same strings, some as copies.
fn snapshot() -> Snapshot {
    let mut s = Snapshot::new(
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        Duration::from_secs(10),
    );
    s.binary = Some(Binary::new("/srv/app", Some("abcdef".into())));
    s.cpu = CpuSource::Sampled { hz: 99 };
    s.cpu_sampling_hz = 99;
    s.sample_rate = 4096;
    let request = span("request", "/users");
    let shared = vec![request.clone(), span("render", "/users")];
    for (i, frames) in [
        shared.clone(),
        shared.clone(),
        vec![span("request", "/orders")],
    ]
    .into_iter()
    .enumerate()
    {
        let mut p = PathProfile::new(PathKind::Span, frames);
        p.memory.alloc_bytes = 1000 * (i as u64 + 1);
        p.memory.alloc_objects = 3;
        p.memory.inuse_bytes = 500;
        p.memory.inuse_objects = 1;
        p.time.spans = 2;
        p.time.wall_ns = 5_000;
        p.time.busy_ns = 4_000;
        p.time.idle_ns = 1_000;
        p.time.cpu_ns = 3_000;
        p.time.long_polls = i as u64;
        p.time.intervals[2] = 7;
        p.outlived = (i as u64, 64);
        s.paths.push(p);
    }
    s.paths.push(PathProfile::new(
        PathKind::NoSpan,
        vec![SpanFrame::synthetic("(no span)")],
    ));
    s.paths[3].memory.alloc_bytes = 99;
    let stack = |n: u32| {
        (0..n)
            .map(|k| code(&format!("app::f{k}"), 10 + k))
            .collect::<Vec<_>>()
    };
    for (i, frames) in [shared.clone(), vec![request.clone()], shared.clone()]
        .into_iter()
        .enumerate()
    {
        let mut c = CpuStack::new(PathKind::Span, frames, stack(3 + i as u32));
        c.samples = 10;
        c.cpu_ns = 101_010_101;
        c.long_poll = i == 1;
        if i == 0 {
            c.links = vec![LinkedSamples {
                link: TraceLink {
                    trace_id: 0xabc,
                    span_id: 0x12,
                },
                samples: 4,
            }];
        }
        s.cpu_stacks.push(c);
        let mut h = StackProfile::new(
            PathKind::Span,
            s.cpu_stacks[i].frames.clone(),
            stack(2 + i as u32),
        );
        h.samples = 2;
        h.sampled_bytes = 256;
        h.memory.alloc_bytes = 8192;
        h.memory.alloc_objects = 32;
        h.memory.inuse_bytes = 4096 * i as u64;
        h.memory.inuse_objects = 16 * i as u64;
        h.lifetimes.freed_objects[1] = 5;
        h.lifetimes.freed_bytes[1] = 640;
        h.lifetimes.temporary_objects = 3 * i as u64;
        h.lifetimes.temporary_bytes = 300;
        s.stacks.push(h);
    }
    s.suspected_leaks.push(SuspectedLeak::new(
        PathKind::Span,
        shared.clone(),
        Vec::new(),
        500,
        400,
        5,
    ));
    let mut t = ThreadProfile::new(1, 4242, "worker".into(), true);
    t.memory.alloc_bytes = 10;
    s.threads.push(t);
    let mut t = ThreadProfile::new(2, 4243, "worker".into(), false);
    t.memory.inuse_bytes = 20;
    s.threads.push(t);
    s
}

#[test]
fn every_kind_streamed_is_the_message_the_profile_makes() {
    for window in [false, true] {
        let mut s = snapshot();
        s.window = window;
        for kind in ProfileKind::ALL {
            let built = s.profile(kind).to_proto();
            let bytes = s.encode(kind);
            let streamed = proto::Profile::decode(&*gunzip(&bytes).unwrap()).unwrap();
            assert!(!streamed.sample.is_empty(), "{kind:?}");
            assert_eq!(streamed, built, "{kind:?}, window {window}");
            assert_eq!(
                crate::Profile::decode(&bytes).unwrap(),
                s.profile(kind),
                "{kind:?}"
            );
        }
    }
}
