//! The benchmark's second baseline (b2): the least a relay can do that
//! publishes what loopguard publishes. Subscribes to `chat.raw.>` and, for
//! each message of the relay benchmark's workload (benches/shared/
//! workload.rs), publishes the copies loopguard does, with no judgement and
//! no state:
//!
//! - a human's message: an egress body to the transcript and to the four
//!   agents' inboxes;
//! - an agent's, which starts with a mention: to that agent's inbox;
//! - a duplicate (the workload says which): a rejection event.
//!
//! Each copy carries a `Nats-Msg-Id` header as long as loopguard's, and the
//! egress body is the ingress payload with loopguard's fields appended, so
//! about as long as loopguard's. Where loopguard parses, keeps state and
//! decides, this reads the workload's arithmetic; what is left is the cost
//! of the output the contract asks for: ~1.8 copies a message instead of
//! the bare relay's one. The relay benchmark checks, from the server's
//! counts, that it publishes as many messages and bytes as loopguard.
//!
//! usage: copy_relay <nats-url>

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use futures::StreamExt;

#[path = "../benches/shared/baseline.rs"]
mod baseline;

#[path = "../benches/shared/workload.rs"]
#[allow(dead_code)] // the producers' half of it is the benchmark's
mod workload;

/// As loopguard and the bare relay.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `received_at` and `observed_at`: RFC 3339 with milliseconds, as long as
/// loopguard's (whose clock the copies need not follow).
const AT: &str = "2026-11-22T20:00:00.000Z";

/// One runtime thread, as loopguard (by default) and the bare relay.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), async_nats::Error> {
    let (client, mut raw) = baseline::subscribe_raw("copy_relay").await?;
    let agents: Vec<String> = (0..workload::AGENTS).map(|a| format!("a{a}")).collect();
    while let Some(m) = raw.next().await {
        // chat.raw.<world>.<kind>.<name>
        let mut parts = m.subject.split('.').skip(2);
        let (Some(world), Some(kind), Some(sender)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Some(seq) = workload::id_of(&m.payload) else {
            // The benchmark's readiness probes (any payload without the
            // workload's numeric id): to the transcript as they are.
            client
                .publish(join(&["chat.public.", world]), m.payload)
                .await?;
            continue;
        };
        if workload::is_duplicate(seq) {
            let event = join(&[
                "{\"id\":\"",
                &seq.to_string(),
                "\",\"world\":\"",
                world,
                "\",\"sender\":\"",
                sender,
                "\",\"sender_kind\":\"",
                kind,
                "\",\"decision\":\"rejected\",\"rule\":\"duplicate\",\"reason\":\"the same content was already approved in this world within the last 300s\",\"depth\":2,\"turn\":2,\"delivered_to\":[],\"observed_at\":\"",
                AT,
                "\"}",
            ]);
            client
                .publish(join(&["chat.events.", world]), event.into())
                .await?;
            continue;
        }
        let human = kind == "human";
        // An agent's message starts with a mention of the next agent.
        let addressee = match human {
            true => None,
            false => {
                let Some(a) = sender.strip_prefix('a').and_then(|a| a.parse::<u64>().ok()) else {
                    continue; // not the workload's
                };
                Some(agents[(a % workload::AGENTS + 1) as usize % agents.len()].as_str())
            }
        };
        // A name-based UUID's length, like loopguard's message key.
        let key = format!("{:08x}-0000-5000-8000-{:012x}", seq as u32, seq);
        let payload = &m.payload[..m.payload.len().saturating_sub(1)]; // its '}'
        let body = join(&[
            // The ingress payload is the workload's, so UTF-8.
            std::str::from_utf8(payload).unwrap_or_default(),
            ",\"world\":\"",
            world,
            "\",\"sender\":\"",
            sender,
            "\",\"sender_kind\":\"",
            kind,
            "\",\"thread_id\":\"",
            &(seq % workload::WORLDS).to_string(),
            "\",\"parent_id\":\"",
            &seq.saturating_sub(workload::WORLDS).to_string(),
            "\",\"depth\":2,\"mentions\":[",
            &addressee
                .map(|a| join(&["\"", a, "\""]))
                .unwrap_or_default(),
            "],\"visibility\":\"",
            if human { "public" } else { "private" },
            "\",\"received_at\":\"",
            AT,
            "\"}",
        ]);
        let body = bytes::Bytes::from(body);
        let copy = |subject: String, dest: &[&str]| {
            let mut id = String::with_capacity(key.len() + 1 + 16);
            id.push_str(&key);
            id.push(':');
            dest.iter().for_each(|d| id.push_str(d));
            let mut headers = HeaderMap::new();
            headers.insert(NATS_MESSAGE_ID, id);
            client.publish_with_headers(subject, headers, body.clone())
        };
        let inbox = |agent: &str| join(&["chat.private.", world, ".", agent]);
        match addressee {
            None => {
                copy(join(&["chat.public.", world]), &["public"]).await?;
                for a in &agents {
                    copy(inbox(a), &["private.", a]).await?;
                }
            }
            Some(a) => copy(inbox(a), &["private.", a]).await?,
        }
    }
    Ok(())
}

/// The parts, end to end, in one allocation.
fn join(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    parts.iter().for_each(|p| s.push_str(p));
    s
}
