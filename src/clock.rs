//! Time, injected. Rules and state take instants as arguments; only the
//! pipeline asks a [`Clock`], so tests drive time by hand and never sleep.

use std::time::{Instant, SystemTime};

/// Where the pipeline reads time from.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time, for windows and cooldowns.
    fn now(&self) -> Instant;
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

    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// RFC 3339 with millisecond precision, UTC.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}
