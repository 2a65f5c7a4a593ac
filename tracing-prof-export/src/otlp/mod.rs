//! Sending profiles as OpenTelemetry profiles (OTLP/HTTP, protobuf, gzip) to an OpenTelemetry
//! Collector, Grafana Pyroscope, or any receiver of `POST /v1development/profiles`.
//!
//! Every interval, [`OtlpExporter`] (a [`Sink`](tracing_prof_core::Sink)) turns the profile
//! into a window since the previous export (counters over the interval, in-use memory at its
//! end) and queues one `ExportProfilesServiceRequest` for its own sender thread, with the
//! retries, backoff, bounded queue and "said once" errors of the Pyroscope exporter. Only
//! `429`, `502`, `503` and `504` answers and transport errors are retried, waiting as long as
//! `Retry-After` asks in seconds (at most a minute, never less than the backoff); a partial
//! success is never retried, and one that rejected profiles counts as a failure. Header values
//! never appear in errors or `Debug` output. The resource leaves `process.pid` out: Pyroscope
//! would make a series of each process.
//!
//! **The profiles signal is in Alpha** (opentelemetry-proto `v1development`, messages of
//! v1.11.0 through the `opentelemetry-proto` crate's generated types): receivers and this
//! exporter may have to change together.
//!
//! # What is sent
//!
//! The profiles Pyroscope gets (the same window, the same limits), one OTLP profile per sample
//! type, all sharing the request's dictionary:
//!
//! | profiles | sample types | period type |
//! |---|---|---|
//! | CPU, sampled | `samples` (`count`); its CPU time is the count times `period` nanoseconds | `cpu`, `nanoseconds` |
//! | CPU, with sampling off and a CPU clock on | `samples` (`count`) per span path, each a nanosecond of CPU time | `cpu`, `nanoseconds`, period 1 |
//! | heap | `alloc_objects`, `alloc_space`, `inuse_objects`, `inuse_space` | `memory`, `bytes`, period the sampling rate |
//! | exact memory per span path (beside sampled heap) | the same four | `span_memory`, `bytes`, period 1 |
//! | spans | `spans`, `wall`, `busy`, `idle` and the CPU times measured | `spans`, `count`, period 1 |
//! | the heap at its peak, once a new one is read | `inuse_objects`, `inuse_space` | `memory_peak` (as heap), `span_memory_peak` (as exact memory) |
//!
//! Frames are those of the pprof files: span frames (`request [span]`) above the code frames.
//! A sample's attributes are its string pprof labels (your span fields, `long_poll`...; numeric
//! ones such as a heap sample's mean size are left out, since Pyroscope would make a series of
//! each value), and on every sample under a span its span path (`span_path`, as on the CPU
//! samples of the files): Pyroscope makes it a label of every series, so that memory and span
//! times can be picked by path as CPU can, at one series per path a profile type.
//! CPU samples taken in a span linked to a trace (the `opentelemetry` feature of
//! tracing-prof-core) carry a `Link` to its trace and span instead of the `span_id` and
//! `trace_id` labels. The resource is [`resource_from_env`](tracing_prof_core::resource_from_env)'s
//! (`service.name` from `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), the scope
//! `tracing-prof`.
//!
//! # What the receivers make of it
//!
//! - **Grafana Pyroscope** (its HTTP port, `http://pyroscope:4040/v1development/profiles`) names
//!   a series after the period type and keeps every resource attribute and sample attribute as
//!   a label (`pkg/ingester/otlp/ingest_handler.go` and `convert.go`): the profile types
//!   `process_cpu:cpu:nanoseconds:cpu:nanoseconds` (samples times the period),
//!   `memory:{alloc,inuse}_{objects,space}:{count,bytes}:memory:bytes`,
//!   `span_memory:...:span_memory:bytes` and `spans:{spans,wall,busy,idle,cpu...}:...:spans:count`,
//!   under `service_name` from `service.name`; linked samples become span profiles
//!   (`span_id`, `trace_id`). Pyroscope's own push API (`PyroscopeExporter`) names memory the
//!   way Go's profiles do (`memory:...:space:bytes`) and keeps wall time out.
//! - **An OpenTelemetry Collector** receives them with the `service.profilesSupport` feature
//!   gate and a `profiles` pipeline (without them, `404`), and passes them on as they came.
//!
//! # Inside
//!
//! `config` (the settings, their checks and `from_env`), `convert` (a window's profiles as the
//! request, from the generated types) and `exporter` (the [`Sink`](tracing_prof_core::Sink)
//! and the requests).

mod config;
mod convert;
mod exporter;

pub use config::{
    DEFAULT_TIMEOUT, ENV_OTLP_COMPRESSION, ENV_OTLP_ENDPOINT, ENV_OTLP_HEADERS,
    ENV_OTLP_PROFILES_COMPRESSION, ENV_OTLP_PROFILES_ENDPOINT, ENV_OTLP_PROFILES_HEADERS,
    ENV_OTLP_PROFILES_PROTOCOL, ENV_OTLP_PROFILES_TIMEOUT, ENV_OTLP_PROTOCOL, ENV_OTLP_TIMEOUT,
    MAX_REQUEST_BYTES, OtlpConfig, PROFILES_PATH,
};
pub use exporter::OtlpExporter;
