//! Where and how to send: the settings, their checks, and [`OtlpConfig::from_env`].

use crate::PushError;
use crate::sending::{Destination, Policy, header_ok, policy_setters, redact_url};
use std::fmt;
use std::time::Duration;
use tracing_prof_core::AttributeValue;

// Named as OpenTelemetry's exporters name them (opentelemetry-specification,
// `specification/protocol/exporter.md`); the profiles variables come first, the general ones
// stand in for them.
/// The whole URL profiles are sent to, used as is.
pub const ENV_OTLP_PROFILES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT";
/// The receiver's base URL; profiles go to its `v1development/profiles`.
pub const ENV_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// Headers on every request, `key=value` pairs separated by commas, values percent-encoded.
pub const ENV_OTLP_PROFILES_HEADERS: &str = "OTEL_EXPORTER_OTLP_PROFILES_HEADERS";
/// As [`ENV_OTLP_PROFILES_HEADERS`], for every signal.
pub const ENV_OTLP_HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
/// Time one request may take, in milliseconds; `0`: the longest allowed, 10 minutes.
pub const ENV_OTLP_PROFILES_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT";
/// As [`ENV_OTLP_PROFILES_TIMEOUT`], for every signal.
pub const ENV_OTLP_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";
/// `gzip` (our default) or `none`.
pub const ENV_OTLP_PROFILES_COMPRESSION: &str = "OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION";
/// As [`ENV_OTLP_PROFILES_COMPRESSION`], for every signal.
pub const ENV_OTLP_COMPRESSION: &str = "OTEL_EXPORTER_OTLP_COMPRESSION";
/// `http/protobuf`, the only protocol sent (and the default); set to another, an error.
pub const ENV_OTLP_PROFILES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL";
/// As [`ENV_OTLP_PROFILES_PROTOCOL`], for every signal; set to another (`grpc` for traces),
/// no OTLP profiles unless [`ENV_OTLP_PROFILES_ENDPOINT`] is set.
pub const ENV_OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";

/// The path of profiles under an OTLP/HTTP base URL (opentelemetry-proto's
/// `docs/specification.md`; the Collector's `defaultProfilesURLPath`).
pub const PROFILES_PATH: &str = "v1development/profiles";
/// Time one request may take: 10 s (the OTLP exporter specification's default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request sent, uncompressed: the Collector's default `max_request_body_size`
/// (20 MiB) less room to spare. A window that would make more goes as one request per
/// profile (each within Pyroscope's 4 MiB and 16 000 samples already).
pub const MAX_REQUEST_BYTES: usize = 16 << 20;

/// Where and how to send. Header values are never shown by `Debug`.
#[derive(Clone)]
pub struct OtlpConfig {
    pub(super) endpoint: String,
    pub(super) headers: Vec<(String, String)>,
    pub(super) gzip: bool,
    pub(super) resource: Vec<(String, AttributeValue)>,
    pub(super) policy: Policy,
}

impl fmt::Debug for OtlpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<String> = self
            .headers
            .iter()
            .map(|(k, _)| format!("{k}: <redacted>"))
            .collect();
        f.debug_struct("OtlpConfig")
            .field("endpoint", &redact_url(&self.endpoint))
            .field("headers", &headers)
            .field("gzip", &self.gzip)
            .field("resource", &self.resource)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl OtlpConfig {
    /// Sends to `endpoint`, the whole URL of the profiles path (as
    /// `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT` gives it: `http://collector:4318/v1development/profiles`),
    /// gzip'd, with the resource of [`resource_from_env`](tracing_prof_core::resource_from_env)
    /// less `process.pid`.
    pub fn new(endpoint: impl Into<String>) -> Self {
        OtlpConfig {
            endpoint: endpoint.into(),
            headers: Vec::new(),
            gzip: true,
            // Without `process.pid`: Pyroscope makes every resource attribute a label, and a
            // pid would make new series at every restart and on every replica.
            resource: tracing_prof_core::resource_from_env()
                .into_iter()
                .filter(|(k, _)| k != "process.pid")
                .collect(),
            policy: Policy::with_timeout(DEFAULT_TIMEOUT),
        }
    }

    /// Sends to `base` (as `OTEL_EXPORTER_OTLP_ENDPOINT` gives it: `http://collector:4318`)
    /// followed by [`PROFILES_PATH`].
    pub fn with_base_url(base: &str) -> Self {
        OtlpConfig::new(format!("{}/{PROFILES_PATH}", base.trim_end_matches('/')))
    }

    /// A header on every request (`Authorization`, `X-Scope-OrgID`...).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
    /// Whether to gzip requests (default: yes).
    pub fn gzip(mut self, on: bool) -> Self {
        self.gzip = on;
        self
    }
    /// The resource every profile is sent with, replacing the one from the environment.
    pub fn resource(mut self, attributes: Vec<(String, AttributeValue)>) -> Self {
        self.resource = attributes;
        self
    }
    policy_setters!();

    pub(crate) fn validate(&self) -> Result<(), PushError> {
        Destination {
            exporter: "OTLP",
            url: &self.endpoint,
            url_setting: &format!(
                "the endpoint ({ENV_OTLP_PROFILES_ENDPOINT} or {ENV_OTLP_ENDPOINT})"
            ),
            credentials_go: &format!("a header ({ENV_OTLP_HEADERS})"),
            policy: &self.policy,
            timeout_var: ENV_OTLP_TIMEOUT,
        }
        .check()?;
        let invalid = |reason: String| {
            Err(PushError::Invalid {
                exporter: "OTLP",
                reason,
            })
        };
        for (name, value) in &self.headers {
            let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            if name.is_empty() || !name.bytes().all(token) {
                return invalid(format!(
                    "the header name {name:?} ({ENV_OTLP_HEADERS}) is not an HTTP header name"
                ));
            }
            if !header_ok(value) {
                return invalid(format!(
                    "the value of header {name} ({ENV_OTLP_HEADERS}) must be printable ASCII, \
                     without CR or LF, and not empty"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_stay_out_of_debug_and_errors() {
        let c = OtlpConfig::new("http://host:4318/v1development/profiles")
            .header("Authorization", "Bearer hunter2");
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("Authorization"), "{shown}");
        let e = OtlpConfig::new("http://u:pw@host:4318/v1development/profiles")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(!e.contains("pw"), "{e}");
    }

    #[test]
    fn bad_settings_are_refused_with_a_reason() {
        let refused = |c: OtlpConfig| c.validate().unwrap_err().to_string();
        assert!(refused(OtlpConfig::new("grpc://h:4317")).contains("http://"));
        assert!(refused(OtlpConfig::new("http://h:notaport/x")).contains("notaport"));
        let e = refused(OtlpConfig::with_base_url("http://h").header("a b", "v"));
        assert!(e.contains("\"a b\""), "{e}");
        let e = refused(OtlpConfig::with_base_url("http://h").header("X-Token", "a\r\nb"));
        assert!(e.contains("X-Token"), "{e}");
        let e = refused(OtlpConfig::with_base_url("http://h").timeout(Duration::from_secs(3600)));
        assert!(e.contains("10m"), "{e}");
        assert!(
            OtlpConfig::with_base_url("http://h:4318/")
                .validate()
                .is_ok()
        );
        assert_eq!(
            OtlpConfig::with_base_url("http://h:4318/").endpoint,
            "http://h:4318/v1development/profiles"
        );
    }
}
