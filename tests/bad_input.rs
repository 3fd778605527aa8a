//! Bad input never hurts: each kind of malformed or hostile input gets a
//! rejection event with a reason, or is treated as plain text, as the
//! contract says; nothing panics, and valid messages keep flowing.

mod support;

use serde_json::json;
use support::{hpub, msg, publish_raw, Harness, NatsServer, Scrape};

const SMALL: &str = "[limits]\nmax_payload_bytes = 1024\n[rules.duplicate]\nwindow_seconds = 0\n";

/// Asserts the one event in `w` is a rejection by `rule` with a reason.
fn assert_rejected(out: &support::Outputs, w: &str, rule: &str) {
    let e = &out.event(w).body;
    assert_eq!(e["decision"], "rejected", "{e}");
    assert_eq!(e["rule"], rule, "{e}");
    assert!(
        e["reason"].as_str().is_some_and(|r| r.len() > 10),
        "a reason a person can read: {e}"
    );
    assert!(
        out.public(w).is_empty() && out.all_private(w).is_empty(),
        "nothing delivered"
    );
}

#[tokio::test]
async fn invalid_utf8_is_rejected_as_invalid() {
    let mut h = Harness::start(SMALL).await;
    h.send("w", "agent", "alice", vec![b'h', 0xff, 0xfe, b'i'])
        .await;
    let out = h.settle("w").await;
    assert_rejected(&out, "w", "invalid");
    assert!(out.event("w").body["reason"]
        .as_str()
        .unwrap()
        .contains("UTF-8"));
}

#[tokio::test]
async fn oversize_payloads_are_rejected_as_too_large() {
    let mut h = Harness::start(SMALL).await;
    h.send("w", "human", "hank", vec![b'x'; 1025]).await;
    let out = h.settle("w").await;
    assert_rejected(&out, "w", "too_large");
    h.send("w", "human", "hank", vec![b'x'; 1024]).await;
    assert_eq!(
        h.settle("w").await.public("w").len(),
        1,
        "exactly the limit is fine"
    );
}

/// A `Nats-Msg-Id` header becomes the id of a message whose payload has
/// none, and every copy carries that id (twice: it is the thread too). With
/// the default limits, a 600 KB header on "hi" made a 1.2 MB copy that the
/// server refused: the message was lost while its event said approved.
#[tokio::test]
async fn a_header_id_is_counted_with_the_payload_it_names() {
    let mut h = Harness::start("").await;
    let client = h.client.clone();
    let send = |subject: &str, id: String| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
        let (client, subject) = (client.clone(), subject.to_string());
        async move {
            client
                .publish_with_headers(subject, headers, "hi".into())
                .await
                .expect("publish");
        }
    };
    send("chat.raw.w.human.hank", "h".repeat(600_000)).await;
    let out = h.settle("w").await;
    assert_rejected(&out, "w", "too_large");
    let e = &out.event("w").body;
    assert!(e["reason"].as_str().unwrap().contains("Nats-Msg-Id"), "{e}");
    assert_eq!(
        e["id"].as_str().unwrap().len(),
        36,
        "a fresh id: the event cannot carry the header's"
    );
    // Its subject is invalid too: still an event, with a fresh id.
    send("chat.raw.w.robot.r2", "h".repeat(600_000)).await;
    let out = h.settle("w").await;
    assert_rejected(&out, "w", "invalid");
    assert_eq!(out.event("w").body["id"].as_str().unwrap().len(), 36);
    // Within the limit, the header is the id, as before.
    send("chat.raw.w.human.hank", "h".repeat(60_000)).await;
    let out = h.settle("w").await;
    let ids: Vec<_> = out.public("w").iter().map(|r| r.str("id").len()).collect();
    assert_eq!(ids, [60_000]);
    let scrape = support::Scrape::take(&h.loopguard.http_addr().await).await;
    assert_eq!(
        scrape.get("loopguard_dropped_total", &[("reason", "publish_error")]),
        0.0
    );
    // With the default limits and server, every copy fits, and it says so.
    h.loopguard
        .until_logged(
            "every message loopguard publishes fits in the server's max_payload",
            1,
        )
        .await;
    assert!(!h
        .loopguard
        .logs()
        .contains("larger than the server's max_payload"));
}

#[tokio::test]
async fn objects_without_string_content_or_with_non_string_ids_are_invalid() {
    let mut h = Harness::start(SMALL).await;
    for payload in [
        json!({}),
        json!({"content": 5}),
        json!({"content": null}),
        json!({"text": ["x"]}),
        json!({"content": "x", "id": 1}),
        json!({"content": "x", "thread_id": {}}),
        json!({"content": "x", "parent_id": false}),
    ] {
        h.send_json("w", "agent", "alice", payload.clone()).await;
        let out = h.settle("w").await;
        assert_rejected(&out, "w", "invalid");
    }
}

#[tokio::test]
async fn malformed_json_and_non_object_json_are_plain_text() {
    let mut h = Harness::start(SMALL).await;
    for raw in [
        "{\"content\": \"unterminated",
        "\"hi\"",
        "[1]",
        "42",
        "null",
        "plain words",
    ] {
        h.send("w", "agent", "alice", raw.as_bytes().to_vec()).await;
        let out = h.settle("w").await;
        let public = out.public("w");
        assert_eq!(public.len(), 1, "{raw:?} is delivered");
        assert_eq!(
            public[0].body["content"], raw,
            "{raw:?} is the content byte for byte"
        );
    }
}

#[tokio::test]
async fn bad_names_in_subjects_are_rejected_with_an_event_when_the_world_is_valid() {
    let mut h = Harness::start(SMALL).await;
    for subject in [
        "chat.raw.w.robot.x".to_string(),
        "chat.raw.w.agent".to_string(),
        "chat.raw.w.agent.a.b".to_string(),
        "chat.raw.w.agent.b\u{f8}b".to_string(),
        format!("chat.raw.w.agent.{}", "a".repeat(65)),
        "chat.join.w.b\u{f8}b".to_string(),
    ] {
        h.publish(subject.clone(), msg("hi").to_string().into())
            .await;
        let out = h.settle("w").await;
        assert_rejected(&out, "w", "invalid");
        let sender = out.event("w").body["sender"].as_str().unwrap().to_string();
        assert!(
            sender.chars().count() <= 64,
            "{subject}: sender is shortened"
        );
    }
}

#[tokio::test]
async fn an_invalid_world_gets_no_event_and_harms_nothing() {
    let mut h = Harness::start(SMALL).await;
    h.publish(
        "chat.raw.w\u{f6}rld.agent.alice".into(),
        msg("hi").to_string().into(),
    )
    .await;
    h.publish(
        format!("chat.raw.{}.agent.alice", "w".repeat(65)),
        msg("hi").to_string().into(),
    )
    .await;
    h.send_json("w", "agent", "alice", msg("still working"))
        .await;
    let mut out = h.settle("w").await;
    // A message with no valid world goes to the first worker, `w` to any:
    // barriers through sixteen worlds pass every worker (of two, by
    // default) but once in 65,536 runs, so nothing said late is missed.
    for i in 0..15 {
        out.0.extend(h.settle(&format!("barrier{i}")).await.0);
    }
    assert_eq!(
        out.0.len(),
        2,
        "only the valid message's copy and event: {:#?}",
        out.0
    );
    assert_eq!(out.public("w").len(), 1);
}

#[tokio::test]
async fn uppercase_names_are_canonicalised_not_rejected() {
    let mut h = Harness::start(SMALL).await;
    h.send_json("W", "agent", "Alice", msg("hi")).await;
    let out = h.settle("w").await;
    assert_eq!(out.public("w")[0].body["sender"], "alice");
    assert_eq!(out.public("w")[0].body["world"], "w");
}

#[tokio::test]
async fn hostile_mentions_are_plain_text_and_never_reach_a_subject() {
    let mut h = Harness::start("[worlds.w]\nagents = [\"bob\"]\n[rules.duplicate]\nwindow_seconds = 0\n[rules.depth]\nmax = 0\n").await;
    for content in [
        "@bob.> hi",
        "@bob.* hi",
        "@* hi",
        "@> hi",
        "@b\u{f8}b hi",
        "@bob\u{a0}x hi",
        "@bob\u{0}x hi",
        "@../bob hi",
    ] {
        h.send_json("w", "agent", "alice", msg(content)).await;
        let out = h.settle("w").await;
        assert_eq!(out.public("w").len(), 1, "{content:?} goes public as text");
        assert!(
            out.all_private("w").is_empty(),
            "{content:?} reaches no inbox"
        );
        for r in &out.0 {
            assert!(
                r.subject == "chat.public.w" || r.subject == "chat.events.w",
                "{content:?} produced subject {}",
                r.subject
            );
        }
    }
}

#[tokio::test]
async fn a_burst_of_garbage_leaves_valid_traffic_untouched() {
    let mut h = Harness::start(SMALL).await;
    let garbage: Vec<Vec<u8>> = vec![
        vec![0xff; 2000],
        vec![0xc3],
        b"{\"content\":".to_vec(),
        vec![0; 100],
        "\u{202e}\u{0}@@@@".as_bytes().to_vec(),
        b"{\"content\": \"\\ud800\"}".to_vec(),
    ];
    for (i, g) in garbage.iter().enumerate() {
        h.send("w", "agent", "alice", g.clone()).await;
        h.send_json(
            "w",
            "human",
            "hank",
            json!({"content": format!("valid {i}"), "id": format!("v{i}")}),
        )
        .await;
    }
    let out = h.settle("w").await;
    assert_eq!(
        out.events("w").len(),
        2 * garbage.len(),
        "one event per ingress message"
    );
    let delivered: Vec<_> = out
        .public("w")
        .iter()
        .filter(|r| r.body["sender"] == "hank")
        .map(|r| r.str("id").to_string())
        .collect();
    assert_eq!(
        delivered,
        (0..garbage.len())
            .map(|i| format!("v{i}"))
            .collect::<Vec<_>>()
    );
    assert!(h.loopguard.is_running());
}

#[tokio::test]
async fn subjects_and_headers_that_are_not_utf8_cost_loopguard_nothing() {
    let mut h = Harness::start(SMALL).await;
    let hi = msg("hi").to_string();
    // A subject that is not UTF-8: the sender (the world is fine) gets a
    // rejection; the world ("w\u{fffd}") gets nothing, as any invalid world.
    let mut ops = b"PUB chat.raw.w.agent.al\xffce ".to_vec();
    ops.extend_from_slice(format!("{}\r\n{hi}\r\n", hi.len()).as_bytes());
    ops.extend_from_slice(b"PUB chat.raw.w\xff.agent.alice ");
    ops.extend_from_slice(format!("{}\r\n{hi}\r\n", hi.len()).as_bytes());
    publish_raw(&h.nats.url(), &ops).await;
    let out = h.settle("w").await;
    assert_rejected(&out, "w", "invalid");
    // A Unicode space inside a subject (nats-server splits on ASCII ones):
    // the name is invalid, and the line still parses.
    let op = hpub(
        "chat.raw.w.agent.a\u{a0}b",
        b"NATS/1.0\r\n\r\n",
        hi.as_bytes(),
    );
    publish_raw(&h.nats.url(), &op).await;
    let out = h.settle("w").await;
    assert_rejected(&out, "w", "invalid");

    // A header value that is not UTF-8 is read with U+FFFD in its place
    // (here the message's id, as the JSON has none).
    let op = hpub(
        "chat.raw.w.human.hank",
        b"NATS/1.0\r\nNats-Msg-Id: x\xff\xfe\r\n\r\n",
        msg("no id of its own").to_string().as_bytes(),
    );
    publish_raw(&h.nats.url(), &op).await;
    let out = h.settle("w").await;
    assert_eq!(out.public("w")[0].str("id"), "x\u{fffd}\u{fffd}");

    // Header blocks the NATS client cannot parse: the message is judged on
    // its payload, as if it had no headers.
    for (i, headers) in [
        &b"NATS/1.0\r\nno colon here\r\n\r\n"[..],
        b"HTTP/1.1\r\nX: y\r\n\r\n",
        b"NATS/1.0 abc\r\nX: y\r\n\r\n",
    ]
    .into_iter()
    .enumerate()
    {
        let body = json!({"content": format!("with bad headers {i}"), "id": format!("h{i}")});
        let op = hpub(
            "chat.raw.w.human.hank",
            headers,
            body.to_string().as_bytes(),
        );
        publish_raw(&h.nats.url(), &op).await;
        h.send_json(
            "w",
            "human",
            "hank",
            json!({"content": format!("plain {i}"), "id": format!("p{i}")}),
        )
        .await;
        let out = h.settle("w").await;
        let ids: Vec<_> = out
            .public("w")
            .iter()
            .map(|r| r.str("id").to_string())
            .collect();
        assert_eq!(
            ids,
            [format!("h{i}"), format!("p{i}")],
            "{headers:?}: both delivered, in order"
        );
    }

    // Each of these used to end loopguard's NATS connection, and lose every
    // message read with it.
    let scrape = support::Scrape::take(&h.loopguard.http_addr().await).await;
    assert_eq!(
        scrape.get("loopguard_nats_reconnects_total", &[]),
        0.0,
        "loopguard kept its connection; its log:\n{}",
        h.loopguard.logs()
    );
    assert!(h.loopguard.is_running());
}

/// An approved message whose copy the server cannot take (over its
/// `max_payload`: plain-text control bytes are escaped six bytes each) is
/// counted as a drop, not a delivery, and the next message still goes.
#[tokio::test]
async fn a_copy_the_server_cannot_take_is_a_drop_not_a_delivery() {
    let dir = tempfile::tempdir().expect("temp dir");
    let conf = dir.path().join("nats.conf");
    std::fs::write(&conf, "max_payload: 131072\n").expect("server config");
    let nats = NatsServer::start_with(&["-c", conf.to_str().expect("path")]);
    let config = "[limits]\nmax_payload_bytes = 32768\n[rules.duplicate]\nwindow_seconds = 0\n";
    let mut h = Harness::start_on(nats, config).await;
    // Said at start-up: 32 KiB of control characters is a 192 KiB copy;
    // ((131072 - 4096) / 8) would fit (a reply can carry its parent's id,
    // the limit's size, twice).
    h.loopguard
        .until_logged(
            "a copy or event can be larger than the server's max_payload",
            1,
        )
        .await;
    assert!(
        h.loopguard.logs().contains("fits=15872"),
        "with the limit that fits"
    );
    h.send("w", "human", "hank", vec![1u8; 32_000]).await;
    h.send_json("w", "human", "hank", json!({"content": "fits", "id": "ok"}))
        .await;
    let out = h.settle("w").await;
    let ids: Vec<_> = out.public("w").iter().map(|r| r.str("id")).collect();
    assert_eq!(ids, ["ok"], "only the copy that fits arrives");
    let scrape = support::Scrape::take(&h.loopguard.http_addr().await).await;
    assert_eq!(
        scrape.get("loopguard_dropped_total", &[("reason", "publish_error")]),
        1.0
    );
    assert_eq!(
        scrape.get("loopguard_deliveries_total", &[("visibility", "public")]),
        1.0,
        "the copy that was not published is not a delivery"
    );
}

/// Human messages are always approved, and each one's id and thread id (up
/// to 256 bytes) is remembered until a world's 1024th, its body kept for
/// the context route: a client can make every world large. `state.max_bytes`
/// bounds them all: loopguard evicts the least recently used worlds, and
/// every message is still delivered.
#[tokio::test]
async fn worlds_filled_by_a_client_are_bounded_in_bytes() {
    let max_bytes = 16 << 20;
    let mut h = Harness::start(&format!(
        "[state]\nmax_bytes = {max_bytes}\ncontext_messages = 4\n"
    ))
    .await;
    let addr = h.loopguard.http_addr().await;
    let state = || async { Scrape::take(&addr).await };
    let within_bound = |held: f64, what: &str| {
        assert!(
            held <= max_bytes as f64 && held > (max_bytes / 2) as f64,
            "{what}: state held {held} bytes against max_bytes {max_bytes}"
        );
    };

    // One message each into many worlds, each kept as context (about 100
    // KiB a world): each world is weighed with its message, not after the
    // next one.
    let quiet = 600;
    let big = "x".repeat(50_000);
    for w in 0..quiet {
        h.send_json(&format!("q{w}"), "human", "hank", json!({"content": big}))
            .await;
    }
    let names: Vec<String> = (0..quiet).map(|w| format!("q{w}")).collect();
    assert_eq!(
        public_copies(&mut h, &names).await,
        quiet,
        "every message delivered"
    );
    let scrape = state().await;
    within_bound(
        scrape.get("loopguard_state_bytes", &[]),
        "one message a world",
    );
    let worlds = scrape.get("loopguard_worlds", &[]);
    assert!(worlds < 200.0, "{worlds} worlds of 100 KiB held in 16 MiB");
    // The rest were let go for room, and counted so.
    let evicted = scrape.get("loopguard_world_evictions_total", &[("cause", "size")]);
    assert!(
        evicted >= quiet as f64 - worlds,
        "{evicted} evicted for size, {worlds} held, of {quiet}"
    );

    // Many messages with 256-byte ids and thread ids into a few worlds.
    let (few, each) = (40, 600);
    for i in 0..few * each {
        let body = json!({
            "content": "hi",
            "id": format!("{i:0>256}"),
            "thread_id": format!("{:0>256}", i + 1),
        });
        h.send_json(&format!("w{}", i % few), "human", "hank", body)
            .await;
    }
    let names: Vec<String> = (0..few).map(|w| format!("w{w}")).collect();
    assert_eq!(
        public_copies(&mut h, &names).await,
        few * each,
        "every message delivered"
    );
    within_bound(
        state().await.get("loopguard_state_bytes", &[]),
        "256-byte ids",
    );
    assert!(h.loopguard.is_running());
}

/// Public copies published in `worlds` until now. Worlds are spread over two
/// workers: each is settled, and the copies of all are counted each time.
async fn public_copies(h: &mut Harness, worlds: &[String]) -> usize {
    let mut copies = 0;
    for world in worlds {
        let out = h.settle(world).await;
        copies += worlds.iter().map(|w| out.public(w).len()).sum::<usize>();
    }
    copies
}
