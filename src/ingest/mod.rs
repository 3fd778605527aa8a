//! Ingest: where messages come in, and the hand-off of each one to the
//! worker that owns its world.
//!
//! Two sources feed the same workers: [`core`] (two wildcard subscriptions,
//! at most once) and [`jetstream`] (a durable pull consumer, at least once,
//! acknowledged only once everything a message produced is confirmed: at
//! the server after a flush, or, with `egress_acks`, stored by the stream
//! that captures it).
//!
//! Ordering: every message of a world goes to the same worker (chosen by a
//! hash of the world name), and a worker decides and publishes a world's
//! messages one at a time, in the order they arrived: a message waiting for
//! the policy service holds back the later ones of its world, and only
//! those, up to the worker's bounds ([`MAX_ASKING`] requests, [`MAX_PARKED`]
//! messages held back): past them the worker takes nothing new until
//! answers come. One world takes at most [`MAX_HELD_PER_WORLD`] of those
//! places (its agents' later messages are rejected), so it takes many
//! worlds flooding a slow service to hold back every world of the intake.
//! Different worlds proceed in parallel on different workers, and on one
//! worker past a world that waits.

pub mod core;
pub mod jetstream;

use std::collections::{HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::message::Acker;
use async_nats::jetstream::AckKind;
use async_nats::Message;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, watch};

use crate::envelope::FallbackId;
use crate::judge::{Decision, Judge, Outbound, PolicyCheck, PolicyFailure, PolicyOutcome};
use crate::names::Name;
use crate::publish::{Answer, Publisher};
use crate::subject::{Origin, SenderKind, Subjects};

/// Messages queued per worker before ingest waits (and so, once the
/// subscription buffer is full too, NATS reports a slow consumer).
pub const WORKER_QUEUE: usize = 4096;

/// Policy requests a worker has in flight at most: each for a different
/// world (a world's next message waits for its answer).
pub const MAX_ASKING: usize = 256;

/// Messages a worker holds back at most behind their worlds' policy
/// requests. Past either bound it takes nothing new until answers come.
pub const MAX_PARKED: usize = 1024;

/// Messages a worker holds back behind one world's policy request before
/// that world's further agent messages are rejected undecided (rule
/// `policy`, see [`Judge::shed`]), and its joins and invalid subjects are
/// decided at once, ahead of the held ones (they publish no copy: see
/// [`Judge::decide_beside_waiting`]), so one world flooding a slow service
/// cannot fill [`MAX_PARKED`] alone and hold back every world. The rest are
/// still held back: humans' and the system's messages (trusted senders),
/// JetStream redeliveries of messages this worker holds or remembers
/// deciding (see `first_here`), and, in observe mode (which rejects
/// nothing for the service), agents' messages.
pub const MAX_HELD_PER_WORLD: usize = 64;

/// JetStream acknowledgements a worker holds before it confirms their
/// outputs and sends them; it also does so whenever it has nothing to
/// decide (its queue empty, or it waits only for policy answers).
pub const ACK_BATCH: usize = 256;

/// Streams' answers to copies (`egress_acks`) a worker awaits at most; past
/// that it confirms its batch early.
pub const ANSWER_BATCH: usize = 1024;

/// Set once the grace period is over (by `app`): workers then await no
/// more policy answers. What waits for one is given up, with what its world
/// holds back behind it (see `Worker::abandon`); in JetStream mode
/// everything else still undecided is handed back too (so no world's later
/// message is decided here ahead of an earlier one handed back), and in
/// core mode it is still decided, as nothing could hand it back.
#[derive(Clone)]
pub struct GraceOver {
    over: watch::Receiver<bool>,
    /// What the workers gave up, for `app` to report.
    left: Arc<Left>,
}

/// Messages given up undecided once the grace period was over, all workers
/// together.
#[derive(Default)]
pub struct Left {
    /// JetStream messages nak'ed (handed to the client: the drain's flush
    /// sends them, if the bound leaves it time): redelivered a second later.
    pub handed_back: AtomicUsize,
    /// JetStream messages whose nak failed: redelivered after `ack_wait`.
    pub not_handed_back: AtomicUsize,
    /// Core messages, and JetStream ones of a stream created again since
    /// (see `jetstream::Replay::current`): lost.
    pub dropped: AtomicUsize,
}

impl GraceOver {
    pub fn new(over: watch::Receiver<bool>) -> GraceOver {
        GraceOver {
            over,
            left: Arc::default(),
        }
    }

    /// What was given up so far.
    pub fn left(&self) -> &Left {
        &self.left
    }

    fn is_over(&self) -> bool {
        *self.over.borrow()
    }

    /// Resolves once the grace period is over; never, if no one can say so
    /// any more.
    async fn wait(mut self) {
        if self.over.wait_for(|over| *over).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// How a JetStream message is acknowledged, and what identifies it.
pub struct Delivery {
    pub acker: Acker,
    /// The message's identity across redeliveries, under which
    /// `Worker::replay` keeps its outputs.
    pub key: jetstream::ReplayKey,
    /// Whether it was delivered before, and so which decision held for it
    /// is republished rather than decided again.
    pub seen: jetstream::Seen,
    /// Stands in for the id of a message that has none, so reprocessing
    /// yields the same ids.
    pub stable_id: String,
    /// When the intake read it: its `ack_wait` runs from then (or earlier,
    /// when it waited in the pull's buffer), queued for a worker included,
    /// so it is told in progress a period after this, not a period after it
    /// is held (see [`Worker::handle`]).
    pub received: Instant,
}

/// One ingress message on its way to a worker.
pub struct Work {
    pub origin: Origin,
    pub message: Message,
    pub delivery: Option<Delivery>,
}

/// Routes messages to workers by world.
pub struct Dispatcher {
    subjects: Subjects,
    workers: Vec<mpsc::Sender<Work>>,
    /// Picks a world's worker. foldhash, not SipHash: it runs for every
    /// message, and a client choosing world names to crowd one worker gains
    /// no more than any client sending many messages (the seed is random).
    hasher: foldhash::fast::RandomState,
    /// Messages queued at all workers together, and those sent to a worker
    /// that was gone (a panic): once every worker has ended, what no worker
    /// took.
    queued: Arc<AtomicUsize>,
}

impl Dispatcher {
    /// Spawns `n` workers sharing `judge` and `publisher`; returns the
    /// dispatcher and the workers' handles, which end once the dispatcher is
    /// dropped, their queues are empty and no policy answer is awaited
    /// (once `grace_over` is set, none is). `replay` is the JetStream mode's
    /// memory of decisions not yet acknowledged, and `ack_wait` its
    /// consumer's, of which a third is how often a message held back
    /// behind a policy request tells the server it is still in progress.
    pub fn spawn(
        n: usize,
        judge: Arc<Judge>,
        publisher: Publisher,
        replay: Option<jetstream::Replay>,
        ack_wait: Option<Duration>,
        grace_over: GraceOver,
    ) -> (Dispatcher, Vec<tokio::task::JoinHandle<()>>) {
        let mut workers = Vec::with_capacity(n);
        let mut handles = Vec::with_capacity(n);
        let queued = Arc::new(AtomicUsize::new(0));
        for _ in 0..n.max(1) {
            let (tx, rx) = mpsc::channel(WORKER_QUEUE);
            workers.push(tx);
            let worker = Worker::new(
                judge.clone(),
                publisher.clone(),
                replay.clone(),
                ack_wait.map(in_progress_every),
                queued.clone(),
                grace_over.clone(),
            );
            handles.push(tokio::spawn(worker.run(rx)));
        }
        let dispatcher = Dispatcher {
            subjects: judge.subjects().clone(),
            workers,
            hasher: Default::default(),
            queued,
        };
        (dispatcher, handles)
    }

    /// Messages queued at all workers, and those no worker took because
    /// theirs was gone (see `app`'s report of a worker that failed).
    pub fn queued(&self) -> Arc<AtomicUsize> {
        self.queued.clone()
    }

    /// Queues one message on its world's worker. One whose worker is gone
    /// (it panicked) is dropped, and stays counted in [`Dispatcher::queued`].
    pub async fn dispatch(&self, message: Message, delivery: Option<Delivery>) {
        let origin = self.subjects.parse(message.subject.as_str());
        let slot = origin.world().map_or(0, |w| {
            self.hasher.hash_one(w.as_str()) as usize % self.workers.len()
        });
        let work = Work {
            origin,
            message,
            delivery,
        };
        self.queued.fetch_add(1, Ordering::Relaxed);
        if self.workers[slot].send(work).await.is_err() {
            tracing::debug!("worker is gone; message dropped");
        }
    }
}

/// Decides and publishes one queue: each world's messages in the order they
/// arrived. A message waiting for the policy service holds back its own
/// world's later messages only; the worker goes on with the other worlds.
struct Worker {
    /// Decides; shared by every worker (worlds are split between them).
    judge: Arc<Judge>,
    /// Sends what is decided, and asks the policy service.
    publisher: Publisher,
    /// JetStream mode: decisions whose acknowledgement may not have reached
    /// the server, so a redelivery is published again as it was, not decided
    /// twice (`None`: core mode).
    replay: Option<jetstream::Replay>,
    /// JetStream messages whose outputs are published but not yet settled.
    acks: Vec<Unacked>,
    /// The server's answers to those outputs, in order (`egress_acks`).
    answers: Vec<Answer>,
    /// The client's connect count when the first of `acks` was published.
    batch_connects: u64,
    /// Messages queued at all workers (the dispatcher's count).
    queued: Arc<AtomicUsize>,
    /// Policy requests in flight: one per world in `parked`.
    asking: FuturesUnordered<BoxFuture<'static, Asked>>,
    /// Worlds with a message waiting for the policy service, each with the
    /// messages that came for it since, in order.
    parked: HashMap<Name, VecDeque<Work>>,
    /// Messages in `parked`'s queues.
    parked_len: usize,
    /// The JetStream messages among `parked` and those asking: a redelivery
    /// of one of them is held back, never rejected for the backlog, as the
    /// first delivery is still to be decided (see [`first_here`]).
    held_keys: HashSet<jetstream::ReplayKey>,
    /// JetStream: how often a message held back tells the server it is
    /// still in progress (see [`in_progress_every`]).
    in_progress_every: Option<Duration>,
    /// When the messages in `parked` say so next.
    in_progress_due: Instant,
    /// Once set, no policy answer is awaited; counts what is given up.
    grace_over: GraceOver,
}

/// A message whose decision waits for the policy service.
struct Asked {
    decision: Box<Decision>,
    check: PolicyCheck,
    delivery: Option<Delivery>,
    /// What the service said, and how long it took; none if the grace
    /// period ran out first.
    answer: Option<(PolicyOutcome, Duration)>,
}

/// A decision: final, or waiting for the policy service.
enum Decided {
    Now(Vec<Outbound>),
    Asking(Box<Decision>, PolicyCheck),
}

impl Worker {
    fn new(
        judge: Arc<Judge>,
        publisher: Publisher,
        replay: Option<jetstream::Replay>,
        in_progress_every: Option<Duration>,
        queued: Arc<AtomicUsize>,
        grace_over: GraceOver,
    ) -> Worker {
        Worker {
            judge,
            publisher,
            replay,
            in_progress_every,
            in_progress_due: Instant::now(),
            acks: Vec::new(),
            answers: Vec::new(),
            batch_connects: 0,
            queued,
            asking: FuturesUnordered::new(),
            parked: HashMap::new(),
            parked_len: 0,
            held_keys: HashSet::new(),
            grace_over,
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Work>) {
        // Until the dispatcher is gone; then until no answer is awaited.
        let mut open = true;
        loop {
            // Answers already in first: each frees its world.
            while !self.asking.is_empty() {
                match self.asking.next().now_or_never() {
                    Some(Some(asked)) => self.answered(asked).await,
                    _ => break,
                }
            }
            self.keep_parked_in_progress().await;
            // Past its bounds, the worker takes nothing new until answers
            // come: its queue fills, and the intake waits for it.
            let room = self.asking.len() < MAX_ASKING && self.parked_len < MAX_PARKED;
            let next = match open && room {
                true => rx.try_recv(),
                false => Err(mpsc::error::TryRecvError::Empty),
            };
            let work = match next {
                Ok(work) => work,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    continue;
                }
                Err(mpsc::error::TryRecvError::Empty) => {
                    // Idle: make what was published durable before waiting.
                    self.settle_acks().await;
                    // No worker has a message waiting: the world cache's
                    // upkeep now delays none (messages the intake has not
                    // handed over yet aside).
                    if self.queued.load(Ordering::Relaxed) == 0 {
                        self.judge.upkeep();
                    }
                    let in_progress = self.in_progress_every.is_some() && self.parked_len > 0;
                    tokio::select! {
                        Some(asked) = self.asking.next(), if !self.asking.is_empty() => {
                            self.answered(asked).await;
                            continue;
                        }
                        // The loop's top says so for what is parked.
                        () = tokio::time::sleep_until(self.in_progress_due.into()), if in_progress => {
                            continue;
                        }
                        work = rx.recv(), if open && room => match work {
                            Some(work) => work,
                            None => {
                                open = false;
                                continue;
                            }
                        },
                        // Nothing awaited, and nothing more will come.
                        else => break,
                    }
                }
            };
            self.queued.fetch_sub(1, Ordering::Relaxed);
            self.handle(work).await;
        }
        self.settle_acks().await;
    }

    /// Decides one message, or parks it behind its world's message that
    /// waits for the policy service (or, past [`MAX_HELD_PER_WORLD`],
    /// rejects an agent's). Once the grace period is over, a JetStream
    /// message is handed back instead: at once, or, behind a waiting
    /// message of its world, after it (so in order).
    async fn handle(&mut self, work: Work) {
        if !self.parked.is_empty() {
            if let Some(waiting) = work.origin.world().and_then(|w| self.parked.get_mut(w)) {
                let held = waiting.len();
                // Not once the grace period is over: a rejection now would
                // decide it ahead of its world's earlier messages, which are
                // handed back.
                if held >= MAX_HELD_PER_WORLD
                    && !self.grace_over.is_over()
                    && !first_here(&self.held_keys, &self.replay, &work)
                {
                    // Behind the one that asks.
                    if let Some(decision) = shed(&self.judge, &work, held + 1) {
                        return self.conclude(decision.outbound, work.delivery).await;
                    }
                    if matches!(work.origin, Origin::Join { .. } | Origin::Invalid { .. }) {
                        return self.decide_beside_waiting(work).await;
                    }
                }
                if let Some(d) = &work.delivery {
                    self.held_keys.insert(d.key);
                }
                if let (Some(every), Some(d)) = (self.in_progress_every, &work.delivery) {
                    // Told a period after the intake read it: at once if
                    // it waited that long in the queue, and the others
                    // held with it then too.
                    let due = d.received + every;
                    if self.parked_len == 0 || due < self.in_progress_due {
                        self.in_progress_due = due;
                    }
                }
                waiting.push_back(work);
                self.parked_len += 1;
                return;
            }
        }
        if work.delivery.is_some() && self.grace_over.is_over() {
            return self.abandon(work.delivery).await;
        }
        self.process(work, false).await;
    }

    /// Decides one message and publishes its outputs, or sends its policy
    /// request. `held`: it was held back behind its world's earlier
    /// message (see [`Worker::ask`]).
    async fn process(
        &mut self,
        Work {
            origin,
            message,
            delivery,
        }: Work,
        held: bool,
    ) {
        #[cfg(debug_assertions)]
        crate::fault::panic_on_world(&origin);
        #[cfg(debug_assertions)]
        if held {
            crate::fault::stall_held().await;
        }
        let replay = self.replay.clone(); // a handle: `publish` borrows self mutably
        match (&delivery, &replay) {
            (Some(d), Some(replay)) => {
                let earlier = match d.seen {
                    jetstream::Seen::New => None,
                    jetstream::Seen::Redelivered => replay.get(d.key),
                    jetstream::Seen::Reread => replay.unacknowledged(d.key),
                };
                // Redelivered while its first outputs may still be in
                // flight: send exactly those again (same ids).
                if let Some(outbound) = earlier {
                    return self.publish(outbound.iter().cloned(), delivery).await;
                }
                match self.decide(origin, &message, Some(&d.stable_id)) {
                    Decided::Now(outbound) => self.conclude(outbound, delivery).await,
                    Decided::Asking(decision, check) => self.ask(decision, check, delivery, held),
                }
            }
            // At most once: nothing to replay, so the copies move out.
            _ => match self.decide(origin, &message, None) {
                Decided::Now(outbound) => self.publish(outbound, delivery).await,
                Decided::Asking(decision, check) => self.ask(decision, check, delivery, held),
            },
        }
    }

    /// A join or an invalid subject of a world that holds back
    /// [`MAX_HELD_PER_WORLD`] messages: decided now, ahead of them (see
    /// [`Judge::decide_beside_waiting`]), its rejection published as a
    /// shed one is.
    async fn decide_beside_waiting(&mut self, work: Work) {
        let stable = work.delivery.as_ref().map(|d| d.stable_id.as_str());
        let fallback = fallback_id(&work.message, stable);
        let decided =
            self.judge
                .decide_beside_waiting(work.origin, &work.message.payload, fallback);
        self.judge.upkeep_between();
        let outbound = decided.map(|d| d.outbound).unwrap_or_default();
        self.conclude(outbound, work.delivery).await
    }

    /// Publishes a final decision's outputs; a JetStream message's are
    /// kept until it is acknowledged, for its redelivery.
    async fn conclude(&mut self, outbound: Vec<Outbound>, delivery: Option<Delivery>) {
        match (&delivery, &self.replay) {
            (Some(d), Some(replay)) => {
                let outbound: Arc<[Outbound]> = outbound.into();
                replay.insert(d.key, outbound.clone());
                self.publish(outbound.iter().cloned(), delivery).await;
            }
            _ => self.publish(outbound, delivery).await,
        }
    }

    /// Publishes one message's outputs, in order; a JetStream message then
    /// waits for its acknowledgement, which goes out with its batch.
    async fn publish(
        &mut self,
        outputs: impl IntoIterator<Item = Outbound>,
        delivery: Option<Delivery>,
    ) {
        if delivery.is_some() && self.acks.is_empty() {
            // A new batch: remember the connection it is published on.
            self.batch_connects = self.publisher.connects();
        }
        let (mut sent, mut flush) = (true, false);
        for out in outputs {
            if !self.send(out, &mut flush).await && delivery.is_some() {
                // Redelivered anyway: the rest would wait in vain.
                sent = false;
                break;
            }
        }
        if let Some(d) = delivery {
            self.acks.push(Unacked {
                acker: d.acker,
                key: d.key,
                sent,
                flush,
                answers_end: self.answers.len(),
            });
            if self.acks.len() >= ACK_BATCH || self.answers.len() >= ANSWER_BATCH {
                self.settle_acks().await;
            }
        }
    }

    /// Publishes one output: as a JetStream publish whose answer the batch
    /// awaits, where a stream captures its subject (`egress_acks`), else as
    /// a core publish, noted in `flush`. False when an answered copy was not
    /// sent (the connection is gone), so its message must stay
    /// unacknowledged. A core publish that fails is counted and logged by
    /// the publisher, and the next copy still goes.
    async fn send(&mut self, out: Outbound, flush: &mut bool) -> bool {
        if !self.publisher.answers(&out.subject) {
            *flush = true;
            let _ = self.publisher.send(out).await;
            return true;
        }
        match self.publisher.send_answered(out).await {
            Some(answer) => {
                self.answers.push(answer);
                true
            }
            None => false,
        }
    }

    /// Decides one message: its outputs, or, when the policy hook is
    /// configured and the cheap rules approved, the question for the
    /// policy service.
    fn decide(&self, origin: Origin, message: &Message, stable_id: Option<&str>) -> Decided {
        let fallback = fallback_id(message, stable_id);
        let decided = self.judge.decide(origin, &message.payload, fallback);
        // Between two decisions, not inside the next one (whichever path
        // brings it: a new message, or one held back behind a policy
        // answer): the world cache's upkeep, once enough lookups built up.
        self.judge.upkeep_between();
        match decided {
            None => Decided::Now(Vec::new()),
            Some(mut decision) => match decision.policy.take() {
                Some(check) => Decided::Asking(Box::new(decision), check),
                None => Decided::Now(decision.outbound),
            },
        }
    }

    /// Sends a message's policy request; its world's later messages wait
    /// for the answer (see [`Worker::answered`]), so nothing of the world
    /// is decided before this message's effects are recorded. A JetStream
    /// message says it is in progress while it waits: first when the
    /// messages held back would have (`held`: it was one of them, last
    /// told up to a period ago), else a period after the intake read it.
    fn ask(
        &mut self,
        decision: Box<Decision>,
        check: PolicyCheck,
        delivery: Option<Delivery>,
        held: bool,
    ) {
        if let Some(world) = &decision.world {
            self.parked.entry(world.clone()).or_default();
        }
        if let Some(d) = &delivery {
            self.held_keys.insert(d.key);
        }
        let publisher = self.publisher.clone();
        let grace_over = self.grace_over.clone();
        let due = match (held, &delivery) {
            (true, _) => Some(self.in_progress_due),
            (false, Some(d)) => self.in_progress_every.map(|every| d.received + every),
            (false, None) => None,
        };
        let told = self
            .in_progress_every
            .zip(due)
            .map(|(every, due)| (due.saturating_duration_since(Instant::now()), every));
        let replay = self.replay.clone();
        self.asking.push(Box::pin(async move {
            let started = Instant::now();
            let answer = if delivery.is_none() && grace_over.is_over() {
                // Core mode, asking after the grace period ran out: nothing
                // could hand the message back, so it is decided (not
                // dropped, as one still waiting then is) as a service that
                // does not answer would have it, by `rules.policy.fail`.
                let outcome = PolicyOutcome::Failed {
                    failure: PolicyFailure::Skipped,
                    why: "not asked: shutting down, the grace period is over".to_owned(),
                };
                Some((outcome, Duration::ZERO))
            } else {
                // The grace period first: once over, no question goes out
                // (nor is one answered at once by a resting breaker).
                tokio::select! {
                    biased;
                    () = grace_over.wait() => None,
                    outcome = publisher.ask_policy(&check) => Some((outcome, started.elapsed())),
                    never = in_progress(delivery.as_ref(), replay, told) => match never {},
                }
            };
            Asked {
                decision,
                check,
                delivery,
                answer,
            }
        }));
    }

    /// Follows the policy service's answer: publishes the message's outputs,
    /// then decides the messages its world held back, in order, until one
    /// of them asks again. Once the grace period is over, a message still
    /// unanswered is given up with those its world held back, and in
    /// JetStream mode those held back behind an answered one are handed
    /// back.
    async fn answered(
        &mut self,
        Asked {
            decision,
            check,
            delivery,
            answer,
        }: Asked,
    ) {
        if let Some(d) = &delivery {
            self.held_keys.remove(&d.key);
        }
        let world = decision.world.clone();
        let Some((outcome, took)) = answer else {
            // Dropped undecided: none of its effects is committed (its
            // world, if the cache evicted it meanwhile, is not put back:
            // the process is ending).
            drop(decision);
            self.abandon(delivery).await;
            return self.abandon_held(world).await;
        };
        if !matches!(
            outcome,
            PolicyOutcome::Failed {
                failure: PolicyFailure::Skipped,
                ..
            }
        ) {
            let metrics = self.judge.metrics();
            metrics.policy_duration.observe(took.as_secs_f64());
        }
        let decision = self.judge.finish(*decision, check, outcome);
        let jetstream = delivery.is_some();
        self.conclude(decision.outbound, delivery).await;
        if jetstream && self.grace_over.is_over() {
            return self.abandon_held(world).await;
        }
        let Some((world, mut later)) = world.and_then(|w| self.parked.remove_entry(&w)) else {
            return;
        };
        while let Some(work) = later.pop_front() {
            if work.delivery.is_some() && self.grace_over.is_over() {
                // The grace period ran out while the world's messages were
                // decided (a slow publish, say): the rest is handed back,
                // as everything undecided is. (Still counted as held.)
                later.push_front(work);
                self.parked.insert(world.clone(), later);
                return self.abandon_held(Some(world)).await;
            }
            self.parked_len -= 1;
            if let Some(d) = &work.delivery {
                self.held_keys.remove(&d.key);
            }
            self.process(work, true).await;
            if let Some(again) = self.parked.get_mut(&world) {
                // It asked: the rest wait for that answer (still counted
                // in `parked_len`).
                again.append(&mut later);
                return;
            }
        }
    }

    /// JetStream: once a period is over, tells the server that each message
    /// held back is still in progress (the one asking tells it itself, see
    /// [`in_progress`]), so none is delivered again however long its world
    /// waits for answers. A message that cannot be told is delivered again
    /// after `ack_wait`, and that redelivery waits behind it (see
    /// [`first_here`]).
    async fn keep_parked_in_progress(&mut self) {
        let Some(every) = self.in_progress_every else {
            return;
        };
        if self.parked_len == 0 {
            return;
        }
        let now = Instant::now();
        if now < self.in_progress_due {
            return;
        }
        for work in self.parked.values().flatten() {
            if let Some(d) = work.delivery.as_ref().filter(|d| self.current(d.key)) {
                if let Err(e) = d.acker.ack_with(AckKind::Progress).await {
                    tracing::debug!(error = %e, "could not say a held message is in progress");
                }
            }
        }
        self.in_progress_due = now + every;
    }

    /// Whether a JetStream message is of the stream as it is now (see
    /// [`jetstream::Replay::current`]).
    fn current(&self, key: jetstream::ReplayKey) -> bool {
        self.replay.as_ref().is_none_or(|r| r.current(key))
    }

    /// Gives up (see [`Worker::abandon`]) the messages `world` held back
    /// behind its policy request.
    async fn abandon_held(&mut self, world: Option<Name>) {
        let Some(held) = world.and_then(|w| self.parked.remove(&w)) else {
            return;
        };
        self.parked_len -= held.len();
        for work in held {
            if let Some(d) = &work.delivery {
                self.held_keys.remove(&d.key);
            }
            self.abandon(work.delivery).await;
        }
    }

    /// Gives up a message left undecided when the grace period ran out: a
    /// JetStream one is handed back (nak'ed), so the server delivers it
    /// again a second later (to the next instance; the delay as the
    /// intake's, see [`jetstream::HAND_BACK_DELAY`]) rather than after
    /// `ack_wait`. A core one is dropped, as the process would lose it
    /// anyway, and so is one of a stream created again since (its nak
    /// would hand back the new stream's message of its number). Its
    /// outputs were never published, and its world's state holds nothing
    /// of it.
    async fn abandon(&mut self, delivery: Option<Delivery>) {
        let left = &self.grace_over.left;
        let Some(d) = delivery.filter(|d| self.current(d.key)) else {
            left.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let nak = AckKind::Nak(Some(jetstream::HAND_BACK_DELAY));
        let count = match d.acker.ack_with(nak).await {
            Ok(()) => &left.handed_back,
            Err(_) => &left.not_handed_back,
        };
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// Acknowledges the messages whose outputs are confirmed: an
    /// acknowledgement never reaches the server before the outputs of its
    /// message. Core publishes are confirmed by a flush over the connection
    /// they were published on; JetStream publishes (`egress_acks`) by the
    /// stream's answer, which comes once it has stored the copy. The answers
    /// are awaited all at once, so a silent server costs one timeout, not
    /// one per copy. Whatever is not acknowledged is redelivered, and its
    /// same ids make the second publish a duplicate that an egress stream
    /// drops.
    async fn settle_acks(&mut self) {
        if self.acks.is_empty() {
            debug_assert!(self.answers.is_empty(), "answers without messages");
            return;
        }
        let flushed = !self.acks.iter().any(|p| p.flush) || self.flushed().await;
        let publisher = &self.publisher;
        let answered =
            futures::future::join_all(self.answers.drain(..).map(|a| publisher.settled(a))).await;
        let (mut from, mut left) = (0, 0);
        for pending in self.acks.drain(..) {
            let confirmed = pending.sent
                && (flushed || !pending.flush)
                && answered[from..pending.answers_end].iter().all(|&ok| ok);
            from = pending.answers_end;
            if !confirmed {
                left += 1;
                continue;
            }
            if self
                .replay
                .as_ref()
                .is_some_and(|r| !r.current(pending.key))
            {
                // Of a stream created again since: nothing to settle.
                continue;
            }
            match pending.acker.ack().await {
                Ok(()) => {
                    if let Some(replay) = &self.replay {
                        replay.acknowledged(pending.key);
                    }
                }
                // Its decision stays among the unacknowledged, for the
                // redelivery.
                Err(e) => tracing::warn!(error = %e, "ack failed; the message will be redelivered"),
            }
        }
        // The next batch starts here.
        self.batch_connects = self.publisher.connects();
        if left > 0 && flushed {
            tracing::info!(
                left,
                "no answer from a stream for some outputs, or a clustered stream unavailable; leaving their messages for redelivery"
            );
        }
    }

    /// Flushes: true when everything published since the batch began
    /// reached the server, over the connection it was published on. The
    /// flush is a round trip (the patched client's PING and PONG,
    /// vendor/async-nats/PATCH.md): the server has read every earlier
    /// publish on this connection when it answers. (`&mut`: the worker is
    /// `Send`, not `Sync`, as its policy requests are.)
    async fn flushed(&mut self) -> bool {
        if let Err(e) = self.publisher.flush().await {
            tracing::warn!(error = %e, pending = self.acks.len(), "flush failed; leaving messages for redelivery");
            return false;
        }
        if self.publisher.connects() != self.batch_connects {
            // The flush went over a new connection: publishes written to the
            // old one may never have arrived.
            tracing::info!(
                pending = self.acks.len(),
                "reconnected during a batch; leaving it for redelivery"
            );
            return false;
        }
        true
    }
}

/// How often a JetStream message held back behind its world's policy
/// request says it is still in progress (`+WPI`, which restarts its
/// `ack_wait` at the server): a third of `ack_wait`, so that one held just
/// after a round, and told late by a worker busy with a batch, is still
/// told in time. Each is one small publish: only messages waiting for the
/// policy service pay it.
fn in_progress_every(ack_wait: Duration) -> Duration {
    ack_wait / 3
}

/// Tells the server that a JetStream message is still in progress: after
/// `first`, then every `every` (`told`), while its stream is the one
/// `replay` knows; never ends (and does nothing for a core message).
async fn in_progress(
    delivery: Option<&Delivery>,
    replay: Option<jetstream::Replay>,
    told: Option<(Duration, Duration)>,
) -> Infallible {
    if let (Some(d), Some(replay), Some((first, every))) = (delivery, replay, told) {
        let mut wait = first;
        loop {
            tokio::time::sleep(wait).await;
            wait = every;
            if !replay.current(d.key) {
                break;
            }
            if let Err(e) = d.acker.ack_with(AckKind::Progress).await {
                tracing::debug!(error = %e, "could not say a message asking the policy is in progress");
            }
        }
    }
    std::future::pending().await
}

/// Whether a JetStream redelivery's first delivery is held in this worker
/// (`held_keys`: a world's messages all come to one worker, the first
/// delivery ahead of the redelivery) or was decided (its decision is in
/// `replay`): rejected for the backlog, such a message would get a second
/// decision; held back, it is republished from the first. Any other
/// redelivery (after a restart, or a first delivery handed back) is a
/// first decision here, and is rejected for the backlog as a new one is.
fn first_here(
    held_keys: &HashSet<jetstream::ReplayKey>,
    replay: &Option<jetstream::Replay>,
    work: &Work,
) -> bool {
    let Some(d) = &work.delivery else {
        return false;
    };
    d.seen != jetstream::Seen::New
        && (held_keys.contains(&d.key) || replay.as_ref().is_some_and(|r| r.holds(d.key, d.seen)))
}

/// The rejection of a message whose world already holds back `held`
/// behind its policy request, when it is rejected rather than held back:
/// an agent's (a pass too), outside observe mode (see [`Judge::shed`]).
/// (Nor a JetStream redelivery whose first delivery is held or decided,
/// see [`first_here`].)
fn shed(judge: &Judge, work: &Work, held: usize) -> Option<Decision> {
    let Origin::Raw {
        world,
        kind: SenderKind::Agent,
        sender,
    } = &work.origin
    else {
        return None;
    };
    let stable = work.delivery.as_ref().map(|d| d.stable_id.as_str());
    let fallback = fallback_id(&work.message, stable);
    judge.shed(world, sender, &work.message.payload, fallback, held)
}

/// What stands in for the id of a message whose payload names none: its
/// `Nats-Msg-Id` header, else `stable_id` (JetStream's stream position).
fn fallback_id<'a>(message: &'a Message, stable_id: Option<&'a str>) -> FallbackId<'a> {
    FallbackId {
        header: message
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str())
            // An empty header names no message (see `envelope::id_field`).
            .filter(|id| !id.is_empty()),
        stable: stable_id,
    }
}

/// A JetStream message whose outputs are published, waiting to be
/// acknowledged.
struct Unacked {
    acker: Acker,
    /// Under which `Worker::replay` keeps its outputs.
    key: jetstream::ReplayKey,
    /// Every output was handed to the client.
    sent: bool,
    /// Some outputs were core publishes, confirmed by the batch's flush.
    flush: bool,
    /// Where its outputs' answers end in `Worker::answers` (they start where
    /// the previous message's end).
    answers_end: usize,
}
