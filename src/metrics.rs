//! Prometheus metrics (contract §8). Labels only ever take values from small
//! fixed sets (kinds, decisions, rule names, reasons, visibilities) or from
//! the configuration (the JetStream stream and consumer), never a world,
//! agent or message value.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::routing::Visibility;
use crate::rules::RuleName;
use crate::subject::SenderKind;

/// Every metric loopguard exports, registered in its own registry.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// Every labelled counter, resolved once per label value so that
    /// counting on the hot path is one atomic add (no label hashing).
    counters: Arc<Counters>,
    pub decision_duration: Histogram,
    pub worlds: IntGauge,
    pub state_bytes: IntGauge,
    pub nats_connected: IntGauge,
    /// Taken from the client's count of connections (see
    /// [`Metrics::sync_client_counts`]).
    nats_reconnects: IntCounter,
    /// 1 while `/readyz` answers 200; what "not ready" alerts watch.
    pub ready: IntGauge,
    dropped: IntCounterVec,
    /// Policy hook outcomes: [approve, reject, timeout, error, skipped,
    /// backlog].
    policy: [IntCounter; 6],
    /// Time the policy service took to answer (or to time out).
    pub policy_duration: Histogram,
    /// Worlds per conversation state, by `Conversation as usize`.
    by_state: [IntGauge; 5],
    /// Configuration reloads: [succeeded, refused].
    reloads: [IntCounter; 2],
    /// 0 from a refused reload until one succeeds: the file in place is
    /// one the next start refuses.
    last_reload_ok: IntGauge,
    /// Worlds the state let go: made room for others, or idle.
    pub evicted: Evicted,
    /// The JetStream consumer's counts, by stream and consumer: what waits
    /// for loopguard, and what it holds unacknowledged.
    jetstream: [IntGaugeVec; 2],
    /// When each drop reason was last logged, and how many since.
    drop_log: Arc<[LogLimit; DropReason::ALL.len()]>,
    /// The client's own counts of its connections and of what it dropped
    /// for a full subscription.
    client: Arc<ClientCounts>,
}

/// The NATS client's counts of its connections and of the messages it
/// dropped because their subscription was full (patched async-nats:
/// vendor/async-nats/PATCH.md), and how much of each the metrics hold.
#[derive(Default)]
struct ClientCounts {
    stats: OnceLock<Arc<async_nats::Statistics>>,
    reconnects: AtomicU64,
    drops: AtomicU64,
    /// The drops in all at the last log line about them.
    logged_drops: AtomicU64,
}

/// Adds to `counter` what `total` holds beyond `counted`, and keeps
/// `total` as counted: each unit once, however the calls interleave.
fn take_count(total: u64, counted: &AtomicU64, counter: &IntCounter) {
    let before = counted.fetch_max(total, Ordering::Relaxed);
    if total > before {
        counter.inc_by(total - before);
    }
}

/// The counters of `loopguard_world_evictions_total`, by cause, which the
/// world cache counts into as it lets worlds go.
#[derive(Clone)]
pub struct Evicted {
    pub size: IntCounter,
    pub idle: IntCounter,
}

/// The counts of loopguard's JetStream consumer
/// (`loopguard_jetstream_pending`, `loopguard_jetstream_ack_pending`),
/// set from each reading of them. A reading that fails takes them away
/// until one succeeds: counts no longer known are neither shown nor
/// alerted on as current.
#[derive(Clone)]
pub struct ConsumerCounts {
    gauges: [IntGaugeVec; 2],
    /// Stream and consumer.
    labels: [String; 2],
}

impl ConsumerCounts {
    /// The consumer's counts, as read: `pending` messages not delivered
    /// yet, `ack_pending` delivered and not acknowledged.
    pub fn set(&self, pending: u64, ack_pending: u64) {
        let labels = [self.labels[0].as_str(), self.labels[1].as_str()];
        for (gauge, n) in self.gauges.iter().zip([pending, ack_pending]) {
            gauge
                .with_label_values(&labels)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The counts could not be read.
    pub fn unknown(&self) {
        let labels = [self.labels[0].as_str(), self.labels[1].as_str()];
        for gauge in &self.gauges {
            // Err: not set since the last failure.
            let _ = gauge.remove_label_values(&labels);
        }
    }
}

/// Why a message was lost or an output not sent: the `reason` label of
/// `loopguard_dropped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// loopguard's subscription buffer was full (`nats.subscription_capacity`).
    SlowConsumer,
    /// The server dropped messages to loopguard, which read too slowly.
    ServerSlowConsumer,
    /// Reserved for a NATS client error that loses a message. async-nats
    /// 0.51 reports none: its client errors are failed connection attempts,
    /// which [`Metrics::client_error`] logs without counting.
    ClientError,
    /// A copy, notice or event could not be published.
    PublishError,
}

impl DropReason {
    pub const ALL: [DropReason; 4] = [
        DropReason::SlowConsumer,
        DropReason::ServerSlowConsumer,
        DropReason::ClientError,
        DropReason::PublishError,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            DropReason::SlowConsumer => "slow_consumer",
            DropReason::ServerSlowConsumer => "server_slow_consumer",
            DropReason::ClientError => "client_error",
            DropReason::PublishError => "publish_error",
        }
    }
}

struct Counters {
    /// `[kind][outcome]`
    messages: [[IntCounter; 3]; 3],
    /// by `RuleName as usize`
    suppressed: Vec<IntCounter>,
    would_suppress: Vec<IntCounter>,
    handoffs: [IntCounter; 2],
    deliveries: [IntCounter; 2],
}

/// How often a [`LogLimit`] lets a line through: the drop log (one per
/// reason), NATS client errors, the HTTP server's failed accepts.
const LOG_LIMIT_INTERVAL: Duration = Duration::from_secs(10);

/// One line every ten seconds for a fault that repeats: the first at once,
/// then one per interval, with how many times it happened since the last.
#[derive(Default)]
pub struct LogLimit {
    last: Mutex<Option<Instant>>,
    since: AtomicU64,
}

impl LogLimit {
    /// Counts one more; `Some(count)` (this one included, since the last
    /// line) when a line is due.
    pub fn due(&self) -> Option<u64> {
        self.due_at(Instant::now())
    }

    fn due_at(&self, now: Instant) -> Option<u64> {
        let since = self.since.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| now.duration_since(t) < LOG_LIMIT_INTERVAL) {
            return None;
        }
        *last = Some(now);
        self.since.store(0, Ordering::Relaxed);
        Some(since)
    }
}

/// The `decision` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Approved,
    Edited,
    Rejected,
}

impl Outcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Approved => "approved",
            Outcome::Edited => "edited",
            Outcome::Rejected => "rejected",
        }
    }
}

/// The `reason` label of hand-backs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    TurnLimit,
    Pass,
}

impl Handoff {
    pub const fn as_str(self) -> &'static str {
        match self {
            Handoff::TurnLimit => "turn_limit",
            Handoff::Pass => "pass",
        }
    }
}

/// `metric`, registered in `registry`.
fn registered<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: M,
) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("each metric is registered once");
    metric
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels);
            registered(
                &registry,
                c.expect("metric definitions are static and valid"),
            )
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels);
            registered(
                &registry,
                g.expect("metric definitions are static and valid"),
            )
        };
        let messages = counter_vec(
            "loopguard_messages_total",
            "Ingress messages decided, by sender kind and decision.",
            &["kind", "decision"],
        );
        let suppressed = counter_vec(
            "loopguard_suppressed_total",
            "Messages rejected, by the rule that rejected them.",
            &["rule"],
        );
        let would_suppress = counter_vec(
            "loopguard_would_suppress_total",
            "Messages a rule would have rejected in observe mode, by rule.",
            &["rule"],
        );
        let handoffs = counter_vec(
            "loopguard_handoffs_total",
            "Control handed back to a human, by reason.",
            &["reason"],
        );
        let deliveries = counter_vec(
            "loopguard_deliveries_total",
            "Copies published: public transcript (notices included) or private inboxes.",
            &["visibility"],
        );
        let decision_duration = Histogram::with_opts(
            HistogramOpts::new(
                "loopguard_decision_duration_seconds",
                "Time to decide one ingress message, parse to serialised output.",
            )
            // Up to 100 ms: a decision's time includes any while its
            // thread was preempted, the case a dashboard is opened for (a
            // p99 past the last bound reads as that bound).
            .buckets(vec![
                1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
                1e-2, 2.5e-2, 5e-2, 1e-1,
            ]),
        )
        .expect("static histogram");
        let worlds =
            IntGauge::new("loopguard_worlds", "Worlds held in state.").expect("static gauge");
        let state_bytes = IntGauge::new(
            "loopguard_state_bytes",
            "Bytes of world state held, as weighed against state.max_bytes.",
        )
        .expect("static gauge");
        let nats_connected = IntGauge::new(
            "loopguard_nats_connected",
            "1 while connected to NATS, else 0.",
        )
        .expect("static gauge");
        let nats_reconnects = IntCounter::new(
            "loopguard_nats_reconnects_total",
            "Connections to NATS re-established after a loss.",
        )
        .expect("static counter");
        let kinds = [SenderKind::Agent, SenderKind::Human, SenderKind::System];
        let outcomes = [Outcome::Approved, Outcome::Edited, Outcome::Rejected];
        let counters = Counters {
            messages: kinds
                .map(|k| outcomes.map(|o| messages.with_label_values(&[k.as_str(), o.as_str()]))),
            suppressed: RuleName::ALL
                .iter()
                .map(|r| suppressed.with_label_values(&[r.as_str()]))
                .collect(),
            would_suppress: RuleName::ALL
                .iter()
                .map(|r| would_suppress.with_label_values(&[r.as_str()]))
                .collect(),
            handoffs: [Handoff::TurnLimit, Handoff::Pass]
                .map(|h| handoffs.with_label_values(&[h.as_str()])),
            deliveries: [Visibility::Public, Visibility::Private]
                .map(|v| deliveries.with_label_values(&[v.as_str()])),
        };
        let dropped = counter_vec(
            "loopguard_dropped_total",
            "Messages lost or outputs not sent, by reason (server_slow_consumer and publish_error are lower bounds; slow_consumer in JetStream mode is redelivered).",
            &["reason"],
        );
        // Every reason from zero, like the other counters: a series born at
        // its first drop would start at that burst's count, and `rate()`,
        // the alert's, would not see the burst.
        for reason in DropReason::ALL {
            dropped.with_label_values(&[reason.as_str()]);
        }
        let by_state_vec = gauge_vec(
            "loopguard_worlds_by_state",
            "Worlds held, by conversation state (cold, warming, hot, cooling, concluded).",
            &["state"],
        );
        let by_state =
            crate::state::Conversation::ALL.map(|c| by_state_vec.with_label_values(&[c.as_str()]));
        let policy_vec = counter_vec(
            "loopguard_policy_requests_total",
            "Policy hook requests, by outcome: approve, reject, timeout, error; and not sent: skipped (the service left the last ones unanswered, or the shutdown's grace period was over), backlog (the world had too many waiting).",
            &["outcome"],
        );
        let policy = [
            "approve", "reject", "timeout", "error", "skipped", "backlog",
        ]
        .map(|o| policy_vec.with_label_values(&[o]));
        let policy_duration = Histogram::with_opts(
            HistogramOpts::new(
                "loopguard_policy_duration_seconds",
                "Time the policy service took to answer, timeouts included.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0,
            ]),
        )
        .expect("static histogram");
        let policy_duration = registered(&registry, policy_duration);
        let reloads_vec = counter_vec(
            "loopguard_config_reloads_total",
            "Configuration reloads (SIGHUP, or a change to the watched file), by result: success, or failure (the old configuration stays).",
            &["result"],
        );
        let reloads = ["success", "failure"].map(|r| reloads_vec.with_label_values(&[r]));
        let evicted_vec = counter_vec(
            "loopguard_world_evictions_total",
            "Worlds dropped from state, by cause: size (to make room within state.max_worlds or state.max_bytes) or idle (silent for state.idle_seconds). An evicted world's turns, depth and duplicate history start again.",
            &["cause"],
        );
        let evicted = Evicted {
            size: evicted_vec.with_label_values(&["size"]),
            idle: evicted_vec.with_label_values(&["idle"]),
        };
        // Series only in JetStream mode, and only while the counts are known.
        let jetstream = [
            gauge_vec(
                "loopguard_jetstream_pending",
                "Messages in loopguard's JetStream stream its consumer has not delivered yet (the intake backlog), as last read from the server; absent while unknown.",
                &["stream", "consumer"],
            ),
            gauge_vec(
                "loopguard_jetstream_ack_pending",
                "Messages its JetStream consumer delivered to loopguard and loopguard has not acknowledged yet (awaiting redelivery included), as last read from the server; absent while unknown.",
                &["stream", "consumer"],
            ),
        ];
        let last_reload_ok = IntGauge::new(
            "loopguard_config_last_reload_successful",
            "0 from a refused configuration reload until one succeeds (the file in place is one the next start refuses); 1 otherwise, and at start.",
        )
        .expect("static gauge");
        last_reload_ok.set(1);
        let ready = IntGauge::new(
            "loopguard_ready",
            "1 while connected to NATS, subscribed, refused nothing by the server's permissions and not draining (what /readyz answers).",
        )
        .expect("static gauge");
        for c in [
            Box::new(decision_duration.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(worlds.clone()),
            Box::new(state_bytes.clone()),
            Box::new(nats_connected.clone()),
            Box::new(nats_reconnects.clone()),
            Box::new(ready.clone()),
            Box::new(last_reload_ok.clone()),
        ] {
            registry
                .register(c)
                .expect("each metric is registered once");
        }
        #[cfg(target_os = "linux")]
        if let Err(e) = registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        )) {
            tracing::warn!(error = %e, "process metrics unavailable");
        }
        Metrics {
            registry,
            counters: Arc::new(counters),
            decision_duration,
            worlds,
            state_bytes,
            nats_connected,
            nats_reconnects,
            ready,
            dropped,
            reloads,
            last_reload_ok,
            evicted,
            jetstream,
            policy,
            policy_duration,
            by_state,
            drop_log: Arc::new(Default::default()),
            client: Arc::default(),
        }
    }

    /// The gauges of the JetStream consumer `consumer` on `stream`.
    pub fn consumer_counts(&self, stream: &str, consumer: &str) -> ConsumerCounts {
        ConsumerCounts {
            gauges: self.jetstream.clone(),
            labels: [stream.to_owned(), consumer.to_owned()],
        }
    }

    /// Sets the per-state world counts.
    pub fn set_worlds_by_state(&self, counts: [i64; 5]) {
        for (gauge, n) in self.by_state.iter().zip(counts) {
            gauge.set(n);
        }
    }

    /// Counts a policy hook answer.
    pub fn policy(&self, outcome: &crate::judge::PolicyOutcome) {
        use crate::judge::{PolicyFailure, PolicyOutcome};
        let i = match outcome {
            PolicyOutcome::Approve => 0,
            PolicyOutcome::Reject(_) => 1,
            PolicyOutcome::Failed { failure, .. } => match failure {
                PolicyFailure::Timeout => 2,
                PolicyFailure::Error => 3,
                PolicyFailure::Skipped => 4,
            },
        };
        self.policy[i].inc();
    }

    /// Counts an agent message rejected undecided, its world's backlog
    /// behind the policy service full (`Judge::shed`).
    pub fn policy_backlog(&self) {
        self.policy[5].inc();
    }

    /// Counts a configuration reload attempt, and keeps whether the last
    /// one succeeded.
    pub fn reload(&self, ok: bool) {
        self.reloads[usize::from(!ok)].inc();
        self.last_reload_ok.set(i64::from(ok));
    }

    /// Whether the last configuration reload succeeded (true before any).
    pub fn last_reload_ok(&self) -> bool {
        self.last_reload_ok.get() == 1
    }

    /// Counts a drop and logs it, at most once per reason every ten
    /// seconds, with how many happened since the last line.
    pub fn dropped(&self, reason: DropReason, detail: &dyn std::fmt::Display) {
        self.dropped.with_label_values(&[reason.as_str()]).inc();
        self.log_limited(reason, detail);
    }

    /// Counts, from now on, `client`'s reconnects and the messages it
    /// drops because their subscription is full (see
    /// [`Metrics::sync_client_counts`]).
    pub fn count_client(&self, client: &async_nats::Client) {
        let _ = self.client.stats.set(client.statistics());
        self.sync_client_counts();
    }

    /// Takes into `loopguard_nats_reconnects_total` and
    /// `loopguard_dropped_total{reason="slow_consumer"}` the reconnects and
    /// the drops for a full subscription since the last call, from the
    /// client's own counts: the event each raises can itself be dropped
    /// (the client's event queue holds 128), as it is in a flood of drops,
    /// when the server may well close the connection too. Called at each
    /// such event and at each scrape. Returns the client's drops in all.
    pub fn sync_client_counts(&self) -> u64 {
        let Some(stats) = self.client.stats.get() else {
            return 0;
        };
        // The first connection is no reconnect.
        let connects = stats.connects.load(Ordering::Relaxed);
        take_count(
            connects.saturating_sub(1),
            &self.client.reconnects,
            &self.nats_reconnects,
        );
        let drops = stats.dropped_messages.load(Ordering::Relaxed);
        let counter = self
            .dropped
            .with_label_values(&[DropReason::SlowConsumer.as_str()]);
        take_count(drops, &self.client.drops, &counter);
        drops
    }

    /// The client's event for a message it dropped, its subscription `sid`
    /// full: counts its drops and logs, at most once every ten seconds.
    /// The line's count is of drops, not of the events that got through.
    pub fn client_dropped(&self, sid: u64) {
        let total = self.sync_client_counts();
        let reason = DropReason::SlowConsumer;
        if self.drop_log[reason as usize].due().is_none() {
            return;
        }
        let count =
            total.saturating_sub(self.client.logged_drops.fetch_max(total, Ordering::Relaxed));
        tracing::warn!(
            reason = reason.as_str(), count, total,
            detail = %format_args!("subscription {sid} buffer full; raise nats.subscription_capacity"),
            "messages dropped"
        );
    }

    /// Logs an error the NATS client reported (a connection attempt that
    /// failed: `detail` says why, `servers` which were tried), at most once
    /// every ten seconds: no message is lost by it, so it is not counted as
    /// a drop (`loopguard_nats_connected` and `LoopguardNatsDisconnected`
    /// tell of the outage).
    pub fn client_error(&self, detail: &dyn std::fmt::Display, servers: &str) {
        let Some(since) = self.drop_log[DropReason::ClientError as usize].due() else {
            return;
        };
        tracing::warn!(count = since, %detail, servers, "NATS client error");
    }

    fn log_limited(&self, reason: DropReason, detail: &dyn std::fmt::Display) {
        let Some(since) = self.drop_log[reason as usize].due() else {
            return;
        };
        tracing::warn!(reason = reason.as_str(), count = since, %detail, "messages dropped");
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let families = self.registry.gather();
        if let Err(e) =
            prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &families, &mut out)
        {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        out
    }

    pub fn message(&self, kind: SenderKind, outcome: Outcome) {
        self.counters.messages[kind as usize][outcome as usize].inc();
    }

    pub fn suppressed(&self, rule: RuleName) {
        self.counters.suppressed[rule as usize].inc();
    }

    pub fn would_suppress(&self, rule: RuleName) {
        self.counters.would_suppress[rule as usize].inc();
    }

    pub fn handoff(&self, reason: Handoff) {
        self.counters.handoffs[reason as usize].inc();
    }

    /// Counts one copy published to the transcript or to an inbox.
    pub fn delivered(&self, to: Visibility) {
        self.counters.deliveries[to as usize].inc();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeating_fault_is_logged_at_once_then_once_an_interval_with_its_count() {
        let limit = LogLimit::default();
        let start = Instant::now();
        let at = |secs: f64| start + Duration::from_secs_f64(secs);
        assert_eq!(limit.due_at(at(0.0)), Some(1));
        // Every 50 ms for just under the interval: counted, not logged.
        let quiet: Vec<_> = (1..200)
            .map(|i| limit.due_at(at(f64::from(i) * 0.05)))
            .collect();
        assert!(quiet.iter().all(Option::is_none), "{quiet:?}");
        assert_eq!(limit.due_at(at(10.0)), Some(200));
        assert_eq!(limit.due_at(at(10.5)), None);
        assert_eq!(limit.due_at(at(60.0)), Some(2));
    }
    #[test]
    fn a_count_taken_from_a_total_adds_each_unit_once() {
        let counter = IntCounter::new("c", "c").unwrap();
        let counted = AtomicU64::new(0);
        for (total, want) in [(5, 5), (3, 5), (5, 5), (7, 7), (0, 7)] {
            take_count(total, &counted, &counter);
            assert_eq!(counter.get(), want, "after a total of {total}");
        }
    }

    #[test]
    fn consumer_counts_are_shown_while_known_and_only_then() {
        let metrics = Metrics::new();
        let text = || String::from_utf8(metrics.encode()).unwrap();
        let counts = metrics.consumer_counts("INGEST", "lg");
        assert!(!text().contains("loopguard_jetstream"), "{}", text());
        counts.set(7, 3);
        let shown = text();
        for line in [
            r#"loopguard_jetstream_pending{consumer="lg",stream="INGEST"} 7"#,
            r#"loopguard_jetstream_ack_pending{consumer="lg",stream="INGEST"} 3"#,
        ] {
            assert!(shown.lines().any(|l| l == line), "{line} not in {shown}");
        }
        counts.unknown();
        assert!(!text().contains("loopguard_jetstream"), "{}", text());
        // Twice unknown is no error, and a reading brings them back.
        counts.unknown();
        counts.set(0, u64::MAX);
        assert!(
            text().contains(r#"_ack_pending{consumer="lg",stream="INGEST"} 9223"#),
            "{}",
            text()
        );
    }
}
