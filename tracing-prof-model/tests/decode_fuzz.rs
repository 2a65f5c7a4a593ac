//! The decoder against corrupt, truncated, hostile and mutated input: every input is either a
//! profile or a `DecodeError`, never a panic, and what decodes survives the rest of the model
//! (tables, folded stacks, re-encoding).
//!
//! A bounded, deterministic mutation fuzzer runs in CI (`TRACING_PROF_FUZZ_ITERS`, default
//! 3000, over the seeds in `tests/corpus`: our files and Go's). For open-ended fuzzing with
//! libFuzzer, see `fuzz/` (`cargo +nightly fuzz run decode`).

use std::io::Read as _;
use tracing_prof_model::pprof::proto;
use tracing_prof_model::{DecodeError, Grouping, Profile};

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 5, "{}: seeds missing", dir.display());
    seeds
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// Decodes `bytes`; when it decodes, runs the rest of the model over it and checks that it
/// round-trips. Panics (with the input saved) are what the caller looks for.
fn exercise(bytes: &[u8]) -> Result<(), DecodeError> {
    let p = Profile::decode(bytes)?;
    for i in 0..p.sample_types.len() {
        let name = p.sample_types[i].name.clone();
        let _ = p.top(Some(&name), Grouping::Function, false, 10);
        let _ = p.top(Some(&name), Grouping::SpanPath, true, 10);
        let _ = p.folded(Some(&name));
        let _ = p.samples_text(Some(&name), 3);
    }
    let again = Profile::decode(&p.encode()).expect("what we encode decodes");
    assert_eq!(again, p, "decode(encode(p)) != p");
    Ok(())
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, mut data: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        if data.is_empty() {
            data.push(rng.next() as u8);
            continue;
        }
        let at = rng.below(data.len());
        match rng.below(7) {
            0 => data[at] ^= 1 << rng.below(8),
            1 => data[at] = rng.next() as u8,
            2 => {
                let end = (at + 1 + rng.below(16)).min(data.len());
                data.drain(at..end);
            }
            3 => {
                let end = (at + 1 + rng.below(64)).min(data.len());
                let chunk = data[at..end].to_vec();
                let to = rng.below(data.len());
                data.splice(to..to, chunk);
            }
            4 => data.truncate(at),
            // A varint-looking byte set to a large or small length.
            5 => data[at] = [0x00, 0x01, 0x7f, 0x80, 0xff][rng.below(5)],
            _ => {
                let n = 1 + rng.below(8);
                let junk: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                data.splice(at..at, junk);
            }
        }
    }
    data
}

#[test]
fn mutated_profiles_decode_or_fail_cleanly() {
    let iters: usize = std::env::var("TRACING_PROF_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let seeds: Vec<Vec<u8>> = corpus().into_iter().map(|(_, b)| gunzip(&b)).collect();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut decoded, mut refused) = (0, 0);
    for i in 0..iters {
        let seed = &seeds[i % seeds.len()];
        let input = mutate(&mut rng, seed.clone());
        let result = std::panic::catch_unwind(|| exercise(&input));
        match result {
            Ok(Ok(())) => decoded += 1,
            Ok(Err(_)) => refused += 1,
            Err(_) => {
                let path = std::env::temp_dir().join(format!("tracing-prof-fuzz-crash-{i}.pb"));
                std::fs::write(&path, &input).unwrap();
                panic!("iteration {i} panicked; input saved to {}", path.display());
            }
        }
    }
    eprintln!("{iters} mutated inputs: {decoded} decoded, {refused} refused");
    // The mutations must exercise both sides, or the test proves nothing.
    assert!(
        decoded > iters / 20 && refused > iters / 20,
        "{decoded} decoded, {refused} refused"
    );
}

fn encode(p: &proto::Profile) -> Vec<u8> {
    prost::Message::encode_to_vec(p)
}

/// A minimal valid message: one sample type, one sample at one location of one function.
fn valid() -> proto::Profile {
    proto::Profile {
        string_table: vec![
            String::new(),
            "samples".into(),
            "count".into(),
            "main".into(),
        ],
        sample_type: vec![proto::ValueType { r#type: 1, unit: 2 }],
        function: vec![proto::Function {
            id: 1,
            name: 3,
            ..Default::default()
        }],
        location: vec![proto::Location {
            id: 1,
            line: vec![proto::Line {
                function_id: 1,
                line: 7,
            }],
            ..Default::default()
        }],
        sample: vec![proto::Sample {
            location_id: vec![1],
            value: vec![5],
            label: Vec::new(),
        }],
        ..Default::default()
    }
}

#[test]
fn structurally_broken_profiles_are_refused_with_a_reason() {
    assert!(Profile::decode(&encode(&valid())).is_ok());
    type Breaker = Box<dyn Fn(&mut proto::Profile)>;
    let cases: Vec<(&str, Breaker)> = vec![
        (
            "string 0 not empty",
            Box::new(|p| p.string_table[0] = "x".into()),
        ),
        ("no string table", Box::new(|p| p.string_table.clear())),
        (
            "string index out of range",
            Box::new(|p| p.function[0].name = 99),
        ),
        (
            "negative string index",
            Box::new(|p| p.sample_type[0].r#type = -1),
        ),
        ("no sample types", Box::new(|p| p.sample_type.clear())),
        ("values missing", Box::new(|p| p.sample[0].value.clear())),
        (
            "dangling location",
            Box::new(|p| p.sample[0].location_id = vec![42]),
        ),
        ("zero location id", Box::new(|p| p.location[0].id = 0)),
        (
            "duplicate location id",
            Box::new(|p| {
                let l = p.location[0].clone();
                p.location.push(l);
            }),
        ),
        (
            "dangling function",
            Box::new(|p| p.location[0].line[0].function_id = 9),
        ),
        (
            "dangling mapping",
            Box::new(|p| p.location[0].mapping_id = 3),
        ),
    ];
    for (what, break_it) in cases {
        let mut p = valid();
        break_it(&mut p);
        match Profile::decode(&encode(&p)) {
            Err(DecodeError::Invalid(msg)) => assert!(!msg.is_empty(), "{what}"),
            other => panic!("{what}: {other:?}"),
        }
    }
}

#[test]
fn hostile_sizes_are_bounded() {
    // A gzip bomb: 300 MiB of zeros in a few hundred KiB.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &vec![0u8; 300 << 20]).unwrap();
    assert!(matches!(
        Profile::decode(&gz.finish().unwrap()),
        Err(DecodeError::TooLarge)
    ));
    // Few bytes that name one location millions of times: capped in frames, not in memory.
    let mut p = valid();
    p.sample = (0..64)
        .map(|_| proto::Sample {
            location_id: vec![1; 100_000],
            value: vec![1],
            label: Vec::new(),
        })
        .collect();
    match Profile::decode(&encode(&p)) {
        Err(DecodeError::Invalid(msg)) => assert!(msg.contains("frames"), "{msg}"),
        other => panic!("{other:?}"),
    }
    // Empty, and not a profile at all.
    assert!(matches!(Profile::decode(&[]), Err(DecodeError::Empty)));
    assert!(Profile::decode(b"\x1f\x8b\x08\x00garbage").is_err());
    assert!(Profile::decode(&[0xff; 64]).is_err());
}

#[test]
fn every_seed_decodes_and_round_trips() {
    for (name, bytes) in corpus() {
        exercise(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
