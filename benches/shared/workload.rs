//! The relay benchmark's workload, shared with `examples/pgo_train.rs`
//! (which trains the profile-guided build on it, see scripts/pgo.sh) and
//! `examples/copy_relay.rs` (the benchmark's baseline (b2)).
//!
//! 100,000 worlds, four agents each, a human message after every four agent
//! messages, agent messages that @mention the next agent, ~200-byte unique
//! contents, and one message in ten (an agent's: one agent message in
//! eight) repeating the previous one.

use std::time::{Duration, Instant};

use futures::StreamExt;

pub const WORLDS: u64 = 100_000;
pub const AGENTS: u64 = 4;

/// Message `seq` of the workload: (ingress subject, egress subject for the
/// direct set-up, payload, whether loopguard should approve it). Sequence
/// numbers run on across the steps of one set-up, so message `seq` is turn
/// `seq / WORLDS` of world `seq % WORLDS`: a world's conversation goes on
/// from step to step, as it would in production.
///
/// Each world's conversation is shifted by `world % 10` turns, so at any
/// moment a fifth of the traffic is human and a tenth duplicates, as in each
/// world. (Unshifted, all 100,000 worlds reached their human turn together,
/// and loopguard got nothing but five-copy broadcasts for a stretch.)
pub fn message(seq: u64) -> (String, String, String, bool) {
    let world = seq % WORLDS;
    let k = seq / WORLDS; // position in the world's own conversation
    let turn = k + world % 10; // the same conversation, in its own phase
    let filler = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua ut enim ad minim veniam quis nostrud";
    if turn % 5 == 4 {
        let payload = format!("{{\"id\":\"{seq}\",\"content\":\"question {seq}: {filler}\"}}");
        return (
            format!("chat.raw.w{world}.human.h"),
            format!("chat.public.w{world}"),
            payload,
            true,
        );
    }
    let agent = turn % AGENTS;
    let next = (agent + 1) % AGENTS;
    let (text_seq, approved) = if is_duplicate(seq) {
        (seq - WORLDS, false)
    } else {
        (seq, true)
    };
    let payload =
        format!("{{\"id\":\"{seq}\",\"content\":\"@a{next} answer {text_seq}: {filler}\"}}");
    (
        format!("chat.raw.w{world}.agent.a{agent}"),
        format!("chat.public.w{world}"),
        payload,
        approved,
    )
}

/// Whether message `seq` repeats its world's previous message (so loopguard
/// rejects it): one message in ten, at turn % 10 == 7, always an agent's
/// (one agent message in eight) whose previous turn is an agent's too; a
/// world's first message has none to repeat.
pub fn is_duplicate(seq: u64) -> bool {
    let (world, k) = (seq % WORLDS, seq / WORLDS);
    (k + world % 10) % 10 == 7 && k > 0
}

/// The numeric `"id":"…"` of a payload of this workload (or of an egress
/// copy of one).
pub fn id_of(payload: &[u8]) -> Option<u64> {
    let at = payload.windows(6).position(|w| w == b"\"id\":\"")? + 6;
    let end = payload[at..].iter().position(|&b| b == b'"')? + at;
    std::str::from_utf8(&payload[at..end]).ok()?.parse().ok()
}

/// Publishes a `ready?` message to `subject` every 200 ms until `copies` of
/// it came out on `echo` (one from each relay listening) in one round.
/// False if that did not happen within `limit`.
pub async fn until_echoed(
    client: &async_nats::Client,
    subject: &'static str,
    echo: &'static str,
    copies: usize,
    limit: Duration,
) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
    let mut echoes = client.subscribe(echo).await?;
    client.flush().await?;
    let deadline = Instant::now() + limit;
    loop {
        client
            .publish(subject, "{\"content\":\"ready?\"}".into())
            .await?;
        let mut seen = 0;
        while let Ok(Some(_)) =
            tokio::time::timeout(Duration::from_millis(200), echoes.next()).await
        {
            seen += 1;
            if seen >= copies {
                return Ok(true);
            }
        }
        if Instant::now() > deadline {
            return Ok(false);
        }
    }
}
