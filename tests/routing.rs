//! Contract §3 and §4 end to end: every routing row, the roster, and the
//! egress payload, against a real nats-server and the real binary.

mod support;

use serde_json::json;
use support::{msg, within, Harness};

/// A world with three roster agents, and loop rules out of the way.
const LOBBY: &str = r#"
[rules.depth]
max = 0
[rules.duplicate]
window_seconds = 0
[rules.rate]
max = 0
[worlds.lobby]
agents = ["alice", "bob", "carol"]
"#;

#[tokio::test]
async fn agent_message_without_leading_mention_goes_to_the_public_transcript_only() {
    let mut h = Harness::start(LOBBY).await;
    h.send_json("lobby", "agent", "alice", msg("I think @bob is right"))
        .await;
    let out = h.settle("lobby").await;
    let public = out.public("lobby");
    assert_eq!(public.len(), 1);
    assert_eq!(public[0].body["visibility"], "public");
    assert_eq!(public[0].body["mentions"], json!([]));
    assert!(out.all_private("lobby").is_empty());
    assert_eq!(out.event("lobby").body["delivered_to"], json!(["public"]));
}

#[tokio::test]
async fn leading_mentions_from_any_sender_go_only_to_the_mentioned_inboxes() {
    let mut h = Harness::start(LOBBY).await;
    for (kind, name) in [("agent", "alice"), ("human", "hank"), ("system", "ops")] {
        h.send_json("lobby", kind, name, msg("@Bob, @carol please review"))
            .await;
        let out = h.settle("lobby").await;
        assert!(out.public("lobby").is_empty(), "{kind}: nothing public");
        for agent in ["bob", "carol"] {
            let copies = out.private("lobby", agent);
            assert_eq!(copies.len(), 1, "{kind}: one copy for {agent}");
            assert_eq!(copies[0].body["visibility"], "private");
            assert_eq!(copies[0].body["mentions"], json!(["bob", "carol"]));
        }
        assert!(out.private("lobby", "alice").is_empty());
        assert_eq!(
            out.event("lobby").body["delivered_to"],
            json!(["private.bob", "private.carol"])
        );
    }
}

/// `@bob.` and `@bob?` are `@name` at the paragraph's start: the
/// punctuation closes the mention (before 2026-11-23 they went public).
#[tokio::test]
async fn a_mention_closed_by_punctuation_goes_only_to_its_inbox() {
    let mut h = Harness::start(LOBBY).await;
    for (kind, name, content) in [
        ("agent", "alice", "@bob. can you check?"),
        ("human", "hank", "@Bob? are you there"),
    ] {
        h.send_json("lobby", kind, name, msg(content)).await;
        let out = h.settle("lobby").await;
        assert!(out.public("lobby").is_empty(), "{content}: nothing public");
        let copies = out.private("lobby", "bob");
        assert_eq!(copies.len(), 1, "{content}");
        assert_eq!(copies[0].body["mentions"], json!(["bob"]));
        assert!(out.private("lobby", "carol").is_empty(), "{content}");
    }
}

#[tokio::test]
async fn human_without_mentions_reaches_the_transcript_and_every_other_agent() {
    let mut h = Harness::start(LOBBY).await;
    h.send_json("lobby", "human", "alice", msg("hello everyone"))
        .await;
    let out = h.settle("lobby").await;
    assert_eq!(out.public("lobby").len(), 1);
    assert!(
        out.private("lobby", "alice").is_empty(),
        "a same-named sender gets no copy"
    );
    for agent in ["bob", "carol"] {
        let copy = out.private("lobby", agent);
        assert_eq!(copy.len(), 1);
        assert_eq!(
            copy[0].body["visibility"], "public",
            "a broadcast copy says public"
        );
        assert_eq!(copy[0].body["mentions"], json!([]));
    }
    assert_eq!(
        out.event("lobby").body["delivered_to"],
        json!(["public", "private.bob", "private.carol"])
    );
}

#[tokio::test]
async fn human_with_only_mid_paragraph_mentions_goes_public_only() {
    let mut h = Harness::start(LOBBY).await;
    h.send_json("lobby", "human", "hank", msg("what does @bob think?"))
        .await;
    let out = h.settle("lobby").await;
    assert_eq!(out.public("lobby").len(), 1);
    assert!(out.all_private("lobby").is_empty());
}

#[tokio::test]
async fn system_message_goes_public_only() {
    let mut h = Harness::start(LOBBY).await;
    h.send_json("lobby", "system", "ops", msg("maintenance at noon"))
        .await;
    let out = h.settle("lobby").await;
    assert_eq!(out.public("lobby").len(), 1);
    assert_eq!(out.public("lobby")[0].body["sender_kind"], "system");
    assert!(out.all_private("lobby").is_empty());
}

#[tokio::test]
async fn self_unknown_and_malformed_mentions_count_as_no_mention() {
    let mut h = Harness::start(LOBBY).await;
    for content in [
        "@alice note to self",
        "@zed hi",
        "@ hi",
        "@@bob hi",
        "@bob.x hi",
        "a@bob.com hi",
        "@bob* hi",
        "@bob> hi",
        "@bøb hi",
    ] {
        h.send_json("lobby", "agent", "alice", msg(content)).await;
        let out = h.settle("lobby").await;
        assert_eq!(out.public("lobby").len(), 1, "{content:?} goes public");
        assert!(
            out.all_private("lobby").is_empty(),
            "{content:?} reaches no inbox"
        );
    }
}

/// Joins and raw messages come in on two subscriptions; a backlog on the
/// raw one must not hold joins back until it is empty (as reading raw
/// first, always, did), or a mention right after a join misses its agent.
#[tokio::test]
async fn a_join_is_taken_in_while_raw_messages_are_backlogged() {
    let mut h = Harness::start("").await;
    // loopguard stopped while a backlog, the join, more backlog and the
    // mention are sent: they wait in its socket, in that order, when it
    // resumes, and the join is far ahead of the mention.
    h.loopguard.signal("STOP");
    let backlog = |range: std::ops::Range<usize>| {
        let h = &h;
        async move {
            for i in range {
                h.send_json("busy", "human", "hank", msg(&format!("m{i}")))
                    .await;
            }
        }
    };
    backlog(0..5_000).await;
    h.join("den", "dave").await;
    backlog(5_000..10_000).await;
    h.send_json("den", "agent", "erin", msg("@dave are you there"))
        .await;
    within("flush", h.client.flush()).await.unwrap();
    h.loopguard.signal("CONT");
    let out = h.settle("den").await;
    assert_eq!(
        out.private("den", "dave").len(),
        1,
        "the join was taken in before the mention: {:?}\n{}",
        out.public("den"),
        h.loopguard.logs()
    );
    assert!(out.public("den").is_empty());
}

#[tokio::test]
async fn the_roster_grows_by_join_and_by_publishing() {
    let mut h = Harness::start("[rules.duplicate]\nwindow_seconds = 0\n").await;
    // nobody is on the roster of "den" yet: @dave is no mention
    h.send_json("den", "agent", "erin", msg("@dave are you there"))
        .await;
    let out = h.settle("den").await;
    assert_eq!(out.public("den").len(), 1);

    h.join("den", "Dave").await;
    assert!(
        h.settle("den").await.0.is_empty(),
        "a join publishes nothing, not even an event"
    );
    h.send_json("den", "agent", "erin", msg("@dave now?")).await;
    let out = h.settle("den").await;
    assert_eq!(
        out.private("den", "dave").len(),
        1,
        "join put dave on the roster"
    );

    // erin published, so she is on the roster too
    h.send_json("den", "agent", "dave", msg("@erin yes")).await;
    let out = h.settle("den").await;
    assert_eq!(out.private("den", "erin").len(), 1);
}

#[tokio::test]
async fn egress_keeps_ingress_fields_and_sets_loopguards_own() {
    let mut h = Harness::start(LOBBY).await;
    h.send_json(
        "lobby",
        "human",
        "Hank",
        json!({"content": "@bob hi", "id": "m-1", "lang": "en", "sender": "forged", "meta": {"k": [1]}}),
    )
    .await;
    let out = h.settle("lobby").await;
    let copy = &out.private("lobby", "bob")[0];
    let b = &copy.body;
    assert_eq!(b["id"], "m-1");
    assert_eq!(b["lang"], "en");
    assert_eq!(b["meta"], json!({"k": [1]}));
    assert_eq!(
        b["sender"], "hank",
        "identity comes from the subject, canonicalised"
    );
    assert_eq!(b["sender_kind"], "human");
    assert_eq!(b["world"], "lobby");
    assert_eq!(b["content"], "@bob hi");
    assert_eq!(b["thread_id"], "m-1");
    assert_eq!(b["parent_id"], json!(null));
    assert_eq!(b["depth"], 0);
    let mut keys = copy.keys.clone();
    keys.sort();
    keys.dedup();
    assert_eq!(
        keys.len(),
        copy.keys.len(),
        "each key once, the ingress ones loopguard sets dropped: {:?}",
        copy.keys
    );
    let received_at = b["received_at"].as_str().unwrap();
    assert!(
        received_at.ends_with('Z') && received_at.contains('T'),
        "{received_at}"
    );
    assert!(copy.msg_id.is_some());

    let e = &out.event("lobby").body;
    for key in [
        "id",
        "world",
        "sender",
        "sender_kind",
        "decision",
        "rule",
        "reason",
        "depth",
        "turn",
        "delivered_to",
        "observed_at",
    ] {
        assert!(e.get(key).is_some(), "event has {key}: {e}");
    }
    assert_eq!(e["decision"], "approved");
    assert_eq!(e["rule"], json!(null));
    assert_eq!(e["turn"], 0);
}

#[tokio::test]
async fn msg_ids_are_unique_per_copy_and_stable_when_a_message_is_processed_again() {
    let mut h = Harness::start(LOBBY).await;
    let payload = json!({"content": "hello all", "id": "same"});
    h.send_json("lobby", "human", "hank", payload.clone()).await;
    let first = h.settle("lobby").await;
    h.send_json("lobby", "human", "hank", payload).await;
    let second = h.settle("lobby").await;

    let ids = |o: &support::Outputs| -> Vec<String> {
        o.0.iter()
            .filter(|r| !r.subject.starts_with("chat.events."))
            .map(|r| r.msg_id.clone().unwrap())
            .collect()
    };
    let (a, b) = (ids(&first), ids(&second));
    assert_eq!(a.len(), 4, "public + three inboxes");
    let unique: std::collections::HashSet<_> = a.iter().collect();
    assert_eq!(unique.len(), a.len(), "unique per copy");
    assert_eq!(a, b, "same ingress message, same Nats-Msg-Ids");
}

/// An event's `Nats-Msg-Id` is its message's key, `event` and the decision:
/// unique beside the copies', stable when the message is processed again
/// to the same decision, and there for a rejected message, which has no
/// copies.
#[tokio::test]
async fn events_carry_a_stable_msg_id_of_their_own() {
    let mut h = Harness::start(LOBBY).await;
    let payload = json!({"content": "hello all", "id": "same"});
    let mut runs = Vec::new();
    for _ in 0..2 {
        h.send_json("lobby", "human", "hank", payload.clone()).await;
        runs.push(h.settle("lobby").await);
    }
    let event_id = |o: &support::Outputs| o.event("lobby").msg_id.clone().unwrap();
    let first = event_id(&runs[0]);
    assert_eq!(first, event_id(&runs[1]), "stable");
    let public = runs[0].public("lobby")[0].msg_id.clone().unwrap();
    let key = public.strip_suffix(":public").unwrap();
    assert_eq!(first, format!("{key}:event.approved"));

    // Rejected (no content): no copies, yet an id, one per message.
    for _ in 0..2 {
        h.send_json("lobby", "agent", "alice", json!({"topic": "none"}))
            .await;
    }
    let out = h.settle("lobby").await;
    let events = out.events("lobby");
    assert_eq!(events.len(), 2);
    assert_eq!(events[1].body["rule"], "invalid");
    let ids: Vec<&str> = events
        .iter()
        .map(|e| e.msg_id.as_deref().unwrap())
        .collect();
    assert!(
        ids.iter().all(|id| id.ends_with(":event.rejected.invalid")),
        "{ids:?}"
    );
    assert_ne!(ids[0], ids[1], "one per message");
}

#[tokio::test]
async fn a_nats_msg_id_header_is_the_id_when_the_json_has_none() {
    let mut h = Harness::start(LOBBY).await;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", "hdr-7");
    h.client
        .publish_with_headers("chat.raw.lobby.agent.alice", headers, "plain text".into())
        .await
        .unwrap();
    let out = h.settle("lobby").await;
    assert_eq!(out.public("lobby")[0].body["id"], "hdr-7");
    assert_eq!(out.public("lobby")[0].body["content"], "plain text");
    // An empty header, or an empty `id`, names no message: each of these
    // gets an id of its own (were "" kept, the two would share their
    // copies' Nats-Msg-Id, and an egress stream would keep one).
    let mut empty = async_nats::HeaderMap::new();
    empty.insert("Nats-Msg-Id", "");
    h.client
        .publish_with_headers("chat.raw.lobby.human.hal", empty, "empty header".into())
        .await
        .unwrap();
    h.send_json(
        "lobby",
        "human",
        "hal",
        json!({"content": "empty id", "id": ""}),
    )
    .await;
    let out = h.settle("lobby").await;
    let ids: Vec<&str> = out.public("lobby").iter().map(|r| r.str("id")).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(
        ids.iter().all(|id| !id.is_empty()) && ids[0] != ids[1],
        "{ids:?}"
    );
}

#[tokio::test]
async fn messages_of_one_world_keep_their_order() {
    let mut h =
        Harness::start("[rules.turns]\nmax = 0\n[rules.rate]\nmax = 0\n[rules.depth]\nmax = 0\n")
            .await;
    for i in 0..300 {
        h.send_json(
            "w",
            "agent",
            "alice",
            json!({"content": format!("n{i}"), "id": format!("m{i}")}),
        )
        .await;
    }
    let out = h.settle("w").await;
    let ids: Vec<String> = out
        .public("w")
        .iter()
        .map(|r| r.str("id").to_string())
        .collect();
    let expected: Vec<String> = (0..300).map(|i| format!("m{i}")).collect();
    assert_eq!(ids, expected);
}
