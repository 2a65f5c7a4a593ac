//! Memory incidents: the cgroup's working set crossing a share of its limit, watched by the
//! aggregator thread; each crossing writes the evidence once (see [`crate::Sink::incident`]).

/// How far below a threshold the working set must fall before its crossing counts again, in
/// points of the limit.
const REARM_POINTS: f64 = 5.0;

/// Which thresholds are armed.
#[derive(Debug)]
pub(crate) struct OomWatch {
    /// Percentages, ascending, each with whether its next crossing counts.
    thresholds: Vec<(u8, bool)>,
}

impl OomWatch {
    pub(crate) fn new(percent: &[u8]) -> Self {
        OomWatch {
            thresholds: percent.iter().map(|&p| (p, true)).collect(),
        }
    }

    pub(crate) fn is_on(&self) -> bool {
        !self.thresholds.is_empty()
    }

    /// The highest threshold crossed since it was armed, for a working set at `used` of the
    /// limit (1.0: at it); every threshold at or below `used` is then disarmed, and those 5
    /// points above `used` or more are armed again.
    pub(crate) fn check(&mut self, used: f64) -> Option<u8> {
        let pct = used * 100.0;
        let mut crossed = None;
        for (t, armed) in &mut self.thresholds {
            let at = f64::from(*t);
            if pct >= at {
                if *armed {
                    crossed = Some(*t);
                }
                *armed = false;
            } else if pct < at - REARM_POINTS {
                *armed = true;
            }
        }
        crossed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_crossing_again_after_falling_five_points() {
        let mut w = OomWatch::new(&[80, 90, 95]);
        assert_eq!(w.check(0.5), None);
        assert_eq!(w.check(0.80), Some(80));
        assert_eq!(w.check(0.85), None, "80% already said");
        assert_eq!(w.check(0.78), None);
        assert_eq!(w.check(0.81), None, "not 5 points below in between");
        assert_eq!(w.check(0.912), Some(90));
        assert_eq!(w.check(0.99), Some(95));
        assert_eq!(w.check(0.74), None);
        assert_eq!(w.check(0.80), Some(80), "armed again below 75%");
        // A jump past several says the highest, and the lower ones are spent.
        let mut w = OomWatch::new(&[80, 90, 95]);
        assert_eq!(w.check(0.97), Some(95));
        assert_eq!(w.check(0.97), None);
        assert!(!OomWatch::new(&[]).is_on());
    }
}
