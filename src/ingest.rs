//! Ingest: the two wildcard subscriptions, and the hand-off of each message
//! to the worker that owns its world.
//!
//! Ordering: every message of a world goes to the same worker (chosen by a
//! hash of the world name), and a worker decides and publishes its messages
//! one at a time, in the order NATS delivered them. Different worlds proceed
//! in parallel on different workers.

use std::hash::BuildHasher;
use std::sync::Arc;

use async_nats::{Message, Subscriber};
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::judge::Judge;
use crate::publish::Publisher;
use crate::subject::{Origin, Subjects};

/// Messages queued per worker before ingest waits (and so, once the
/// subscription buffer is full too, NATS reports a slow consumer).
pub const WORKER_QUEUE: usize = 4096;

/// One ingress message on its way to a worker.
pub struct Work {
    pub origin: Origin,
    pub message: Message,
}

/// Routes messages to workers by world.
pub struct Dispatcher {
    subjects: Subjects,
    workers: Vec<mpsc::Sender<Work>>,
    hasher: std::collections::hash_map::RandomState,
}

impl Dispatcher {
    /// Spawns `n` workers sharing `judge` and `publisher`; returns the
    /// dispatcher and the workers' handles, which end once the dispatcher is
    /// dropped and their queues are empty.
    pub fn spawn(
        n: usize,
        judge: Arc<Judge>,
        publisher: Publisher,
    ) -> (Dispatcher, Vec<tokio::task::JoinHandle<()>>) {
        let mut workers = Vec::with_capacity(n);
        let mut handles = Vec::with_capacity(n);
        for _ in 0..n.max(1) {
            let (tx, rx) = mpsc::channel(WORKER_QUEUE);
            workers.push(tx);
            handles.push(tokio::spawn(work(rx, judge.clone(), publisher.clone())));
        }
        let dispatcher = Dispatcher {
            subjects: judge.subjects().clone(),
            workers,
            hasher: Default::default(),
        };
        (dispatcher, handles)
    }

    /// Queues one message on its world's worker.
    pub async fn dispatch(&self, message: Message) {
        let origin = self.subjects.parse(message.subject.as_str());
        let slot = origin.world().map_or(0, |w| {
            self.hasher.hash_one(w.as_str()) as usize % self.workers.len()
        });
        if self.workers[slot]
            .send(Work { origin, message })
            .await
            .is_err()
        {
            tracing::error!("worker is gone; message dropped");
        }
    }
}

/// A worker: decides and publishes its queue in order.
async fn work(mut rx: mpsc::Receiver<Work>, judge: Arc<Judge>, publisher: Publisher) {
    while let Some(Work { origin, message }) = rx.recv().await {
        let header_id = message
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str());
        let Some(decision) = judge.decide(origin, &message.payload, header_id) else {
            continue;
        };
        for out in decision.outbound {
            // Failures are logged by the publisher; the next copy still goes.
            let _ = publisher.send(out).await;
        }
    }
}

/// Reads both subscriptions until `stop` resolves, then drains them: the
/// server stops sending, and whatever it already sent is still dispatched.
pub async fn run(
    mut raw: Subscriber,
    mut join: Subscriber,
    dispatcher: &Dispatcher,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            Some(m) = raw.next() => dispatcher.dispatch(m).await,
            Some(m) = join.next() => dispatcher.dispatch(m).await,
            else => return,
        }
    }
    tracing::info!("shutdown: intake stopped, draining subscriptions");
    for sub in [&mut raw, &mut join] {
        if let Err(e) = sub.drain().await {
            tracing::warn!(error = %e, "could not drain a subscription");
        }
    }
    let mut drained = 0u64;
    let mut rest = futures::stream::select(raw, join);
    while let Some(m) = rest.next().await {
        dispatcher.dispatch(m).await;
        drained += 1;
    }
    tracing::info!(drained, "shutdown: subscriptions drained");
}
