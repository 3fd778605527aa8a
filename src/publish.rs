//! Publishing decided messages to NATS, in the order the judge queued them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use async_nats::jetstream::context::{
    PublishAckFuture, PublishError as StoreError, PublishErrorKind,
};
use async_nats::RequestErrorKind;

use crate::breaker::{Breakers, Ended, Resting};
use crate::judge::{Outbound, PolicyCheck, PolicyFailure, PolicyOutcome};
use crate::metrics::{DropReason, Metrics};

/// The longest wait for a stream's answer to a JetStream publish before
/// the input is left for redelivery; shorter with a short `ack_wait`
/// (see [`Publisher::answered`]).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The debug line of a wait for a stream's answer that timed out.
pub const NO_ANSWER: &str = "no answer from a stream within the wait";

/// Sends [`Outbound`] messages on one client.
#[derive(Clone)]
pub struct Publisher {
    client: async_nats::Client,
    /// Set with `nats.jetstream.egress_acks`: copies on subjects a stream
    /// captures go out as JetStream publishes, each answered by the stream.
    answered: Option<Answered>,
    /// Counts what could not be sent.
    metrics: Metrics,
    /// Which policy services are not asked for now, shared by every clone.
    breakers: Arc<Breakers>,
}

/// Where and how copies are sent as JetStream publishes.
#[derive(Clone)]
struct Answered {
    jetstream: async_nats::jetstream::Context,
    /// Subject prefixes (`P.public.`) of the egress families a stream
    /// captures whole.
    prefixes: Vec<String>,
    /// Subjects the server's permissions refused a publish to.
    refusals: Arc<Refusals>,
}

/// Egress subjects the server's permissions refused a publish to, and when
/// (the client's error events, see `app::connect`). The server tells the
/// connection, not the reply subject, so a refused JetStream publish is
/// never answered: its wait ends at the refusal, not in a timeout, which
/// would leave the input for redelivery, refused again, for ever.
#[derive(Default)]
pub struct Refusals {
    refused: Mutex<HashMap<Box<str>, Instant>>,
    /// Wakes the waits for an answer at each refusal, so that a refused
    /// copy is settled then, not when its wait times out.
    noted: tokio::sync::Notify,
}

/// Subjects [`Refusals`] holds at most. Past it, refusals older than twice
/// the longest wait for an answer go (a wait starts when its batch
/// settles, so a younger one may still be wanted), and if none is that
/// old, all go. An answer whose refusal is forgotten times out, and its
/// input is redelivered and its copy refused again: nothing is lost.
const MAX_REFUSALS: usize = 4096;

impl Refusals {
    /// Notes that the server refused a publish to `subject` just now.
    pub fn record(&self, subject: &str) {
        {
            let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
            if refused.len() >= MAX_REFUSALS && !refused.contains_key(subject) {
                refused.retain(|_, at| at.elapsed() < 2 * ANSWER_TIMEOUT);
                if refused.len() >= MAX_REFUSALS {
                    refused.clear();
                }
            }
            refused.insert(subject.into(), Instant::now());
        }
        self.noted.notify_waiters();
    }

    /// Whether the server refused a publish to `subject` at or after
    /// `sent`: the one sent then, as the server refuses in order.
    fn since(&self, subject: &str, sent: Instant) -> bool {
        let refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        refused.get(subject).is_some_and(|at| *at >= sent)
    }

    /// Waits until the server has refused a publish to `subject` at or
    /// after `sent` (at once if it has).
    async fn refused(&self, subject: &str, sent: Instant) {
        loop {
            // Listening before looking, so a refusal in between still wakes.
            let noted = self.noted.notified();
            tokio::pin!(noted);
            noted.as_mut().enable();
            if self.since(subject, sent) {
                return;
            }
            noted.await;
        }
    }
}

impl Publisher {
    pub fn new(client: async_nats::Client, metrics: Metrics) -> Publisher {
        Publisher {
            client,
            answered: None,
            metrics,
            breakers: Arc::default(),
        }
    }

    /// A publisher that sends copies of the egress families in `captured`
    /// (wildcards such as `P.private.*.*`, each captured whole by a stream:
    /// see `ingest::jetstream::captured_egress`) as JetStream publishes;
    /// the rest as core publishes. Answers are awaited at most half of
    /// `ack_wait`, so that a worker has settled a batch before the server
    /// redelivers its messages.
    pub fn answered(
        client: async_nats::Client,
        metrics: Metrics,
        captured: &[String],
        ack_wait: Duration,
        refusals: Arc<Refusals>,
    ) -> Publisher {
        let jetstream = async_nats::jetstream::ContextBuilder::new()
            .timeout(ANSWER_TIMEOUT.min(ack_wait / 2))
            // Workers bound what they hold unanswered (`ANSWER_BATCH` in
            // ingest); the context's own bound, reached, would make a worker
            // wait for answers only it can collect.
            .max_ack_inflight(1 << 20)
            .build(client.clone());
        let prefixes = captured
            .iter()
            .map(|family| family.split('*').next().unwrap_or_default().to_string())
            .collect();
        Publisher {
            client,
            answered: Some(Answered {
                jetstream,
                prefixes,
                refusals,
            }),
            metrics,
            breakers: Arc::default(),
        }
    }

    /// True when a copy on `subject` goes through
    /// [`Publisher::send_answered`]: a stream captures its family.
    pub fn answers(&self, subject: &str) -> bool {
        self.answered
            .as_ref()
            .is_some_and(|a| a.prefixes.iter().any(|p| subject.starts_with(p.as_str())))
    }

    /// Publishes one message. A failure is counted, logged (rate-limited)
    /// and returned; the caller goes on with the next message.
    pub async fn send(&self, out: Outbound) -> Result<(), async_nats::PublishError> {
        debug_assert_safe(&out.subject);
        let delivery = out.delivery;
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
        match (&result, delivery) {
            (Err(e), _) => self.metrics.dropped(DropReason::PublishError, e),
            (Ok(()), Some(to)) => self.metrics.delivered(to),
            (Ok(()), None) => {}
        }
        result
    }

    /// Publishes one message as a JetStream publish, which the stream that
    /// captures its subject answers once it has stored it. `None`: not
    /// sent, and sending again could help (the connection is gone); the
    /// input must stay unacknowledged. An output the server can never take
    /// (too large) is counted as a publish error and answered as done, like
    /// the core path, so its input is not redelivered forever.
    pub async fn send_answered(&self, out: Outbound) -> Option<Answer> {
        debug_assert_safe(&out.subject);
        let answered = self.answered.as_ref()?;
        let delivery = out.delivery;
        let mut publish =
            async_nats::jetstream::message::PublishMessage::build().payload(out.payload);
        if let Some(id) = out.msg_id {
            publish = publish.message_id(id);
        }
        let (subject, sent) = (out.subject.clone(), Instant::now());
        match answered.jetstream.send_publish(out.subject, publish).await {
            Ok(answer) => Some(Answer::Awaited {
                answer,
                delivery,
                subject,
                sent,
            }),
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

    /// Waits for the stream's answer to one output: true once it is settled
    /// (stored, and counted as a delivery, or refused, which is counted as a
    /// publish error: by the stream, here, or by the server's permissions,
    /// when their error comes, which ends the wait: no answer follows it),
    /// false when no stream answered (timed out, the connection went, or
    /// "no responders": the stream is not there now) or a clustered stream
    /// answered that it cannot store anything just now, so the input must
    /// be redelivered.
    pub async fn settled(&self, answer: Answer) -> bool {
        let Answer::Awaited {
            answer,
            delivery,
            subject,
            sent,
        } = answer
        else {
            return true;
        };
        let Some(answered) = &self.answered else {
            return false;
        };
        let answer = tokio::select! {
            biased;
            answer = answer => answer,
            () = answered.refusals.refused(&subject, sent) => return true,
        };
        match answer {
            Ok(_) => {
                if let Some(to) = delivery {
                    self.metrics.delivered(to);
                }
                true
            }
            Err(e) if refused(&e) => {
                self.metrics.dropped(DropReason::PublishError, &e);
                true
            }
            Err(e) if e.kind() == PublishErrorKind::TimedOut => {
                // Or refused as the wait ended.
                let refused = answered.refusals.since(&subject, sent);
                tracing::debug!(subject, refused, "{NO_ANSWER}");
                refused
            }
            Err(e) => {
                if unavailable(&e) {
                    tracing::debug!(subject, error = %e, "a clustered stream cannot store just now");
                }
                false
            }
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
    /// "reason": "…"}`. Not while the subject rests ([`crate::breaker`]).
    pub async fn ask_policy(&self, check: &PolicyCheck) -> PolicyOutcome {
        let subject = check.subject.as_str();
        let resting = self
            .breakers
            .resting(subject, Instant::now(), check.trip_after);
        if let Some(Resting { left, timeouts }) = resting {
            return PolicyOutcome::Failed {
                failure: PolicyFailure::Skipped,
                why: format!(
                    "not asked: its last {timeouts} questions went unanswered; asked again in {} ms",
                    left.as_millis().max(1)
                ),
            };
        }
        let asked = Instant::now();
        // Its only timeout is `timeout_ms`, not also the client's 10 s
        // (which cut short the longer one a debug build's test may give:
        // fault::policy_timeout); the client's bounds JetStream's calls.
        let request = self.client.send_request(
            check.subject.clone(),
            async_nats::Request::new()
                .payload(check.request.clone())
                .timeout(None),
        );
        let reply = match tokio::time::timeout(check.timeout, request).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) if e.kind() != RequestErrorKind::TimedOut => {
                Err((PolicyFailure::Error, e.to_string()))
            }
            _ => Err((
                PolicyFailure::Timeout,
                format!("no answer within {} ms", check.timeout.as_millis()),
            )),
        };
        let ended = match &reply {
            Err((PolicyFailure::Timeout, _)) => Ended::TimedOut,
            _ => Ended::Answered { asked },
        };
        self.breakers
            .record(subject, ended, Instant::now(), check.trip_after);
        match reply {
            Ok(reply) => read_answer(&reply.payload),
            Err((failure, why)) => PolicyOutcome::Failed { failure, why },
        }
    }

    /// Waits until everything published so far has reached the server.
    pub async fn flush(&self) -> Result<(), async_nats::client::FlushError> {
        self.client.flush().await
    }
}

/// The characters of a policy service's reason kept (the event's reason
/// quotes it).
pub const MAX_POLICY_REASON_CHARS: usize = 500;

/// What a policy service's answer says: `{"decision": "approve"|"reject",
/// "reason": "…"}` (other fields ignored; a reject's reason optional, cut
/// to [`MAX_POLICY_REASON_CHARS`]). Anything else is a failed question, as
/// no answer is: the service's bytes are not trusted.
pub fn read_answer(payload: &[u8]) -> PolicyOutcome {
    #[derive(serde::Deserialize)]
    struct Answer {
        decision: String,
        #[serde(default)]
        reason: Option<String>,
    }
    // An object: serde would also read `["approve"]` as one.
    let object = payload.trim_ascii_start().first() == Some(&b'{');
    match serde_json::from_slice::<Answer>(payload)
        .ok()
        .filter(|_| object)
    {
        Some(a) if a.decision == "approve" => PolicyOutcome::Approve,
        Some(a) if a.decision == "reject" => PolicyOutcome::Reject(
            a.reason
                .unwrap_or_else(|| "rejected by the policy service".into())
                .chars()
                .take(MAX_POLICY_REASON_CHARS)
                .collect(),
        ),
        _ => PolicyOutcome::Failed {
            failure: PolicyFailure::Error,
            why: "the answer is not {\"decision\": \"approve\"|\"reject\"}".into(),
        },
    }
}

/// The server's answer to one JetStream publish, still to come or already
/// known.
pub enum Answer {
    Awaited {
        answer: PublishAckFuture,
        /// Where the copy counts as a delivery once stored.
        delivery: Option<crate::routing::Visibility>,
        /// Where and when it was sent: the wait ends when the server's
        /// permissions refuse that subject since.
        subject: String,
        sent: Instant,
    },
    Done,
}

/// True when a failed JetStream publish was answered by the stream, which
/// refused the copy (full, or its own error): settled, but not stored, and
/// retrying could loop for as long as the stream refuses. False when no
/// stream answered: timed out, the connection went, or "no responders" (the
/// stream that captured the subject at start-up is not there now); and when
/// a clustered stream answered that it cannot store anything just now
/// ([`unavailable`]).
fn refused(e: &StoreError) -> bool {
    let unanswered = matches!(
        e.kind(),
        PublishErrorKind::StreamNotFound
            | PublishErrorKind::TimedOut
            | PublishErrorKind::BrokenPipe
    );
    !unanswered && !unavailable(e)
}

/// A clustered stream's answer while it has no leader or no quorum (a NATS
/// server restarting in a rolling upgrade, an election): "JetStream system
/// temporarily unavailable" (10008), "cluster can not handle request"
/// (10009), or a 503 without a code whose description is the replication
/// layer's (`raft: …`: a proposal that failed). Settling on it would lose
/// the copy for a pause of the cluster: the input is redelivered instead. A
/// full stream (503 with 10077, "maximum messages exceeded"; servers before
/// error codes gave it no code) is a refusal.
fn unavailable(e: &StoreError) -> bool {
    use async_nats::jetstream::{Error as ApiError, ErrorCode};
    let Some(api) = std::error::Error::source(e).and_then(|s| s.downcast_ref::<ApiError>()) else {
        return false;
    };
    matches!(
        api.error_code(),
        ErrorCode::CLUSTER_NOT_AVAILABLE | ErrorCode::CLUSTER_NOT_LEADER
    ) || (api.code() == 503
        && api.error_code() == ErrorCode(0)
        && api.to_string().starts_with("raft:"))
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

    /// A policy service's bytes are untrusted: only the two answers count,
    /// a reason is kept to 500 characters (not bytes), and anything else is
    /// a failed question.
    #[test]
    fn a_policy_answer_is_read_strictly() {
        let failed = |p: &[u8]| {
            matches!(
                read_answer(p),
                PolicyOutcome::Failed {
                    failure: PolicyFailure::Error,
                    ..
                }
            )
        };
        assert_eq!(
            read_answer(br#"{"decision":"approve"}"#),
            PolicyOutcome::Approve
        );
        assert_eq!(
            read_answer(br#"{"decision":"approve","reason":"fine","score":0.9}"#),
            PolicyOutcome::Approve,
            "other fields ignored"
        );
        assert_eq!(
            read_answer(br#"{"decision":"reject","reason":"off topic"}"#),
            PolicyOutcome::Reject("off topic".into())
        );
        for no_reason in [
            &br#"{"decision":"reject"}"#[..],
            br#"{"decision":"reject","reason":null}"#,
        ] {
            assert_eq!(
                read_answer(no_reason),
                PolicyOutcome::Reject("rejected by the policy service".into())
            );
        }
        let long = format!(r#"{{"decision":"reject","reason":"{}"}}"#, "é".repeat(600));
        assert_eq!(
            read_answer(long.as_bytes()),
            PolicyOutcome::Reject("é".repeat(MAX_POLICY_REASON_CHARS))
        );
        for bad in [
            &b""[..],
            b"approve",
            b"\xff\xfe",
            br#"{"decision":"Approve"}"#,
            br#"{"decision":"maybe"}"#,
            br#"{"decision":1}"#,
            br#"{"decision":"reject","reason":5}"#,
            br#"{"reason":"no decision"}"#,
            br#"["approve"]"#,
            br#"["reject","why"]"#,
            br#"{"decision":"approve""#,
        ] {
            assert!(failed(bad), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    proptest::proptest! {
        /// As the fuzz target (fuzz/fuzz_targets/policy_answer.rs): an
        /// approval only from an object whose decision is "approve", a
        /// rejection only from one whose decision is "reject", with its
        /// reason, cut to the bound, or the default. Answers built as a
        /// service might send them: a decision of any JSON kind, a reason
        /// of any length (or another kind, or none), other fields, spaces,
        /// and now and then the object in an array, its values alone in
        /// one, or cut short.
        #[test]
        fn any_answer_is_read_within_its_bounds(
            decision in proptest::sample::select(vec![
                r#""approve""#, r#""reject""#, r#""Approve""#, r#""maybe""#, "1", "null", "true",
                r#"["approve"]"#, r#"{"x":1}"#,
            ]),
            reason in proptest::option::of(proptest::prop_oneof![
                proptest::strategy::Strategy::prop_map("[a-zé ]{0,700}", |r| {
                    serde_json::to_string(&r).unwrap()
                }),
                proptest::sample::select(vec!["null".to_string(), "5".to_string(), "[]".to_string()]),
            ]),
            extra in proptest::option::of(r#""[a-z]{1,8}":[0-9]{1,3}"#),
            reason_first in proptest::bool::ANY,
            space in proptest::sample::select(vec!["", " ", "\n\t "]),
            wrap in proptest::sample::select(vec!["object", "array", "fields", "cut"]),
        ) {
            let mut members = vec![format!(r#""decision":{space}{decision}"#)];
            if let Some(r) = &reason {
                members.insert(usize::from(!reason_first), format!(r#""reason":{r}"#));
            }
            members.extend(extra.clone());
            let object = format!("{space}{{{space}{}{space}}}", members.join(","));
            // Cut as bytes: maybe inside a character, as a network can.
            let bytes = match wrap {
                "array" => format!("[{object}]").into_bytes(),
                // The values alone, in order: serde reads that as the struct.
                "fields" => {
                    let r = reason.as_ref().map(|r| format!(",{r}")).unwrap_or_default();
                    format!("[{decision}{r}]").into_bytes()
                }
                "cut" => object.as_bytes()[..object.len() / 2].to_vec(),
                _ => object.into_bytes(),
            };
            let text = String::from_utf8_lossy(&bytes);
            let value = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
            let read = |key: &str| value.as_ref().filter(|v| v.is_object()).map(|v| v[key].clone());
            let said = read("decision");
            match read_answer(&bytes) {
                PolicyOutcome::Approve => {
                    proptest::prop_assert_eq!(said, Some(serde_json::json!("approve")), "{}", text);
                }
                PolicyOutcome::Reject(why) => {
                    proptest::prop_assert_eq!(said, Some(serde_json::json!("reject")), "{}", text);
                    let expected = match read("reason") {
                        Some(serde_json::Value::String(r)) => r.chars().take(MAX_POLICY_REASON_CHARS).collect(),
                        _ => "rejected by the policy service".to_string(),
                    };
                    proptest::prop_assert_eq!(why, expected, "{}", text);
                }
                PolicyOutcome::Failed { .. } => {
                    // Not a readable answer: not an object, a decision
                    // that is neither, or a reason that is not a string.
                    let readable = matches!(read("reason"), Some(serde_json::Value::String(_) | serde_json::Value::Null) | None)
                        && value.as_ref().is_some_and(|v| v.is_object())
                        && matches!(said.as_ref().and_then(|d| d.as_str()), Some("approve" | "reject"));
                    proptest::prop_assert!(!readable, "{}", text);
                }
            }
        }
    }

    #[test]
    fn only_a_missing_answer_leaves_the_input_for_redelivery() {
        let refused = |kind| refused(&StoreError::new(kind));
        // No answer, or no stream there to answer: the copy may not be stored.
        assert!(!refused(PublishErrorKind::StreamNotFound));
        assert!(!refused(PublishErrorKind::TimedOut));
        assert!(!refused(PublishErrorKind::BrokenPipe));
        // The stream answered with an error: sending again would not help.
        assert!(refused(PublishErrorKind::Other));
        assert!(refused(PublishErrorKind::WrongLastSequence));
    }

    /// The stream's own answers, as nats-server words them.
    #[test]
    fn a_clustered_stream_without_a_leader_leaves_the_input_for_redelivery() {
        let answered = |json: &str| {
            let api: async_nats::jetstream::Error = serde_json::from_str(json).unwrap();
            refused(&StoreError::with_source(PublishErrorKind::Other, api))
        };
        // No leader or no quorum: the copy waits for the cluster.
        assert!(!answered(
            r#"{"code":503,"err_code":10008,"description":"JetStream system temporarily unavailable"}"#
        ));
        assert!(!answered(
            r#"{"code":500,"err_code":10009,"description":"JetStream cluster can not handle request"}"#
        ));
        assert!(!answered(
            r#"{"code":503,"description":"raft: not leader"}"#
        ));
        // A full stream (with a code, and without, as before error codes),
        // a copy too large for it: refusals.
        assert!(answered(
            r#"{"code":503,"description":"maximum messages exceeded"}"#
        ));
        assert!(answered(
            r#"{"code":503,"err_code":10077,"description":"maximum messages exceeded"}"#
        ));
        assert!(answered(
            r#"{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"}"#
        ));
    }

    #[test]
    fn a_refusal_counts_for_publishes_sent_before_it_to_its_subject() {
        let refusals = Refusals::default();
        let sent = Instant::now();
        assert!(!refusals.since("chat.public.w", sent));
        refusals.record("chat.public.w");
        assert!(refusals.since("chat.public.w", sent));
        assert!(!refusals.since("chat.public.v", sent), "another subject");
        let later = Instant::now() + Duration::from_millis(1);
        assert!(!refusals.since("chat.public.w", later), "sent after it");
    }

    #[tokio::test]
    async fn a_wait_for_an_answer_ends_at_a_refusal_of_its_subject() {
        let refusals = Arc::new(Refusals::default());
        let sent = Instant::now();
        let wait = tokio::spawn({
            let refusals = refusals.clone();
            async move { refusals.refused("chat.public.w", sent).await }
        });
        tokio::task::yield_now().await;
        refusals.record("chat.public.v");
        tokio::task::yield_now().await;
        assert!(
            !wait.is_finished(),
            "another subject's refusal ends nothing"
        );
        refusals.record("chat.public.w");
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("woken by the refusal")
            .unwrap();
        // Refused already: no wait.
        tokio::time::timeout(
            Duration::from_secs(10),
            refusals.refused("chat.public.w", sent),
        )
        .await
        .expect("at once");
    }

    #[test]
    fn refusals_are_bounded() {
        let refusals = Refusals::default();
        let sent = Instant::now();
        for i in 0..=MAX_REFUSALS {
            refusals.record(&format!("chat.public.w{i}"));
        }
        let held = refusals.refused.lock().unwrap().len();
        assert!(held <= MAX_REFUSALS, "{held}");
        let newest = format!("chat.public.w{MAX_REFUSALS}");
        assert!(refusals.since(&newest, sent), "the newest is kept");
    }
}
