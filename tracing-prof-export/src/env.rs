//! Every environment variable the exporters read, in one place: what a deployment can set, and
//! how each value is checked. A bad value is an error naming the variable
//! ([`ConfigError::Env`]); the exporters' `from_env` functions call in here.

use crate::files::{DEFAULT_DIR, FileExporter};
use crate::http::DEFAULT_HTTP_ADDR;
use crate::pyroscope::{PyroscopeApi, PyroscopeConfig, PyroscopeError};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use tracing_prof_core::__private::{env_var, parse_bool, parse_duration};
use tracing_prof_core::config::ConfigError;

// Files.
/// Output directory.
pub const ENV_DIR: &str = "TRACING_PROF_DIR";
/// Files kept per kind and process, `0` for all.
pub const ENV_KEEP_FILES: &str = "TRACING_PROF_KEEP_FILES";
/// Also write each interval's own numbers (`{kind}-delta.*` files): `1`/`0`, `true`/`false`, ...
pub const ENV_DELTAS: &str = "TRACING_PROF_DELTAS";
/// Also write flame graph SVGs beside the pprof files: `1`/`0`, `true`/`false`, ...
pub const ENV_FLAMEGRAPHS: &str = "TRACING_PROF_FLAMEGRAPHS";

// `/debug/pprof`.
/// Address to serve on (`host:port`, or `default` for [`DEFAULT_HTTP_ADDR`]); unset: no server.
pub const ENV_HTTP_ADDR: &str = "TRACING_PROF_HTTP_ADDR";
/// Bearer token the endpoint requires, if set.
pub const ENV_HTTP_TOKEN: &str = "TRACING_PROF_HTTP_TOKEN";
/// `1` to serve on a non-loopback address without a token (refused otherwise).
pub const ENV_HTTP_ALLOW_PUBLIC: &str = "TRACING_PROF_HTTP_ALLOW_PUBLIC";
/// `1` makes a `/debug/pprof` server that cannot listen an error at start; by default the
/// service runs without it and the server tries again every
/// [`BIND_RETRY`](crate::http::BIND_RETRY).
pub const ENV_HTTP_REQUIRED: &str = "TRACING_PROF_HTTP_REQUIRED";

// Pyroscope.
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

// OTLP (`otlp` feature). Named as OpenTelemetry's exporters name them
// (opentelemetry-specification, `specification/protocol/exporter.md`); the profiles variables
// come first, the general ones stand in for them.
/// The whole URL profiles are sent to, used as is.
#[cfg(feature = "otlp")]
pub const ENV_OTLP_PROFILES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT";
/// The receiver's base URL; profiles go to its `v1development/profiles`.
#[cfg(feature = "otlp")]
pub const ENV_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// Headers on every request, `key=value` pairs separated by commas, values percent-encoded.
#[cfg(feature = "otlp")]
pub const ENV_OTLP_PROFILES_HEADERS: &str = "OTEL_EXPORTER_OTLP_PROFILES_HEADERS";
/// As [`ENV_OTLP_PROFILES_HEADERS`], for every signal.
#[cfg(feature = "otlp")]
pub const ENV_OTLP_HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
/// Time one request may take, in milliseconds; `0`: the longest allowed, 10 minutes.
#[cfg(feature = "otlp")]
pub const ENV_OTLP_PROFILES_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT";
/// As [`ENV_OTLP_PROFILES_TIMEOUT`], for every signal.
#[cfg(feature = "otlp")]
pub const ENV_OTLP_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";
/// `gzip` (our default) or `none`.
#[cfg(feature = "otlp")]
pub const ENV_OTLP_PROFILES_COMPRESSION: &str = "OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION";
/// As [`ENV_OTLP_PROFILES_COMPRESSION`], for every signal.
#[cfg(feature = "otlp")]
pub const ENV_OTLP_COMPRESSION: &str = "OTEL_EXPORTER_OTLP_COMPRESSION";
/// `http/protobuf`, the only protocol sent (and the default); set to another, an error.
#[cfg(feature = "otlp")]
pub const ENV_OTLP_PROFILES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL";
/// As [`ENV_OTLP_PROFILES_PROTOCOL`], for every signal; set to another (`grpc` for traces),
/// no OTLP profiles unless [`ENV_OTLP_PROFILES_ENDPOINT`] is set.
#[cfg(feature = "otlp")]
pub const ENV_OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";

pub(crate) fn file_exporter() -> Result<FileExporter, ConfigError> {
    let set = env_var(ENV_DIR, |s| Ok(PathBuf::from(s)))?;
    let mut exporter = FileExporter::new(set.clone().unwrap_or_else(|| DEFAULT_DIR.into()));
    match exporter.check() {
        Ok(()) => {}
        // A full disk is a condition of the moment, not a setting: the service starts, and
        // each export tries again (and reports its failures once).
        Err(e) if e.is_out_of_space() => {
            eprintln!("tracing-prof: {e}; exports will try again every interval");
        }
        Err(e) => {
            return Err(ConfigError::Env {
                name: ENV_DIR,
                value: exporter.dir().display().to_string(),
                reason: match set {
                    Some(_) => e.to_string(),
                    None => format!("{e} (the default: {ENV_DIR} is unset)"),
                },
            });
        }
    }
    if let Some(keep) = env_var(ENV_KEEP_FILES, |s| {
        s.parse::<usize>()
            .map_err(|_| format!("expected a whole number (0 keeps all), got {s:?}"))
    })? {
        exporter = exporter.keep(keep);
    }
    if let Some(on) = env_var(ENV_DELTAS, parse_bool)? {
        exporter = exporter.deltas(on);
    }
    if let Some(on) = env_var(ENV_FLAMEGRAPHS, parse_bool)? {
        exporter = exporter.flamegraphs(on);
    }
    Ok(exporter)
}

pub(crate) fn pyroscope_config() -> Result<Option<PyroscopeConfig>, PyroscopeError> {
    let Some(url) = env_var(ENV_SERVER_ADDRESS, |s| Ok(s.to_owned()))? else {
        return Ok(None);
    };
    let app = env_var(ENV_APPLICATION_NAME, |s| Ok(s.to_owned()))?.unwrap_or_else(default_app_name);
    let mut c = PyroscopeConfig::new(url, app);
    if let Some(token) = env_var(ENV_AUTH_TOKEN, |s| Ok(s.to_owned()))? {
        c = c.bearer_token(token);
    }
    let user = env_var(ENV_BASIC_AUTH_USER, |s| Ok(s.to_owned()))?;
    let password = env_var(ENV_BASIC_AUTH_PASSWORD, |s| Ok(s.to_owned()))?;
    match (user, password) {
        (Some(u), Some(p)) => c = c.basic_auth(u, p),
        (None, None) => {}
        _ => {
            return Err(PyroscopeError::Invalid(format!(
                "set both {ENV_BASIC_AUTH_USER} and {ENV_BASIC_AUTH_PASSWORD}, or neither"
            )));
        }
    }
    if let Some(t) = env_var(ENV_TENANT_ID, |s| Ok(s.to_owned()))? {
        c = c.tenant(t);
    }
    if let Some(tags) = env_var(ENV_LABELS, parse_tags)? {
        for (k, v) in tags {
            c = c.tag(k, v);
        }
    }
    if let Some(api) = env_var(ENV_API, |s| match s {
        "push" => Ok(PyroscopeApi::Push),
        "ingest" => Ok(PyroscopeApi::Ingest),
        _ => Err(format!("expected push or ingest, got {s:?}")),
    })? {
        c = c.api(api);
    }
    if let Some(t) = env_var(ENV_TIMEOUT, parse_duration)? {
        c = c.timeout(t);
    }
    Ok(Some(c))
}

fn default_app_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "rust-app".into())
}

fn parse_tags(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .ok_or_else(|| {
                    format!("expected key=value pairs separated by commas, got {pair:?}")
                })
        })
        .collect()
}

/// What `/debug/pprof`'s server is told by the environment.
pub(crate) struct HttpSettings {
    /// `host:port` as given (`default` replaced).
    pub(crate) addr: String,
    pub(crate) token: Option<String>,
    /// A failed bind is an error at start.
    pub(crate) required: bool,
}

/// `TRACING_PROF_HTTP_*`, checked; `Ok(None)` when `TRACING_PROF_HTTP_ADDR` is unset. An
/// address that is not loopback needs a token, or `TRACING_PROF_HTTP_ALLOW_PUBLIC=1`.
pub(crate) fn http_settings() -> Result<Option<HttpSettings>, ConfigError> {
    let Some(addr) = env_var(ENV_HTTP_ADDR, |s| Ok(s.to_owned()))? else {
        return Ok(None);
    };
    let addr = if addr == "default" {
        DEFAULT_HTTP_ADDR.to_owned()
    } else {
        addr
    };
    let token = env_var(ENV_HTTP_TOKEN, |s| Ok(s.to_owned()))?;
    let public = env_var(ENV_HTTP_ALLOW_PUBLIC, parse_bool)?.unwrap_or(false);
    let required = env_var(ENV_HTTP_REQUIRED, parse_bool)?.unwrap_or(false);
    let resolved: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| ConfigError::Env {
            name: ENV_HTTP_ADDR,
            value: addr.clone(),
            reason: format!("not an address to listen on: {e}"),
        })?
        .collect();
    if token.is_none() && !public && resolved.iter().any(|a| !a.ip().is_loopback()) {
        return Err(ConfigError::Env {
            name: ENV_HTTP_ADDR,
            value: addr,
            reason: format!(
                "not a loopback address, and no {ENV_HTTP_TOKEN}: anyone who can reach it \
                 could read the profiles; set a token, or {ENV_HTTP_ALLOW_PUBLIC}=1 to serve \
                 without one"
            ),
        });
    }
    Ok(Some(HttpSettings {
        addr,
        token,
        required,
    }))
}

/// An OpenTelemetry variable: the profiles one when set, else the general one, with the name
/// of the one read. Empty counts as unset, as OpenTelemetry's SDKs read them
/// (`sdk-environment-variables.md`, "Parsing empty value").
#[cfg(feature = "otlp")]
fn otel_var(
    profiles: &'static str,
    general: &'static str,
) -> Result<Option<(&'static str, String)>, ConfigError> {
    for name in [profiles, general] {
        match std::env::var(name) {
            Ok(v) if v.trim().is_empty() => {}
            Ok(v) => return Ok(Some((name, v.trim().to_owned()))),
            Err(std::env::VarError::NotPresent) => {}
            Err(std::env::VarError::NotUnicode(v)) => {
                // Headers may hold a token: their value is never shown.
                let headers = [ENV_OTLP_PROFILES_HEADERS, ENV_OTLP_HEADERS].contains(&name);
                return Err(ConfigError::Env {
                    name,
                    value: if headers {
                        "<not shown>".into()
                    } else {
                        v.to_string_lossy().into_owned()
                    },
                    reason: "not valid UTF-8".into(),
                });
            }
        }
    }
    Ok(None)
}

#[cfg(feature = "otlp")]
pub(crate) fn otlp_config() -> Result<Option<crate::otlp::OtlpConfig>, crate::otlp::OtlpError> {
    use crate::otlp::OtlpConfig;
    let bad = |name: &'static str, value: &str, reason: String| ConfigError::Env {
        name,
        value: value.to_owned(),
        reason,
    };
    // The endpoint: the profiles one as is; the general one as a base.
    let (mut c, profiles_endpoint) = match otel_var(ENV_OTLP_PROFILES_ENDPOINT, ENV_OTLP_ENDPOINT)?
    {
        None => return Ok(None),
        Some((ENV_OTLP_PROFILES_ENDPOINT, url)) => (OtlpConfig::new(url), true),
        Some((_, base)) => (OtlpConfig::with_base_url(&base), false),
    };
    match otel_var(ENV_OTLP_PROFILES_PROTOCOL, ENV_OTLP_PROTOCOL)? {
        Some((_, protocol)) if protocol.eq_ignore_ascii_case("http/protobuf") => {}
        None => {}
        // The general protocol is for the other signals; the profiles endpoint is HTTP.
        Some((ENV_OTLP_PROTOCOL, _)) if profiles_endpoint => {}
        Some((ENV_OTLP_PROTOCOL, protocol)) => {
            // The general settings point at a receiver of another protocol (gRPC for the
            // traces, say): profiles are not for it. Said, and no OTLP export.
            eprintln!(
                "tracing-prof: {ENV_OTLP_PROTOCOL}={protocol}: tracing-prof sends profiles over \
                 OTLP/HTTP with protobuf only, so it sends none to {ENV_OTLP_ENDPOINT}; set \
                 {ENV_OTLP_PROFILES_ENDPOINT} to the receiver's HTTP endpoint \
                 (http://HOST:4318/v1development/profiles) to send them"
            );
            return Ok(None);
        }
        Some((name, protocol)) => {
            return Err(bad(
                name,
                &protocol,
                format!(
                    "tracing-prof sends profiles over OTLP/HTTP with protobuf only; set \
                     {ENV_OTLP_PROFILES_PROTOCOL}=http/protobuf and \
                     {ENV_OTLP_PROFILES_ENDPOINT} to the receiver's HTTP endpoint \
                     (http://HOST:4318/v1development/profiles)"
                ),
            )
            .into());
        }
    }
    if let Some((name, headers)) = otel_var(ENV_OTLP_PROFILES_HEADERS, ENV_OTLP_HEADERS)? {
        let (good, wrong) = tracing_prof_core::__private::key_values(&headers);
        if let Some(pair) = wrong.first() {
            // Named by its place, and by its key only when it has one that is a header
            // name: a pair without `=` may be a whole `Authorization: Bearer ...`.
            let place = headers
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .position(|p| p == *pair)
                .map_or(0, |i| i + 1);
            let key = pair.split_once('=').map(|(k, _)| k.trim()).filter(|k| {
                !k.is_empty()
                    && k.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
            return Err(bad(
                name,
                "<not shown>",
                format!(
                    "expected key=value pairs separated by commas, values percent-encoded; \
                     pair {place}{} is not",
                    key.map(|k| format!(" (key {k:?})")).unwrap_or_default()
                ),
            )
            .into());
        }
        for (k, v) in good {
            c = c.header(k, v);
        }
    }
    if let Some((name, ms)) = otel_var(ENV_OTLP_PROFILES_TIMEOUT, ENV_OTLP_TIMEOUT)? {
        let ms = ms.parse::<u64>().map_err(|_| {
            bad(
                name,
                &ms,
                "expected a whole number of milliseconds (0: the longest, 10 minutes)".into(),
            )
        })?;
        // 0 is "no limit" to OpenTelemetry; a server that never answers would then hold the
        // queue for good, so it is the longest we allow, 10 minutes.
        c = c.timeout(match ms {
            0 => crate::sending::MAX_TIMEOUT,
            ms => std::time::Duration::from_millis(ms),
        });
    }
    if let Some((name, compression)) =
        otel_var(ENV_OTLP_PROFILES_COMPRESSION, ENV_OTLP_COMPRESSION)?
    {
        c = c.gzip(match compression.to_ascii_lowercase().as_str() {
            "gzip" => true,
            "none" => false,
            _ => {
                return Err(bad(name, &compression, "expected gzip or none".into()).into());
            }
        });
    }
    c.validate()?;
    Ok(Some(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_key_value_pairs_separated_by_commas() {
        assert_eq!(
            parse_tags("env=prod, region=eu ,").unwrap(),
            [
                ("env".into(), "prod".into()),
                ("region".into(), "eu".into())
            ]
        );
        assert!(parse_tags("env").is_err());
    }
}
