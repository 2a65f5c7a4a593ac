//! Which trace span CPU samples belong to: the OpenTelemetry ids a sample is linked to, and
//! how many samples of a stack each span holds.

/// The OpenTelemetry ids of a trace span (a local root span, unless the layer is told to link
/// every span).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceLink {
    /// The W3C trace id as a big-endian number.
    pub trace_id: u128,
    /// The W3C span id as a big-endian number (never 0).
    pub span_id: u64,
}

impl TraceLink {
    /// The span id as OpenTelemetry and Pyroscope write it: 16 lowercase hex digits.
    pub fn span_id_hex(&self) -> String {
        format!("{:016x}", self.span_id)
    }

    /// The trace id as OpenTelemetry writes it: 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }
}

/// The samples of one [`CpuStack`](crate::CpuStack) taken while one trace span's work ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkedSamples {
    /// The span.
    pub link: TraceLink,
    /// Its samples (part of the stack's `samples`).
    pub samples: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_as_opentelemetry_writes_them() {
        let l = TraceLink {
            trace_id: 0x0af7651916cd43dd8448eb211c80319c,
            span_id: 0xb7ad6b7169203331,
        };
        // The W3C trace-context example's ids (traceparent
        // 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01).
        assert_eq!(l.trace_id_hex(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(l.span_id_hex(), "b7ad6b7169203331");
        let small = TraceLink {
            trace_id: 1,
            span_id: 2,
        };
        assert_eq!(small.span_id_hex(), "0000000000000002");
        assert_eq!(small.trace_id_hex().len(), 32);
    }

    /// A cumulative snapshot with one CPU stack of `samples`, `links` of them linked.
    fn snapshot(samples: u64, links: &[(u64, u64)]) -> crate::Snapshot {
        use crate::{CodeFrame, CpuSource, CpuStack, PathKind, Snapshot, SpanFrame};
        use std::time::{Duration, SystemTime};
        let mut s = Snapshot::new(SystemTime::UNIX_EPOCH, Duration::from_secs(10));
        s.cpu = CpuSource::Sampled { hz: 100 };
        s.cpu_sampling_hz = 100;
        let mut stack = CpuStack::new(
            PathKind::Span,
            vec![SpanFrame::new("app", "request", None, None)],
            vec![CodeFrame::named("work")],
        );
        stack.samples = samples;
        stack.cpu_ns = samples * 10_000_000;
        stack.links = links
            .iter()
            .map(|&(span_id, samples)| LinkedSamples {
                link: TraceLink {
                    trace_id: 7,
                    span_id,
                },
                samples,
            })
            .collect();
        s.cpu_stacks.push(stack);
        s
    }

    /// `(span_id label or "", samples, cpu_ns)` per sample of the CPU profile.
    fn rows(s: &crate::Snapshot) -> Vec<(String, i64, i64)> {
        s.profile(crate::ProfileKind::Cpu)
            .samples
            .iter()
            .map(|x| {
                let span = x.labels.iter().find(|l| l.key == "span_id").map_or(
                    String::new(),
                    |l| match &l.value {
                        crate::LabelValue::Str(v) => v.clone(),
                        other => panic!("{other:?}"),
                    },
                );
                (span, x.values[0], x.values[1])
            })
            .collect()
    }

    #[test]
    fn linked_samples_get_samples_of_their_own_and_windows_subtract_per_span() {
        let base = snapshot(10, &[(1, 4), (2, 3)]);
        assert_eq!(
            rows(&base),
            [
                ("0000000000000001".into(), 4, 40_000_000),
                ("0000000000000002".into(), 3, 30_000_000),
                (String::new(), 3, 30_000_000),
            ]
        );
        let p = base.profile(crate::ProfileKind::Cpu);
        let trace = &p.samples[0]
            .labels
            .iter()
            .find(|l| l.key == "trace_id")
            .unwrap();
        assert_eq!(
            trace.value,
            crate::LabelValue::Str("00000000000000000000000000000007".into())
        );
        // Span 1 grew by 2, span 2 did not, span 3 is new, span 4 was let go before `base`
        // was taken and is absent from it.
        let now = snapshot(20, &[(1, 6), (2, 3), (3, 5)]);
        let w = now.window_since(&base);
        assert_eq!(
            rows(&w),
            [
                ("0000000000000001".into(), 2, 20_000_000),
                ("0000000000000003".into(), 5, 50_000_000),
                (String::new(), 3, 30_000_000),
            ]
        );
        // Links never claim more than the stack's growth.
        let w = snapshot(12, &[(5, 9)]).window_since(&base);
        assert_eq!(rows(&w), [("0000000000000005".into(), 2, 20_000_000)]);
    }
}
