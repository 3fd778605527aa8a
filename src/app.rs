//! Wiring: connect to NATS, subscribe, start the workers, run until told to
//! stop, then drain in order — intake, workers, publishes — within the grace
//! period, then hand back what is still undecided.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use crate::admin::{self, Admin, Readiness};
use crate::clock::{Clock, SystemClock};
use crate::config::{NatsAuth, Settings};
use crate::ingest::jetstream::JetStreamError;
use crate::ingest::{self, Dispatcher};
use crate::judge::{self, Judge};
use crate::metrics::{DropReason, Metrics};
use crate::publish::{self, Publisher};
use crate::subject::Subjects;

/// Why loopguard could not run.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("cannot listen on http.listen {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot read NATS credentials file {path}: {source}")]
    Credentials {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot set up the NATS connection: {0}")]
    Connect(#[from] async_nats::ConnectError),
    #[error(transparent)]
    JetStream(#[from] JetStreamError),
    #[error("cannot subscribe to {subject}: {source}")]
    Subscribe {
        subject: String,
        source: async_nats::SubscribeError,
    },
    /// A bug: the rest of the process may be as broken, so it stops (in
    /// JetStream mode what the worker held is delivered again).
    #[error("a worker stopped: {0}; its worlds' messages can no longer be decided")]
    Worker(String),
    /// A failure above, whose drain the grace period then cut short.
    #[error("{0} (the grace period ran out with messages left undecided)")]
    Unfinished(String),
}

/// Re-reads the configuration (same file, same environment) on SIGHUP.
pub type Reload = Box<dyn Fn() -> Result<Settings, crate::config::ConfigError> + Send + Sync>;

/// How to reload: on SIGHUP and, when `reload.watch_seconds` asks for it,
/// when the config file changes.
pub struct Reloader {
    /// Loads the configuration again, as at start.
    pub load: Reload,
    /// The config file (`--config`), to watch; none, none watched.
    pub path: Option<std::path::PathBuf>,
    /// The file's [`FileStamp`] read just before the running configuration
    /// was loaded from it (so taken first: the order is the point): the
    /// watch applies any change since, one made while loopguard was
    /// starting too.
    pub loaded: Option<FileStamp>,
    /// SIGHUP, listened for since before [`run`] began: one sent in
    /// between is kept, and reloads once the reloads are set up.
    pub hangup: crate::shutdown::Hangup,
}

/// Runs loopguard until `stop` resolves, then shuts down gracefully. With
/// `reload`, SIGHUP applies a new configuration without dropping a message.
pub async fn run(
    settings: Settings,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    reload: Option<Reloader>,
) -> Result<(), AppError> {
    let settings = Arc::new(settings);
    let config = &settings.config;
    let metrics = Metrics::new();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let judge = Arc::new(Judge::new(settings.clone(), clock.clone(), metrics.clone()));

    #[cfg(debug_assertions)]
    crate::fault::hold_start().await;

    // Reloads first (a SIGHUP that came since `Hangup::listen` reloads now).
    if let Some(reload) = reload {
        start_reloads(reload, config.reload.watch_seconds, &judge, &metrics);
    }

    warn_if_worlds_can_outweigh(&settings);

    // Then HTTP: /healthz answers and /readyz says 503 while NATS is not
    // there yet.
    let listener = tokio::net::TcpListener::bind(&config.http.listen)
        .await
        .map_err(|source| AppError::Bind {
            addr: config.http.listen.clone(),
            source,
        })?;
    let http_addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(addr = %http_addr, "http listening");
    let readiness = Arc::new(Readiness::default());
    let http = tokio::spawn(admin::serve(
        listener,
        Arc::new(Admin {
            metrics: metrics.clone(),
            judge: judge.clone(),
            readiness: readiness.clone(),
            clock,
            admin_token: config.http.admin_token.clone(),
            context_messages: config.state.context_messages,
            by_state: Default::default(),
        }),
    ));

    // Egress subjects the server refused a publish to (`egress_acks`).
    let refusals = Arc::new(publish::Refusals::default());
    let client = connect(&settings, judge.subjects(), &metrics, &readiness, &refusals).await?;
    metrics.count_client(&client);
    // One stop signal, observable by every stage: set-up retries, intake
    // and the grace timer.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // A worker's failure stops the intake too (see the drain).
    let stop_now = stop_tx.clone();
    {
        let readiness = readiness.clone();
        tokio::spawn(async move {
            stop.await;
            readiness.draining();
            let _ = stop_tx.send(true);
        });
    }
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stopping| *stopping).await;
        }
    };

    tokio::spawn(check_max_payload(client.clone(), judge.clone(), stopped()));

    let subjects = judge.subjects().clone();
    let jetstream = &config.nats.jetstream;
    let capacity = config.nats.subscription_capacity;
    // Egress families a stream captures whole (`egress_acks`).
    let mut captured = Vec::new();
    // The consumer's own, which may differ from the config's; the larger,
    // as a consumer created again later takes the config's.
    let mut max_ack_pending = jetstream.max_ack_pending;
    // The consumer's own too: answers to copies are awaited for less than
    // it waits for an acknowledgement.
    let mut ack_wait = Duration::from_secs(jetstream.ack_wait_seconds);
    // Read before the round trips that confirm the intake (see
    // `round_trip_on`).
    let connects = admin::connects(&client);
    let (intake, confirmed) = if jetstream.enabled {
        match open_jetstream(&client, jetstream, &subjects, capacity, stopped()).await? {
            Some((messages, families)) => {
                captured = families;
                max_ack_pending = max_ack_pending.max(messages.max_ack_pending);
                ack_wait = ack_wait.min(messages.ack_wait);
                // A drain holds what it has not settled for the grace
                // period and up to 3 s more: past `ack_wait` the server
                // delivers it again on its own, ahead of what is handed back.
                let drain = Duration::from_secs(config.shutdown.grace_seconds)
                    + HAND_BACK_BOUND
                    + RUNTIME_STOP_BOUND;
                if ack_wait <= drain {
                    tracing::warn!(
                        ack_wait_seconds = ack_wait.as_secs(),
                        grace_seconds = config.shutdown.grace_seconds,
                        "the consumer's ack wait is no longer than a shutdown's drain (the grace period and 3 s): messages still held when loopguard stops can be delivered again before those it hands back, a world's later ones first"
                    );
                }
                tokio::spawn(ingest::jetstream::watch_counts(
                    client.clone(),
                    jetstream.clone(),
                    metrics.consumer_counts(&jetstream.stream, &jetstream.consumer),
                    stopped(),
                ));
                // Its set-up's requests were answered after the consumer was made.
                let on = round_trip_on(connects, admin::connects(&client));
                (Intake::JetStream(Box::new(messages)), on)
            }
            None => {
                tracing::info!("shutdown: stopped before JetStream was ready");
                http.abort();
                return Ok(());
            }
        }
    } else {
        let subscribe = |subject: String| {
            let client = client.clone();
            async move {
                client
                    .subscribe(subject.clone())
                    .await
                    .map_err(|source| AppError::Subscribe { subject, source })
            }
        };
        let raw = subscribe(subjects.raw_wildcard()).await?;
        let join = subscribe(subjects.join_wildcard()).await?;
        // Once the server answers a round trip it holds both subscriptions:
        // from /readyz 200 on, a message published elsewhere comes in.
        // Until NATS is first reached the round trip waits; a signal then
        // goes on to the intake, which stops and drains as always.
        let confirmed = tokio::select! {
            flushed = client.flush() => match flushed {
                Ok(()) => round_trip_on(connects, admin::connects(&client)),
                Err(e) => {
                    tracing::warn!(error = %e, "could not confirm the subscriptions with the server");
                    None
                }
            },
            _ = stopped() => None,
        };
        (Intake::Core(raw, join), confirmed)
    };
    readiness.subscribed(client.clone(), confirmed);
    if confirmed.is_some() || admin::connects(&client) > 0 {
        // (Not after a signal that came while NATS was never reached: the
        // subscriptions were only asked for.)
        tracing::info!(
            raw = %subjects.raw_wildcard(), join = %subjects.join_wildcard(),
            mode = ?config.mode, jetstream = jetstream.enabled, "subscribed"
        );
    }

    // With one runtime thread, two workers still let one world's slow
    // publish overlap another's decision; with more threads, one per thread.
    let workers = config.runtime.threads.max(2);
    let publisher = if jetstream.enabled && jetstream.egress_acks {
        Publisher::answered(
            client.clone(),
            metrics.clone(),
            &captured,
            ack_wait,
            refusals,
        )
    } else {
        Publisher::new(client.clone(), metrics.clone())
    };
    let replay = jetstream
        .enabled
        .then(|| ingest::jetstream::Replay::new(max_ack_pending));
    // Set when the grace period is over: the workers then hand back what
    // they have not decided.
    let (grace_over_tx, grace_over) = tokio::sync::watch::channel(false);
    let grace_over = ingest::GraceOver::new(grace_over);
    let (dispatcher, handles) = Dispatcher::spawn(
        workers,
        judge.clone(),
        publisher.clone(),
        replay.clone(),
        jetstream.enabled.then_some(ack_wait),
        grace_over.clone(),
    );
    let mut workers: futures::stream::FuturesUnordered<_> = handles.into_iter().collect();
    // Intake ending in an error (a consumer that refuses loopguard) starts
    // the grace period, as a signal does (and a worker stopped by a bug,
    // which stops the intake too).
    let failed = tokio::sync::Notify::new();
    // What failed, so that a drain the grace period cuts short still fails
    // the exit.
    let failure = std::sync::OnceLock::<String>::new();

    // What the workers have not taken yet (see `Dispatcher::queued`).
    let queued = dispatcher.queued();
    let drain = async {
        let intake = async {
            match intake {
                Intake::Core(raw, join) => {
                    let reached = || admin::connects(&client) > 0;
                    ingest::core::run(raw, join, &dispatcher, stopped(), reached).await;
                    Ok(None)
                }
                Intake::JetStream(messages) => {
                    // Not ready from the loss noticed until the consumer
                    // is open again: no message comes in meanwhile.
                    let lost = || readiness.unsubscribed();
                    let reopen = async || {
                        let open = async || {
                            ingest::jetstream::consumer(&client, jetstream, &subjects, capacity)
                                .await
                        };
                        let connects = admin::connects(&client);
                        let pull = retrying(open, stopped()).await?;
                        if pull.is_some() {
                            let on = round_trip_on(connects, admin::connects(&client));
                            readiness.subscribed(client.clone(), on);
                        }
                        Ok(pull)
                    };
                    ingest::jetstream::run(
                        *messages,
                        lost,
                        reopen,
                        &dispatcher,
                        replay.as_ref(),
                        jetstream,
                        &subjects,
                        stopped(),
                    )
                    .await
                    .map(Some)
                }
            }
        };
        // Workers end only once intake has: one that ends before (a
        // panic) ends loopguard, rather than leave its worlds undecided.
        // The intake then stops as at a signal, and drains: what NATS
        // already sent is still decided, but for the failed worker's
        // worlds (counted below). Workers first: the intake, busy, would
        // spend the task's budget and hide a worker's end until it was
        // idle (while it dropped what came for that worker's worlds).
        let mut worker_down = false;
        let (mut intake, pulled) = {
            let intake = intake; // ends here, and its borrow of the dispatcher
            tokio::pin!(intake);
            tokio::select! {
                biased;
                Some(ended) = workers.next() => {
                    worker_down = true;
                    let e = worker_failed(ended, false);
                    let _ = failure.set(e.to_string());
                    readiness.draining();
                    let _ = stop_now.send(true);
                    let pulled = match intake.await {
                        Ok(pulled) => pulled,
                        Err(also) => {
                            tracing::warn!(error = %also, "the intake failed too");
                            None
                        }
                    };
                    (Err(e), pulled)
                }
                intake = &mut intake => match intake {
                    Ok(pulled) => (Ok(()), pulled),
                    Err(e) => (Err(e), None),
                },
            }
        };
        if let Err(e) = &intake {
            let _ = failure.set(e.to_string());
            readiness.draining();
            failed.notify_one();
        }
        drop(dispatcher);
        tracing::info!("shutdown: waiting for workers to publish what was taken in");
        while let Some(ended) = workers.next().await {
            // One that panics while the others drain still fails the exit.
            if ended.is_err() {
                worker_down = true;
                let e = worker_failed(ended, true);
                if intake.is_ok() {
                    let _ = failure.set(e.to_string());
                    intake = Err(e);
                }
            }
        }
        if worker_down {
            // Those sent to a failed worker and not taken: still in its
            // queue when it failed, or sent after. Besides them, the one it
            // failed on and those it held behind a policy answer.
            tracing::error!(
                undecided = queued.load(Ordering::Relaxed),
                "shutdown: messages for the failed worker's worlds left undecided (core: lost; JetStream: redelivered after ack_wait), besides the one it failed on and any it held back behind a policy answer"
            );
        }
        // JetStream: what the intake pulled and no worker took goes back
        // only now, after what the workers handed back undecided (when the
        // grace period ran out), which came before it: the server delivers
        // them again in that order. A drain cut short past the grace period
        // (`HAND_BACK_BOUND`) never gets here: those come back after
        // `ack_wait`, as what the workers still hold does; and so does what
        // it pulled once a worker failed: handed back, a world's later
        // messages would come back ahead of those the failed worker held.
        match pulled {
            Some(pulled) if !worker_down => {
                pulled.hand_back().await;
            }
            _ => {}
        }
        // Nothing to flush from a client that never connected, whose flush
        // would wait for a connection.
        if admin::connects(&client) > 0 {
            tracing::info!("shutdown: flushing");
            if let Err(e) = publisher.flush().await {
                tracing::warn!(error = %e, "shutdown: flush failed");
            }
        }
        intake
    };
    // The grace period runs from the signal (or the failure), not from
    // start-up.
    let grace = Duration::from_secs(config.shutdown.grace_seconds);
    tokio::pin!(drain);
    let ended = tokio::select! {
        intake = &mut drain => {
            tracing::info!("shutdown: complete");
            intake
        }
        _ = async {
            tokio::select! {
                _ = stopped() => {}
                _ = failed.notified() => {}
            }
            tokio::time::sleep(grace).await
        } => {
            tracing::warn!(grace_seconds = grace.as_secs(), "shutdown: grace period over; handing back what is left undecided, then exiting");
            // No policy answer is awaited any more: what waits for one (and
            // what its world holds back) is given up, in JetStream mode with
            // everything else undecided (see `ingest::GraceOver`), and the
            // drain goes on for as long as that takes. Bounded, as NATS may
            // be what held the drain up.
            let _ = grace_over_tx.send(true);
            let finished = tokio::time::timeout(HAND_BACK_BOUND, &mut drain).await.is_ok();
            let left = grace_over.left();
            let count = |n: &std::sync::atomic::AtomicUsize| n.load(Ordering::Relaxed);
            // Not finished: what the workers had not taken from their
            // queues yet is lost too (core), or redelivered after ack_wait.
            let still_queued = if finished { 0 } else { count(&queued) };
            tracing::warn!(
                handed_back = count(&left.handed_back),
                not_handed_back = count(&left.not_handed_back),
                dropped = count(&left.dropped),
                still_queued,
                finished,
                "shutdown: messages left undecided when the grace period ran out (JetStream: handed back, so redelivered a second later, else after ack_wait, as are all if not finished; core: dropped, and those still queued at the workers if not finished)"
            );
            failure.get().map_or(Ok(()), |why| Err(AppError::Unfinished(why.clone())))
        }
    };
    http.abort();
    ended
}

/// Sets up reloads: SIGHUP, and the config file's watch every `every`
/// seconds (`reload.watch_seconds`; 0: none) when there is a file.
fn start_reloads(reload: Reloader, every: u64, judge: &Arc<Judge>, metrics: &Metrics) {
    let Reloader {
        load,
        path,
        loaded,
        hangup,
    } = reload;
    let load = Arc::new(load);
    // The version of the file a SIGHUP applied, for the watch: not
    // applied again (and counted twice) when the watch sees it.
    let by_sighup = Arc::new(SighupApplied::default());
    // A pipe (`--config <(…)`, `/dev/stdin`) is read once: read again, it
    // is empty (all defaults) or waits for a writer that is gone.
    let regular = path.as_deref().is_some_and(std::path::Path::is_file);
    let watched = path.clone().filter(|_| every > 0 && regular);
    reload_on_sighup(
        hangup,
        load.clone(),
        judge.clone(),
        metrics.clone(),
        watched.map(|path| (path, by_sighup.clone())),
        path.is_some() && !regular,
    );
    match (path, every > 0) {
        (Some(path), true) if !regular => tracing::warn!(
            watch_seconds = every,
            path = %path.display(),
            "reload.watch_seconds is set, but the config file is no regular file (a pipe?): not watched"
        ),
        (Some(path), true) => {
            tokio::spawn(reload_on_change(
                load,
                path,
                loaded,
                Duration::from_secs(every),
                judge.clone(),
                metrics.clone(),
                by_sighup,
            ));
        }
        (None, true) => tracing::warn!(
            watch_seconds = every,
            "reload.watch_seconds is set, but there is no config file (--config) to watch"
        ),
        _ => {}
    }
}

/// How long, past the grace period, the workers may take to hand back what
/// they have not decided and the intake, after them, what it pulled (which
/// alone may take a second: see `ingest::jetstream::Pulled::hand_back`).
/// `main` then gives tasks still running [`RUNTIME_STOP_BOUND`].
const HAND_BACK_BOUND: Duration = Duration::from_secs(2);

/// How long `main` gives tasks still running when `run` returns (a DNS
/// lookup for a server that does not answer), so the exit is not held past
/// the grace period.
pub const RUNTIME_STOP_BOUND: Duration = Duration::from_secs(1);

/// The error for a worker that ended before intake did, or failed
/// (`shutting_down`: during the drain).
fn worker_failed(ended: Result<(), tokio::task::JoinError>, shutting_down: bool) -> AppError {
    let why = match ended {
        Err(e) if e.is_panic() => panic_message(e.into_panic()),
        Err(e) => e.to_string(),
        Ok(()) => "it ended early".into(),
    };
    tracing::error!(error = %why, shutting_down, "a worker stopped; shutting down");
    AppError::Worker(why)
}

/// What a panic said, when it said it with a string.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => payload
            .downcast_ref::<&str>()
            .map_or("a panic".into(), |m| m.to_string()),
    }
}

/// Warns when one world can hold more than it is weighed at (half of
/// `state.max_bytes`): then the cache may hold more than `max_bytes`,
/// about twice the heaviest world's parts ([`crate::state::heaviest_parts`]).
fn warn_if_worlds_can_outweigh(settings: &Settings) {
    let heaviest = crate::state::heaviest_parts(settings);
    let max_bytes = settings.config.state.max_bytes;
    if heaviest as u64 > max_bytes / 2 {
        let mib = |b: u64| b >> 20;
        tracing::warn!(
            world_mib = mib(heaviest as u64),
            max_bytes_mib = mib(max_bytes),
            "one world may hold more than half of state.max_bytes (its agents' last rules.rate.max approval times, state.context_messages entries, and a latest message whose ids are up to limits.max_payload_bytes each): the cache may then hold about twice that, past state.max_bytes; raise state.max_bytes, or lower those"
        );
    }
}

/// Loads the configuration again and applies it; an invalid one is refused
/// (logged, counted) and the running one stays.
fn apply_reload(reload: &Reload, judge: &Judge, metrics: &Metrics, trigger: &'static str) -> bool {
    // SIGHUP and the file watch may fire together: one load-and-swap at a
    // time, so an older file can never be applied after a newer one.
    static RELOADING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = RELOADING.lock().unwrap_or_else(|p| p.into_inner());
    match reload().and_then(|settings| judge.reload(settings)) {
        Ok(restart) => {
            metrics.reload(true);
            // As applied: restart-only sections (`state`) keep running values.
            warn_if_worlds_can_outweigh(&judge.settings());
            if restart.is_empty() {
                tracing::info!(trigger, "configuration reloaded");
            } else {
                tracing::warn!(
                    trigger,
                    sections = ?restart,
                    "configuration reloaded; changes to these sections take effect after a restart"
                );
            }
            true
        }
        Err(e) => {
            metrics.reload(false);
            tracing::error!(trigger, error = %e, "configuration reload failed; the running configuration stays");
            false
        }
    }
}

/// [`apply_reload`] on the blocking pool: it reads files and builds the
/// rules' matchers, which must not hold a runtime thread (with
/// `runtime.threads = 1`, every decision would wait for a slow disk).
/// Whether it was applied.
async fn reload_in_background(
    reload: &Arc<Reload>,
    judge: &Arc<Judge>,
    metrics: &Metrics,
    trigger: &'static str,
) -> bool {
    let (reload, judge, m) = (reload.clone(), judge.clone(), metrics.clone());
    let applied = tokio::task::spawn_blocking(move || apply_reload(&reload, &judge, &m, trigger));
    applied.await.unwrap_or_else(|e| {
        metrics.reload(false);
        tracing::error!(trigger, error = %e, "configuration reload failed; the running configuration stays");
        false
    })
}

/// The longest wait before the file watch tries a refused file again.
const RELOAD_RETRY_MAX: Duration = Duration::from_secs(300);

/// Reloads when the file's modification time, size or identity changes
/// (see [`FileStamp`]), once the change has stood for a whole check: a
/// file written in place (truncated, then filled) is not read half-written,
/// when an empty or cut file may still parse, as all defaults. A version of
/// the file that was refused is tried again, at waits that double from one
/// check up to [`RELOAD_RETRY_MAX`], until a reload (from here or a SIGHUP)
/// succeeds or the file changes: what refused it may have been passing (a
/// TLS file it names, caught mid-rotation), and its change would otherwise
/// wait for the next edit.
async fn reload_on_change(
    reload: Arc<Reload>,
    path: std::path::PathBuf,
    loaded: Option<FileStamp>,
    every: Duration,
    judge: Arc<Judge>,
    metrics: Metrics,
    by_sighup: Arc<SighupApplied>,
) {
    let stamp =
        async |p: &std::path::Path| tokio::fs::metadata(p).await.ok().map(|m| file_stamp(&m));
    let mut applied = loaded;
    let (mut seen, mut changing) = (applied, 0);
    // When to try a refused file again, and how long that wait was.
    let mut retry: Option<(tokio::time::Instant, Duration)> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let at = tick.tick().await;
        if let Some(version) = by_sighup.take() {
            // A SIGHUP applied this version: it is the one applied now.
            (applied, retry) = (Some(version), None);
        }
        let now = stamp(&path).await;
        changing = if now == seen { 0 } else { changing + 1 };
        seen = now;
        // A file rewritten at every check is read at the third.
        let trigger = if now != applied && (changing == 0 || changing >= 3) {
            (applied, changing) = (now, 0);
            retry = None;
            "file change"
        } else if now == applied && retry.is_some_and(|(due, _)| at >= due) {
            // The refused version again, its wait over (never a newer one
            // still being written: that waits for its stable check).
            if metrics.last_reload_ok() {
                // A SIGHUP applied a file since.
                retry = None;
                continue;
            }
            "file change, tried again"
        } else {
            continue;
        };
        let reloaded = reload_in_background(&reload, &judge, &metrics, trigger).await;
        retry = (!reloaded).then(|| {
            let wait = retry.map_or(every, |(_, wait)| (wait * 2).min(RELOAD_RETRY_MAX));
            // From the refusal's end, not the tick, so a slow reload is
            // not tried again at once; less half a check, so a quick one
            // is tried again at the tick `wait` after this one.
            let due = tokio::time::Instant::now() + wait.saturating_sub(every / 2);
            (due, wait)
        });
    }
}

/// What tells one version of the watched file from another: its
/// modification time and size, and on Unix which file it is and when its
/// inode last changed. A link swapped to another file of the same size and
/// modification time (an archive keeps whole seconds) is a change too.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FileStamp(Option<std::time::SystemTime>, u64, [i64; 4]);

impl FileStamp {
    /// The stamp of the file at `path` now (`None` if it cannot be read).
    pub fn of(path: &std::path::Path) -> Option<FileStamp> {
        std::fs::metadata(path).ok().map(|m| file_stamp(&m))
    }
}

/// The stamp of the file `m` describes.
fn file_stamp(m: &std::fs::Metadata) -> FileStamp {
    #[cfg(unix)]
    let identity = {
        use std::os::unix::fs::MetadataExt;
        // Device and inode numbers fit: the kernel's are 64-bit, compared
        // only for equality.
        [m.dev() as i64, m.ino() as i64, m.ctime(), m.ctime_nsec()]
    };
    #[cfg(not(unix))]
    let identity = [0; 4];
    FileStamp(m.modified().ok(), m.len(), identity)
}

/// The [`FileStamp`] of the watched file as the last successful SIGHUP
/// reload found it before reading it, until the watch takes it.
#[derive(Default)]
struct SighupApplied(std::sync::Mutex<Option<FileStamp>>);

impl SighupApplied {
    fn set(&self, version: FileStamp) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(version);
    }

    fn take(&self) -> Option<FileStamp> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// Applies a new configuration on every SIGHUP (one that came while
/// loopguard was starting too: `hangup` kept it). With the file watched,
/// tells the watch which version of it a successful reload read.
fn reload_on_sighup(
    mut hangup: crate::shutdown::Hangup,
    reload: Arc<Reload>,
    judge: Arc<Judge>,
    metrics: Metrics,
    watched: Option<(std::path::PathBuf, Arc<SighupApplied>)>,
    from_a_pipe: bool,
) {
    tokio::spawn(async move {
        loop {
            hangup.recv().await;
            if from_a_pipe {
                // Read again, it would give all defaults: nothing applied.
                tracing::warn!("SIGHUP: the config file is no regular file (a pipe?), read once at start; the running configuration stays (restart to change it)");
                continue;
            }
            // Taken before the file is read, as at start (`loaded`): a
            // change made meanwhile is the watch's to apply.
            let version = match &watched {
                Some((path, _)) => tokio::fs::metadata(path).await.ok().map(|m| file_stamp(&m)),
                None => None,
            };
            let reloaded = reload_in_background(&reload, &judge, &metrics, "SIGHUP").await;
            if let (true, Some(version), Some((_, by_sighup))) = (reloaded, version, &watched) {
                by_sighup.set(version);
            }
        }
    });
}

/// Where messages come from.
enum Intake {
    Core(async_nats::Subscriber, async_nats::Subscriber),
    JetStream(Box<ingest::jetstream::Pull>),
}

/// Sets up the JetStream stream and consumer and, with `egress_acks`, finds
/// the egress families streams capture, retrying while the server is
/// unreachable or not ready; `None` if stopped first.
async fn open_jetstream(
    client: &async_nats::Client,
    config: &crate::config::JetStreamConfig,
    subjects: &crate::subject::Subjects,
    capacity: usize,
    stopped: impl std::future::Future<Output = ()>,
) -> Result<Option<(ingest::jetstream::Pull, Vec<String>)>, AppError> {
    let open = async || {
        let messages = ingest::jetstream::consumer(client, config, subjects, capacity).await?;
        // Retried as the rest of the set-up: a server still recovering
        // its streams may not answer yet, and going on without the list
        // would flush every copy, not have it answered, until a restart. A
        // list that is not permitted keeps loopguard unready, saying so.
        let captured = match config.egress_acks {
            true => ingest::jetstream::captured_egress(client, subjects).await?,
            false => Vec::new(),
        };
        Ok((messages, captured))
    };
    retrying(open, stopped).await
}

/// Runs `open` until it succeeds, again every 2 s while the server refuses
/// or does not answer; `None` if stopped first. A misconfiguration is
/// returned at once: retrying would not help.
async fn retrying<T>(
    mut open: impl AsyncFnMut() -> Result<T, JetStreamError>,
    stopped: impl std::future::Future<Output = ()>,
) -> Result<Option<T>, AppError> {
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            _ = &mut stopped => return Ok(None),
            result = open() => match result {
                Ok(opened) => return Ok(Some(opened)),
                Err(e) if e.is_misconfiguration() => return Err(e.into()),
                Err(e) => {
                    // The server's answer when JetStream is off there.
                    let text = e.to_string().to_ascii_lowercase();
                    if text.contains("unavailable") || text.contains("not enabled") {
                        tracing::warn!(error = %e, hint = "is JetStream on in the server (nats-server -js, or a jetstream block in its config)?", "JetStream set-up failed; retrying in 2s");
                    } else {
                        tracing::warn!(error = %e, "JetStream set-up failed; retrying in 2s");
                    }
                }
            },
        }
        tokio::select! {
            _ = &mut stopped => return Ok(None),
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

/// Says whether every message loopguard publishes (copies, events) fits in
/// the largest the server takes (`max_payload`): one that does not is
/// refused, and counted as a `publish_error` drop. Checked once connected,
/// and again whenever the server's figure (a reconnect to another server)
/// or the payload limit (a reload) changes; async-nats announces neither,
/// so it looks once a second.
async fn check_max_payload(
    client: async_nats::Client,
    judge: Arc<Judge>,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut checked = None;
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = every.tick() => {}
        }
        // The client stores a new server's figure just after it says it is
        // connected, and its copy of the server's INFO later: act only once
        // both agree.
        let server = client.max_payload();
        let connected = client.connection_state() == async_nats::connection::State::Connected;
        if !connected || client.try_server_info().map(|i| i.max_payload) != Some(server) {
            continue;
        }
        let limit = judge.settings().config.limits.max_payload_bytes;
        if checked == Some((server, limit)) {
            continue;
        }
        checked = Some((server, limit));
        let largest = judge::largest_output(limit);
        let fits = judge::payload_limit_for(server);
        if largest <= server {
            tracing::info!(
                server_max_payload = server,
                largest_output = largest,
                "every message loopguard publishes fits in the server's max_payload"
            );
        } else if fits == 0 {
            tracing::warn!(
                server_max_payload = server,
                largest_output = largest,
                "a copy or event can be larger than the server's max_payload, and would be dropped \
                 (publish_error): raise the server's max_payload"
            );
        } else {
            tracing::warn!(
                server_max_payload = server,
                largest_output = largest,
                limits.max_payload_bytes = limit,
                fits,
                "a copy or event can be larger than the server's max_payload, and would be dropped \
                 (publish_error): lower limits.max_payload_bytes to `fits` or raise the \
                 server's max_payload"
            );
        }
    }
}

/// The connection (by the client's count, see `admin::connects`) a round
/// trip that came back between two readings of the count, `before` and
/// `after`, was made on, when that is certain: the one connection
/// throughout, or the first, made while the round trip waited. A round trip
/// in flight when a connection is lost fails, but one that came back on a
/// connection lost just after it cannot be told from one on the next.
fn round_trip_on(before: u64, after: u64) -> Option<u64> {
    (after == before.max(1)).then_some(after)
}

/// What a publish the server's permissions refused was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused<'a> {
    /// A copy, notice or event, to this subject: an output not sent.
    Output(&'a str),
    /// A JetStream acknowledgement (nothing is finished) or pull (nothing
    /// comes in): not ready until a restart.
    Intake,
    /// Anything else: a policy request (it fails as the service's silence
    /// does) or a JetStream set-up call (retried; not ready until it
    /// succeeds).
    Other,
}

/// Reads a `Permissions Violation for Publish to "S"` error of the server.
/// (Its other publish error, `… with Reply of "R"`, is for replies to
/// reserved subjects, `_R_.…` or `$JS.ACK.…`: loopguard sends none. Its
/// replies are `_INBOX.…` subjects, which publish permissions do not
/// check; a refused subscription to them is a subscription error.)
fn refused_publish<'a>(error: &'a str, subjects: &Subjects) -> Refused<'a> {
    let Some((_, rest)) = error.split_once("Publish to \"") else {
        return Refused::Other;
    };
    let subject = rest.split_once('"').map_or(rest, |(subject, _)| subject);
    if subjects.is_egress(subject) {
        Refused::Output(subject)
    } else if subject.starts_with("$JS.ACK.") || subject.starts_with("$JS.API.CONSUMER.MSG.NEXT.") {
        Refused::Intake
    } else {
        Refused::Other
    }
}

/// Connects with unbounded retries, from the first attempt on: a NATS
/// server that is not up yet must not stop loopguard (contract §6).
async fn connect(
    settings: &Settings,
    subjects: &Subjects,
    metrics: &Metrics,
    readiness: &Arc<Readiness>,
    refusals: &Arc<publish::Refusals>,
) -> Result<async_nats::Client, AppError> {
    let config = &settings.config;
    // Validated at start-up, so these cannot fail here. Credentials in
    // the URL go as user/password or token (below), not in the address,
    // which the client's debug lines print whole.
    let servers: Vec<_> = config
        .nats
        .servers()
        .unwrap_or_default()
        .into_iter()
        .map(without_credentials)
        .collect();
    // As the logs name them: scheme, host and port.
    let shown: Vec<String> = servers
        .iter()
        .map(|a| {
            let url = a.clone().into_inner();
            // `host_str`: an IPv6 address in its brackets.
            let host = url.host_str().unwrap_or_else(|| a.host());
            format!("{}://{host}:{}", url.scheme(), a.port())
        })
        .collect();
    let tls_used = config.nats.tls.required || servers.iter().any(|a| a.tls_required());
    let servers_shown: Arc<str> = shown.join(", ").into();
    let was_connected = Arc::new(AtomicBool::new(false));
    let m = metrics.clone();
    let readiness = readiness.clone();
    // What a refused publish of loopguard's own output goes to.
    let subjects = Arc::new(subjects.clone());
    let refusals = refusals.clone();
    // The log of refused publishes that are not outputs (those count as
    // drops, logged as such): intake's, and the rest.
    let refused_logs: Arc<[crate::metrics::LogLimit; 2]> = Arc::default();
    let options = async_nats::ConnectOptions::new()
        .name("loopguard")
        // Every subject loopguard publishes or sends a request to is built
        // from names and a prefix validated long before (names.rs,
        // config.rs), is a policy subject validated with the configuration,
        // or is a reply subject the server gave (JetStream acknowledgements),
        // so the client's scan of each one for whitespace can go (publish.rs
        // still checks, in debug builds). Subscriptions are always checked.
        .skip_subject_validation(true)
        .retry_on_initial_connect()
        .max_reconnects(None)
        .subscription_capacity(config.nats.subscription_capacity)
        // The client's default, 60 s, leaves a silent server unnoticed (and
        // `/readyz` at 200) for three minutes.
        .ping_interval(Duration::from_secs(config.nats.ping_interval_seconds))
        .event_callback(move |event| {
            let m = m.clone();
            let was_connected = was_connected.clone();
            let readiness = readiness.clone();
            let subjects = subjects.clone();
            let refusals = refusals.clone();
            let refused_logs = refused_logs.clone();
            let servers_shown = servers_shown.clone();
            async move {
                match event {
                    async_nats::Event::Connected => {
                        m.nats_connected.set(1);
                        if was_connected.swap(true, Ordering::SeqCst) {
                            m.sync_client_counts();
                            // Ready once the server holds the subscriptions
                            // the client sends again.
                            readiness.confirm();
                            tracing::info!("reconnected to NATS");
                        } else {
                            tracing::info!("connected to NATS");
                        }
                    }
                    async_nats::Event::Disconnected => {
                        m.nats_connected.set(0);
                        tracing::warn!("disconnected from NATS; reconnecting");
                    }
                    async_nats::Event::SlowConsumer(sid) => m.client_dropped(sid),
                    async_nats::Event::ServerError(async_nats::ServerError::SlowConsumer(sid)) => m
                        .dropped(
                            DropReason::ServerSlowConsumer,
                            &format_args!("the server dropped messages for subscription {sid}"),
                        ),
                    // nats-server mostly closes a slow consumer's connection
                    // instead (a reconnect); async-nats 0.51 builds no
                    // SlowConsumer server error, so the text is matched.
                    async_nats::Event::ServerError(async_nats::ServerError::Other(e))
                        if e.to_ascii_lowercase().contains("slow consumer") =>
                    {
                        m.dropped(
                            DropReason::ServerSlowConsumer,
                            &format_args!("the server reported a slow consumer: {e}"),
                        )
                    }
                    // The server's permissions: a refused subscription
                    // takes nothing in until a restart (not ready).
                    async_nats::Event::ServerError(async_nats::ServerError::Other(e))
                        if e.starts_with("Permissions Violation for Subscription") =>
                    {
                        readiness.refused();
                        tracing::error!(error = %e, "the server refused a subscription: loopguard takes nothing in on it and stays unready; grant it, then restart loopguard");
                    }
                    // A copy, notice or event: an output not sent. An
                    // acknowledgement or a pull (JetStream): nothing is
                    // finished or comes in, so not ready until a restart.
                    // Anything else (a policy request, which fails as the
                    // service's silence does; a JetStream set-up call, which
                    // is retried): logged.
                    async_nats::Event::ServerError(async_nats::ServerError::Other(e))
                        if e.starts_with("Permissions Violation for Publish") =>
                    {
                        match refused_publish(&e, &subjects) {
                            Refused::Output(subject) => {
                                m.dropped(
                                    DropReason::PublishError,
                                    &format_args!("the server refused a publish: {e}"),
                                );
                                // A JetStream publish's wait for an answer
                                // ends here, not in a redelivery.
                                refusals.record(subject);
                            }
                            // Each acknowledgement, pull or policy request
                            // refused is one more error from the server:
                            // a line every ten seconds, with the count.
                            Refused::Intake => {
                                readiness.refused();
                                if let Some(count) = refused_logs[0].due() {
                                    tracing::error!(error = %e, count, "the server refused a publish loopguard needs: it stays unready; grant it, then restart loopguard");
                                }
                            }
                            Refused::Other => {
                                if let Some(count) = refused_logs[1].due() {
                                    tracing::error!(error = %e, count, "the server refused a publish loopguard needs; grant it");
                                }
                            }
                        }
                    }
                    async_nats::Event::ClientError(e) => m.client_error(&e, &servers_shown),
                    other => tracing::warn!(event = %other, "NATS client event"),
                }
            }
        });
    let auth = config.nats.auth().unwrap_or(NatsAuth::None);
    let options = match auth {
        // Credentials in the URL, which async-nats ignores, come here as
        // user/password or token (NatsConfig::auth).
        NatsAuth::None => options,
        NatsAuth::UserPassword { user, password } => options.user_and_password(user, password),
        NatsAuth::Token(token) => options.token(token),
        NatsAuth::NkeySeed(seed) => options.nkey(seed),
        NatsAuth::CredentialsFile(path) => options
            .credentials_file(&path)
            .await
            .map_err(|source| AppError::Credentials { path, source })?,
    };
    let tls = &config.nats.tls;
    let mut options = options.require_tls(tls.required);
    if !tls.ca_file.is_empty() {
        options = options.add_root_certificates(tls.ca_file.clone().into());
    }
    if !tls.cert_file.is_empty() {
        options = options
            .add_client_certificate(tls.cert_file.clone().into(), tls.key_file.clone().into());
    }
    // `tls`: required by the config or by a `tls://` address.
    tracing::info!(servers = ?shown, tls = tls_used, "connecting to NATS");
    Ok(options.connect(servers).await?)
}

/// `server` with no user, password or token in it: async-nats ignores
/// them there (loopguard presents them as
/// [`crate::config::NatsConfig::auth`] reads them),
/// and its `Debug` shows them.
fn without_credentials(server: async_nats::ServerAddr) -> async_nats::ServerAddr {
    let mut url = server.clone().into_inner();
    // Both fail only for an address that cannot hold credentials.
    if url.set_password(None).is_err() || url.set_username("").is_err() {
        return server;
    }
    async_nats::ServerAddr::from_url(url).unwrap_or(server)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_address_goes_to_the_client_without_its_credentials() {
        for (written, secret) in [
            ("nats://lg:pw-Zq81@127.0.0.1:4333", "pw-Zq81"),
            ("tls://tok-Pq55@nats.example:4443", "tok-Pq55"),
            ("wss://a%40b:c%3Ad@nats.example", "c%3Ad"),
        ] {
            let server: async_nats::ServerAddr = written.parse().unwrap();
            let bare = without_credentials(server.clone());
            let shown = format!("{bare:?}");
            assert!(!shown.contains(secret), "{shown}");
            assert_eq!((bare.username(), bare.password()), (None, None));
            assert_eq!(
                (bare.host(), bare.port(), bare.tls_required()),
                (server.host(), server.port(), server.tls_required())
            );
            assert_eq!(bare.into_inner().scheme(), server.into_inner().scheme());
        }
        let plain: async_nats::ServerAddr = "nats://127.0.0.1:4222".parse().unwrap();
        assert_eq!(without_credentials(plain.clone()), plain);
    }

    #[test]
    fn a_round_trip_confirms_a_connection_only_when_certain() {
        assert_eq!(round_trip_on(0, 1), Some(1), "the first, made meanwhile");
        assert_eq!(round_trip_on(3, 3), Some(3));
        assert_eq!(round_trip_on(3, 4), None, "a reconnect meanwhile");
        assert_eq!(round_trip_on(0, 2), None);
    }

    #[test]
    fn a_refused_publish_is_read_by_what_it_stops() {
        let subjects = Subjects::new("chat");
        let refused = |subject: &str| format!("Permissions Violation for Publish to \"{subject}\"");
        for (error, what) in [
            (refused("chat.public.w"), Refused::Output("chat.public.w")),
            (
                refused("chat.private.w.a"),
                Refused::Output("chat.private.w.a"),
            ),
            (refused("chat.events.w"), Refused::Output("chat.events.w")),
            // A policy subject beside them under the prefix.
            (refused("chat.policy.check"), Refused::Other),
            (refused("$JS.ACK.S.C.1.2.3.4.0"), Refused::Intake),
            (refused("$JS.API.CONSUMER.MSG.NEXT.S.C"), Refused::Intake),
            // Set-up calls are retried.
            (refused("$JS.API.STREAM.LIST"), Refused::Other),
            (refused("$JS.API.CONSUMER.CREATE.S.C"), Refused::Other),
            (
                "Permissions Violation for Publish with Reply of \"_R_.x\"".into(),
                Refused::Other,
            ),
        ] {
            assert_eq!(refused_publish(&error, &subjects), what, "{error}");
        }
    }
}
