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
//! hash of the world name), and a worker decides and publishes its messages
//! one at a time, in the order they arrived. Different worlds proceed in
//! parallel on different workers.

pub mod core;
pub mod jetstream;

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_nats::Message;
use tokio::sync::mpsc;

use crate::envelope::FallbackId;
use crate::judge::{Judge, Outbound};
use crate::publish::{Answer, Publisher};
use crate::subject::{Origin, Subjects};

/// Messages queued per worker before ingest waits (and so, once the
/// subscription buffer is full too, NATS reports a slow consumer).
pub const WORKER_QUEUE: usize = 4096;

/// JetStream acknowledgements a worker holds before it confirms their
/// outputs and sends them; it also does so whenever its queue runs empty.
pub const ACK_BATCH: usize = 256;

/// Streams' answers to copies (`egress_acks`) a worker awaits at most; past
/// that it confirms its batch early.
pub const ANSWER_BATCH: usize = 1024;

/// How a JetStream message is acknowledged, and what identifies it.
pub struct Delivery {
    pub acker: async_nats::jetstream::message::Acker,
    /// The message's identity across redeliveries, under which
    /// `Worker::replay` keeps its outputs.
    pub key: jetstream::ReplayKey,
    /// Whether it was delivered before, and so which decision held for it
    /// is republished rather than decided again.
    pub seen: jetstream::Seen,
    /// Stands in for the id of a message that has none, so reprocessing
    /// yields the same ids.
    pub stable_id: String,
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
    /// Messages queued at all workers together.
    queued: Arc<AtomicUsize>,
}

impl Dispatcher {
    /// Spawns `n` workers sharing `judge` and `publisher`; returns the
    /// dispatcher and the workers' handles, which end once the dispatcher is
    /// dropped and their queues are empty. `replay` is the JetStream mode's
    /// memory of decisions not yet acknowledged.
    pub fn spawn(
        n: usize,
        judge: Arc<Judge>,
        publisher: Publisher,
        replay: Option<jetstream::Replay>,
    ) -> (Dispatcher, Vec<tokio::task::JoinHandle<()>>) {
        let mut workers = Vec::with_capacity(n);
        let mut handles = Vec::with_capacity(n);
        let queued = Arc::new(AtomicUsize::new(0));
        for _ in 0..n.max(1) {
            let (tx, rx) = mpsc::channel(WORKER_QUEUE);
            workers.push(tx);
            let worker = Worker {
                judge: judge.clone(),
                publisher: publisher.clone(),
                replay: replay.clone(),
                acks: Vec::new(),
                answers: Vec::new(),
                batch_connects: 0,
                queued: queued.clone(),
            };
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

    /// Queues one message on its world's worker.
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
            self.queued.fetch_sub(1, Ordering::Relaxed);
            tracing::error!("worker is gone; message dropped");
        }
    }
}

/// Decides and publishes one queue, in order.
struct Worker {
    judge: Arc<Judge>,
    publisher: Publisher,
    replay: Option<jetstream::Replay>,
    /// JetStream messages whose outputs are published but not yet settled.
    acks: Vec<Pending>,
    /// The server's answers to those outputs, in order (`egress_acks`).
    answers: Vec<Answer>,
    /// The client's connect count when the first of `acks` was published.
    batch_connects: u64,
    /// Messages queued at all workers (the dispatcher's count).
    queued: Arc<AtomicUsize>,
}

impl Worker {
    async fn run(mut self, mut rx: mpsc::Receiver<Work>) {
        loop {
            let work = match rx.try_recv() {
                Ok(work) => work,
                Err(mpsc::error::TryRecvError::Empty) => {
                    // Idle: make what was published durable before waiting.
                    self.settle_acks().await;
                    // No worker has a message waiting: the world cache's
                    // upkeep now delays none (messages the intake has not
                    // handed over yet aside).
                    if self.queued.load(Ordering::Relaxed) == 0 {
                        self.judge.upkeep();
                    }
                    match rx.recv().await {
                        Some(work) => work,
                        None => break,
                    }
                }
                Err(mpsc::error::TryRecvError::Disconnected) => break,
            };
            self.queued.fetch_sub(1, Ordering::Relaxed);
            self.handle(work).await;
            if self.acks.len() >= ACK_BATCH || self.answers.len() >= ANSWER_BATCH {
                self.settle_acks().await;
            }
        }
        self.settle_acks().await;
    }

    async fn handle(
        &mut self,
        Work {
            origin,
            message,
            delivery,
        }: Work,
    ) {
        #[cfg(debug_assertions)]
        fault::panic_on_world(&origin);
        if delivery.is_some() && self.acks.is_empty() {
            // A new batch: remember the connection it is published on.
            self.batch_connects = self.publisher.connects();
        }
        let replay = self.replay.clone(); // a handle: `decide` borrows self mutably
        let (mut sent, mut flush) = (true, false);
        match (&delivery, &replay) {
            (Some(d), Some(replay)) => {
                let earlier = match d.seen {
                    jetstream::Seen::New => None,
                    jetstream::Seen::Redelivered => replay.get(d.key),
                    jetstream::Seen::Reread => replay.unacknowledged(d.key),
                };
                let outbound = match earlier {
                    // Redelivered while its first outputs may still be in
                    // flight: send exactly those again (same ids).
                    Some(outbound) => outbound,
                    None => {
                        let outbound: Arc<[Outbound]> = self
                            .decide(origin, &message, Some(&d.stable_id))
                            .await
                            .into();
                        replay.insert(d.key, outbound.clone());
                        outbound
                    }
                };
                for out in outbound.iter() {
                    if !self.send(out.clone(), &mut flush).await {
                        // Redelivered anyway: the rest would wait in vain.
                        sent = false;
                        break;
                    }
                }
            }
            // At most once: nothing to replay, so the copies move out.
            _ => {
                for out in self.decide(origin, &message, None).await {
                    let _ = self.send(out, &mut flush).await;
                }
            }
        }
        if let Some(d) = delivery {
            self.acks.push(Pending {
                acker: d.acker,
                key: d.key,
                sent,
                flush,
                answers_end: self.answers.len(),
            });
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

    /// Decides one message; when the policy hook is configured and the
    /// cheap rules approved, asks the policy service first. The worker waits
    /// for the answer, so its worlds stay in order.
    async fn decide(
        &mut self,
        origin: Origin,
        message: &Message,
        stable_id: Option<&str>,
    ) -> Vec<Outbound> {
        let fallback = FallbackId {
            header: message
                .headers
                .as_ref()
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .map(|v| v.as_str())
                // An empty header names no message (see `envelope::id_field`).
                .filter(|id| !id.is_empty()),
            stable: stable_id,
        };
        let Some(mut decision) = self.judge.decide(origin, &message.payload, fallback) else {
            return Vec::new();
        };
        if let Some(check) = decision.policy.take() {
            // Acknowledge what is already published before a possibly slow
            // request, so no acknowledgement waits past `ack_wait`.
            self.settle_acks().await;
            let started = std::time::Instant::now();
            let outcome = self.publisher.ask_policy(&check).await;
            self.judge
                .metrics()
                .policy_duration
                .observe(started.elapsed().as_secs_f64());
            decision = self.judge.finish(decision, check, outcome);
        }
        decision.outbound
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
        // The next batch starts here, also when a policy call settled this
        // one in the middle of a message.
        self.batch_connects = self.publisher.connects();
        if left > 0 && flushed {
            tracing::info!(
                left,
                "no answer from a stream for some outputs; leaving their messages for redelivery"
            );
        }
    }

    /// Flushes: true when everything published since the batch began
    /// reached the server, over the connection it was published on. The
    /// flush is a round trip (the patched client's PING and PONG,
    /// vendor/async-nats/PATCH.md): the server has read every earlier
    /// publish on this connection when it answers.
    async fn flushed(&self) -> bool {
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

/// A JetStream message whose outputs are published, waiting to be
/// acknowledged.
struct Pending {
    acker: async_nats::jetstream::message::Acker,
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

/// Fault injection for the tests of what follows a bug, in debug builds
/// only: a message to the world named by `LOOPGUARD_TEST_PANIC_WORLD`
/// panics its worker.
#[cfg(debug_assertions)]
mod fault {
    use crate::subject::Origin;

    pub fn panic_on_world(origin: &Origin) {
        static WORLD: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        let world = WORLD.get_or_init(|| std::env::var("LOOPGUARD_TEST_PANIC_WORLD").ok());
        if let (Some(world), Some(to)) = (world, origin.world()) {
            assert!(world != to.as_str(), "fault injected for world {world}");
        }
    }
}
