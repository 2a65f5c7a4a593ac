//! Pushing profiles to Pyroscope / Grafana Cloud Profiles.
//!
//! Every interval, [`PyroscopeExporter`] (a [`Sink`](tracing_prof_core::Sink)) turns the profile into a window since the
//! previous push (counters over the interval, in-use memory at its end), encodes its series as
//! pprof and hands them to its own sender thread through a bounded queue. The aggregator never
//! waits on the network: when the queue is full the oldest batch is dropped and counted. The
//! sender retries transport errors, `429` and `5xx` answers with exponential backoff, and gives
//! up on other `4xx` answers (a configuration error) at once; every failure is counted and
//! reported on stderr once per distinct error, with the start of the server's answer (Pyroscope
//! says there why it refused). Errors and `Debug` output never contain the URL's credentials,
//! the token or the password.
//!
//! # The series
//!
//! Named so that Pyroscope's UI shows each under a profile type it knows, or in the right units,
//! and nothing twice (profile type IDs are `name:type:unit:period_type:period_unit`):
//!
//! | `__name__` | what | profile types |
//! |---|---|---|
//! | `process_cpu` | the `cpu` kind (sampled code stacks under span paths), or with CPU sampling off and a CPU clock on, the CPU time of each span path | `process_cpu:samples:count:cpu:nanoseconds` and `process_cpu:cpu:nanoseconds:cpu:nanoseconds` (Go's), or the second only |
//! | `memory` | the `heap` kind: sampled code stacks under span paths (exact span paths when heap sampling is off) | Go's four, `memory:{alloc,inuse}_{objects,space}:...:space:bytes` |
//! | `span_memory` | exact memory per span path, beside sampled `memory` (push API only: `/ingest` would name it `memory`, counting it twice) | as `memory`, under `span_memory`: bytes and counts, shown as such |
//! | `spans` | spans closed per span path | `spans:spans:count:spans:count` |
//! | `memory_peak`, `span_memory_peak` | memory in use at the heap's peak, sampled stacks and exact per span path, in the push of the window in which a new peak was read (push API only, as `span_memory`) | `inuse_objects` and `inuse_space` of `memory`'s and `span_memory`'s |
//!
//! Wall, busy and idle time per span path are not pushed: no profile type the UI knows holds
//! wall time, and under another it would show nanoseconds as plain counts. They are in the
//! files and at `/debug/pprof`.
//!
//! Every push series carries `__delta__="false"`: the values are windows already, and
//! Pyroscope 1.x would otherwise turn `memory` allocations into deltas between pushes, storing
//! 0 (2.x ignores the label; the server's own `/ingest` sets it).
//!
//! A profile beyond Pyroscope's default limits ([`MAX_SAMPLES`] samples, [`MAX_PROFILE_BYTES`]
//! uncompressed) would be refused whole: its smallest samples are summed into one
//! `(N smaller stacks merged)` sample instead, totals unchanged, counted in
//! [`PushStats::merged_samples`](crate::PushStats::merged_samples). Pyroscope refuses profiles that start more than an hour ago:
//! keep the interval under an hour.
//!
//! # The APIs
//!
//! - [`PyroscopeApi::Push`] (default): `POST /push.v1.PusherService/Push`, a protobuf
//!   `PushRequest` (Connect) with one series per row above, labels `__name__`, `service_name`,
//!   `__delta__` and your tags.
//! - [`PyroscopeApi::Ingest`]: `POST /ingest?name=APP{tags}&from=..&until=..&spyName=tracing-prof`
//!   (times in Unix nanoseconds), one request per series, a multipart form with the pprof in
//!   `profile` and a `sample_type_config`. The server names the series from the sample types,
//!   to the same names as above.
//!
//! # Inside
//!
//! `config` (the settings, their checks and `from_env`), `series` (a window's series, kept
//! within Pyroscope's limits), `exporter` (the [`Sink`](tracing_prof_core::Sink): windows in, a
//! bounded queue out), `sender` (the thread that sends with retries and backoff) and `wire`
//! (the two APIs' request bodies).

mod config;
mod exporter;
mod sender;
mod series;
pub(crate) mod wire;

pub use crate::pushed::{MAX_PROFILE_BYTES, MAX_SAMPLES};
pub use config::{
    DEFAULT_BACKOFF, DEFAULT_FLUSH_TIMEOUT, DEFAULT_QUEUE_CAPACITY, DEFAULT_RETRIES,
    DEFAULT_TIMEOUT, ENV_API, ENV_APPLICATION_NAME, ENV_AUTH_TOKEN, ENV_BASIC_AUTH_PASSWORD,
    ENV_BASIC_AUTH_USER, ENV_LABELS, ENV_SERVER_ADDRESS, ENV_TENANT_ID, ENV_TIMEOUT,
    MAX_SERIES_TAGS, PyroscopeApi, PyroscopeConfig,
};
pub use exporter::PyroscopeExporter;
