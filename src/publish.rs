//! Publishing decided messages to NATS, in the order the judge queued them.

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};

use crate::judge::Outbound;
use crate::metrics::{DropReason, Metrics};

/// Sends [`Outbound`] messages on one client.
#[derive(Clone)]
pub struct Publisher {
    client: async_nats::Client,
    /// Counts what could not be sent.
    metrics: Metrics,
}

impl Publisher {
    pub fn new(client: async_nats::Client, metrics: Metrics) -> Publisher {
        Publisher { client, metrics }
    }

    /// Publishes one message. A failure is counted, logged (rate-limited)
    /// and returned; the caller goes on with the next message.
    pub async fn send(&self, out: Outbound) -> Result<(), async_nats::PublishError> {
        let result = match out.msg_id {
            Some(id) => {
                let mut headers = HeaderMap::new();
                headers.insert(NATS_MESSAGE_ID, id);
                self.client
                    .publish_with_headers(out.subject, headers, out.payload)
                    .await
            }
            None => self.client.publish(out.subject, out.payload).await,
        };
        if let Err(e) = &result {
            self.metrics.dropped(DropReason::PublishError, e);
        }
        result
    }

    /// How many times the client has connected: a change between a publish
    /// and a flush means the publish may have died with the old connection.
    pub fn connects(&self) -> u64 {
        self.client
            .statistics()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits until everything published so far has reached the server.
    pub async fn flush(&self) -> Result<(), async_nats::client::FlushError> {
        self.client.flush().await
    }
}
