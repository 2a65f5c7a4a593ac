//! Which totals of a profile are estimates from sampling, from how many sample points, with
//! what error, and where the exact numbers are: what every tool that prints a sampled total
//! says beside it.

use crate::Profile;

/// A sampled total: how much it rests on and how far it may be off.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Estimate {
    /// Sample points the total stands on (bytes or CPU time over the sampling period).
    pub points: u64,
    /// One standard error, relative: `1 / sqrt(points)`, the error of a count of points; the
    /// jittered distances of the heap sampler make it smaller (see `tracing-prof-alloc`).
    pub relative_error: f64,
    /// Where the exact number is, where one is kept.
    pub exact: Option<&'static str>,
}

impl std::fmt::Display for Estimate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "an estimate from {} sample points", self.points)?;
        if self.points > 0 {
            write!(
                f,
                ", ±{:.1}% (one standard error)",
                self.relative_error * 100.0
            )?;
        }
        if let Some(exact) = self.exact {
            write!(f, "; exact: {exact}")?;
        }
        Ok(())
    }
}

impl Profile {
    /// Whether the total of sample type `index` is an estimate from sampling, and how good:
    /// memory sampled every `period` bytes (`space/bytes` with a period over 1: heap, allocs,
    /// Go's heap), CPU sampled every `period` ns (`cpu/nanoseconds`), and the `cpu` type of a
    /// spans profile whose comments say it was sampled. `None` for exact counts.
    pub fn estimate(&self, index: usize) -> Option<Estimate> {
        let ty = self.sample_types.get(index)?;
        let ours = self.comments.iter().any(|c| c.starts_with("tracing-prof:"));
        let period_type = self.period_type.as_ref();
        let points = |total: i64, period: i64| (total.max(0) as u64) / (period.max(1) as u64);
        let (points, exact) = match period_type.map(|p| p.unit.as_str()) {
            Some("bytes") if self.period > 1 => {
                let space = match ty.unit.as_str() {
                    "bytes" => index,
                    _ => self.sample_type_index(&ty.name.replace("_objects", "_space"))?,
                };
                let exact = ours.then_some("the span_memory profile (per span path)");
                (points(self.total(space), self.period), exact)
            }
            Some("nanoseconds") if self.period > 0 => {
                let n = match ty.unit.as_str() {
                    "nanoseconds" => points(self.total(index), self.period),
                    _ => self.total(index).max(0) as u64,
                };
                let exact = ours.then_some("TRACING_PROF_CPU_TIME=exact (per span path)");
                (n, exact)
            }
            _ if ty.name == "cpu" => {
                let hz: i64 = self.comments.iter().find_map(|c| {
                    let rest = c.strip_prefix("tracing-prof: cpu is sampled (")?;
                    rest.split(' ').next()?.parse().ok()
                })?;
                let exact = Some("TRACING_PROF_CPU_TIME=exact (per span path)");
                (points(self.total(index), 1_000_000_000 / hz.max(1)), exact)
            }
            _ => return None,
        };
        Some(Estimate {
            points,
            relative_error: if points > 0 {
                1.0 / (points as f64).sqrt()
            } else {
                1.0
            },
            exact,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::{Profile, Sample, SampleType};

    fn profile(types: &[(&str, &str)], values: Vec<i64>) -> Profile {
        let mut p = Profile::new(types.iter().map(|&(n, u)| SampleType::new(n, u)).collect());
        p.samples.push(Sample {
            stack: Vec::new(),
            values,
            labels: Vec::new(),
        });
        p
    }

    /// A heap profile's totals stand on total/rate points; objects on their bytes; exact
    /// counts (period 1) are no estimate; CPU on total/period; a spans profile's sampled cpu.
    #[test]
    fn sampled_totals_say_how_many_points_they_stand_on() {
        let mut heap = profile(
            &[("inuse_objects", "count"), ("inuse_space", "bytes")],
            vec![3, 100 * 524_288],
        );
        heap.period_type = Some(SampleType::new("space", "bytes"));
        heap.comments.push("tracing-prof: sampled: ...".into());
        assert!(heap.estimate(1).is_none(), "period 1: exact counts");
        heap.period = 524_288;
        let e = heap.estimate(1).unwrap();
        assert_eq!((e.points, e.relative_error), (100, 0.1));
        assert_eq!(heap.estimate(0).unwrap().points, 100);
        assert_eq!(
            e.to_string(),
            "an estimate from 100 sample points, ±10.0% (one standard error); exact: the \
             span_memory profile (per span path)"
        );
        let mut exact = heap.clone();
        exact.period = 1;
        assert!(exact.estimate(1).is_none());

        let mut cpu = profile(
            &[("samples", "count"), ("cpu", "nanoseconds")],
            vec![400, 4_000_000_000],
        );
        cpu.period_type = Some(SampleType::new("cpu", "nanoseconds"));
        cpu.period = 10_000_000;
        assert_eq!(cpu.estimate(1).unwrap().points, 400);
        assert_eq!(cpu.estimate(0).unwrap().points, 400);
        assert!(
            cpu.estimate(1).unwrap().exact.is_none(),
            "not ours: no pointer"
        );

        let mut spans = profile(
            &[("spans", "count"), ("cpu", "nanoseconds")],
            vec![5, 2_000_000_000],
        );
        assert!(spans.estimate(1).is_none(), "not said to be sampled: exact");
        spans
            .comments
            .push("tracing-prof: cpu is sampled (100 Hz, estimates); off_cpu = ...".into());
        assert_eq!(spans.estimate(1).unwrap().points, 200);
        assert!(spans.estimate(0).is_none(), "span counts are exact");
    }
}
