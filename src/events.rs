//! Decision events (contract §4) and the one place a decision is reported:
//! [`report`] writes the log line, counts the decision's metrics and
//! serialises the event, so the three can never disagree. What happens to
//! the copies afterwards is counted where they are published (publish.rs):
//! `loopguard_deliveries_total` for each copy sent, `loopguard_dropped_total`
//! for each that could not be, which the event's `delivered_to` (the
//! decision) cannot know. Timings and the policy service's outcomes are
//! counted where they are measured: `loopguard_decision_duration_seconds`
//! by the judge, `loopguard_policy_*` as the answer comes in.

use crate::config::Config;
use crate::json;
use crate::judge::{message_key, Decision, Outbound};
use crate::metrics::{Metrics, Outcome};
use crate::names::Name;
use crate::rules::RuleName;
use crate::subject::{SenderKind, Subjects};

/// Logs and counts `d`, and returns its event when one is due.
pub fn report(
    d: &Decision,
    config: &Config,
    subjects: &Subjects,
    metrics: &Metrics,
) -> Option<Outbound> {
    let world = d.world.as_ref().map_or("", |w| w.as_str());
    let rule = d.rule.map_or("", RuleName::as_str);
    // The id, a reason (a policy service's own words) and the sender of an
    // invalid subject (any Unicode but control characters) are a client's
    // text: recorded as strings, which the text format writes quoted and
    // escaped (a newline cannot start a forged line, a space cannot fake a
    // field) and the JSON format as JSON strings.
    let (id, reason, sender) = (d.id.as_str(), &*d.reason, d.sender.as_str());
    match d.outcome {
        Outcome::Rejected => tracing::debug!(
            world,
            sender,
            kind = d.kind.map_or("", SenderKind::as_str),
            id = logged_id(id),
            rule,
            reason,
            "message rejected"
        ),
        _ => {
            tracing::trace!(
                world,
                sender,
                id = logged_id(id),
                outcome = d.outcome.as_str(),
                "message delivered"
            )
        }
    }
    if let Some(handoff) = d.handoff {
        tracing::info!(
            world,
            sender,
            reason = handoff.as_str(),
            "control handed back to a human"
        );
        metrics.handoff(handoff);
    }

    if let Some(kind) = d.kind {
        metrics.message(kind, d.outcome);
    }
    if let (Outcome::Rejected, Some(rule)) = (d.outcome, d.rule) {
        metrics.suppressed(rule);
    }
    if let Some(rule) = d.would_reject {
        metrics.would_suppress(rule);
    }

    let world_name = d.world.as_ref()?;
    let plain_approval = d.outcome == Outcome::Approved && d.would_reject.is_none();
    if plain_approval && !config.events.approved {
        return None;
    }
    // The event published on `P.events.W` (contract §4).
    let mut event = json::Object::with_capacity(256 + d.reason.len());
    event
        .str("id", &d.id)
        .str("world", world)
        .str("sender", &d.sender)
        .opt_str("sender_kind", d.kind.map(SenderKind::as_str))
        .str("decision", d.outcome.as_str())
        .opt_str("rule", d.rule.map(RuleName::as_str))
        .str("reason", &d.reason)
        .u32("depth", d.depth)
        .u32("turn", d.turn)
        .joined_strs("delivered_to", d.delivered_to.entries())
        .str("observed_at", d.observed_at.as_str());
    if let Some(rule) = d.would_reject {
        event.str("would_reject", rule.as_str());
    }
    Some(Outbound {
        subject: subjects.events(world_name),
        msg_id: Some(event_id(d, world_name)),
        payload: event.finish(),
        delivery: None,
    })
}

/// Characters of a message's id a log line holds at most: a client's id may
/// be as long as a payload (a megabyte), a log line need not be.
const LOGGED_ID_CHARS: usize = 256;

/// `id` cut to [`LOGGED_ID_CHARS`] characters for a log line.
fn logged_id(id: &str) -> &str {
    id.char_indices()
        .nth(LOGGED_ID_CHARS)
        .map_or(id, |(end, _)| &id[..end])
}

/// The event's `Nats-Msg-Id`: the message's key, `event` and the decision
/// (`event.approved`, `event.rejected.duplicate`...), so an events stream
/// drops an event published again (a JetStream message processed again)
/// as an egress stream drops the copies, but keeps a different decision
/// about the same id (a client's resent message rejected as a duplicate).
/// The key is taken from a copy's id where the decision has one (no second
/// hash on the hot path).
fn event_id(d: &Decision, world: &Name) -> String {
    let mut buffer = uuid::Uuid::encode_buffer();
    let copied = d
        .outbound
        .iter()
        .find_map(|o| Some(o.msg_id.as_deref()?.split_once(':')?.0));
    let key = match copied {
        Some(key) => key,
        None => {
            let kind = d.kind.map_or("", SenderKind::as_str);
            message_key(world, kind, &d.sender, &d.id)
                .hyphenated()
                .encode_lower(&mut buffer)
        }
    };
    // Written once: key, `:event.`, the decision and its rule.
    let (outcome, rule) = (d.outcome.as_str(), d.rule.map_or("", RuleName::as_str));
    let mut id = String::with_capacity(key.len() + 8 + outcome.len() + 1 + rule.len());
    id.push_str(key);
    id.push_str(":event.");
    id.push_str(outcome);
    if !rule.is_empty() {
        id.push('.');
        id.push_str(rule);
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_line_holds_an_id_s_first_256_characters() {
        assert_eq!(logged_id("m1"), "m1");
        let long = "é".repeat(LOGGED_ID_CHARS + 10);
        assert_eq!(logged_id(&long), "é".repeat(LOGGED_ID_CHARS));
        let exact = "x".repeat(LOGGED_ID_CHARS);
        assert_eq!(logged_id(&exact), exact);
    }
}
