//! The process's OpenTelemetry resource, read from the environment as the OpenTelemetry SDKs
//! read it: what the process context publishes and what OTLP exports are stamped with.

/// A resource attribute's value: a string, or an integer (`process.pid`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttributeValue {
    /// A string attribute.
    Str(String),
    /// An integer attribute.
    Int(i64),
}

/// The resource of this process from the OpenTelemetry environment variables:
/// `OTEL_RESOURCE_ATTRIBUTES` (`key=value` pairs separated by commas, values percent-encoded),
/// then `service.name` from `OTEL_SERVICE_NAME` if set, else from those pairs, else
/// `unknown_service:` and the executable's name (the SDK environment specification's rules);
/// then `process.pid` and the `telemetry.sdk.*` attributes. A malformed pair is left out and
/// said on stderr.
pub fn resource_from_env() -> Vec<(String, AttributeValue)> {
    let mut out: Vec<(String, AttributeValue)> = Vec::new();
    if let Ok(pairs) = std::env::var("OTEL_RESOURCE_ATTRIBUTES") {
        let (good, bad) = key_values(&pairs);
        for pair in bad {
            eprintln!(
                "tracing-prof: OTEL_RESOURCE_ATTRIBUTES: {pair:?} is not key=value \
                 (percent-encoded); left out"
            );
        }
        for (k, v) in good {
            out.retain(|(key, _)| *key != k);
            out.push((k, AttributeValue::Str(v)));
        }
    }
    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty());
    let has_service = out.iter().any(|(k, _)| k == "service.name");
    if let Some(name) = service {
        out.retain(|(k, _)| k != "service.name");
        out.insert(0, ("service.name".into(), AttributeValue::Str(name)));
    } else if !has_service {
        let exe = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default();
        out.insert(
            0,
            (
                "service.name".into(),
                AttributeValue::Str(format!("unknown_service:{exe}")),
            ),
        );
    }
    for (k, v) in [
        (
            "process.pid",
            AttributeValue::Int(i64::from(std::process::id())),
        ),
        (
            "telemetry.sdk.name",
            AttributeValue::Str("tracing-prof".into()),
        ),
        ("telemetry.sdk.language", AttributeValue::Str("rust".into())),
        (
            "telemetry.sdk.version",
            AttributeValue::Str(env!("CARGO_PKG_VERSION").into()),
        ),
    ] {
        if !out.iter().any(|(key, _)| key == k) {
            out.push((k.into(), v));
        }
    }
    out
}

/// `attributes` as OpenTelemetry's generated `Resource` message.
#[cfg(feature = "otel-proto")]
pub fn resource_message(
    attributes: &[(String, AttributeValue)],
) -> opentelemetry_proto::tonic::resource::v1::Resource {
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    opentelemetry_proto::tonic::resource::v1::Resource {
        attributes: attributes
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.clone(),
                value: Some(AnyValue {
                    value: Some(match v {
                        AttributeValue::Str(s) => any_value::Value::StringValue(s.clone()),
                        AttributeValue::Int(i) => any_value::Value::IntValue(*i),
                    }),
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// `key=value` pairs separated by commas, keys and values trimmed, values percent-decoded:
/// the format of `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_EXPORTER_OTLP_HEADERS` (the W3C
/// Baggage's, without its properties). Returns the good pairs in order, and the pairs that are
/// not `key=value` with a valid escape (to say so, never to use).
pub fn key_values(s: &str) -> (Vec<(String, String)>, Vec<&str>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match pair
            .split_once('=')
            .map(|(k, v)| (k.trim(), percent_decode(v.trim())))
        {
            Some((k, Some(v))) if !k.is_empty() => good.push((k.to_owned(), v)),
            _ => bad.push(pair),
        }
    }
    (good, bad)
}

/// `%XX` escapes decoded; `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hi = (bytes.next()? as char).to_digit(16)?;
            let lo = (bytes.next()? as char).to_digit(16)?;
            out.push((hi * 16 + lo) as u8);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_escapes_are_decoded_and_bad_ones_refused() {
        assert_eq!(percent_decode("a%20b%2Cc").as_deref(), Some("a b,c"));
        assert_eq!(percent_decode("plain"), Some("plain".into()));
        assert_eq!(percent_decode("bad%2"), None);
        assert_eq!(percent_decode("bad%zz"), None);
        assert_eq!(percent_decode("%ff"), None, "not UTF-8");
    }

    #[test]
    fn key_values_keeps_good_pairs_in_order_and_names_bad_ones() {
        let (good, bad) = key_values(" a = 1 ,b=x%2Cy,,nokey,=v,c=%zz, d=");
        assert_eq!(
            good,
            [
                ("a".to_owned(), "1".to_owned()),
                ("b".to_owned(), "x,y".to_owned()),
                ("d".to_owned(), String::new()),
            ]
        );
        assert_eq!(bad, ["nokey", "=v", "c=%zz"]);
    }
}
