//! The series of one window, each a gzip'd pprof within Pyroscope's limits.

use super::PyroscopeApi;
use crate::pushed::{Select, window_profiles};
use tracing_prof_model::{SampleType, Snapshot};

/// One pprof of a batch and the Pyroscope series it belongs to.
pub(super) struct Series {
    /// `__name__` on the push API (the ingest API derives the same one from the sample types).
    pub(super) name: &'static str,
    pub(super) sample_types: Vec<SampleType>,
    /// Gzip'd pprof.
    pub(super) pprof: Vec<u8>,
}

/// The series of one window, named as the Pyroscope UI knows them (see the module docs), and
/// on the push API the heap at a `peak` read since the last push.
pub(super) fn series_of(
    window: &Snapshot,
    api: PyroscopeApi,
    peak: Option<&Snapshot>,
) -> (Vec<Series>, usize) {
    // `/ingest` would name `span_memory` and the peak's `memory` too (from their sample
    // types), counting memory twice.
    let push = api == PyroscopeApi::Push;
    let (profiles, merged) = window_profiles(
        window,
        Select {
            span_memory: push,
            ..Select::default()
        },
        peak.filter(|_| push),
    );
    let series = profiles
        .into_iter()
        .map(|p| Series {
            name: p.name,
            sample_types: p.sample_types,
            pprof: tracing_prof_model::pprof::gzip(&p.message),
        })
        .collect();
    (series, merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pushed::MAX_SAMPLES;
    use std::time::{Duration, SystemTime};
    use tracing_prof_model::{Profile, ProfileKind};

    /// A window with `n` CPU stacks, stack `i` sampled `i + 1` times, and CPU sampling on.
    fn cpu_window(n: u64) -> Snapshot {
        use tracing_prof_model::{CodeFrame, CpuSource, CpuStack, PathKind, SpanFrame};
        let mut w = Snapshot::new(SystemTime::now(), Duration::from_secs(10));
        w.window = true;
        w.cpu = CpuSource::Sampled { hz: 100 };
        let span = vec![SpanFrame::new("app", "request", None, None)];
        for i in 0..n {
            let mut s = CpuStack::new(
                PathKind::Span,
                span.clone(),
                vec![CodeFrame::named(&format!("f{i}"))],
            );
            s.samples = i + 1;
            s.cpu_ns = (i + 1) * 10_000_000;
            w.cpu_stacks.push(s);
        }
        w
    }

    #[test]
    fn a_window_beyond_pyroscopes_sample_limit_is_merged_not_rejected() {
        let n = MAX_SAMPLES as u64 + 500;
        let (series, merged) = series_of(&cpu_window(n), PyroscopeApi::Push, None);
        assert_eq!(merged, 501);
        let cpu = series.iter().find(|s| s.name == "process_cpu").unwrap();
        let p = Profile::decode(&cpu.pprof).unwrap();
        assert_eq!(p.samples.len(), MAX_SAMPLES);
        // Every sample still counted: 1 + 2 + ... + n samples.
        assert_eq!(p.total(0), (n * (n + 1) / 2) as i64);
        let other = p
            .samples
            .iter()
            .find(|s| s.stack[0].function.contains("merged"))
            .unwrap();
        assert_eq!(&*other.stack[0].function, "(501 smaller stacks merged)");
        assert_eq!(other.values[0], (1..=501).sum::<i64>(), "the smallest ones");

        let (series, merged) = series_of(&cpu_window(100), PyroscopeApi::Push, None);
        assert_eq!(merged, 0);
        let names: Vec<&str> = series.iter().map(|s| s.name).collect();
        // No span path and no memory in this window: only CPU.
        assert_eq!(names, ["process_cpu"]);
    }

    /// Samples linked to trace spans go first when a window would pass the limit: the stacks
    /// stay whole, every sample counted, none merged.
    #[test]
    fn links_go_before_stacks_are_merged() {
        use tracing_prof_model::{LinkedSamples, TraceLink};
        let mut w = cpu_window(100);
        // Stack 99 has 100 samples; give 20 000 spans one sample each on a stack of its own.
        let mut s = w.cpu_stacks[0].clone();
        s.code = [tracing_prof_model::CodeFrame::named("linked")].into();
        s.samples = 20_000;
        s.cpu_ns = 20_000 * 10_000_000;
        s.links = (1..=20_000)
            .map(|span_id| LinkedSamples {
                link: TraceLink {
                    trace_id: 9,
                    span_id,
                },
                samples: 1,
            })
            .collect();
        w.cpu_stacks.push(s);
        assert!(w.profile(ProfileKind::Cpu).samples.len() > MAX_SAMPLES);
        let (series, merged) = series_of(&w, PyroscopeApi::Push, None);
        assert_eq!(merged, 0);
        let cpu = series.iter().find(|s| s.name == "process_cpu").unwrap();
        let p = Profile::decode(&cpu.pprof).unwrap();
        assert_eq!(p.samples.len(), 101);
        assert_eq!(p.total(0), 5050 + 20_000);
        assert!(
            p.samples
                .iter()
                .all(|s| s.labels.iter().all(|l| l.key != "span_id"))
        );
    }
}
