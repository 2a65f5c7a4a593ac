//! Where and how to push: the settings, their checks against Pyroscope's own limits, and
//! [`PyroscopeConfig::from_env`].

use crate::PushError;
use crate::sending::{Destination, Policy, header_ok, policy_setters, redact_url};
use std::fmt;
use std::time::Duration;

/// Server URL, e.g. `http://pyroscope:4040` (as Pyroscope's own clients name it). Unset: no push.
pub const ENV_SERVER_ADDRESS: &str = "PYROSCOPE_SERVER_ADDRESS";
/// Application name (`service_name`); default: the executable's name.
pub const ENV_APPLICATION_NAME: &str = "PYROSCOPE_APPLICATION_NAME";
/// Bearer token.
pub const ENV_AUTH_TOKEN: &str = "PYROSCOPE_AUTH_TOKEN";
/// Basic auth user (Grafana Cloud: the stack's user id).
pub const ENV_BASIC_AUTH_USER: &str = "PYROSCOPE_BASIC_AUTH_USER";
/// Basic auth password (Grafana Cloud: an access policy token).
pub const ENV_BASIC_AUTH_PASSWORD: &str = "PYROSCOPE_BASIC_AUTH_PASSWORD";
/// Tenant, sent as `X-Scope-OrgID`.
pub const ENV_TENANT_ID: &str = "PYROSCOPE_TENANT_ID";
/// Static tags, `key=value,key2=value2`.
pub const ENV_LABELS: &str = "PYROSCOPE_LABELS";
/// `push` (default) or `ingest`.
pub const ENV_API: &str = "TRACING_PROF_PYROSCOPE_API";
/// Request timeout, a duration like `10s`.
pub const ENV_TIMEOUT: &str = "TRACING_PROF_PYROSCOPE_TIMEOUT";

pub use crate::sending::{
    DEFAULT_BACKOFF, DEFAULT_FLUSH_TIMEOUT, DEFAULT_QUEUE_CAPACITY, DEFAULT_RETRIES,
};
/// Time one HTTP request may take: 10 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Which Pyroscope API to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PyroscopeApi {
    /// `POST /push.v1.PusherService/Push` (Connect, protobuf).
    #[default]
    Push,
    /// `POST /ingest` (multipart form).
    Ingest,
}

#[derive(Clone, PartialEq, Eq)]
pub(super) enum Auth {
    None,
    Basic { user: String, password: String },
    Bearer(String),
}

/// Where and how to push. Secrets are never shown by `Debug`.
#[derive(Clone)]
pub struct PyroscopeConfig {
    pub(super) url: String,
    pub(super) app: String,
    pub(super) api: PyroscopeApi,
    pub(super) auth: Auth,
    pub(super) tenant: Option<String>,
    pub(super) tags: Vec<(String, String)>,
    pub(super) policy: Policy,
}

impl fmt::Debug for PyroscopeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auth = match &self.auth {
            Auth::None => "none",
            Auth::Basic { .. } => "basic <redacted>",
            Auth::Bearer(_) => "bearer <redacted>",
        };
        f.debug_struct("PyroscopeConfig")
            .field("url", &redact_url(&self.url))
            .field("policy", &self.policy)
            .field("app", &self.app)
            .field("api", &self.api)
            .field("auth", &auth)
            .field("tenant", &self.tenant)
            .field("tags", &self.tags)
            .finish_non_exhaustive()
    }
}

impl PyroscopeConfig {
    /// Pushes to `url` (e.g. `http://localhost:4040`) as application `app`.
    pub fn new(url: impl Into<String>, app: impl Into<String>) -> Self {
        PyroscopeConfig {
            url: url.into().trim_end_matches('/').to_owned(),
            app: app.into(),
            api: PyroscopeApi::default(),
            auth: Auth::None,
            tenant: None,
            tags: Vec::new(),
            policy: Policy::with_timeout(DEFAULT_TIMEOUT),
        }
    }

    /// Which API (default [`PyroscopeApi::Push`]).
    pub fn api(mut self, api: PyroscopeApi) -> Self {
        self.api = api;
        self
    }
    /// `Authorization: Basic` (Grafana Cloud: user id and access policy token).
    pub fn basic_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.auth = Auth::Basic {
            user: user.into(),
            password: password.into(),
        };
        self
    }
    /// `Authorization: Bearer`.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.auth = Auth::Bearer(token.into());
        self
    }
    /// Tenant, sent as `X-Scope-OrgID` (multi-tenant Pyroscope).
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }
    /// A static tag on every profile (`env=prod`, `region=eu-west-1`...).
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.push((key.into(), value.into()));
        self
    }
    policy_setters!();

    pub(super) fn validate(&self) -> Result<(), PushError> {
        Destination {
            exporter: "Pyroscope",
            url: &self.url,
            url_setting: &format!("the server address ({ENV_SERVER_ADDRESS})"),
            credentials_go: "basic_auth / PYROSCOPE_BASIC_AUTH_*",
            policy: &self.policy,
            timeout_var: ENV_TIMEOUT,
        }
        .check()?;
        let invalid = |reason: String| {
            Err(PushError::Invalid {
                exporter: "Pyroscope",
                reason,
            })
        };
        // Header values: a CR or LF would split the request (ureq refuses it at every push),
        // non-ASCII is not sent as written.
        let secret = |what: &str, var: &str| {
            invalid(format!(
                "{what} ({var}) must be printable ASCII, without CR or LF, and not empty"
            ))
        };
        match &self.auth {
            Auth::None => {}
            Auth::Bearer(t) if !header_ok(t) => return secret("the bearer token", ENV_AUTH_TOKEN),
            Auth::Basic { user, password }
                if !header_ok(user) || !header_ok(password) || user.contains(':') =>
            {
                return secret(
                    "the basic-auth user (no ':') and password",
                    "PYROSCOPE_BASIC_AUTH_USER, PYROSCOPE_BASIC_AUTH_PASSWORD",
                );
            }
            _ => {}
        }
        if let Some(t) = &self.tenant
            && !header_ok(t)
        {
            return invalid(format!(
                "the tenant ({ENV_TENANT_ID}) {t:?} must be printable ASCII, without CR or LF"
            ));
        }
        // `service_name` is a label value (at most 2048 bytes, `pkg/validation/limits.go`);
        // `/ingest` also parses it from `name=APP{...}` and allows only letters, digits and
        // `_ . - /` (`api/model/labelset/validate.go`, `IsServiceNameRuneAllowed`).
        let ingest_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/');
        if self.app.is_empty()
            || self.app.len() > MAX_LABEL_VALUE
            || self.app.chars().any(char::is_control)
            || self.app.contains(['{', '}', ',', '=', '"'])
            || (self.api == PyroscopeApi::Ingest && !self.app.chars().all(ingest_ok))
        {
            return invalid(format!(
                "application name ({ENV_APPLICATION_NAME}) {:?}: {}",
                self.app,
                if self.api == PyroscopeApi::Ingest {
                    "the ingest API allows letters, digits and _ . - / only"
                } else {
                    "must be 1 to 2048 bytes without control characters or { } , = \""
                }
            ));
        }
        if self.tags.len() > MAX_SERIES_TAGS {
            return invalid(format!(
                "{} tags ({ENV_LABELS}); Pyroscope allows {MAX_SERIES_TAGS} beside the labels we set",
                self.tags.len()
            ));
        }
        for (i, (k, v)) in self.tags.iter().enumerate() {
            let key_ok = k
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
                && k.len() <= MAX_LABEL_NAME
                && !k.starts_with("__")
                && !RESERVED_TAGS.contains(&k.as_str());
            let value_ok = !v.is_empty()
                && v.len() <= MAX_LABEL_VALUE
                && v.trim() == v
                && !v.chars().any(char::is_control)
                && !v.contains(['{', '}', ',', '=', '"']);
            if !key_ok || !value_ok {
                return invalid(format!(
                    "tag {k}={v:?} ({ENV_LABELS}): keys are [A-Za-z_][A-Za-z0-9_.]* (not starting \
                     with __, not {}); values are not empty, have no space at either end and \
                     none of {{ }} , = \"",
                    RESERVED_TAGS.join(", ")
                ));
            }
            if self.tags[..i].iter().any(|(earlier, _)| earlier == k) {
                return invalid(format!(
                    "tag {k} ({ENV_LABELS}) is given twice; Pyroscope rejects duplicate label names"
                ));
            }
        }
        Ok(())
    }
}

/// Pyroscope's default `validation.max-length-label-name` and `-label-value`.
const MAX_LABEL_NAME: usize = 1024;
const MAX_LABEL_VALUE: usize = 2048;
/// Labels we set ourselves, or the server sets on `/ingest` (`pkg/og/convert/pprof/profile.go`,
/// `createLabels`): a tag of the same name would be a duplicate label.
const RESERVED_TAGS: [&str; 3] = ["service_name", "app_name", "pyroscope_spy"];

/// Pyroscope's default `validation.max-label-names-per-series` is 30; `__name__`,
/// `service_name`, `__delta__` and (on `/ingest`) `pyroscope_spy` leave 26 for tags.
pub const MAX_SERIES_TAGS: usize = 26;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_stay_out_of_debug_and_errors() {
        let c = PyroscopeConfig::new("https://user:pw@host:4040", "app").basic_auth("u", "hunter2");
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("pw@"),
            "{shown}"
        );
        let e = PyroscopeConfig::new("https://user:pw@host:4040", "app")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(!e.contains("pw"), "{e}");
    }

    #[test]
    fn bad_settings_are_refused_with_a_reason() {
        assert!(PyroscopeConfig::new("ftp://x", "a").validate().is_err());
        assert!(PyroscopeConfig::new("http://x", "a{b}").validate().is_err());
        assert!(
            PyroscopeConfig::new("http://x", "a")
                .tag("9x", "v")
                .validate()
                .is_err()
        );
        assert!(
            PyroscopeConfig::new("http://x", "a")
                .tag("env", "a,b")
                .validate()
                .is_err()
        );
        assert!(
            PyroscopeConfig::new("http://x", "a")
                .tag("env", "prod")
                .validate()
                .is_ok()
        );
        let refused = |c: PyroscopeConfig| c.validate().unwrap_err().to_string();
        let e = refused(PyroscopeConfig::new("http://127.0.0.1:notaport", "a"));
        assert!(
            e.contains("PYROSCOPE_SERVER_ADDRESS") && e.contains("notaport"),
            "{e}"
        );
        assert!(
            PyroscopeConfig::new("http://:4040", "a")
                .validate()
                .is_err()
        );
        assert!(PyroscopeConfig::new("http://h:0", "a").validate().is_err());
        assert!(
            PyroscopeConfig::new("http://h:65536", "a")
                .validate()
                .is_err()
        );
        assert!(
            PyroscopeConfig::new("http://[::1:4040", "a")
                .validate()
                .is_err()
        );
        assert!(
            PyroscopeConfig::new("http://h st:4040", "a")
                .validate()
                .is_err()
        );
        for ok in [
            "http://[::1]:4040",
            "http://h:4040/prefix",
            "http://h",
            "https://h/x?y=1",
        ] {
            if ok.starts_with("https") && !cfg!(feature = "tls") {
                continue;
            }
            assert!(PyroscopeConfig::new(ok, "a").validate().is_ok(), "{ok}");
        }
        let base = || PyroscopeConfig::new("http://h:4040", "a");
        let e = refused(base().tenant("t\r\nX-Evil: 1"));
        assert!(e.contains("PYROSCOPE_TENANT_ID"), "{e}");
        assert!(base().tenant("tenant-é").validate().is_err());
        let e = refused(base().bearer_token("s3cr3t\n"));
        assert!(
            e.contains("PYROSCOPE_AUTH_TOKEN") && !e.contains("s3cr3t"),
            "{e}"
        );
        assert!(base().basic_auth("u:x", "p").validate().is_err());
        let e = refused(base().timeout(Duration::from_micros(1)));
        assert!(e.contains("TRACING_PROF_PYROSCOPE_TIMEOUT"), "{e}");
        assert!(
            base()
                .retries(u32::MAX, Duration::from_secs(1))
                .validate()
                .is_err()
        );
        assert!(base().retries(3, Duration::MAX).validate().is_err());
        // What Pyroscope would reject, refused at start instead of at every push.
        let ingest =
            |app: &str| PyroscopeConfig::new("http://h:4040", app).api(PyroscopeApi::Ingest);
        assert!(ingest("shop-api/v2.eu_1").validate().is_ok());
        let e = refused(ingest("shop api"));
        assert!(
            e.contains("PYROSCOPE_APPLICATION_NAME") && e.contains("_ . - /"),
            "{e}"
        );
        assert!(ingest("café").validate().is_err());
        assert!(base().tag("env", "a").tag("env", "b").validate().is_err());
        for key in ["__delta__", "service_name", "pyroscope_spy", "app_name"] {
            assert!(base().tag(key, "x").validate().is_err(), "{key}");
        }
        for value in ["", " prod", "prod ", "a\nb"] {
            assert!(base().tag("env", value).validate().is_err(), "{value:?}");
        }
        let many = (0..=MAX_SERIES_TAGS).fold(base(), |c, i| c.tag(format!("t{i}"), "v"));
        assert!(refused(many).contains("26"));
        let enough = (0..MAX_SERIES_TAGS).fold(base(), |c, i| c.tag(format!("t{i}"), "v"));
        assert!(enough.validate().is_ok());
        assert!(base().tag("k".repeat(1025), "v").validate().is_err());
        assert!(base().tag("k", "v".repeat(2049)).validate().is_err());
    }
}
