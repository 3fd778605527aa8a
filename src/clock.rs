//! Time, injected. Rules and state take instants as arguments; only the
//! pipeline asks a [`Clock`], so tests drive time by hand and never sleep.

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
    fn a_clock_outside_the_years_1970_to_9999_reads_as_the_nearest_end() {
        let before = UNIX_EPOCH - Duration::from_millis(1500);
        assert_eq!(rfc3339(before).as_str(), "1970-01-01T00:00:00.000Z");
        let after = UNIX_EPOCH + Duration::from_secs(300_000_000_000);
        assert_eq!(rfc3339(after).as_str(), "9999-12-31T23:59:59.999Z");
    }
}
