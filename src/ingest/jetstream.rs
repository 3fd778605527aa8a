//! JetStream ingest (`nats.jetstream.enabled`): at least once, no loss.
//!
//! `P.raw.>` and `P.join.>` are captured in a stream (created if absent,
//! verified if present) and read through a durable pull consumer with
//! explicit acknowledgements. A worker acknowledges a message only after the
//! outputs it produced were confirmed (see `Worker`): published and flushed,
//! or, with `egress_acks`, answered by the stream that captures them. So a
//! crash at any point leaves the message to be redelivered. Redelivery yields
//! the same `Nats-Msg-Id`s — ids come from the payload, the header, or the
//! stream sequence — so a stream that captures egress with deduplication
//! holds each approved message exactly once.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, stream, AckKind};
use futures::{FutureExt, StreamExt};

use super::{Delivery, Dispatcher};
use crate::config::{JetStreamConfig, Retention, Storage};
use crate::judge::Outbound;
use crate::subject::Subjects;

/// Why the stream or consumer cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JetStreamError {
    /// Misconfiguration: retrying will not help.
    #[error("stream {stream} exists but does not capture {missing}; add the subject or choose another nats.jetstream.stream")]
    Subjects { stream: String, missing: String },
    /// The server refused or did not answer (not reachable, JetStream off,
    /// not enough servers for the replicas, not permitted): retried, as an
    /// operator may fix it; the log line gives the server's reason.
    #[error("JetStream set-up: {0}")]
    Unavailable(String),
    /// The consumer named `nats.jetstream.consumer` exists but refuses
    /// loopguard's pull requests (a push consumer): retrying would not help.
    #[error("consumer {consumer} refuses loopguard's pulls ({reason}); delete it (nats consumer rm) so loopguard creates its own, or choose another nats.jetstream.consumer")]
    Refused { consumer: String, reason: String },
    /// The stream captures subjects besides loopguard's input: a consumer
    /// without a filter would read them and acknowledge them (on a work
    /// queue, deleting them), loopguard's own copies among them.
    #[error("stream {stream} captures {pattern}, which is not loopguard's input ({raw} and {join}): loopguard would read and acknowledge those messages too; narrow its subjects to those two (nats stream edit), or move the others to a stream of their own")]
    Broader {
        stream: String,
        pattern: String,
        raw: String,
        join: String,
    },
    /// The consumer named `nats.jetstream.consumer` exists with settings
    /// under which loopguard could lose messages.
    #[error("consumer {consumer} {reason}; edit it where the server allows (nats consumer edit), else delete it so loopguard creates its own (nats consumer rm: on an interest stream that deletes the messages it has not acknowledged)")]
    Unsuitable { consumer: String, reason: String },
}

impl JetStreamError {
    /// A misconfiguration, which retrying will not mend (the rest is the
    /// server's state, which may).
    pub fn is_misconfiguration(&self) -> bool {
        !matches!(self, JetStreamError::Unavailable(_))
    }
}

/// A pull from loopguard's consumer, and when its stream was created: a
/// stream created again (lost with a server restart, or deleted) numbers
/// its messages from 1 again.
pub struct Pull {
    pub messages: pull::Stream,
    pub created: async_nats::datetime::DateTime,
    /// The consumer's own `max_ack_pending` (an existing one keeps its
    /// own): with the config's, it sizes [`Replay`].
    pub max_ack_pending: u64,
    /// The consumer's own `ack_wait`, which bounds how long answers to
    /// copies may be awaited (`egress_acks`).
    pub ack_wait: Duration,
    /// Whether the stream is a work queue (its own retention, which an
    /// existing stream keeps whatever the config says): see [`run`].
    pub workqueue: bool,
}

/// Decisions whose acknowledgement may not have reached the server, by
/// [`ReplayKey`] (the stream sequence): a redelivery while the first outputs are not yet
/// confirmed (in flight, or a NATS outage of any length) republishes them
/// instead of deciding again (which would see its own earlier approval,
/// e.g. as a duplicate).
///
/// Two tiers, so that the traffic after an outage cannot push out the
/// decisions the outage left unacknowledged: `unacked` holds a decision
/// until its message is acknowledged, and only then moves to `acked`,
/// which keeps the latest ones in case that acknowledgement was slow or
/// lost. Each tier drops its least recently used first; together
/// they hold at most twice `max_ack_pending` decisions,
/// [`REPLAY_BYTES_PER_DECISION`] each on average: three quarters of that for
/// `unacked` (the server delivers at most `max_ack_pending` unacknowledged
/// messages, so theirs fit while they average 1.5 times that; larger ones
/// are dropped, logged by [`Dropped`]), a quarter for `acked`.
#[derive(Clone)]
pub struct Replay {
    unacked: Tier,
    acked: Tier,
    /// The `max_ack_pending` it was sized for.
    sized_for: u64,
    /// The stream's generation now (see [`ReplayKey`]), shared with the
    /// workers (see [`Replay::current`]).
    generation: Arc<AtomicU32>,
}

/// One tier of [`Replay`]: decisions by message.
type Tier = moka::sync::Cache<ReplayKey, Arc<[Outbound]>>;

/// Whether a pulled message was delivered before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Not before: decided.
    New,
    /// Redelivered (or, on a work queue, delivered again by a new
    /// consumer: what is left there was never finished): a decision held
    /// for it, acknowledged or not, is republished.
    Redelivered,
    /// Delivered again by a new consumer on a `limits` or `interest`
    /// stream, which starts at the stream's first message, finished ones
    /// too: a decision held unacknowledged is republished; a finished
    /// message is decided again.
    Reread,
}

/// A message in [`Replay`]: its stream's generation (how often loopguard
/// has found the stream created again, numbering from 1 again) and its
/// stream sequence. With the generation, a worker still finishing a
/// message of the old stream cannot store or remove a decision under a
/// number that now names another message.
pub type ReplayKey = (u32, u64);

/// What a decision may hold on average in [`Replay`]. A decision is
/// weighed at its copies' bytes but at least this, so typical ones are
/// bounded by count and large ones by bytes: bounded by count alone,
/// 20,000 (the default) human messages of 64 KiB of control characters
/// could hold about 8 GB (estimated from their copies' size).
const REPLAY_BYTES_PER_DECISION: u32 = 4096;

impl Replay {
    /// Sized for `max_ack_pending` unacknowledged messages.
    pub fn new(max_ack_pending: u64) -> Replay {
        let quarter = max_ack_pending.saturating_mul(u64::from(REPLAY_BYTES_PER_DECISION) / 2);
        let dropped = Arc::new(Dropped::default());
        let unacked = tier(quarter.saturating_mul(3))
            .eviction_listener(move |_, _, cause| {
                if cause == moka::notification::RemovalCause::Size {
                    dropped.log();
                }
            })
            .build();
        Replay {
            unacked,
            acked: tier(quarter).build(),
            sized_for: max_ack_pending,
            generation: Arc::default(),
        }
    }

    /// A consumer opened again may allow more unacknowledged messages than
    /// this was sized for (created again with the config's, or edited):
    /// said once a reopening, as their decisions may then be dropped.
    pub fn check_size(&self, max_ack_pending: u64) {
        if max_ack_pending > self.sized_for {
            tracing::warn!(
                max_ack_pending,
                sized_for = self.sized_for,
                "the consumer now allows more unacknowledged messages than the decisions held for redelivery were sized for; restart loopguard to size them again"
            );
        }
    }

    /// The decision of a message delivered before, if held. One found
    /// among the acknowledged is unacknowledged again (it was delivered
    /// again), so it moves back.
    pub fn get(&self, key: ReplayKey) -> Option<Arc<[Outbound]>> {
        if let Some(outbound) = self.unacked.get(&key) {
            return Some(outbound);
        }
        let outbound = self.acked.remove(&key)?;
        self.unacked.insert(key, outbound.clone());
        Some(outbound)
    }

    /// The decision of a message delivered before, only if it was never
    /// acknowledged.
    pub fn unacknowledged(&self, key: ReplayKey) -> Option<Arc<[Outbound]>> {
        self.unacked.get(&key)
    }

    /// Whether a decision is held that a message delivered again (`seen`)
    /// would be republished from (see [`Replay::get`] and
    /// [`Replay::unacknowledged`]), without moving it.
    pub fn holds(&self, key: ReplayKey, seen: Seen) -> bool {
        match seen {
            Seen::New => false,
            Seen::Redelivered => self.unacked.contains_key(&key) || self.acked.contains_key(&key),
            Seen::Reread => self.unacked.contains_key(&key),
        }
    }

    /// A message decided and not acknowledged yet.
    pub fn insert(&self, key: ReplayKey, outbound: Arc<[Outbound]>) {
        self.unacked.insert(key, outbound);
    }

    /// The message is acknowledged: its decision is held a while longer,
    /// among the acknowledged, for a redelivery should that acknowledgement
    /// be slow or lost.
    pub fn acknowledged(&self, key: ReplayKey) {
        if let Some(outbound) = self.unacked.remove(&key) {
            self.acked.insert(key, outbound);
        }
    }

    /// The stream was created again, and its messages are now of
    /// `generation`: the decisions held are of messages it no longer has.
    pub fn new_generation(&self, generation: u32) {
        self.generation.store(generation, Ordering::Relaxed);
        self.unacked.invalidate_all();
        self.acked.invalidate_all();
    }

    /// Whether a message is of the stream as it is, not of one it replaced
    /// (created again since): only then is it acknowledged, handed back or
    /// said to be in progress. Its acknowledgement subject names its
    /// stream sequence, which in the new stream names another message: the
    /// server would settle that one.
    pub fn current(&self, key: ReplayKey) -> bool {
        key.0 == self.generation.load(Ordering::Relaxed)
    }
}

/// Decisions awaiting acknowledgement dropped for room: they weighed more
/// than 1.5 times [`REPLAY_BYTES_PER_DECISION`] on average, or the consumer
/// allows more of them than [`Replay`] was sized for. Their redelivery, if any,
/// is decided again, and may then be judged by its own first approval
/// (e.g. as a duplicate). Logged at most every ten seconds.
#[derive(Default)]
struct Dropped {
    since: std::sync::atomic::AtomicU64,
    last: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Dropped {
    fn log(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.since.fetch_add(1, Relaxed);
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        if last.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(10)) {
            *last = Some(now);
            let count = self.since.swap(0, Relaxed);
            tracing::warn!(
                count,
                "decisions awaiting acknowledgement dropped for room (more than 6 KiB each on average, or more unacknowledged messages than the consumer's max_ack_pending when loopguard started): a redelivery of theirs is decided again; lower the consumer's max_ack_pending (nats consumer edit)"
            );
        }
    }
}

/// One tier of [`Replay`], of `capacity` bytes.
fn tier(capacity: u64) -> moka::sync::CacheBuilder<ReplayKey, Arc<[Outbound]>, Tier> {
    // moka refuses an entry heavier than the whole cache: one that large
    // is weighed as the whole, and held alone.
    let heaviest = u32::try_from(capacity).unwrap_or(u32::MAX);
    moka::sync::Cache::builder()
        .max_capacity(capacity)
        .weigher(move |_, outbound: &Arc<[Outbound]>| weight(outbound).min(heaviest))
        // Least recently used, not moka's default TinyLFU: that admits a
        // new entry only if it was asked for more often than the one it
        // would evict, so once full it kept the oldest decisions and
        // refused every new one.
        .eviction_policy(moka::policy::EvictionPolicy::lru())
}

/// The bytes a decision holds (payloads, subjects, ids), at least
/// [`REPLAY_BYTES_PER_DECISION`]. A message's copies share one body, next
/// to each other: it counts once.
fn weight(outbound: &[Outbound]) -> u32 {
    let mut bytes = 0;
    let mut previous: Option<&bytes::Bytes> = None;
    for o in outbound {
        bytes += std::mem::size_of::<Outbound>()
            + o.subject.len()
            + o.msg_id.as_ref().map_or(0, String::len);
        if previous.is_none_or(|p| p.as_ptr() != o.payload.as_ptr()) {
            bytes += o.payload.len();
        }
        previous = Some(&o.payload);
    }
    u32::try_from(bytes)
        .unwrap_or(u32::MAX)
        .max(REPLAY_BYTES_PER_DECISION)
}

/// The ingest stream's duplicate window: the server's least. nats-server
/// deduplicates by `Nats-Msg-Id` across a whole stream, so a raw message
/// whose header id another one carried within the window (any world, any
/// sender: ids are theirs to reuse, contract §9) would be dropped unjudged.
/// Its default of two minutes made that likely for agents numbering their
/// messages; it cannot be turned off.
pub const INGEST_DUPLICATE_WINDOW: Duration = Duration::from_millis(100);

/// Creates or verifies the stream, then creates or opens the consumer.
pub async fn consumer(
    client: &async_nats::Client,
    config: &JetStreamConfig,
    subjects: &Subjects,
    subscription_capacity: usize,
) -> Result<Pull, JetStreamError> {
    let unavailable = |e: &dyn std::fmt::Display| JetStreamError::Unavailable(e.to_string());
    let js = jetstream::new(client.clone());
    let wanted = [subjects.raw_wildcard(), subjects.join_wildcard()];
    let mut stream = js
        .get_or_create_stream(stream::Config {
            name: config.stream.clone(),
            subjects: wanted.to_vec(),
            retention: retention_of(config.retention),
            storage: match config.storage {
                Storage::File => stream::StorageType::File,
                Storage::Memory => stream::StorageType::Memory,
            },
            num_replicas: config.replicas,
            max_age: Duration::from_secs(config.max_age_seconds),
            max_bytes: limit(config.max_bytes),
            max_messages: limit(config.max_messages),
            duplicate_window: INGEST_DUPLICATE_WINDOW,
            ..Default::default()
        })
        .await
        .map_err(|e| unavailable(&e))?;
    let info = stream.info().await.map_err(|e| unavailable(&e))?.clone();
    for subject in &wanted {
        if !info.config.subjects.iter().any(|p| covers(p, subject)) {
            return Err(JetStreamError::Subjects {
                stream: config.stream.clone(),
                missing: subject.clone(),
            });
        }
    }
    let foreign = |p: &&String| !wanted.iter().any(|w| covers(w, p));
    if let Some(pattern) = info.config.subjects.iter().find(foreign) {
        return Err(JetStreamError::Broader {
            stream: config.stream.clone(),
            pattern: pattern.clone(),
            raw: wanted[0].clone(),
            join: wanted[1].clone(),
        });
    }
    if info.config.duplicate_window > INGEST_DUPLICATE_WINDOW {
        tracing::warn!(
            stream = %config.stream,
            duplicate_window = ?info.config.duplicate_window,
            "the existing stream drops a message whose Nats-Msg-Id header another one carried within its duplicate window, unjudged and uncounted; set the window to 100ms (nats stream edit {} --dupe-window 100ms)",
            config.stream
        );
    }
    let retention = &info.config.retention;
    if *retention != retention_of(config.retention) {
        tracing::warn!(
            stream = %config.stream, retention = ?retention,
            "the existing stream keeps its own retention, not nats.jetstream.retention's"
        );
    }
    let consumer: jetstream::consumer::Consumer<pull::Config> = stream
        .get_or_create_consumer(
            &config.consumer,
            pull::Config {
                durable_name: Some(config.consumer.clone()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(config.ack_wait_seconds),
                max_ack_pending: i64::try_from(config.max_ack_pending).unwrap_or(i64::MAX),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| match e.kind() {
            stream::ConsumerErrorKind::InvalidConsumerType => JetStreamError::Refused {
                consumer: config.consumer.clone(),
                reason: e.to_string(),
            },
            _ => unavailable(&e),
        })?;
    // An existing consumer keeps the settings it was created with.
    let held = &consumer.cached_info().config;
    if let Some(reason) = unsuitable(held, &wanted) {
        return Err(JetStreamError::Unsuitable {
            consumer: config.consumer.clone(),
            reason,
        });
    }
    let ack_wait = Duration::from_secs(config.ack_wait_seconds);
    if held.ack_wait != ack_wait
        || held.max_ack_pending != i64::try_from(config.max_ack_pending).unwrap_or(i64::MAX)
    {
        tracing::warn!(
            consumer = %config.consumer,
            ack_wait_seconds = held.ack_wait.as_secs(),
            max_ack_pending = held.max_ack_pending,
            "the existing consumer keeps its own ack_wait and max_ack_pending, not nats.jetstream's; edit it (nats consumer edit) to apply them, or delete it (nats consumer rm; on an interest stream that also deletes the messages no other consumer wants)"
        );
    }
    if held.max_deliver > 0 {
        tracing::warn!(
            consumer = %config.consumer, max_deliver = held.max_deliver,
            "the existing consumer delivers a message at most max_deliver times: one left unfinished that often (an egress stream away, NATS unreachable) is not delivered again"
        );
    }
    tracing::info!(stream = %config.stream, consumer = %config.consumer, "JetStream consumer ready");
    // Each pull asks for a batch, and for the next one when half of it is
    // left, so up to one and a half batches are on their way into the
    // subscription: kept within `nats.subscription_capacity`, where the
    // client would drop what overflows (a slow consumer, counted as lost,
    // and redelivered out of order after `ack_wait`).
    let batch = (subscription_capacity / 2).clamp(1, PULL_BATCH);
    let batch = match usize::try_from(held.max_batch) {
        Ok(max) if max > 0 => batch.min(max),
        _ => batch,
    };
    let messages = consumer
        .stream()
        .max_messages_per_batch(batch)
        .heartbeat(PULL_HEARTBEAT)
        .messages()
        .await
        .map_err(|e| unavailable(&e))?;
    Ok(Pull {
        messages,
        created: info.created,
        // Unlimited (-1): the config's.
        max_ack_pending: u64::try_from(held.max_ack_pending)
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or(config.max_ack_pending),
        ack_wait: held.ack_wait,
        workqueue: *retention == stream::RetentionPolicy::WorkQueue,
    })
}

/// How often [`watch_counts`] reads the consumer's counts.
const COUNTS_EVERY: Duration = Duration::from_secs(10);

/// How long a reading of the counts may take before it counts as failed.
const COUNTS_TIMEOUT: Duration = Duration::from_secs(5);

/// Keeps `counts` at those of loopguard's consumer, read from the server
/// every [`COUNTS_EVERY`] until `stop` resolves: the messages waiting in
/// the stream for loopguard (its intake backlog, which grows while
/// loopguard falls behind or stops pulling) and those delivered to it and
/// not acknowledged (awaiting redelivery included). A reading that fails
/// (NATS away, the consumer being set up again) leaves them unknown until
/// one succeeds, logged as it starts and as it ends. So are they once
/// `stop` resolves: a drain's would be stale.
///
/// Read, not counted here: other instances on the same consumer, and
/// messages published while loopguard is away, are in the server's counts.
pub async fn watch_counts(
    client: async_nats::Client,
    config: JetStreamConfig,
    counts: crate::metrics::ConsumerCounts,
    stop: impl std::future::Future<Output = ()>,
) {
    #[cfg(debug_assertions)]
    let every = crate::fault::counts_every().unwrap_or(COUNTS_EVERY);
    #[cfg(not(debug_assertions))]
    let every = COUNTS_EVERY;
    let js = jetstream::new(client);
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    let mut failing = false;
    loop {
        let read = async {
            ticks.tick().await;
            let read = js.get_consumer_from_stream::<pull::Config, _, _>(
                config.consumer.as_str(),
                config.stream.as_str(),
            );
            tokio::time::timeout(COUNTS_TIMEOUT, read).await
        };
        let failure = match tokio::select! {
            biased;
            _ = &mut stop => break,
            read = read => read,
        } {
            Ok(Ok(consumer)) => {
                let info = consumer.cached_info();
                counts.set(info.num_pending, info.num_ack_pending as u64);
                None
            }
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("the server did not answer".to_owned()),
        };
        match failure {
            None if failing => {
                failing = false;
                tracing::info!("JetStream consumer counts read again");
            }
            None => {}
            Some(reason) => {
                counts.unknown();
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(%reason, "JetStream consumer counts unknown: loopguard_jetstream_pending and _ack_pending are left out until a reading succeeds");
                }
            }
        }
    }
    counts.unknown();
}

/// The stream retention a config asks for.
fn retention_of(retention: Retention) -> stream::RetentionPolicy {
    match retention {
        Retention::Workqueue => stream::RetentionPolicy::WorkQueue,
        Retention::Limits => stream::RetentionPolicy::Limits,
        Retention::Interest => stream::RetentionPolicy::Interest,
    }
}

/// Why an existing consumer's settings could lose messages, or would
/// deliver none, if they could: an acknowledgement that settles others too
/// (a worker's would settle another's unfinished ones), headers without
/// payloads, priority groups (nats-server 2.11 on refuses a pull that names
/// none, as loopguard's do: it would pull nothing, opening the consumer
/// again every 30 s while `/readyz` said 200), or a filter that leaves out
/// part of loopguard's input (`wanted`).
fn unsuitable(held: &jetstream::consumer::Config, wanted: &[String]) -> Option<String> {
    use jetstream::consumer::AckPolicy;
    if held.ack_policy != AckPolicy::Explicit {
        return Some(format!(
            "acknowledges with policy {:?}, not explicit: one acknowledgement would settle messages not yet finished",
            held.ack_policy
        ));
    }
    if held.headers_only {
        return Some("delivers headers only, without payloads".to_owned());
    }
    if !held.priority_groups.is_empty() {
        return Some(format!(
            "has priority groups ({}): the server delivers only to pulls that name one, and loopguard's name none",
            held.priority_groups.join(", ")
        ));
    }
    let filters: Vec<&str> = std::iter::once(&held.filter_subject)
        .chain(&held.filter_subjects)
        .map(String::as_str)
        .filter(|f| !f.is_empty())
        .collect();
    if filters.is_empty() {
        return None;
    }
    let missed = wanted
        .iter()
        .find(|w| !filters.iter().any(|f| covers(f, w)))?;
    Some(format!(
        "filters its messages ({}) and leaves out {missed}",
        filters.join(", ")
    ))
}

/// The egress families (`P.public.*`, `P.private.*.*`, `P.events.*`) that
/// a stream captures whole: loopguard sends those copies as JetStream
/// publishes and waits for the stream's answer (`egress_acks`). Only
/// those: a JetStream publish that reaches core subscribers and no stream
/// gets no answer at all. A stream that captures part of a family is
/// logged: that family's copies are flushed, not answered, and a NATS
/// restart can drop some.
pub async fn captured_egress(
    client: &async_nats::Client,
    subjects: &Subjects,
) -> Result<Vec<String>, JetStreamError> {
    let unavailable = |e: &dyn std::fmt::Display| {
        JetStreamError::Unavailable(format!(
            "egress_acks: cannot list the streams ($JS.API.STREAM.LIST): {e}"
        ))
    };
    let js = jetstream::new(client.clone());
    let mut streams = js.streams();
    // (stream, subject pattern, whether the stream answers publishes)
    let mut patterns = Vec::new();
    while let Some(info) = streams.next().await {
        let info = info.map_err(|e| unavailable(&e))?;
        // A `no_ack` stream (required of one on `>`) stores without
        // answering, and a sealed one stores nothing more.
        let answers = !info.config.no_ack && !info.config.sealed;
        for subject in info.config.subjects {
            patterns.push((info.config.name.clone(), subject, answers));
        }
    }
    let mut captured = Vec::new();
    for family in subjects.egress_wildcards() {
        let answering = patterns
            .iter()
            .find(|(_, p, answers)| *answers && covers(p, &family));
        if let Some((stream, _, _)) = answering {
            tracing::info!(%family, %stream, "egress answered by a stream (egress_acks)");
            captured.push(family);
        } else if let Some((stream, pattern, answers)) =
            patterns.iter().find(|(_, p, _)| overlaps(p, &family))
        {
            let why = match answers {
                true => "a stream captures part of an egress family: its copies are flushed, not answered by the stream (egress_acks needs one stream to capture the whole family)",
                false => "a stream that does not answer publishes (no_ack or sealed) captures egress: its copies are flushed, not answered",
            };
            tracing::warn!(%family, %stream, %pattern, "{why}");
        }
    }
    if captured.is_empty() {
        tracing::warn!("egress_acks is on, but no stream captures an egress family: every copy is flushed, not answered");
    }
    Ok(captured)
}

/// 0 means unlimited (-1 to the server).
fn limit(n: u64) -> i64 {
    if n == 0 {
        -1
    } else {
        i64::try_from(n).unwrap_or(i64::MAX)
    }
}

/// True when the stream subject `pattern` captures every subject `subject`
/// can match (`chat.>` covers `chat.raw.>`).
fn covers(pattern: &str, subject: &str) -> bool {
    let (mut p, mut s) = (pattern.split('.'), subject.split('.'));
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(t)) if t != ">" => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// True when the stream subject `pattern` and the wildcard `subject` can
/// both match some subject (`chat.public.w1` and `chat.public.*`).
fn overlaps(pattern: &str, subject: &str) -> bool {
    let (mut p, mut s) = (pattern.split('.'), subject.split('.'));
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some(a), Some(b)) if a == b || a == "*" || b == "*" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The least time between two openings of the consumer: a pull lost again
/// at once (a server that ends or fails every pull) is retried at this
/// pace, not in a busy loop.
const REOPEN_EVERY: Duration = Duration::from_secs(2);

/// What a pull error means for the pull.
enum PullError {
    /// Passing (a reconnect, a slow answer): the pull goes on.
    Passing,
    /// The pull will bring nothing more: open the consumer again. The pull
    /// request failed (after a reconnect the client could not find the
    /// consumer), no one answers it, or heartbeats were missed (the server
    /// lost the request, or is away).
    Lost,
    /// The consumer will never serve loopguard's pulls.
    Refused,
}

impl PullError {
    fn of(kind: pull::MessagesErrorKind) -> PullError {
        use pull::MessagesErrorKind::*;
        match kind {
            // RequestLimitExceeded: the client caps its pulls at the
            // consumer's limits when it opens them, so only limits lowered
            // since (`nats consumer edit`) are exceeded; opening again
            // reads them.
            Pull | NoResponders | MissingHeartbeat | RequestLimitExceeded => PullError::Lost,
            PushBasedConsumer => PullError::Refused,
            _ => PullError::Passing,
        }
    }
}

/// Pulls messages until `stop` resolves, and returns what was pulled but
/// not yet handed to a worker, for the caller to hand back once the workers
/// have handed back theirs (see [`Pulled::hand_back`]).
///
/// When the server ends the pull (the consumer was deleted) or stops
/// answering it (see [`PullError::Lost`]), `reopen` sets the stream and the
/// consumer up again, retrying while the server is away, and pulling goes
/// on. Its error (a misconfiguration: a stream that no longer captures
/// loopguard's subjects or captures others too, a consumer loopguard cannot
/// use), or a consumer that refuses loopguard's pulls, ends the intake.
///
/// A consumer opened again may deliver, for the first time, messages the
/// last one delivered: those up to the highest sequence seen count as
/// redelivered, so [`Replay`] republishes a decision it holds rather than
/// deciding again (which would see its own earlier approval). A stream
/// created again numbers from 1: then `replay` forgets every decision.
// The pull, what to do when it is lost and how to open it again, where
// messages go, and the settings.
#[allow(clippy::too_many_arguments)]
pub async fn run<E: From<JetStreamError>>(
    first: Pull,
    lost: impl Fn(),
    mut reopen: impl AsyncFnMut() -> Result<Option<Pull>, E>,
    dispatcher: &Dispatcher,
    replay: Option<&Replay>,
    config: &JetStreamConfig,
    subjects: &Subjects,
    stop: impl std::future::Future<Output = ()>,
) -> Result<Pulled, E> {
    let (raw, join) = (subjects.raw_wildcard(), subjects.join_wildcard());
    let (raw, join) = (raw.trim_end_matches('>'), join.trim_end_matches('>'));
    let stream = config.stream.as_str();
    tokio::pin!(stop);
    let (mut highest, mut seen_before, mut generation) = (0, 0, 0);
    let mut created = first.created;
    let mut next = Some(first);
    while let Some(pull) = next.take() {
        // On a work queue, a new consumer delivers what is left of the
        // stream: nothing acknowledged, so a message it has seen before was
        // decided and not finished. On other streams it starts from the
        // stream's first message, finished ones too: those are decided
        // again. The stream's own retention, not the config's.
        let workqueue = pull.workqueue;
        if let Some(replay) = replay {
            replay.check_size(pull.max_ack_pending);
        }
        if pull.created != created {
            tracing::warn!(%stream, "the stream was created again: its sequences start again");
            (highest, seen_before, created) = (0, 0, pull.created);
            generation += 1;
            if let Some(replay) = replay {
                replay.new_generation(generation);
            }
        }
        let opened = tokio::time::Instant::now();
        let mut messages = pull.messages;
        let why = loop {
            let item = tokio::select! {
                biased;
                _ = &mut stop => break None,
                item = messages.next() => item,
            };
            let message = match item {
                Some(Ok(m)) => m,
                Some(Err(e)) => match PullError::of(e.kind()) {
                    PullError::Passing => {
                        tracing::warn!(error = %e, "JetStream pull");
                        continue;
                    }
                    PullError::Lost => break Some(e.to_string()),
                    PullError::Refused => {
                        return Err(JetStreamError::Refused {
                            consumer: config.consumer.clone(),
                            reason: e.to_string(),
                        }
                        .into())
                    }
                },
                None => break Some("the server ended the pull".to_owned()),
            };
            let (sequence, delivered) = match message.info() {
                Ok(info) => (info.stream_sequence, info.delivered),
                Err(e) => {
                    tracing::warn!(error = %e, "JetStream message without delivery info; skipped");
                    continue;
                }
            };
            highest = highest.max(sequence);
            let (message, acker) = message.split();
            let subject = message.subject.as_str();
            if !subject.starts_with(raw) && !subject.starts_with(join) {
                // A stream edited since it was checked to capture more: not
                // ours to judge, nor to acknowledge (on a work queue that
                // would delete it). Handed back; the consumer opened again
                // then finds the stream broader, which stops loopguard (see
                // `JetStreamError::Broader`), as at start-up.
                if let Err(e) = acker.ack_with(AckKind::Nak(Some(HAND_BACK_DELAY))).await {
                    tracing::warn!(error = %e, "could not hand back a message; it comes back after ack_wait");
                }
                break Some(format!(
                    "the stream delivered a message on {subject:?}, which is not loopguard's input"
                ));
            }
            let seen = if delivered > 1 || (workqueue && sequence <= seen_before) {
                Seen::Redelivered
            } else if sequence <= seen_before {
                Seen::Reread
            } else {
                Seen::New
            };
            let delivery = Delivery {
                acker,
                key: (generation, sequence),
                seen,
                stable_id: format!("{stream}-{sequence}"),
                received: std::time::Instant::now(),
            };
            dispatcher.dispatch(message, Some(delivery)).await;
        };
        // Dropped before opening again: the old pull could still take a
        // batch that no one would read until `ack_wait` brings it back.
        let pulled = Pulled::take(messages);
        let Some(why) = why else {
            tracing::info!("shutdown: intake stopped");
            return Ok(pulled);
        };
        // At once, before the hand-back and the wait for it (up to about
        // 2.25 s in all): nothing comes in from here until the new pull.
        lost();
        let handed_back = pulled.hand_back().await;
        tracing::warn!(reason = %why, "JetStream consumer lost; opening the consumer again");
        #[cfg(debug_assertions)]
        crate::fault::hold_reopen().await;
        // Not before what was handed back is due again: a new pull any
        // sooner would get the messages after them first, a world's later
        // messages decided ahead of its earlier ones.
        let due = handed_back.map(|at| at + HAND_BACK_DELAY + HAND_BACK_MARGIN);
        let reopen_at = due.map_or(opened + REOPEN_EVERY, |due| due.max(opened + REOPEN_EVERY));
        tokio::select! {
            biased;
            _ = &mut stop => break,
            _ = tokio::time::sleep_until(reopen_at) => {}
        }
        next = reopen().await?;
        seen_before = highest;
    }
    tracing::info!("shutdown: intake stopped");
    Ok(Pulled::default())
}

/// What a pull brought in that no worker got, taken from the pull as it
/// ends. [`Pulled::hand_back`] gives it back to the server.
#[derive(Default)]
pub struct Pulled(Vec<jetstream::Message>);

impl Pulled {
    /// Ends a pull: the messages the client already holds are taken
    /// without waiting, then the pull is dropped (the server sends it
    /// nothing more). Messages still on their way then come back after
    /// `ack_wait`. With more than one runtime thread, taking the held
    /// messages can let the pull ask for a batch before it is dropped,
    /// which the server may send to the dropped pull: that batch too comes
    /// back after `ack_wait`.
    fn take(mut messages: pull::Stream) -> Pulled {
        let (mut held, mut errors) = (Vec::new(), 0);
        loop {
            // Unconstrained: the task's cooperative budget, spent, would
            // make the subscription look empty with messages still in it.
            match tokio::task::unconstrained(messages.next()).now_or_never() {
                Some(Some(Ok(m))) => held.push(m),
                // A status the pull reports (a heartbeat missed, say): what
                // follows it may still be messages.
                Some(Some(Err(_))) if errors < HAND_BACK_MAX_ERRORS => errors += 1,
                _ => break,
            }
        }
        Pulled(held)
    }

    /// Hands each message back (a nak with [`HAND_BACK_DELAY`]), so the
    /// server delivers it again a second later, not after `ack_wait`. A pull
    /// that starts after that second gets them ahead of later messages (a
    /// pull already running elsewhere can get later ones first). So a
    /// world's messages stay in order across a reopen, which waits for it,
    /// and across a restart: on shutdown `app` hands these back only once
    /// the workers have handed back what they held undecided (when the
    /// grace period ran out), which came before them. Messages whose nak
    /// the server does not get come back after `ack_wait`. Returns when
    /// the naks were handed to the client, if there were any: a reopen
    /// waits until they are due.
    pub async fn hand_back(self) -> Option<tokio::time::Instant> {
        let held = self.0;
        if held.is_empty() {
            return None;
        }
        let mut handed_back = 0usize;
        // Bounded (by the same second, short against the grace period):
        // with the connection gone the client's queue can fill, and a
        // shutdown or a reopen should not wait on it.
        let nak_all = async {
            for m in &held {
                if let Err(e) = m.ack_with(AckKind::Nak(Some(HAND_BACK_DELAY))).await {
                    tracing::warn!(error = %e, "could not hand back a message; it comes back after ack_wait");
                    break;
                }
                handed_back += 1;
            }
        };
        if tokio::time::timeout(HAND_BACK_DELAY, nak_all)
            .await
            .is_err()
        {
            tracing::warn!("handing back took too long; the rest come back after ack_wait");
        }
        tracing::info!(
            handed_back,
            held = held.len(),
            "messages pulled but not given to a worker handed back for redelivery"
        );
        // The last nak is due a second after the server gets it: counted
        // from here, after the last was queued (which may take up to that
        // second).
        Some(tokio::time::Instant::now())
    }
}

/// Messages a pull asks for at a time: async-nats's default, unless
/// `nats.subscription_capacity` is too small for it.
const PULL_BATCH: usize = 200;

/// How often the server says an open pull is alive (async-nats's default
/// for `messages()`): two missed, and the pull counts as lost.
const PULL_HEARTBEAT: Duration = Duration::from_secs(15);

/// How long the server waits before delivering a handed-back message
/// again. Long enough for the dropped pull's unsubscription to reach it
/// first (sent before the naks, but through a queue that may be full, and
/// a server with leaf nodes or gateways still serves a pull for 250 ms
/// after its interest is gone); short against `ack_wait`.
pub(super) const HAND_BACK_DELAY: Duration = Duration::from_secs(1);

/// How long past [`HAND_BACK_DELAY`] a reopened pull waits, for the naks'
/// way to the server (queued by the time [`Pulled::hand_back`] returns,
/// sent by the client's connection after it).
const HAND_BACK_MARGIN: Duration = Duration::from_millis(250);

/// Errors [`Pulled::take`] reads past while taking what the pull holds.
const HAND_BACK_MAX_ERRORS: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(bytes: usize) -> Arc<[Outbound]> {
        Arc::from(vec![Outbound {
            subject: "chat.public.w".into(),
            msg_id: None,
            payload: vec![b'x'; bytes].into(),
            delivery: None,
        }])
    }

    /// A replay for `max_ack_pending = 50`: room for 75 small decisions
    /// unacknowledged and 25 acknowledged.
    fn small_replay() -> Replay {
        Replay::new(50)
    }

    #[test]
    fn replay_is_bounded_by_count_and_by_bytes() {
        // Small decisions: three quarters of twice max_ack_pending of them
        // unacknowledged, a quarter acknowledged.
        let replay = small_replay();
        for seq in 0..1000 {
            replay.insert((0, seq), decision(100));
        }
        for seq in 0..1000 {
            replay.acknowledged((0, seq));
        }
        for seq in 1000..2000 {
            replay.insert((0, seq), decision(100));
        }
        replay.unacked.run_pending_tasks();
        replay.acked.run_pending_tasks();
        assert_eq!(replay.unacked.entry_count(), 75);
        assert_eq!(replay.acked.entry_count(), 25);
        assert!(replay.get((0, 1999)).is_some(), "the newest is held");
        assert!(
            replay.get((0, 999)).is_some(),
            "and the newest acknowledged"
        );
        // Large ones: 4 KiB each on average, so 300 KiB of 64 KiB ones.
        let replay = small_replay();
        for seq in 0..1000 {
            replay.insert((0, seq), decision(64 * 1024));
        }
        replay.unacked.run_pending_tasks();
        assert!(
            replay.unacked.weighted_size() <= 75 * 4096,
            "{}",
            replay.unacked.weighted_size()
        );
        assert!(replay.unacked.entry_count() >= 4, "the newest stay");
        assert!(replay.get((0, 999)).is_some());
        // Heavier than the whole: held, alone.
        replay.insert((0, 1000), decision(1 << 20));
        replay.unacked.run_pending_tasks();
        assert!(replay.get((0, 1000)).is_some());
    }

    /// A message a new consumer on a `limits` stream delivers again
    /// ([`Seen::Reread`]) is republished only if its decision was never
    /// acknowledged: a finished one is decided again, and an
    /// acknowledged decision stays where it is.
    #[test]
    fn a_reread_message_finds_only_an_unacknowledged_decision() {
        let replay = small_replay();
        replay.insert((0, 1), decision(10));
        replay.insert((0, 2), decision(10));
        replay.acknowledged((0, 1));
        assert!(replay.unacknowledged((0, 1)).is_none());
        assert!(replay.unacknowledged((0, 2)).is_some());
        assert!(replay.unacknowledged((0, 3)).is_none());
        // Still held for a redelivery proper.
        assert!(replay.get((0, 1)).is_some());
    }

    /// A NATS restart leaves a batch unacknowledged; until it comes back
    /// (`ack_wait` later) the traffic goes on, decided and acknowledged.
    /// With one cache for both, those newer decisions pushed out the old
    /// batch's, which was then decided afresh, as a duplicate of itself.
    #[test]
    fn traffic_after_an_outage_cannot_push_out_unacknowledged_decisions() {
        let replay = small_replay();
        for seq in 0..40 {
            replay.insert((0, seq), decision(100));
        }
        for seq in 40..10_000 {
            replay.insert((0, seq), decision(100));
            replay.acknowledged((0, seq));
        }
        for seq in 0..40 {
            assert!(replay.get((0, seq)).is_some(), "decision {seq} lost");
        }
        // One redelivered after its acknowledgement is unacknowledged
        // again: it moves back, where newer acknowledged ones cannot reach it.
        assert!(replay.get((0, 9_999)).is_some());
        for seq in 10_000..20_000 {
            replay.insert((0, seq), decision(100));
            replay.acknowledged((0, seq));
        }
        assert!(replay.get((0, 9_999)).is_some());
        assert!(replay.current((0, 0)));
        replay.new_generation(1);
        assert!(replay.get((0, 0)).is_none());
        assert!(!replay.current((0, 0)) && replay.current((1, 0)));
    }

    #[test]
    fn copies_sharing_a_body_weigh_it_once() {
        let body = bytes::Bytes::from(vec![b'x'; 100_000]);
        let copy = |subject: &str| Outbound {
            subject: subject.into(),
            msg_id: Some("id".into()),
            payload: body.clone(),
            delivery: None,
        };
        let broadcast: Vec<Outbound> = (0..100).map(|i| copy(&format!("s{i}"))).collect();
        let one = weight(&broadcast[..1]);
        assert!(one >= 100_000);
        assert!(
            weight(&broadcast) < one + 100 * 200,
            "{}",
            weight(&broadcast)
        );
        let apart = [decision(100_000)[0].clone(), decision(100_000)[0].clone()];
        assert!(weight(&apart) >= 200_000);
    }

    #[test]
    fn a_consumer_that_could_lose_messages_or_deliver_none_is_unsuitable() {
        use jetstream::consumer::{AckPolicy, Config};
        let wanted = ["chat.raw.>".to_owned(), "chat.join.>".to_owned()];
        let fit = Config {
            ack_policy: AckPolicy::Explicit,
            ..Default::default()
        };
        assert_eq!(unsuitable(&fit, &wanted), None);
        let filtered = Config {
            filter_subjects: wanted.to_vec(),
            ..fit.clone()
        };
        assert_eq!(unsuitable(&filtered, &wanted), None);
        for (unfit, says) in [
            (
                Config {
                    ack_policy: AckPolicy::All,
                    ..fit.clone()
                },
                "not explicit",
            ),
            (
                Config {
                    headers_only: true,
                    ..fit.clone()
                },
                "headers only",
            ),
            (
                Config {
                    priority_groups: vec!["jobs".into()],
                    ..fit.clone()
                },
                "priority groups (jobs)",
            ),
            (
                Config {
                    filter_subject: "chat.raw.>".into(),
                    ..fit.clone()
                },
                "leaves out chat.join.>",
            ),
        ] {
            let reason = unsuitable(&unfit, &wanted).unwrap_or_default();
            assert!(reason.contains(says), "{says}: {reason:?}");
        }
    }

    #[test]
    fn stream_subjects_cover_what_they_should() {
        assert!(covers("chat.raw.>", "chat.raw.>"));
        assert!(covers("chat.>", "chat.raw.>"));
        assert!(covers(">", "chat.join.>"));
        assert!(covers("chat.*.>", "chat.raw.>"));
        assert!(!covers("chat.raw.*", "chat.raw.>"));
        assert!(!covers("chat.raw.>", "chat.join.>"));
        assert!(!covers("other.>", "chat.raw.>"));
    }

    #[test]
    fn egress_families_are_captured_whole_or_in_part() {
        for pattern in ["chat.public.*", "chat.public.>", "chat.*.*", "chat.>", ">"] {
            assert!(covers(pattern, "chat.public.*"), "{pattern}");
        }
        assert!(covers("chat.private.>", "chat.private.*.*"));
        assert!(!covers("chat.private.*", "chat.private.*.*"));
        for pattern in ["chat.public.w1", "chat.*.w1", "chat.private.*"] {
            assert!(!covers(pattern, "chat.public.*"), "{pattern}");
        }
        assert!(overlaps("chat.public.w1", "chat.public.*"));
        assert!(overlaps("chat.*.w1", "chat.public.*"));
        assert!(overlaps("chat.private.w1.>", "chat.private.*.*"));
        assert!(!overlaps("chat.private.*", "chat.private.*.*"));
        assert!(!overlaps("chat.private.>", "chat.public.*"));
        assert!(!overlaps("chat.public.w1.x", "chat.public.*"));
        assert!(!overlaps("other.public.w1", "chat.public.*"));
    }
}
