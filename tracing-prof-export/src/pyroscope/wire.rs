//! What goes on the wire: the `/ingest` multipart form and the push API's protobuf messages.

use tracing_prof_model::SampleType;

/// The `/ingest` form: the pprof in `profile`, units and aggregation in `sample_type_config`.
pub(super) fn multipart(boundary: &str, pprof: &[u8], types: &[SampleType]) -> Vec<u8> {
    let config: Vec<String> = types
        .iter()
        .map(|st| {
            let (t, unit) = (&st.name, st.unit.as_str());
            let (units, aggregation) = match unit {
                "bytes" => ("bytes", if t.starts_with("inuse") { "average" } else { "sum" }),
                "count" if t.ends_with("objects") => ("objects", if t.starts_with("inuse") { "average" } else { "sum" }),
                _ => ("samples", "sum"),
            };
            format!("\"{t}\":{{\"units\":\"{units}\",\"aggregation\":\"{aggregation}\",\"display-name\":\"{t}\"}}")
        })
        .collect();
    let json = format!("{{{}}}", config.join(","));
    let mut body = Vec::with_capacity(pprof.len() + json.len() + 512);
    for (name, file, bytes) in [
        ("profile", "profile.pprof", pprof),
        (
            "sample_type_config",
            "sample_type_config.json",
            json.as_bytes(),
        ),
    ] {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{file}\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    body
}

/// Pyroscope's `push.v1` messages (`api/push/v1/push.proto`, `types/v1` `LabelPair`), as prost
/// types, for the push API and for tests that play the server.
pub mod push {
    #![allow(missing_docs, reason = "mirrors push.proto field for field")]

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PushRequest {
        #[prost(message, repeated, tag = "1")]
        pub series: Vec<RawProfileSeries>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RawProfileSeries {
        #[prost(message, repeated, tag = "1")]
        pub labels: Vec<LabelPair>,
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<RawSample>,
    }

    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct LabelPair {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }

    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct RawSample {
        #[prost(bytes = "vec", tag = "1")]
        pub raw_profile: Vec<u8>,
        #[prost(string, tag = "2")]
        pub id: String,
    }
}
