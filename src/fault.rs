//! Fault injection for the tests of what follows a bug or a stall, in debug
//! builds only. Each fault reads one `LOOPGUARD_TEST_*` variable, once.

use std::sync::OnceLock;
use std::time::Duration;

use crate::subject::Origin;

/// A message to the world named by `LOOPGUARD_TEST_PANIC_WORLD` panics its
/// worker.
pub fn panic_on_world(origin: &Origin) {
    static WORLD: OnceLock<Option<String>> = OnceLock::new();
    let world = WORLD.get_or_init(|| std::env::var("LOOPGUARD_TEST_PANIC_WORLD").ok());
    if let (Some(world), Some(to)) = (world, origin.world()) {
        assert!(world != to.as_str(), "fault injected for world {world}");
    }
}

/// Holds up each message held back behind a policy answer for
/// `LOOPGUARD_TEST_STALL_HELD_MS`, as a slow publish of the one before it
/// would.
pub async fn stall_held() {
    static STALL: OnceLock<Option<Duration>> = OnceLock::new();
    if let Some(stall) = millis(&STALL, "LOOPGUARD_TEST_STALL_HELD_MS") {
        tokio::time::sleep(stall).await;
    }
}

/// Holds up every HTTP request but the probes for
/// `LOOPGUARD_TEST_SLOW_HANDLER_MS`, on its blocking thread, as a scrape of
/// many worlds would.
pub fn slow_handler() {
    static SLOW: OnceLock<Option<Duration>> = OnceLock::new();
    if let Some(slow) = millis(&SLOW, "LOOPGUARD_TEST_SLOW_HANDLER_MS") {
        std::thread::sleep(slow);
    }
}

/// The milliseconds `var` gives, read into `cell` the first time.
fn millis(cell: &'static OnceLock<Option<Duration>>, var: &str) -> Option<Duration> {
    *cell.get_or_init(|| {
        std::env::var(var)
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map(Duration::from_millis)
    })
}

/// Holds up loopguard's start for `LOOPGUARD_TEST_SLOW_START_MS`, after the
/// configuration is loaded and before reloads are set up, as a slow start
/// would (logged, so a test knows when it is held).
pub async fn slow_start() {
    static SLOW: OnceLock<Option<Duration>> = OnceLock::new();
    if let Some(slow) = millis(&SLOW, "LOOPGUARD_TEST_SLOW_START_MS") {
        tracing::warn!(ms = slow.as_millis() as u64, "test fault: start held");
        tokio::time::sleep(slow).await;
    }
}
