//! Time, injected. Rules and state take the time as an argument (world
//! state as a [`Stamp`]); only the pipeline asks a [`Clock`], so tests drive
//! time by hand and never sleep.

use std::cell::RefCell;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where the pipeline reads time from.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time, for windows and cooldowns.
    fn now(&self) -> Instant;
    /// Monotonic time, when the caller has just read the machine's own
    /// clock (`machine`, a message's arrival at the judge) for another
    /// purpose: the system clock answers with that reading rather than take
    /// a second one.
    fn now_at(&self, _machine: Instant) -> Instant {
        self.now()
    }
    /// Wall-clock time, for `received_at` and `observed_at`.
    fn wall(&self) -> SystemTime;
}

/// The real clocks of the machine.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn now_at(&self, machine: Instant) -> Instant {
        machine
    }

    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A moment as world state keeps it: nanoseconds after a process-wide
/// origin (when the first stamp is made), signed, so that a moment before the
/// origin (a test clock's start) is kept exactly too; about 292 years
/// either side, past which it saturates. Eight bytes where an [`Instant`] is
/// sixteen (seconds and nanoseconds, padded), and a world keeps thousands
/// of times: each agent's approvals for the rate rule, the duplicate
/// window, the conversation's activity, and when on, the budget's and
/// `similar`'s windows. Less memory a world, and fewer pages of it for a
/// growing world to touch first (docs/benchmarks.md, criterion notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp(i64);

impl Stamp {
    /// The moment `at`.
    pub fn of(at: Instant) -> Stamp {
        static ORIGIN: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);
        let origin = *ORIGIN;
        match at.checked_duration_since(origin) {
            Some(after) => Stamp(nanos(after)),
            None => Stamp(-nanos(origin.duration_since(at))),
        }
    }

    /// The time from `earlier` to this moment; zero if `earlier` is later.
    pub fn since(self, earlier: Stamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0).max(0).unsigned_abs())
    }
}

/// The moment `length` after: as late as a stamp can be, if that is past
/// its range (where an `Instant` panics).
impl std::ops::Add<Duration> for Stamp {
    type Output = Stamp;

    fn add(self, length: Duration) -> Stamp {
        Stamp(self.0.saturating_add(nanos(length)))
    }
}

/// The moment `length` before: as early as a stamp can be, if that is past
/// its range (where an `Instant` panics).
impl std::ops::Sub<Duration> for Stamp {
    type Output = Stamp;

    fn sub(self, length: Duration) -> Stamp {
        Stamp(self.0.saturating_sub(nanos(length)))
    }
}

/// `length` in nanoseconds, as many as an `i64` holds at most.
fn nanos(length: Duration) -> i64 {
    i64::try_from(length.as_nanos()).unwrap_or(i64::MAX)
}

/// An instant as RFC 3339 text with millisecond precision, UTC:
/// `YYYY-MM-DDTHH:MM:SS.mmmZ`, always 24 ASCII bytes (years 1970 to 9999),
/// held inline. Every decision is stamped, and a `String` would be one more
/// allocation each time.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Rfc3339([u8; 24]);

impl Rfc3339 {
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever written into it: this cannot fail.
        debug_assert!(self.0.is_ascii());
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for Rfc3339 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// `t` as RFC 3339 with millisecond precision, UTC. Every message is
/// stamped, so the date and time of day are formatted once per second (per
/// thread) and only the milliseconds each time. A clock outside the years
/// 1970 to 9999 (which RFC 3339 or `humantime` cannot write) reads as the
/// nearest end.
pub fn rfc3339(t: SystemTime) -> Rfc3339 {
    thread_local! {
        /// A second since the epoch, and its text up to the seconds
        /// (`YYYY-MM-DDTHH:MM:SS`).
        static SECOND: RefCell<(u64, [u8; 19])> = const { RefCell::new((u64::MAX, [0; 19])) };
    }
    const LAST: Duration = Duration::new(253_402_300_799, 999_999_999); // 9999-12-31T23:59:59.999…
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default().min(LAST);
    SECOND.with(|cached| {
        let (second, text) = &mut *cached.borrow_mut();
        if *second != since.as_secs() {
            let whole = UNIX_EPOCH + Duration::from_secs(since.as_secs());
            let formatted = humantime::format_rfc3339_seconds(whole).to_string();
            // `YYYY-MM-DDTHH:MM:SSZ` for every year in range.
            debug_assert_eq!(formatted.len(), 20, "{formatted}");
            if let Some(prefix) = formatted.as_bytes().get(..19) {
                text.copy_from_slice(prefix);
            }
            *second = since.as_secs();
        }
        let millis = since.subsec_millis();
        let mut out = [0u8; 24];
        out[..19].copy_from_slice(text);
        out[19] = b'.';
        for (i, digit) in [millis / 100, millis / 10 % 10, millis % 10]
            .into_iter()
            .enumerate()
        {
            out[20 + i] = b'0' + digit as u8;
        }
        out[23] = b'Z';
        Rfc3339(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn the_cached_second_formats_like_humantime(
            start in 0u64..8_000_000_000_000,
            steps in proptest::collection::vec(0u64..3_000, 1..20),
        ) {
            // Times moving forward by under 3 s, so most share the cached
            // second and some cross into the next.
            let mut at = start;
            for step in steps {
                at += step;
                let t = UNIX_EPOCH + Duration::from_millis(at) + Duration::from_micros(999);
                proptest::prop_assert_eq!(
                    rfc3339(t).to_string(),
                    humantime::format_rfc3339_millis(t).to_string()
                );
            }
        }
    }

    #[test]
    fn stamps_keep_the_order_and_the_distance_of_their_instants() {
        Stamp::of(Instant::now()); // the origin is set by now
        let now = Instant::now();
        let later = now + Duration::from_millis(1500);
        assert!(Stamp::of(now).0 >= 0, "after the origin");
        assert_eq!(
            Stamp::of(later).since(Stamp::of(now)),
            Duration::from_millis(1500)
        );
        assert_eq!(Stamp::of(now).since(Stamp::of(later)), Duration::ZERO);
        assert!(Stamp::of(now) < Stamp::of(later));
        // Before the origin: as exact, and still in order.
        let earlier = now
            .checked_sub(Duration::from_secs(3600))
            .expect("Linux's monotonic clock reaches an hour back");
        assert!(Stamp::of(earlier).0 < 0, "before the origin");
        assert_eq!(
            Stamp::of(now).since(Stamp::of(earlier)),
            Duration::from_secs(3600)
        );
        assert!(Stamp::of(earlier) < Stamp::of(now));
        let s = Stamp::of(now);
        assert_eq!(
            (s + Duration::from_secs(2)).since(s),
            Duration::from_secs(2)
        );
        assert_eq!(s.since(s - Duration::from_secs(2)), Duration::from_secs(2));
    }

    #[test]
    fn stamps_saturate_at_the_ends_of_their_range() {
        let (first, last) = (Stamp(i64::MIN), Stamp(i64::MAX));
        assert_eq!(last.since(first), Duration::from_nanos(i64::MAX as u64));
        assert_eq!(Stamp(i64::MIN + 1) - Duration::from_secs(1), first);
        assert_eq!(Stamp(i64::MAX - 1) + Duration::from_secs(1), last);
        assert_eq!(Stamp(0) - Duration::MAX, Stamp(-i64::MAX));
        assert_eq!(Stamp(0) + Duration::MAX, last);
        let centuries = Duration::from_secs(300 * 365 * 86_400);
        assert_eq!(Stamp::of(Instant::now() + centuries), last);
    }

    #[test]
    fn a_clock_outside_the_years_1970_to_9999_reads_as_the_nearest_end() {
        let before = UNIX_EPOCH - Duration::from_millis(1500);
        assert_eq!(rfc3339(before).as_str(), "1970-01-01T00:00:00.000Z");
        let after = UNIX_EPOCH + Duration::from_secs(300_000_000_000);
        assert_eq!(rfc3339(after).as_str(), "9999-12-31T23:59:59.999Z");
    }
}
