//! Publishing decided messages to NATS, in the order the judge queued them.

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};

use crate::judge::{Outbound, PolicyCheck, PolicyOutcome};
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
        // The client does not check (see `skip_subject_validation` in app.rs).
        debug_assert!(
            !out.subject.is_empty() && !out.subject.contains([' ', '\t', '\r', '\n']),
            "unsafe subject {:?}",
            out.subject
        );
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

    /// Asks the policy service about one message: a NATS request with the
    /// message's egress JSON, answered by `{"decision": "approve"|"reject",
    /// "reason": "…"}`.
    pub async fn ask_policy(&self, check: &PolicyCheck) -> PolicyOutcome {
        let request = self
            .client
            .request(check.subject.clone(), check.request.clone());
        let reply = match tokio::time::timeout(check.timeout, request).await {
            Err(_) => {
                return PolicyOutcome::Failed {
                    timeout: true,
                    why: format!("no answer within {} ms", check.timeout.as_millis()),
                }
            }
            Ok(Err(e)) => {
                return PolicyOutcome::Failed {
                    timeout: false,
                    why: e.to_string(),
                }
            }
            Ok(Ok(reply)) => reply,
        };
        #[derive(serde::Deserialize)]
        struct Answer {
            decision: String,
            #[serde(default)]
            reason: Option<String>,
        }
        match serde_json::from_slice::<Answer>(&reply.payload) {
            Ok(a) if a.decision == "approve" => PolicyOutcome::Approve,
            Ok(a) if a.decision == "reject" => PolicyOutcome::Reject(
                a.reason
                    .unwrap_or_else(|| "rejected by the policy service".into())
                    .chars()
                    .take(500)
                    .collect(),
            ),
            _ => PolicyOutcome::Failed {
                timeout: false,
                why: "the answer is not {\"decision\": \"approve\"|\"reject\"}".into(),
            },
        }
    }

    /// Waits until everything published so far has reached the server.
    pub async fn flush(&self) -> Result<(), async_nats::client::FlushError> {
        self.client.flush().await
    }
}
