//! Publishing decided messages to NATS, in the order the judge queued them.

use std::time::Duration;

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use async_nats::jetstream::context::{
    PublishAckFuture, PublishError as StoreError, PublishErrorKind,
};

use crate::judge::{Outbound, PolicyCheck, PolicyOutcome};
use crate::metrics::{DropReason, Metrics};

/// How long a worker waits for the server's answer to a JetStream publish
/// before it leaves the input for redelivery.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends [`Outbound`] messages on one client.
#[derive(Clone)]
pub struct Publisher {
    client: async_nats::Client,
    /// Set with `nats.jetstream.egress_acks`: outputs go out as JetStream
    /// publishes, each answered by the server.
    jetstream: Option<async_nats::jetstream::Context>,
    /// Counts what could not be sent.
    metrics: Metrics,
}

impl Publisher {
    pub fn new(client: async_nats::Client, metrics: Metrics) -> Publisher {
        Publisher {
            client,
            jetstream: None,
            metrics,
        }
    }

    /// A publisher whose outputs the server answers ([`Publisher::send_answered`]).
    pub fn answered(client: async_nats::Client, metrics: Metrics) -> Publisher {
        let jetstream = async_nats::jetstream::ContextBuilder::new()
            .timeout(ANSWER_TIMEOUT)
            // Workers bound what they hold unanswered (`ANSWER_BATCH` in
            // ingest); the context's own bound, reached, would make a worker
            // wait for answers only it can collect.
            .max_ack_inflight(1 << 30)
            .build(client.clone());
        Publisher {
            client,
            jetstream: Some(jetstream),
            metrics,
        }
    }

    /// True when outputs go through [`Publisher::send_answered`].
    pub fn answers(&self) -> bool {
        self.jetstream.is_some()
    }

    /// Publishes one message. A failure is counted, logged (rate-limited)
    /// and returned; the caller goes on with the next message.
    pub async fn send(&self, out: Outbound) -> Result<(), async_nats::PublishError> {
        debug_assert_safe(&out.subject);
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

    /// Publishes one message as a JetStream publish: the server answers it
    /// with a stream's acknowledgement, or with "no responders" when no
    /// stream captures the subject (core subscribers got it either way).
    /// `None`: not sent, and sending again could help (the connection is
    /// gone); the input must stay unacknowledged. An output the server can
    /// never take (too large) is counted as a publish error and answered as
    /// done, like the core path, so its input is not redelivered forever.
    pub async fn send_answered(&self, out: Outbound) -> Option<Answer> {
        debug_assert_safe(&out.subject);
        let jetstream = self.jetstream.as_ref()?;
        let mut publish =
            async_nats::jetstream::message::PublishMessage::build().payload(out.payload);
        if let Some(id) = out.msg_id {
            publish = publish.message_id(id);
        }
        match jetstream.send_publish(out.subject, publish).await {
            Ok(answer) => Some(Answer::Awaited(answer)),
            Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => {
                self.metrics.dropped(DropReason::PublishError, &e);
                Some(Answer::Done)
            }
            Err(e) => {
                tracing::debug!(error = %e, "JetStream publish not sent; the input stays for redelivery");
                None
            }
        }
    }

    /// Waits for the server's answer to one output: true once it is
    /// settled (stored, no stream captures it, or refused for good, which is
    /// counted as a publish error), false when no answer came (timed out, or
    /// the connection went), so the input must be redelivered.
    pub async fn settled(&self, answer: Answer) -> bool {
        let Answer::Awaited(answer) = answer else {
            return true;
        };
        match answer.await {
            Ok(_) => true,
            Err(e) => settled_by(&e).unwrap_or_else(|| {
                self.metrics.dropped(DropReason::PublishError, &e);
                true
            }),
        }
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

/// The server's answer to one JetStream publish, still to come or already
/// known.
pub enum Answer {
    Awaited(PublishAckFuture),
    Done,
}

/// What a failed JetStream answer means: `Some(true)` settled (no stream
/// captures the subject), `Some(false)` unknown (no answer: redeliver),
/// `None` refused by the stream (full, or its own error): settled, but the
/// copy was not stored.
fn settled_by(e: &StoreError) -> Option<bool> {
    match e.kind() {
        PublishErrorKind::StreamNotFound => Some(true),
        PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => Some(false),
        _ => None,
    }
}

/// The client does not check subjects (see `skip_subject_validation` in
/// app.rs); every subject here was built from validated parts.
fn debug_assert_safe(subject: &str) {
    debug_assert!(
        !subject.is_empty() && !subject.contains([' ', '\t', '\r', '\n']),
        "unsafe subject {subject:?}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_answer_leaves_the_input_for_redelivery() {
        let answer = |kind| settled_by(&StoreError::new(kind));
        // No stream captures the subject: core subscribers had the copy.
        assert_eq!(answer(PublishErrorKind::StreamNotFound), Some(true));
        // No answer: the copy may not be stored.
        assert_eq!(answer(PublishErrorKind::TimedOut), Some(false));
        assert_eq!(answer(PublishErrorKind::BrokenPipe), Some(false));
        // The stream answered with an error: sending again would not help.
        assert_eq!(answer(PublishErrorKind::Other), None);
        assert_eq!(answer(PublishErrorKind::WrongLastSequence), None);
    }
}
