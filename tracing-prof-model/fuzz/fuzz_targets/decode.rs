//! Any bytes: a profile or a `DecodeError`, never a panic; what decodes re-encodes to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracing_prof_model::{Grouping, Profile};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Profile::decode(data) {
        let _ = p.top(None, Grouping::Function, false, 10);
        let _ = p.top(None, Grouping::SpanPath, false, 10);
        let _ = p.folded(None);
        let again = Profile::decode(&p.encode()).expect("what we encode decodes");
        assert_eq!(again, p);
    }
});
