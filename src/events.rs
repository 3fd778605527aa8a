//! Decision events (contract §4) and the one place a decision is reported:
//! [`report`] writes the log line, counts the metrics and serialises the
//! event, so the three can never disagree.

use serde::Serialize;

use crate::config::Config;
use crate::judge::{to_bytes, Decision, Outbound};
use crate::metrics::{Metrics, Outcome};
use crate::routing::Visibility;
use crate::rules::RuleName;
use crate::subject::{SenderKind, Subjects};

/// The event published on `P.events.W`.
#[derive(Serialize)]
struct Event<'a> {
    id: &'a str,
    world: &'a str,
    sender: &'a str,
    sender_kind: Option<SenderKind>,
    decision: &'static str,
    rule: Option<RuleName>,
    reason: &'a str,
    depth: u32,
    turn: u32,
    delivered_to: &'a [String],
    observed_at: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    would_reject: Option<RuleName>,
}

/// Logs and counts `d`, and returns its event when one is due.
pub fn report(
    d: &Decision,
    config: &Config,
    subjects: &Subjects,
    metrics: &Metrics,
) -> Option<Outbound> {
    let world = d.world.as_ref().map_or("", |w| w.as_str());
    let rule = d.rule.map_or("", RuleName::as_str);
    match d.outcome {
        Outcome::Rejected => tracing::debug!(
            world, sender = %d.sender, kind = d.kind.map_or("", SenderKind::as_str),
            id = %d.id, rule, reason = %d.reason, "message rejected"
        ),
        _ => {
            tracing::trace!(world, sender = %d.sender, id = %d.id, outcome = d.outcome.as_str(), "message delivered")
        }
    }
    if let Some(handoff) = d.handoff {
        tracing::info!(world, sender = %d.sender, reason = handoff.as_str(), "control handed back to a human");
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
    let private = d
        .delivered_to
        .iter()
        .filter(|t| t.starts_with("private."))
        .count();
    let notices = usize::from(d.handoff == Some(crate::metrics::Handoff::TurnLimit));
    metrics.deliveries(Visibility::Public, d.delivered_to.len() - private + notices);
    metrics.deliveries(Visibility::Private, private);

    let world_name = d.world.as_ref()?;
    let plain_approval = d.outcome == Outcome::Approved && d.would_reject.is_none();
    if plain_approval && !config.events.approved {
        return None;
    }
    let event = Event {
        id: &d.id,
        world,
        sender: &d.sender,
        sender_kind: d.kind,
        decision: d.outcome.as_str(),
        rule: d.rule,
        reason: &d.reason,
        depth: d.depth,
        turn: d.turn,
        delivered_to: &d.delivered_to,
        observed_at: &d.observed_at,
        would_reject: d.would_reject,
    };
    Some(Outbound {
        subject: subjects.events(world_name),
        msg_id: None,
        payload: to_bytes(&event),
    })
}
