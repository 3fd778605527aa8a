//! Contract §5 end to end: each rule, the hand-back, pass, observe mode and
//! event switches, against a real nats-server and the real binary.

mod support;

use serde_json::json;
use support::{msg, Harness};

/// Every loop rule off; a test turns on the one it proves.
const RULES_OFF: &str = "[rules.turns]\nmax = 0\n[rules.depth]\nmax = 0\n[rules.duplicate]\nwindow_seconds = 0\n[rules.rate]\nmax = 0\n";

fn with(rule: &str) -> String {
    // TOML forbids a table twice, so the rule under test replaces its section.
    let section = rule.lines().next().unwrap();
    let mut out = String::new();
    let mut skip = false;
    for line in RULES_OFF.lines() {
        if line.starts_with('[') {
            skip = line == section;
        }
        if !skip {
            out.push_str(line);
            out.push('\n');
        }
    }
    out + rule
}

#[tokio::test]
async fn turn_limit_rejects_and_sends_exactly_one_handback_until_a_human_speaks() {
    let mut h = Harness::start(&with("[rules.turns]\nmax = 3\n")).await;
    for i in 0..3 {
        h.send_json(
            "w",
            "agent",
            if i % 2 == 0 { "alice" } else { "bob" },
            msg(&format!("turn {i}")),
        )
        .await;
    }
    let out = h.settle("w").await;
    assert_eq!(out.public("w").len(), 3);
    let turns: Vec<_> = out.field("w", "turn");
    assert_eq!(turns, [json!(1), json!(2), json!(3)]);

    h.send_json("w", "agent", "alice", msg("turn 3")).await;
    h.send_json("w", "agent", "bob", msg("turn 4")).await;
    let out = h.settle("w").await;
    let public = out.public("w");
    assert_eq!(public.len(), 1, "only the hand-back notice: {public:#?}");
    let notice = &public[0].body;
    assert_eq!(notice["sender"], "loopguard");
    assert_eq!(notice["sender_kind"], "system");
    assert_eq!(notice["reason"], "turn_limit");
    assert!(notice["content"].as_str().unwrap().starts_with("@human"));
    let events = out.events("w");
    assert_eq!(
        events.len(),
        2,
        "one event per ingress message, none for the notice"
    );
    for e in &events {
        assert_eq!(e.body["decision"], "rejected");
        assert_eq!(e.body["rule"], "turns");
        assert_eq!(e.body["turn"], 4);
        assert_eq!(e.body["delivered_to"], json!([]));
    }

    // A human resets the counter; agents may speak again, and a second trip
    // sends a second notice.
    h.send_json("w", "human", "hank", msg("carry on")).await;
    for i in 0..4 {
        h.send_json("w", "agent", "alice", msg(&format!("again {i}")))
            .await;
    }
    let out = h.settle("w").await;
    let agent_public = out
        .public("w")
        .iter()
        .filter(|r| r.body["sender"] == "alice")
        .count();
    assert_eq!(agent_public, 3);
    let notices = out
        .public("w")
        .iter()
        .filter(|r| r.body["sender"] == "loopguard")
        .count();
    assert_eq!(notices, 1);
}

#[tokio::test]
async fn a_system_message_resets_turns_too() {
    let mut h = Harness::start(&with("[rules.turns]\nmax = 1\n")).await;
    h.send_json("w", "agent", "alice", msg("one")).await;
    h.send_json("w", "system", "ops", msg("reset")).await;
    h.send_json("w", "agent", "alice", msg("two")).await;
    let out = h.settle("w").await;
    assert_eq!(out.field("w", "decision"), vec![json!("approved"); 3]);
}

#[tokio::test]
async fn pass_is_edited_into_a_handback_goes_public_and_resets_turns() {
    let mut h = Harness::start(&with("[rules.turns]\nmax = 1\n")).await;
    h.send_json("w", "agent", "alice", msg("one")).await;
    h.send_json(
        "w",
        "agent",
        "bob",
        msg("@alice I'm done <WORLD>pass</world>"),
    )
    .await;
    h.send_json("w", "agent", "alice", msg("after the pass"))
        .await;
    let out = h.settle("w").await;
    let events = out.events("w");
    assert_eq!(events[1].body["decision"], "edited");
    assert_eq!(events[1].body["rule"], "pass");
    assert_eq!(events[1].body["turn"], 0);
    assert_eq!(
        events[2].body["decision"], "approved",
        "the pass reset the turn counter"
    );
    let edited = out
        .public("w")
        .into_iter()
        .find(|r| r.body["sender"] == "bob")
        .unwrap();
    assert_eq!(
        edited.body["content"],
        "@human bob is passing control to you"
    );
    assert!(
        out.private("w", "alice").is_empty(),
        "a pass goes public, not to the mentioned agent"
    );
}

#[tokio::test]
async fn pass_is_never_blocked_by_a_paused_world() {
    let mut h = Harness::start(&with("[rules.turns]\nmax = 1\n")).await;
    h.send_json("w", "agent", "alice", msg("one")).await;
    h.send_json("w", "agent", "bob", msg("two")).await;
    h.send_json("w", "agent", "bob", msg("<world>pass</world>"))
        .await;
    let out = h.settle("w").await;
    let decisions: Vec<_> = out.field("w", "decision");
    assert_eq!(
        decisions,
        [json!("approved"), json!("rejected"), json!("edited")]
    );
}

#[tokio::test]
async fn depth_follows_parent_then_thread_then_latest_and_rejects_past_the_limit() {
    let mut h = Harness::start(&with("[rules.depth]\nmax = 2\n")).await;
    h.send_json(
        "w",
        "human",
        "hank",
        json!({"content": "question", "id": "h1"}),
    )
    .await;
    h.send_json("w", "agent", "alice", json!({"content": "a1", "id": "a1"}))
        .await;
    h.send_json("w", "agent", "bob", json!({"content": "a2", "id": "a2"}))
        .await;
    h.send_json("w", "agent", "alice", json!({"content": "a3", "id": "a3"}))
        .await;
    // an explicit parent_id still remembered restarts the chain lower
    h.send_json(
        "w",
        "agent",
        "carol",
        json!({"content": "c1", "id": "c1", "parent_id": "h1"}),
    )
    .await;
    let out = h.settle("w").await;
    let events = out.events("w");
    let depths: Vec<_> = events.iter().map(|e| e.body["depth"].clone()).collect();
    assert_eq!(depths, [json!(0), json!(1), json!(2), json!(3), json!(1)]);
    assert_eq!(events[3].body["decision"], "rejected");
    assert_eq!(events[3].body["rule"], "depth");
    let c1 = out
        .public("w")
        .into_iter()
        .find(|r| r.body["id"] == "c1")
        .unwrap();
    assert_eq!(c1.body["parent_id"], "h1");
    assert_eq!(c1.body["thread_id"], "h1");

    // a rejected message is not remembered: replying to a3 falls back to the
    // thread's latest approved message (c1, depth 1)
    h.send_json(
        "w",
        "agent",
        "bob",
        json!({"content": "b", "id": "b", "parent_id": "a3", "thread_id": "h1"}),
    )
    .await;
    let out = h.settle("w").await;
    assert_eq!(out.event("w").body["depth"], 2);
    assert_eq!(out.public("w")[0].body["parent_id"], "c1");
}

#[tokio::test]
async fn duplicate_content_from_any_sender_is_rejected_within_the_window() {
    let mut h = Harness::start(&with("[rules.duplicate]\nwindow_seconds = 300\n")).await;
    h.join("w", "bob").await;
    h.settle("w").await;
    h.send_json("w", "human", "hank", msg("Sounds good")).await;
    h.send_json("w", "agent", "alice", msg("@bob   sounds GOOD"))
        .await;
    h.send_json("w", "agent", "alice", msg("something new"))
        .await;
    let out = h.settle("w").await;
    let events = out.events("w");
    assert_eq!(events[1].body["decision"], "rejected");
    assert_eq!(events[1].body["rule"], "duplicate");
    assert_eq!(events[2].body["decision"], "approved");
}

#[tokio::test]
async fn cooldown_applies_per_agent() {
    let mut h = Harness::start(&with("[rules.cooldown]\nseconds = 60\n")).await;
    h.send_json("w", "agent", "alice", msg("one")).await;
    h.send_json("w", "agent", "alice", msg("two")).await;
    h.send_json("w", "agent", "bob", msg("three")).await;
    let out = h.settle("w").await;
    let rules: Vec<_> = out.field("w", "rule");
    assert_eq!(rules, [json!(null), json!("cooldown"), json!(null)]);
}

#[tokio::test]
async fn rate_caps_each_agent_per_window() {
    let mut h = Harness::start(&with("[rules.rate]\nmax = 2\nwindow_seconds = 60\n")).await;
    for i in 0..3 {
        h.send_json("w", "agent", "alice", msg(&format!("a{i}")))
            .await;
    }
    h.send_json("w", "agent", "bob", msg("b0")).await;
    let out = h.settle("w").await;
    let rules: Vec<_> = out.field("w", "rule");
    assert_eq!(
        rules,
        [json!(null), json!(null), json!("rate"), json!(null)]
    );
    // state is per world: alice is fresh elsewhere
    h.send_json("v", "agent", "alice", msg("a0")).await;
    assert_eq!(h.settle("v").await.event("v").body["decision"], "approved");
}

#[tokio::test]
async fn observe_mode_delivers_everything_and_reports_would_reject_without_a_notice() {
    let mut h = Harness::start(&format!(
        "mode = \"observe\"\n{}",
        with("[rules.turns]\nmax = 1\n")
    ))
    .await;
    h.send_json("w", "agent", "alice", msg("one")).await;
    h.send_json("w", "agent", "bob", msg("two")).await;
    h.send_json("w", "agent", "carol", msg("three")).await;
    let out = h.settle("w").await;
    let public = out.public("w");
    assert_eq!(public.len(), 3, "observe mode delivers: {public:#?}");
    assert!(
        public.iter().all(|r| r.body["sender"] != "loopguard"),
        "no notice in observe mode"
    );
    let events = out.events("w");
    assert_eq!(events[1].body["decision"], "approved");
    assert_eq!(events[1].body["would_reject"], "turns");
    assert!(events[0].body.get("would_reject").is_none());

    // invalid input is still rejected in observe mode
    h.send("w", "agent", "bob", vec![0xffu8, 0xfe]).await;
    let out = h.settle("w").await;
    assert_eq!(out.event("w").body["rule"], "invalid");
    assert!(out.public("w").is_empty());
}

#[tokio::test]
async fn with_approved_events_off_only_edits_and_rejections_get_events() {
    let mut h = Harness::start(&format!(
        "[events]\napproved = false\n{}",
        with("[rules.turns]\nmax = 1\n")
    ))
    .await;
    h.send_json("w", "agent", "alice", msg("one")).await;
    h.send_json("w", "agent", "bob", msg("two")).await;
    h.send_json("w", "agent", "bob", msg("<world>pass</world>"))
        .await;
    let out = h.settle("w").await;
    let decisions: Vec<_> = out.field("w", "decision");
    assert_eq!(decisions, [json!("rejected"), json!("edited")]);
    assert_eq!(out.public("w").len(), 3, "approved, notice, pass");
}

#[tokio::test]
async fn per_world_overrides_apply_to_that_world_only() {
    let config = format!(
        "{}[worlds.strict]\nrules.turns.max = 1\n",
        with("[rules.turns]\nmax = 5\n")
    );
    let mut h = Harness::start(&config).await;
    for (w, expected) in [
        ("strict", (json!("rejected"), json!("turns"))),
        ("relaxed", (json!("approved"), json!(null))),
    ] {
        h.send_json(w, "agent", "alice", msg("one")).await;
        h.send_json(w, "agent", "bob", msg("two")).await;
        let out = h.settle(w).await;
        let second = &out.events(w)[1].body;
        assert_eq!(
            (second["decision"].clone(), second["rule"].clone()),
            expected,
            "{w}"
        );
    }
}
