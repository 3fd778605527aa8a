//! A circuit breaker for the policy hook. After `rules.policy.trip_after`
//! (default [`TRIP_AFTER`]) questions in a row to one subject went
//! unanswered within their timeout, that subject is not asked for
//! [`REST`]: meanwhile its questions fail at once, as an unanswered one
//! would (`rules.policy.fail`), rather than each world waiting out
//! `timeout_ms` for every agent message. Then questions go out again: an
//! answer closes the breaker, another timeout opens it for [`REST`] more.
//! Answers to questions sent before it tripped are not counted: they say
//! nothing of the service since, and under a partial failure would reopen
//! it at once, again and again.
//!
//! Only timeouts count: a service that is gone gets "no responders" at
//! once, and an unreadable answer is an answer, so neither makes anyone
//! wait; like an answer, they start the count again.
//!
//! Worlds that name the same subject share its count, each with its own
//! threshold: a world is not asked while the count has reached its
//! `trip_after` and the last timeout is less than [`REST`] old, whichever
//! world's question it was (a world whose `trip_after` is 0 is always
//! asked, and its timeouts count for the others too). An answer to a
//! question sent after the last trip closes the breaker for all of them,
//! whichever world asked (a patient world's question, sent while an
//! impatient one rests).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Questions in a row that time out before a subject rests, by default
/// (`rules.policy.trip_after`).
pub const TRIP_AFTER: u32 = 5;

/// How long a subject rests once tripped.
pub const REST: Duration = Duration::from_secs(5);

/// [`REST`] (in debug builds, a test may lengthen it: `fault::breaker_rest`).
fn rest() -> Duration {
    #[cfg(debug_assertions)]
    return crate::fault::breaker_rest(REST);
    #[cfg(not(debug_assertions))]
    REST
}

/// One breaker per policy subject (a world may name its own service).
#[derive(Debug, Default)]
pub struct Breakers {
    /// Only subjects that timed out since their last answer: an answer
    /// removes its subject, so the map holds the failing services.
    by_subject: Mutex<HashMap<String, Breaker>>,
}

#[derive(Debug)]
struct Breaker {
    /// Questions in a row that timed out.
    timeouts: u32,
    /// When the last of them timed out: a world whose threshold the count
    /// has reached does not ask for [`REST`] after it.
    last_timeout: Instant,
    /// The last timeout that found the count at a world's threshold (the
    /// subject tripped, or its rest went on), as that timeout or a world
    /// told to rest found it: answers to questions sent before then are not
    /// counted.
    tripped: Option<Instant>,
}

impl Breaker {
    /// Whether a trip's rest lasts at `now`.
    fn rests(&self, now: Instant) -> bool {
        self.tripped.is_some() && self.last_timeout + rest() > now
    }

    /// The last timeout tripped the subject for some world (`resting`:
    /// a rest lasted already); a rest that begins is logged.
    fn trip(&mut self, subject: &str, resting: bool) {
        if !resting {
            tracing::warn!(
                subject,
                timeouts = self.timeouts,
                rest_seconds = rest().as_secs(),
                "policy service does not answer; not asking it for a while (rules.policy.fail applies)"
            );
        }
        self.tripped = Some(self.last_timeout);
    }
}

/// How a question to the policy service ended, as the breaker counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// An answer, or an error that came at once, to a question sent at
    /// `asked`.
    Answered {
        asked: Instant,
    },
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
    /// Whether a world whose threshold is `trip_after` (0: never) does not
    /// ask `subject` at `now`, and why.
    pub fn resting(&self, subject: &str, now: Instant, trip_after: u32) -> Option<Resting> {
        if trip_after == 0 {
            return None;
        }
        let mut by_subject = self.lock();
        let breaker = by_subject.get_mut(subject)?;
        let until = breaker.last_timeout + rest();
        if until <= now || breaker.timeouts < trip_after {
            return None;
        }
        // Other worlds' timeouts may have brought the count to this one's
        // threshold: its rest is a trip all the same.
        let resting = breaker.rests(now);
        breaker.trip(subject, resting);
        Some(Resting {
            left: until - now,
            timeouts: breaker.timeouts,
        })
    }

    /// Counts how a question to `subject` ended at `now`. For a world
    /// whose threshold is `trip_after` (0: never rests), a timeout may trip
    /// the subject (or keep it resting).
    pub fn record(&self, subject: &str, ended: Ended, now: Instant, trip_after: u32) {
        let mut by_subject = self.lock();
        match ended {
            Ended::Answered { asked } => {
                let Some(breaker) = by_subject.get(subject) else {
                    return;
                };
                match breaker.tripped {
                    // Asked before the trip: not news of the service since.
                    Some(tripped) if asked < tripped => {}
                    Some(_) => {
                        by_subject.remove(subject);
                        tracing::info!(subject, "policy service answers again");
                    }
                    None => {
                        by_subject.remove(subject);
                    }
                }
            }
            Ended::TimedOut => {
                let breaker = by_subject
                    .entry(subject.to_string())
                    .or_insert_with(|| Breaker {
                        timeouts: 0,
                        last_timeout: now,
                        tripped: None,
                    });
                let resting = breaker.rests(now);
                breaker.timeouts = breaker.timeouts.saturating_add(1);
                breaker.last_timeout = now;
                if trip_after > 0 && breaker.timeouts >= trip_after {
                    breaker.trip(subject, resting);
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
        b.record("p", Ended::Answered { asked: t0 }, t0, TRIP_AFTER);
        b.record("p", Ended::TimedOut, t0, TRIP_AFTER);
        assert_eq!(rests(&b, t0), None);
        assert!(b.lock().get("p").is_some_and(|x| x.timeouts == 1));
    }

    #[test]
    fn an_answer_to_a_question_sent_before_the_trip_does_not_reopen_it() {
        let (b, t0) = (Breakers::default(), Instant::now());
        trip(&b, t0 + MS);
        let asked = Ended::Answered { asked: t0 };
        b.record("p", asked, t0 + 2 * MS, TRIP_AFTER);
        assert_eq!(rests(&b, t0 + 2 * MS), Some(REST - MS), "still resting");
        // Nor once the rest is over.
        b.record("p", asked, t0 + REST + 2 * MS, TRIP_AFTER);
        assert!(b.lock().get("p").is_some_and(|x| x.timeouts == TRIP_AFTER));
    }

    #[test]
    fn an_answer_to_a_question_sent_while_it_rests_closes_it() {
        // A patient world asks while an impatient one rests: the service
        // answers it, so the impatient world asks again too.
        let (b, t0) = (Breakers::default(), Instant::now());
        for _ in 0..3 {
            b.record("p", Ended::TimedOut, t0, 3);
        }
        assert!(b.resting("p", t0 + MS, 3).is_some());
        let answered = Ended::Answered { asked: t0 + MS };
        b.record("p", answered, t0 + 2 * MS, 100);
        assert_eq!(b.resting("p", t0 + 2 * MS, 3), None);
        assert!(b.lock().is_empty(), "an answered subject is forgotten");
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
        b.record("p", Ended::Answered { asked: after }, after, TRIP_AFTER);
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
    fn a_rest_other_worlds_timeouts_began_ignores_answers_sent_before_it() {
        let (b, t0) = (Breakers::default(), Instant::now());
        for _ in 0..3 {
            b.record("p", Ended::TimedOut, t0 + MS, 100);
        }
        assert!(b.resting("p", t0 + 2 * MS, 3).is_some(), "resting at 3");
        b.record("p", Ended::Answered { asked: t0 }, t0 + 3 * MS, 100);
        assert!(b.resting("p", t0 + 3 * MS, 3).is_some(), "an old answer");
        let since = Ended::Answered { asked: t0 + 2 * MS };
        b.record("p", since, t0 + 4 * MS, 100);
        assert_eq!(b.resting("p", t0 + 4 * MS, 3), None, "a new one");
    }

    #[test]
    fn a_patient_world_s_timeouts_rest_an_impatient_one() {
        // The count is the subject's: the impatient world does not wait out
        // a timeout of its own first.
        let (b, t0) = (Breakers::default(), Instant::now());
        for _ in 0..50 {
            b.record("p", Ended::TimedOut, t0, 100);
        }
        assert_eq!(b.resting("p", t0, 100), None);
        let resting = b.resting("p", t0 + MS, 5).expect("resting at 5");
        assert_eq!((resting.left, resting.timeouts), (REST - MS, 50));
        assert_eq!(b.resting("p", t0 + REST, 5), None, "5 s after the last");
    }

    #[test]
    fn trip_after_zero_never_rests_but_its_timeouts_count() {
        let (b, t0) = (Breakers::default(), Instant::now());
        for _ in 0..100 {
            b.record("p", Ended::TimedOut, t0, 0);
        }
        assert_eq!(b.resting("p", t0, 0), None);
        assert!(rests(&b, t0).is_some(), "for a world that rests at 5");
    }
}
