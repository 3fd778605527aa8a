//! A circuit breaker for the policy hook. After `rules.policy.trip_after`
//! (default [`TRIP_AFTER`]) questions in a row to one subject went
//! unanswered within their timeout, that subject is not asked for
//! [`REST`]: meanwhile its questions fail at once, as an unanswered one
//! would (`rules.policy.fail`), rather than each world waiting out
//! `timeout_ms` for every agent message. Then questions go out again: an
//! answer closes the breaker, another timeout opens it for [`REST`] more.
//! Answers that come while it rests, to questions sent before it tripped,
//! are not counted: they say nothing of the service since, and under a
//! partial failure would reopen it at once, again and again.
//!
//! Only timeouts count: a service that is gone gets "no responders" at
//! once, and an unreadable answer is an answer, so neither makes anyone
//! wait; like an answer, they start the count again.
//!
//! Worlds that name the same subject share its count, each with its own
//! threshold: a world is not asked while the subject rests and the count
//! has reached the world's `trip_after`.

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
    /// Once tripped: until when the subject is not asked.
    resting_until: Option<Instant>,
}

/// How a question to the policy service ended, as the breaker counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// An answer, or an error that came at once.
    Answered,
    TimedOut,
}

/// Why a subject is not asked now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resting {
    /// Until the rest ends.
    pub left: Duration,
    /// Questions in a row that timed out.
    pub timeouts: u32,
}

impl Breakers {
    /// Whether a world whose threshold is `trip_after` (not 0) does not ask
    /// `subject` at `now`, and why.
    pub fn resting(&self, subject: &str, now: Instant, trip_after: u32) -> Option<Resting> {
        let by_subject = self.lock();
        let breaker = by_subject.get(subject)?;
        let until = breaker.resting_until?;
        (until > now && breaker.timeouts >= trip_after).then(|| Resting {
            left: until - now,
            timeouts: breaker.timeouts,
        })
    }

    /// Counts how a question to `subject` ended at `now`; `trip_after`
    /// timeouts in a row make it rest (0: never).
    pub fn record(&self, subject: &str, ended: Ended, now: Instant, trip_after: u32) {
        let mut by_subject = self.lock();
        match ended {
            Ended::Answered => {
                let Some(breaker) = by_subject.get(subject) else {
                    return;
                };
                match breaker.resting_until {
                    // Asked before the trip: not news of the service since.
                    Some(until) if until > now => {}
                    Some(_) => {
                        by_subject.remove(subject);
                        tracing::info!(subject, "policy service answers again");
                    }
                    None => {
                        by_subject.remove(subject);
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

    const MS: Duration = Duration::from_millis(1);

    fn rests(b: &Breakers, now: Instant) -> Option<Duration> {
        b.resting("p", now, TRIP_AFTER).map(|r| r.left)
    }

    fn trip(b: &Breakers, now: Instant) {
        for _ in 0..TRIP_AFTER {
            b.record("p", Ended::TimedOut, now, TRIP_AFTER);
        }
    }

    #[test]
    fn trips_after_timeouts_in_a_row_and_rests() {
        let (b, t0) = (Breakers::default(), Instant::now());
        for i in 1..TRIP_AFTER {
            b.record("p", Ended::TimedOut, t0, TRIP_AFTER);
            assert_eq!(rests(&b, t0), None, "after {i} timeouts");
        }
        b.record("p", Ended::TimedOut, t0, TRIP_AFTER);
        assert_eq!(
            b.resting("p", t0, TRIP_AFTER),
            Some(Resting {
                left: REST,
                timeouts: TRIP_AFTER
            })
        );
        let later = t0 + Duration::from_secs(2);
        assert_eq!(rests(&b, later), Some(REST - Duration::from_secs(2)));
        assert_eq!(b.resting("other", later, TRIP_AFTER), None, "per subject");
        assert_eq!(rests(&b, t0 + REST), None, "asked again after the rest");
    }

    #[test]
    fn an_answer_between_timeouts_starts_the_count_again() {
        let (b, t0) = (Breakers::default(), Instant::now());
        for _ in 0..TRIP_AFTER - 1 {
            b.record("p", Ended::TimedOut, t0, TRIP_AFTER);
        }
        b.record("p", Ended::Answered, t0, TRIP_AFTER);
        b.record("p", Ended::TimedOut, t0, TRIP_AFTER);
        assert_eq!(rests(&b, t0), None);
        assert!(b.lock().get("p").is_some_and(|x| x.timeouts == 1));
    }

    #[test]
    fn an_answer_while_it_rests_does_not_reopen_it() {
        let (b, t0) = (Breakers::default(), Instant::now());
        trip(&b, t0);
        b.record("p", Ended::Answered, t0 + MS, TRIP_AFTER);
        assert_eq!(rests(&b, t0 + MS), Some(REST - MS), "still resting");
    }

    #[test]
    fn after_the_rest_one_timeout_trips_again_and_one_answer_closes() {
        let (b, t0) = (Breakers::default(), Instant::now());
        trip(&b, t0);
        let after = t0 + REST;
        assert_eq!(rests(&b, after), None);
        b.record("p", Ended::TimedOut, after, TRIP_AFTER);
        assert_eq!(rests(&b, after), Some(REST), "still failing");
        let after = after + REST;
        b.record("p", Ended::Answered, after, TRIP_AFTER);
        assert_eq!(rests(&b, after), None);
        assert!(b.lock().is_empty(), "an answered subject is forgotten");
    }

    #[test]
    fn worlds_sharing_a_subject_rest_at_their_own_threshold() {
        let (b, t0) = (Breakers::default(), Instant::now());
        for _ in 0..3 {
            b.record("p", Ended::TimedOut, t0, 3);
        }
        assert!(b.resting("p", t0, 3).is_some());
        assert_eq!(b.resting("p", t0, 100), None, "a patient world still asks");
    }

    #[test]
    fn trip_after_zero_never_rests() {
        let (b, t0) = (Breakers::default(), Instant::now());
        for _ in 0..100 {
            b.record("p", Ended::TimedOut, t0, 0);
        }
        assert_eq!(rests(&b, t0), None);
        assert!(b.lock().is_empty(), "nothing kept for it");
    }
}
