//! Fault injection for the tests of what follows a bug or a stall, in debug
//! builds only. Each fault reads one `LOOPGUARD_TEST_*` variable (once,
//! but for the gates, read each time they are met).

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

/// The policy hook's timeout: `rules.policy.timeout_ms`, but in place of
/// its bound of 10 s, `LOOPGUARD_TEST_POLICY_TIMEOUT_MAX_MS` when set. A
/// test that holds a world behind a question the service never answers
/// gives the bound; the harness sets this far past it, so that a loaded
/// machine does not release the world while the test still sets up (a
/// test of the timeout itself gives less).
pub fn policy_timeout(configured: Duration) -> Duration {
    static LONGEST: OnceLock<Option<Duration>> = OnceLock::new();
    match millis(&LONGEST, "LOOPGUARD_TEST_POLICY_TIMEOUT_MAX_MS") {
        Some(longest)
            if configured == Duration::from_millis(crate::config::MAX_POLICY_TIMEOUT_MS) =>
        {
            longest
        }
        _ => configured,
    }
}

/// How long a tripped policy subject rests: `breaker::REST`, or
/// `LOOPGUARD_TEST_BREAKER_REST_MS` when set, so that a test of the rest
/// does not race its 5 s on a loaded machine.
pub fn breaker_rest(rest: Duration) -> Duration {
    static REST: OnceLock<Option<Duration>> = OnceLock::new();
    millis(&REST, "LOOPGUARD_TEST_BREAKER_REST_MS").unwrap_or(rest)
}

/// Holds up every HTTP request but the probes, on its blocking thread, as a
/// scrape of many worlds would, until the file `LOOPGUARD_TEST_HOLD_HANDLERS`
/// names exists (at most a minute), and says so in the log: a test then
/// knows how many handlers run, whatever the machine's pace.
pub fn hold_handler() {
    let Some(release) = std::env::var_os("LOOPGUARD_TEST_HOLD_HANDLERS") else {
        return;
    };
    tracing::warn!("test fault: handler held");
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while !std::path::Path::new(&release).exists() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Not a fault: the JetStream consumer's counts are read every
/// `LOOPGUARD_TEST_COUNTS_EVERY_MS`, not every 10 s, so that a test sees
/// them follow the consumer within its time.
pub fn counts_every() -> Option<Duration> {
    static EVERY: OnceLock<Option<Duration>> = OnceLock::new();
    millis(&EVERY, "LOOPGUARD_TEST_COUNTS_EVERY_MS").filter(|every| !every.is_zero())
}

/// Not a fault: a reply's write waits without progress at most
/// `LOOPGUARD_TEST_HTTP_WRITE_TIMEOUT_MS`, not `admin::WRITE_TIMEOUT`, so
/// that a test sees a connection closed within its time.
pub fn http_write_timeout() -> Option<Duration> {
    static TIMEOUT: OnceLock<Option<Duration>> = OnceLock::new();
    millis(&TIMEOUT, "LOOPGUARD_TEST_HTTP_WRITE_TIMEOUT_MS").filter(|t| !t.is_zero())
}

/// Holds up loopguard's start, after the configuration is loaded and
/// before reloads are set up, until the file `LOOPGUARD_TEST_HOLD_START`
/// names exists (at most a minute), and says so in the log: a test then
/// acts inside that window for certain, which is otherwise a few
/// microseconds.
pub async fn hold_start() {
    hold_until_released("LOOPGUARD_TEST_HOLD_START", "test fault: start held").await;
}

/// Holds up the JetStream intake's reopening of a lost consumer, after it
/// logged the loss, until the file `LOOPGUARD_TEST_HOLD_REOPEN` names
/// exists (at most a minute): a test then reads `/readyz` between the loss
/// and the reopening for certain, which can otherwise be milliseconds.
pub async fn hold_reopen() {
    hold_until_released("LOOPGUARD_TEST_HOLD_REOPEN", "test fault: reopening held").await;
}

/// Waits, when `var` names a file, until that file exists (at most a
/// minute), having logged `held`.
async fn hold_until_released(var: &str, held: &'static str) {
    let Some(release) = std::env::var_os(var) else {
        return;
    };
    tracing::warn!(release = ?release, "{held}");
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    while !std::path::Path::new(&release).exists() && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
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
