//! A series of cumulative profiles of one process, in time order: how a sample type grew per
//! span path or per stack from one profile to the next. What the `tracing-prof leaks` command
//! reads from a folder of files, and what a leak looks like from outside the process: in-use
//! memory that keeps growing and never falls ([`is_suspected_leak`]).

use crate::ModelError;
use crate::profile::{Profile, Sample};
use crate::table::Grouping;
use std::collections::HashMap;

/// How one span path or stack moved over the series.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Growth {
    /// The span path (`request -> cache_fill`), or for [`Grouping::Function`] the span path
    /// and the innermost code frame (`request -> cache_fill @ app::fill`).
    pub name: String,
    /// Its value in each profile of the series, in order (0 where it was absent).
    pub values: Vec<i64>,
    /// How many of the steps between consecutive profiles it grew in.
    pub grew: usize,
    /// How many consecutive steps at the end of the series it grew in.
    pub growing_now: usize,
}

impl Growth {
    /// Last value minus first.
    pub fn change(&self) -> i64 {
        match (self.values.first(), self.values.last()) {
            (Some(a), Some(b)) => b.saturating_sub(*a),
            _ => 0,
        }
    }
}

/// The one rule that makes a series of in-use values a suspected leak, in the profiler (one
/// value per capture) and in `tracing-prof leaks` (one per file) alike: over its last `steps`
/// steps the value never fell, rose in at least half of them (a sampled estimate moves only when
/// a sample is taken or freed, so it may stand still for a step), and rose by at least
/// `min_growth` in all. With fewer than `steps + 1` values, not yet. A steady working set,
/// allocations freed at the pace they are made, never qualifies however large it is; a cache
/// still warming up looks the same as a leak until it stops growing.
///
/// # Examples
/// ```
/// use tracing_prof_model::series::is_suspected_leak;
/// assert!(is_suspected_leak(&[0, 10, 10, 20, 30], 4, 25)); // 3 rises of 4, never fell
/// assert!(!is_suspected_leak(&[0, 10, 5, 20, 30], 4, 25)); // fell once
/// assert!(!is_suspected_leak(&[0, 0, 0, 0, 30], 4, 25)); // rose in 1 step of 4
/// assert!(!is_suspected_leak(&[0, 5, 10, 15, 20], 4, 25)); // not by enough
/// ```
pub fn is_suspected_leak(values: &[i64], steps: usize, min_growth: i64) -> bool {
    let steps = steps.max(1);
    if values.len() <= steps {
        return false;
    }
    let tail = &values[values.len() - 1 - steps..];
    let rises = tail.windows(2).filter(|w| w[1] > w[0]).count();
    let falls = tail.windows(2).filter(|w| w[1] < w[0]).count();
    falls == 0 && rises * 2 >= steps && tail[steps].saturating_sub(tail[0]) >= min_growth
}

/// The key of a sample in a series: its span path, plus its innermost code frame when
/// `grouping` is by function (stacks).
fn key(s: &Sample, grouping: Grouping) -> String {
    let path = s.span_path();
    let path = if path.is_empty() {
        "(no span path)".to_owned()
    } else {
        path
    };
    match grouping {
        Grouping::SpanPath => path,
        Grouping::Function => match s.leaf_function() {
            Some(f) => format!("{path} @ {}", f.display_with_location()),
            None => path,
        },
    }
}

/// How sample type `sample_type` (default: each profile's default) grew per span path
/// ([`Grouping::SpanPath`]) or per stack ([`Grouping::Function`]) across `profiles`, which
/// must be cumulative profiles of one process in time order. Sorted by how many steps at the
/// end each grew in, then by total change, largest first.
pub fn growth(
    profiles: &[Profile],
    sample_type: Option<&str>,
    grouping: Grouping,
) -> Result<Vec<Growth>, ModelError> {
    let mut at: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<Growth> = Vec::new();
    for (i, p) in profiles.iter().enumerate() {
        let index = p.sample_type_named(sample_type)?;
        for s in &p.samples {
            let v = s.values.get(index).copied().unwrap_or(0);
            let k = key(s, grouping);
            let row = *at.entry(k.clone()).or_insert_with(|| {
                out.push(Growth {
                    name: k,
                    values: vec![0; profiles.len()],
                    grew: 0,
                    growing_now: 0,
                });
                out.len() - 1
            });
            out[row].values[i] = out[row].values[i].saturating_add(v);
        }
    }
    for g in &mut out {
        let steps: Vec<bool> = g.values.windows(2).map(|w| w[1] > w[0]).collect();
        g.grew = steps.iter().filter(|&&up| up).count();
        g.growing_now = steps.iter().rev().take_while(|&&up| up).count();
    }
    out.sort_by(|a, b| {
        (b.growing_now, b.change())
            .cmp(&(a.growing_now, a.change()))
            .then_with(|| a.name.cmp(&b.name))
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Frame, FrameKind, SampleType};

    fn profile(values: &[(&str, i64)]) -> Profile {
        let mut p = Profile::new(vec![SampleType::new("inuse_space", "bytes")]);
        for &(span, v) in values {
            p.samples.push(Sample {
                stack: vec![
                    Frame::new(FrameKind::Span, format!("app::{span}"), None, None),
                    Frame::new(FrameKind::Code, "app::fill", None, None),
                ],
                values: vec![v],
                labels: Vec::new(),
            });
        }
        p
    }

    #[test]
    fn growth_per_path_and_per_stack() {
        let series = [
            profile(&[("cache", 100), ("leak", 10)]),
            profile(&[("cache", 300), ("leak", 20)]),
            profile(&[("cache", 250), ("leak", 30), ("new", 5)]),
        ];
        let g = growth(&series, None, Grouping::SpanPath).unwrap();
        let names: Vec<&str> = g.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["leak", "new", "cache"]);
        assert_eq!(
            (g[0].values.clone(), g[0].grew, g[0].growing_now),
            (vec![10, 20, 30], 2, 2)
        );
        assert_eq!((g[1].values.clone(), g[1].growing_now), (vec![0, 0, 5], 1));
        assert_eq!((g[2].change(), g[2].grew, g[2].growing_now), (150, 1, 0));
        let g = growth(&series, Some("inuse_space"), Grouping::Function).unwrap();
        assert_eq!(g[0].name, "leak @ app::fill");
        assert!(growth(&series, Some("alloc_space"), Grouping::Function).is_err());
    }
}
