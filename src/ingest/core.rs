//! Core NATS ingest: two wildcard subscriptions, at most once. What the
//! server already sent is still handled on shutdown (the subscriptions are
//! drained, not dropped).

use async_nats::Subscriber;
use futures::StreamExt;

use super::Dispatcher;

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
            Some(m) = raw.next() => dispatcher.dispatch(m, None).await,
            Some(m) = join.next() => dispatcher.dispatch(m, None).await,
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
        dispatcher.dispatch(m, None).await;
        drained += 1;
    }
    tracing::info!(drained, "shutdown: subscriptions drained");
}
