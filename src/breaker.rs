//! A circuit breaker for the policy hook. After `rules.policy.trip_after`
//! (default [`TRIP_AFTER`]) questions in a row to one subject went
//! unanswered within their timeout, that
//! subject is not asked for [`REST`]: meanwhile its questions fail at once,
//! as an unanswered one would (`rules.policy.fail`), rather than each world
//! waiting out `timeout_ms` for every agent message. Then questions go out
//! again: an answer closes the breaker, another timeout opens it for
//! [`REST`] more.
//!
//! Only timeouts count: a service that is gone gets "no responders" at
//! once, and an unreadable answer is an answer, so neither makes anyone
//! wait.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Questions in a row that time out before a subject rests, by default
/// (`rules.policy.trip_after`).
pub const TRIP_AFTER: u32 = 5;

/// How long a subject rests once tripped.
pub const REST: Duration = Duration::from_secs(5);

/// One breaker per policy subject (a world may name its own service).
#[derive(Debug, Default)]
pub struct Breakers {
    /// Only subjects that timed out since their last answer: an answer
    /// removes its subject, so the map holds the failing services.
    by_subject: Mutex<HashMap<String, Breaker>>,
}

#[derive(Debug, Default)]
struct Breaker {
    /// Questions in a row that timed out.
    timeouts: u32,
    /// While tripped: until when the subject is not asked.
    resting_until: Option<Instant>,
}

/// How a question to the policy service ended, as the breaker counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// An answer, or an error that came at once.
    Answered,
    TimedOut,
}

impl Breakers {
    /// How long `subject` still rests at `now`, if it does.
    pub fn resting(&self, subject: &str, now: Instant) -> Option<Duration> {
        let by_subject = self.lock();
        let until = by_subject.get(subject)?.resting_until?;
        (until > now).then(|| until - now)
    }

    /// Counts how a question to `subject` ended at `now`; `trip_after`
    /// timeouts in a row make it rest (0: never).
    pub fn record(&self, subject: &str, ended: Ended, now: Instant, trip_after: u32) {
        let mut by_subject = self.lock();
        match ended {
            Ended::Answered => {
                if let Some(was) = by_subject.remove(subject) {
                    if was.resting_until.is_some() {
                        tracing::info!(
                            subject,
                            "policy service answers again; asking it every time"
                        );
                    }
                }
            }
            Ended::TimedOut if trip_after == 0 => {}
            Ended::TimedOut => {
                let breaker = match by_subject.get_mut(subject) {
                    Some(b) => b,
                    None => by_subject.entry(subject.to_string()).or_default(),
                };
                breaker.timeouts = breaker.timeouts.saturating_add(1);
                if breaker.timeouts >= trip_after {
                    if breaker.resting_until.is_none_or(|until| until <= now) {
                        tracing::warn!(
                            subject,
                            timeouts = breaker.timeouts,
                            rest_seconds = REST.as_secs(),
                            "policy service does not answer; not asking it for a while (rules.policy.fail applies)"
                        );
                    }
                    breaker.resting_until = Some(now + REST);
                }
            }
        }
    }

    /// The map; a panic elsewhere while it was held left it whole (each
    /// change is one map operation).
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Breaker>> {
        self.by_subject.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trips_after_timeouts_in_a_row_and_rests() {
        let (b, t0) = (Breakers::default(), Instant::now());
        for i in 1..TRIP_AFTER {
            b.record("p", Ended::TimedOut, t0, TRIP_AFTER);
            assert_eq!(b.resting("p", t0), None, "after {i} timeouts");
        }
        b.record("p", Ended::TimedOut, t0, TRIP_AFTER);
        assert_eq!(b.resting("p", t0), Some(REST));
        let later = t0 + Duration::from_secs(2);
        assert_eq!(b.resting("p", later), Some(REST - Duration::from_secs(2)));
        assert_eq!(b.resting("other", later), None, "per subject");
        assert_eq!(
            b.resting("p", t0 + REST),
            None,
            "asked again after the rest"
        );
    }

    #[test]
    fn an_answer_between_timeouts_starts_the_count_again() {
        let (b, t0) = (Breakers::default(), Instant::now());
        for _ in 0..TRIP_AFTER - 1 {
            b.record("p", Ended::TimedOut, t0, TRIP_AFTER);
        }
        b.record("p", Ended::Answered, t0, TRIP_AFTER);
        b.record("p", Ended::TimedOut, t0, TRIP_AFTER);
        assert_eq!(b.resting("p", t0), None);
        assert!(b.lock().get("p").is_some_and(|x| x.timeouts == 1));
    }

    #[test]
    fn after_the_rest_one_timeout_trips_again_and_one_answer_closes() {
        let (b, t0) = (Breakers::default(), Instant::now());
        for _ in 0..TRIP_AFTER {
            b.record("p", Ended::TimedOut, t0, TRIP_AFTER);
        }
        let after = t0 + REST;
        assert_eq!(b.resting("p", after), None);
        b.record("p", Ended::TimedOut, after, TRIP_AFTER);
        assert_eq!(b.resting("p", after), Some(REST), "still failing");
        b.record("p", Ended::Answered, after, TRIP_AFTER);
        assert_eq!(b.resting("p", after), None);
        assert!(b.lock().is_empty(), "an answered subject is forgotten");
    }

    #[test]
    fn trip_after_zero_never_rests() {
        let (b, t0) = (Breakers::default(), Instant::now());
        for _ in 0..100 {
            b.record("p", Ended::TimedOut, t0, 0);
        }
        assert_eq!(b.resting("p", t0), None);
        assert!(b.lock().is_empty(), "nothing kept for it");
    }
}
