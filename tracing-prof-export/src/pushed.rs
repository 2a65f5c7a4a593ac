//! What the pushing exporters send of a window: its profiles, named and kept within the
//! limits of the servers they go to. Pyroscope's push and ingest APIs and OTLP send the same
//! profiles, so that a service seen through either shows the same numbers.

use tracing_prof_model::pprof::proto;
use tracing_prof_model::{Label, Profile, ProfileKind, SampleType, Snapshot};

/// Pyroscope's default `validation.max-profile-stacktrace-samples` (`pkg/validation/limits.go`):
/// a profile with more samples is rejected whole.
pub const MAX_SAMPLES: usize = 16_000;
/// Pyroscope's default `validation.max-profile-size-bytes`, of the uncompressed pprof.
pub const MAX_PROFILE_BYTES: usize = 4 << 20;

/// What to send beside CPU and memory.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Select {
    /// Exact memory per span path beside sampled heap stacks.
    pub(crate) span_memory: bool,
    /// The wall, busy, idle and CPU times of the `spans` kind beside its counts (OTLP says
    /// their unit; Pyroscope's push API would show them as counts).
    pub(crate) span_times: bool,
    /// A `span_path` label on every sample under a span (the CPU kind has one already).
    pub(crate) span_path_labels: bool,
}

/// One profile of a window, ready to encode.
pub(crate) struct Pushed {
    /// Pyroscope's name for it: `process_cpu`, `memory`, `span_memory`, `spans`, or at the
    /// heap's peak `memory_peak` and `span_memory_peak`.
    pub(crate) name: &'static str,
    pub(crate) sample_types: Vec<SampleType>,
    /// The pprof message, within [`MAX_SAMPLES`] and [`MAX_PROFILE_BYTES`].
    pub(crate) message: proto::Profile,
}

/// The profiles of one window that have samples: CPU (sampled stacks, or with CPU sampling off
/// and a CPU clock on, the CPU time of each span path), memory (sampled stacks, or exact span
/// paths when heap sampling is off), exact memory per span path beside sampled stacks when
/// `select.span_memory`, and span counts; with a `peak` (a heap peak read since the last push),
/// memory as it was at the peak (and exact memory per span path then, with
/// `select.span_memory`). Returns them and how many samples were merged to keep within the
/// limits (the smallest first, totals unchanged).
pub(crate) fn window_profiles(
    window: &Snapshot,
    select: Select,
    peak: Option<&Snapshot>,
) -> (Vec<Pushed>, usize) {
    let mut out: Vec<(&'static str, Profile)> = Vec::new();
    let spans = window.profile(ProfileKind::Spans);
    if ProfileKind::Cpu.is_available(window) {
        let mut cpu = window.profile(ProfileKind::Cpu);
        if cpu.samples.len() > MAX_SAMPLES {
            // Samples linked to trace spans are a sample per (stack, span): past the limit,
            // the links go first (the stacks stay whole), before any stack is merged.
            let mut unlinked = window.clone();
            for s in &mut unlinked.cpu_stacks {
                s.links.clear();
            }
            cpu = unlinked.profile(ProfileKind::Cpu);
        }
        out.push(("process_cpu", cpu));
    } else if let Some(mut cpu) = spans.with_sample_types(&["cpu"]) {
        // Measured by the CPU clock on enter and exit: exact CPU time per span path, Go's CPU
        // type without the sample count.
        cpu.period_type = Some(SampleType::new("cpu", "nanoseconds"));
        cpu.period = 1;
        out.push(("process_cpu", cpu));
    }
    out.push(("memory", window.profile(ProfileKind::Heap)));
    if select.span_memory && ProfileKind::Heap.is_sampled(window) {
        // Exact per span path, beside the sampled stacks; unsampled, `memory` is this already.
        out.push(("span_memory", window.profile(ProfileKind::SpanMemory)));
    }
    if let Some(peak) = peak {
        // In use only: its allocation counters are totals since the start, where a series'
        // are each window's own.
        let in_use = |kind: ProfileKind| {
            peak.profile(kind)
                .with_sample_types(&["inuse_objects", "inuse_space"])
        };
        out.extend(in_use(ProfileKind::Heap).map(|p| ("memory_peak", p)));
        if select.span_memory && ProfileKind::Heap.is_sampled(peak) {
            out.extend(in_use(ProfileKind::SpanMemory).map(|p| ("span_memory_peak", p)));
        }
    }
    if select.span_times {
        out.push(("spans", spans));
    } else if let Some(counts) = spans.with_sample_types(&["spans"]) {
        out.push(("spans", counts));
    }
    let mut merged = 0;
    let profiles = out
        .into_iter()
        // Nothing to store (the server keeps nothing of a profile without samples).
        .filter(|(_, p)| !p.samples.is_empty())
        .map(|(name, mut p)| {
            if select.span_path_labels {
                for s in &mut p.samples {
                    let path = s.span_path();
                    if s.label("span_path").is_none() && !path.is_empty() {
                        s.labels.push(Label::str("span_path", path));
                    }
                }
            }
            merged += p.keep_largest(MAX_SAMPLES);
            let message = loop {
                let message = p.to_proto();
                if prost::Message::encoded_len(&message) <= MAX_PROFILE_BYTES
                    || p.samples.len() <= 1
                {
                    break message;
                }
                merged += p.keep_largest(p.samples.len() / 2);
            };
            Pushed {
                name,
                sample_types: p.sample_types,
                message,
            }
        })
        .collect();
    (profiles, merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};
    use tracing_prof_model::{PathKind, PathProfile, SpanFrame};

    /// A snapshot whose span path `app::name` holds `bytes` in one block (heap sampling off:
    /// memory is the exact span paths).
    fn holding(name: &str, bytes: u64) -> Snapshot {
        let mut s = Snapshot::new(SystemTime::now(), Duration::from_secs(10));
        let mut p = PathProfile::new(
            PathKind::Span,
            vec![SpanFrame::new("app", name, None, None)],
        );
        p.memory.alloc_objects = 3;
        p.memory.alloc_bytes = 3 * bytes;
        p.memory.inuse_objects = 1;
        p.memory.inuse_bytes = bytes;
        s.paths.push(p);
        s
    }

    #[test]
    fn a_peak_goes_as_memory_in_use_at_the_peak() {
        let window = holding("plateau", 16 << 20);
        let (without, _) = window_profiles(&window, Select::default(), None);
        assert!(without.iter().all(|p| !p.name.ends_with("_peak")));

        let peak = holding("spike", 64 << 20);
        let (with, _) = window_profiles(&window, Select::default(), Some(&peak));
        let sent: Vec<&str> = with.iter().map(|p| p.name).collect();
        assert_eq!(sent, ["memory", "memory_peak"]);
        let p = &with[1];
        let types: Vec<&str> = p.sample_types.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(types, ["inuse_objects", "inuse_space"]);
        let profile = Profile::decode(&prost::Message::encode_to_vec(&p.message)).unwrap();
        assert_eq!(profile.total(1), 64 << 20);
        assert_eq!(profile.total(0), 1);
        assert!(profile.samples[0].stack[0].function.ends_with("spike"));
    }
}
