//! Core NATS ingest: two wildcard subscriptions, at most once. What the
//! server already sent is still handled on shutdown (the subscriptions are
//! drained, not dropped).

use async_nats::Subscriber;
use futures::StreamExt;

use super::Dispatcher;

/// Reads both subscriptions until `stop` resolves, then drains them: the
/// server stops sending, and whatever it already sent is still dispatched.
/// Unless NATS was never `reached`: then nothing was sent, and a drain
/// would wait for a connection, so for the whole grace period.
pub async fn run(
    raw: Subscriber,
    join: Subscriber,
    dispatcher: &Dispatcher,
    stop: impl std::future::Future<Output = ()>,
    reached: impl Fn() -> bool,
) {
    tokio::pin!(stop);
    // Read in turn: a backlog of raw messages does not hold joins back (and
    // a mention after a join miss its agent) until the backlog is gone.
    let mut both = futures::stream::select(raw, join);
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            m = both.next() => match m {
                Some(m) => dispatcher.dispatch(m, None).await,
                None => return,
            },
        }
    }
    if !reached() {
        tracing::info!("shutdown: intake stopped; NATS was never reached, nothing to drain");
        return;
    }
    tracing::info!("shutdown: intake stopped, draining subscriptions");
    let (raw, join) = both.get_mut();
    for sub in [raw, join] {
        if let Err(e) = sub.drain().await {
            tracing::warn!(error = %e, "could not drain a subscription");
        }
    }
    let mut drained = 0u64;
    while let Some(m) = both.next().await {
        dispatcher.dispatch(m, None).await;
        drained += 1;
    }
    tracing::info!(drained, "shutdown: subscriptions drained");
}
