//! The OpenTelemetry process context (OTEP 4719), read back as the OTEP tells an external
//! reader to (its "Reading Protocol"): find the mapping in `/proc/self/maps` by name, read its
//! header through `/proc/self/mem` as another process would, check the signature, the version
//! and a non-zero `published_at_ns`, read `payload_size` bytes after the header, read the
//! header again and see `published_at_ns` unchanged, then decode the payload with the official
//! `opentelemetry/proto/resource/v1/resource.proto` (opentelemetry-proto v1.11.0, in
//! `test-support/otel_proto/`, Apache 2.0: its `LICENSE`), not with our structs. Then: updates (the
//! header stays; a payload too large for its page goes elsewhere, pointed to), no mapping in a
//! child of `fork`, and none once the profiler stops.

use prost_reflect::{DescriptorPool, DynamicMessage, Value};
use std::io::{Read, Seek, SeekFrom};
use tracing_prof_core::AttributeValue;
use tracing_prof_core::Profiler;
use tracing_prof_core::process_context::{self, HEADER_BYTES};

/// Where `/proc/self/maps` shows a mapping named `OTEL_CTX`: the OTEP's names
/// (`[anon_shmem:OTEL_CTX]`, `/memfd:OTEL_CTX`) and the reference implementation's
/// (`[anon:OTEL_CTX]`, an anonymous private mapping named with `prctl`).
fn find_mapping() -> Option<u64> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().find_map(|l| {
        let name = l.split_whitespace().nth(5)?;
        let named = [
            "[anon_shmem:OTEL_CTX]",
            "/memfd:OTEL_CTX",
            "[anon:OTEL_CTX]",
        ]
        .iter()
        .any(|n| name.starts_with(n));
        let start = l.split('-').next()?;
        named.then(|| u64::from_str_radix(start, 16).ok()).flatten()
    })
}

fn read_mem(at: u64, len: usize) -> Vec<u8> {
    let mut mem = std::fs::File::open("/proc/self/mem").unwrap();
    mem.seek(SeekFrom::Start(at)).unwrap();
    let mut buf = vec![0u8; len];
    mem.read_exact(&mut buf).unwrap();
    buf
}

/// The header's fields: (signature, version, payload_size, published_at_ns, payload).
fn header(at: u64) -> ([u8; 8], u32, u32, u64, u64) {
    let h = read_mem(at, HEADER_BYTES);
    let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap());
    (
        h[..8].try_into().unwrap(),
        u32_at(8),
        u32_at(12),
        u64_at(16),
        u64_at(24),
    )
}

/// The reading protocol: where the header is, when it was published, the resource's
/// attributes as (key, string or integer value), and where the payload was.
fn read_context() -> (u64, u64, Vec<(String, String)>, u64) {
    let at = find_mapping().expect("a mapping named OTEL_CTX in /proc/self/maps");
    loop {
        let (signature, version, size, published, payload) = header(at);
        assert_eq!(&signature, b"OTEL_CTX");
        assert_eq!(version, 2);
        if published == 0 {
            continue; // being written
        }
        let bytes = read_mem(payload, size as usize);
        if header(at).3 != published {
            continue; // changed while read
        }
        return (at, published, decode(&bytes), payload);
    }
}

fn decode(payload: &[u8]) -> Vec<(String, String)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../test-support/otel_proto");
    let files = protox::compile(["opentelemetry/proto/resource/v1/resource.proto"], [dir])
        .expect("the official .proto files compile");
    let pool = DescriptorPool::from_file_descriptor_set(files).unwrap();
    let resource = pool
        .get_message_by_name("opentelemetry.proto.resource.v1.Resource")
        .unwrap();
    let message = DynamicMessage::decode(resource, payload).expect("a Resource");
    let Value::List(attributes) = &*message.get_field_by_name("attributes").unwrap() else {
        panic!("no attributes");
    };
    attributes
        .iter()
        .map(|kv| {
            let kv = kv.as_message().unwrap();
            let key = kv
                .get_field_by_name("key")
                .unwrap()
                .as_str()
                .unwrap()
                .to_owned();
            let value = kv.get_field_by_name("value").unwrap();
            let any = value.as_message().unwrap();
            let (field, v) = any
                .fields()
                .next()
                .map(|(f, v)| (f.name().to_owned(), v.clone()))
                .expect("a value");
            let v = match (field.as_str(), v) {
                ("string_value", Value::String(s)) => s,
                ("int_value", Value::I64(i)) => i.to_string(),
                other => panic!("{other:?}"),
            };
            (key, v)
        })
        .collect()
}

/// Whether a child of `fork` sees a mapping named OTEL_CTX: read with system calls only (the
/// child of a threaded process may not allocate).
fn child_sees_mapping() -> bool {
    // SAFETY: the child only makes system calls into a stack buffer, then `_exit`s.
    match unsafe { libc::fork() } {
        0 => {
            let mut buf = [0u8; 65536];
            let mut len = 0;
            // SAFETY: a NUL-terminated path; reads into our own buffer.
            unsafe {
                let fd = libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY);
                while fd >= 0 && len < buf.len() {
                    let n = libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len);
                    if n <= 0 {
                        break;
                    }
                    len += n as usize;
                }
            }
            let found = buf[..len].windows(8).any(|w| w == b"OTEL_CTX");
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(if found { 1 } else { 0 }) }
        }
        pid => {
            assert!(pid > 0, "fork failed");
            let mut status = 0;
            // SAFETY: waits for our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            assert!(libc::WIFEXITED(status));
            libc::WEXITSTATUS(status) == 1
        }
    }
}

#[test]
fn published_at_start_read_as_the_otep_says_updated_gone_in_a_fork_and_at_stop() {
    if crate::isolated(
        module_path!(),
        "published_at_start_read_as_the_otep_says_updated_gone_in_a_fork_and_at_stop",
    ) {
        return;
    }
    // SAFETY: set before any other thread of this test binary's one test is started.
    unsafe {
        std::env::set_var("OTEL_SERVICE_NAME", "checkout");
        std::env::set_var(
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment.name=prod,team=a%2Cb,service.name=ignored,broken",
        );
    }
    assert_eq!(find_mapping(), None);
    let (_layer, guard) = Profiler::builder()
        .cpu_sampling(0)
        .heap_sampling(0)
        .build()
        .unwrap();
    let (at, published, attributes, payload) = read_context();
    assert_eq!(
        payload,
        at + HEADER_BYTES as u64,
        "the payload follows the header"
    );
    let pid = std::process::id().to_string();
    let expected: Vec<(String, String)> = [
        ("service.name", "checkout"),
        ("deployment.environment.name", "prod"),
        ("team", "a,b"),
        ("process.pid", pid.as_str()),
        ("telemetry.sdk.name", "tracing-prof"),
        ("telemetry.sdk.language", "rust"),
        ("telemetry.sdk.version", env!("CARGO_PKG_VERSION")),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    assert_eq!(attributes, expected);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    assert!(
        published <= now && now - published < 60_000_000_000,
        "{published} vs {now}"
    );

    // The resource changes: updated in place, with a later timestamp.
    let mut changed: Vec<(String, AttributeValue)> = vec![
        (
            "service.name".into(),
            AttributeValue::Str("checkout".into()),
        ),
        (
            "service.version".into(),
            AttributeValue::Str("2.0.1".into()),
        ),
        ("process.pid".into(), AttributeValue::Int(7)),
    ];
    process_context::publish(&changed).unwrap();
    let (at2, published2, attributes, payload) = read_context();
    assert_eq!(at2, at, "updated in place");
    assert_eq!(payload, at + HEADER_BYTES as u64);
    assert!(published2 > published);
    assert_eq!(
        attributes,
        [
            ("service.name", "checkout"),
            ("service.version", "2.0.1"),
            ("process.pid", "7")
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
    );
    // One that no longer fits after the header: the header stays, pointing elsewhere.
    changed.push(("big".into(), AttributeValue::Str("x".repeat(10_000))));
    process_context::publish(&changed).unwrap();
    let (at3, published3, attributes, payload) = read_context();
    assert_eq!(at3, at, "the header stays where readers found it");
    assert!(published3 > published2);
    assert_ne!(payload, at + HEADER_BYTES as u64);
    assert_eq!(attributes.last().unwrap().1.len(), 10_000);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert_eq!(maps.matches("OTEL_CTX").count(), 1, "{maps}");
    // And back after the header when it fits again.
    changed.pop();
    process_context::publish(&changed).unwrap();
    let (_, _, attributes, payload) = read_context();
    assert_eq!(payload, at + HEADER_BYTES as u64);
    assert_eq!(attributes.len(), 3);

    assert!(
        !child_sees_mapping(),
        "a child of fork inherited the mapping"
    );
    assert!(find_mapping().is_some(), "the parent keeps it");

    drop(guard);
    assert_eq!(find_mapping(), None, "removed when the profiler stops");
}
