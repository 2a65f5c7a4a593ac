//! What a pushing exporter says on stderr when it fails, and how often: keyed by cause, held
//! back with a count, and said again ever more rarely.

use super::Failure;
use std::time::{Duration, Instant};

/// How long a cause already said is held back at first: a minute; then twice as long each time
/// it is said again, up to [`MAX_SAY_EVERY`].
pub(super) const SAY_EVERY: Duration = Duration::from_secs(60);
/// The longest a cause is held back: an hour (a server down all night says so hourly).
pub(super) const MAX_SAY_EVERY: Duration = Duration::from_secs(3600);

/// What a sender says on stderr: each cause of failure at once, then again only after
/// [`SAY_EVERY`] (doubling up to [`MAX_SAY_EVERY`]), with the number of failures held back
/// meanwhile; "works again" after any was said.
#[derive(Debug, Default)]
pub(super) struct Reporter {
    /// Per cause: when it was said last, how long it is held back now, failures held back.
    /// Kept across successes, so that a failure that comes and goes is held back too.
    said: std::collections::HashMap<String, (Instant, Duration, u64)>,
    /// A failure was said since the last success.
    failing: bool,
}

impl Reporter {
    /// The line to say for `f` at `now`, if it is time to say one.
    pub(super) fn failed(&mut self, f: &Failure, now: Instant) -> Option<String> {
        match self.said.get_mut(&f.cause) {
            Some((at, every, held)) if now.duration_since(*at) < *every => {
                *held += 1;
                None
            }
            Some((at, every, held)) => {
                let line = format!(
                    "{} ({} more failures of this kind in the last {}; next said in {} at the \
                     earliest)",
                    f.message,
                    *held,
                    minutes(now.duration_since(*at)),
                    minutes((*every * 2).min(MAX_SAY_EVERY)),
                );
                (*at, *every, *held) = (now, (*every * 2).min(MAX_SAY_EVERY), 0);
                self.failing = true;
                Some(line)
            }
            None => {
                self.said.insert(f.cause.clone(), (now, SAY_EVERY, 0));
                self.failing = true;
                Some(format!(
                    "{} (retrying with backoff, dropping when the queue is full; failures of \
                     this kind are said again at most once a minute)",
                    f.message
                ))
            }
        }
    }

    /// Whether a failure was said since the last success: then "works again" is said.
    pub(super) fn works_again(&mut self) -> bool {
        std::mem::take(&mut self.failing)
    }
}

/// `d` in whole minutes, as a reader says it.
fn minutes(d: Duration) -> String {
    match d.as_secs().div_ceil(60) {
        1 => "minute".to_owned(),
        n => format!("{n} minutes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(cause: &str, message: &str) -> Failure {
        Failure {
            message: message.into(),
            cause: cause.into(),
            retry: true,
            retry_after: None,
        }
    }

    /// A server whose 500 carries a new request id each time: one line per cause, not one per
    /// attempt (found in a new user's trial: 21 lines in 8 s); said again after a minute with
    /// what was held back, then ever more rarely; a new cause at once; "works again" after.
    #[test]
    fn each_cause_is_said_at_most_once_a_minute_with_a_count_of_the_rest() {
        let mut r = Reporter::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let said: Vec<_> = (0..59)
            .filter_map(|s| r.failed(&failure("HTTP 500", &format!("req {s}")), at(s)))
            .collect();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].starts_with("req 0 (retrying"), "{}", said[0]);
        // Another cause is said at once.
        assert!(
            r.failed(&failure("transport: Io", "refused"), at(30))
                .is_some()
        );
        // A minute on: said again, with the count held back.
        let again = r.failed(&failure("HTTP 500", "req 60"), at(60)).unwrap();
        assert!(
            again.contains("58 more failures of this kind in the last minute"),
            "{again}"
        );
        assert!(again.contains("next said in 2 minutes"), "{again}");
        // Then after two minutes, not one.
        assert!(r.failed(&failure("HTTP 500", "x"), at(170)).is_none());
        assert!(r.failed(&failure("HTTP 500", "x"), at(180)).is_some());
        // Then 4, 8, 16, 32 minutes apart, then hourly: 11 lines in the next 8 hours.
        let mut lines = 0;
        for s in (181..30_000).step_by(10) {
            lines += usize::from(r.failed(&failure("HTTP 500", "x"), at(s)).is_some());
        }
        assert_eq!(lines, 11, "lines in the next 8 hours");
        assert!(r.works_again());
        assert!(!r.works_again(), "said once");
        // A failure that comes and goes between successes is held back all the same: no
        // "failed" and "works again" at every interval.
        assert!(r.failed(&failure("HTTP 500", "x"), at(29_000)).is_none());
        assert!(!r.works_again());
        // After its hour, said again.
        assert!(
            r.failed(&failure("HTTP 500", "x"), at(28_981 + 3600))
                .is_some()
        );
        assert!(r.works_again());
    }
}
