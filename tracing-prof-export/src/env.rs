//! Every environment variable the exporters read, in one place: what a deployment can set, and
//! how each value is checked. A bad value is an error naming the variable
//! ([`ConfigError::Env`]). The exporters' `from_env` functions are here; each exporter's
//! module names its variables (`ENV_*`), and this module depends on the exporters, never the
//! reverse.

use crate::PushError;
use crate::files::{
    DEFAULT_DIR, ENV_DELTAS, ENV_DIR, ENV_FLAMEGRAPHS, ENV_KEEP_FILES, FileExporter,
};
use crate::http::{
    DEFAULT_HTTP_ADDR, ENV_HTTP_ADDR, ENV_HTTP_ALLOW_PUBLIC, ENV_HTTP_REQUIRED, ENV_HTTP_TOKEN,
    ENV_METRICS_ADDR, HttpError, HttpServer, HttpSettings, MetricsServer,
};
use crate::metrics::{ENV_METRICS_BUCKETS, ENV_METRICS_HISTOGRAMS, SpanMetrics};
#[cfg(feature = "otlp")]
use crate::otlp::{
    ENV_OTLP_COMPRESSION, ENV_OTLP_ENDPOINT, ENV_OTLP_HEADERS, ENV_OTLP_PROFILES_COMPRESSION,
    ENV_OTLP_PROFILES_ENDPOINT, ENV_OTLP_PROFILES_HEADERS, ENV_OTLP_PROFILES_PROTOCOL,
    ENV_OTLP_PROFILES_TIMEOUT, ENV_OTLP_PROTOCOL, ENV_OTLP_TIMEOUT,
};
use crate::pyroscope::{
    ENV_API, ENV_APPLICATION_NAME, ENV_AUTH_TOKEN, ENV_BASIC_AUTH_PASSWORD, ENV_BASIC_AUTH_USER,
    ENV_LABELS, ENV_SERVER_ADDRESS, ENV_TENANT_ID, ENV_TIMEOUT, PyroscopeApi, PyroscopeConfig,
};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use tracing_prof_core::__private::{env_var, parse_bool, parse_duration};
use tracing_prof_core::Profiler;
use tracing_prof_core::config::ConfigError;

impl FileExporter {
    /// [`DEFAULT_DIR`] and [`DEFAULT_KEEP_FILES`](crate::files::DEFAULT_KEEP_FILES), overridden by `TRACING_PROF_DIR` and
    /// `TRACING_PROF_KEEP_FILES` when set. The directory is [checked](Self::check): one that
    /// cannot be created or written to is an error naming the variable, unless the disk is
    /// full (said on stderr; the exports try again every interval).
    pub fn from_env() -> Result<Self, ConfigError> {
        file_exporter()
    }
}

impl PyroscopeConfig {
    /// From `PYROSCOPE_SERVER_ADDRESS` and friends (see the `ENV_*` constants); `Ok(None)` when
    /// `PYROSCOPE_SERVER_ADDRESS` is unset.
    pub fn from_env() -> Result<Option<Self>, PushError> {
        pyroscope_config()
    }
}

#[cfg(feature = "otlp")]
impl crate::otlp::OtlpConfig {
    /// From the OTLP exporter variables (the `ENV_*` constants), as OpenTelemetry's SDKs read
    /// them; `Ok(None)` when neither `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT` nor
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
    pub fn from_env() -> Result<Option<Self>, PushError> {
        otlp_config()
    }
}

impl HttpServer {
    /// Starts a server if `TRACING_PROF_HTTP_ADDR` is set (`default` means
    /// [`DEFAULT_HTTP_ADDR`](crate::http::DEFAULT_HTTP_ADDR)), requiring `TRACING_PROF_HTTP_TOKEN` as a bearer token if that is
    /// set. A bad setting is an error. An address that cannot be listened on now (a port
    /// another process holds) is not: it is said once on stderr, the server tries again every
    /// [`BIND_RETRY`](crate::http::BIND_RETRY) in the background, and its state is in
    /// [`Profiler::services`](tracing_prof_core::Profiler::services) and on the index page of
    /// any other `/debug/pprof` mount; `TRACING_PROF_HTTP_REQUIRED=1` makes it an error.
    pub fn from_env(profiler: &Profiler) -> Result<Option<HttpServer>, HttpError> {
        match http_settings()? {
            Some(settings) => HttpServer::from_settings(profiler, settings).map(Some),
            None => Ok(None),
        }
    }
}

impl MetricsServer {
    /// Starts a listener that serves `/metrics` only if `TRACING_PROF_METRICS_ADDR` is set
    /// (`:9464` for loopback, `0.0.0.0:9464` for every interface): what Prometheus scrapes on a
    /// pod's address while the profiles stay on loopback. A port taken is said and tried
    /// again, as for [`HttpServer::from_env`]; `TRACING_PROF_HTTP_TOKEN`, when set, is asked
    /// for here too.
    pub fn from_env(profiler: &Profiler) -> Result<Option<MetricsServer>, HttpError> {
        match metrics_settings()? {
            Some(settings) => HttpServer::from_settings(profiler, settings)
                .map(|server| Some(MetricsServer(server))),
            None => Ok(None),
        }
    }
}

fn file_exporter() -> Result<FileExporter, ConfigError> {
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

fn pyroscope_config() -> Result<Option<PyroscopeConfig>, PushError> {
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
            return Err(PushError::Invalid {
                exporter: "Pyroscope",
                reason: format!(
                    "set both {ENV_BASIC_AUTH_USER} and {ENV_BASIC_AUTH_PASSWORD}, or neither"
                ),
            });
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

/// `TRACING_PROF_HTTP_*`, checked; `Ok(None)` when `TRACING_PROF_HTTP_ADDR` is unset. An
/// address that is not loopback needs a token, or `TRACING_PROF_HTTP_ALLOW_PUBLIC=1`.
fn http_settings() -> Result<Option<HttpSettings>, ConfigError> {
    let Some(addr) = env_var(ENV_HTTP_ADDR, |s| Ok(s.to_owned()))? else {
        return Ok(None);
    };
    let addr = match addr.as_str() {
        "default" => DEFAULT_HTTP_ADDR.to_owned(),
        // `:6060`, as Go users type it: Go listens on every interface for it, we on loopback
        // (the profiles show code, paths and arguments; a public address is a choice to make
        // explicitly, with a token).
        port if port.starts_with(':') => format!("127.0.0.1{port}"),
        _ => addr,
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
        var: ENV_HTTP_ADDR,
        metrics_only: false,
        metrics: span_metrics()?,
        addr,
        token,
        required,
    }))
}

/// `/metrics` as `TRACING_PROF_METRICS_HISTOGRAMS` and `TRACING_PROF_METRICS_BUCKETS` say.
fn span_metrics() -> Result<SpanMetrics, ConfigError> {
    let mut m = SpanMetrics::new();
    if let Some(n) = env_var(ENV_METRICS_HISTOGRAMS, |s| {
        s.parse::<usize>()
            .map_err(|_| format!("expected a number of span paths (0: none), got {s:?}"))
    })? {
        m = m.histogram_paths(n);
    }
    if let Some((min, max)) = env_var(ENV_METRICS_BUCKETS, |s| {
        let (a, b) = s
            .split_once("..")
            .ok_or_else(|| format!("expected MIN..MAX, two durations (10us..100s), got {s:?}"))?;
        let (a, b) = (parse_duration(a.trim())?, parse_duration(b.trim())?);
        if a >= b {
            return Err(format!(
                "the first bound must be below the second, got {s:?}"
            ));
        }
        Ok((a, b))
    })? {
        m = m.buckets(min, max);
    }
    Ok(m)
}

/// `TRACING_PROF_METRICS_ADDR`, checked; `Ok(None)` when unset. Any address, without a token
/// (span metrics name span paths, never code): `TRACING_PROF_HTTP_TOKEN` is asked for when set.
fn metrics_settings() -> Result<Option<HttpSettings>, ConfigError> {
    let Some(addr) = env_var(ENV_METRICS_ADDR, |s| Ok(s.to_owned()))? else {
        return Ok(None);
    };
    let addr = match addr.strip_prefix(':') {
        Some(port) => format!("127.0.0.1:{port}"),
        None => addr,
    };
    addr.to_socket_addrs().map_err(|e| ConfigError::Env {
        name: ENV_METRICS_ADDR,
        value: addr.clone(),
        reason: format!("not an address to listen on: {e}"),
    })?;
    Ok(Some(HttpSettings {
        var: ENV_METRICS_ADDR,
        metrics_only: true,
        metrics: span_metrics()?,
        addr,
        token: env_var(ENV_HTTP_TOKEN, |s| Ok(s.to_owned()))?,
        required: env_var(ENV_HTTP_REQUIRED, parse_bool)?.unwrap_or(false),
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
fn otlp_config() -> Result<Option<crate::otlp::OtlpConfig>, PushError> {
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
