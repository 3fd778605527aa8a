//! JetStream mode (`nats.jetstream.enabled`): no message lost across a
//! kill -9, a NATS restart or a SIGTERM under load, and every approved
//! message exactly once in a stream that captures egress with deduplication.

mod support;

use std::future::IntoFuture;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use futures::StreamExt;
use serde_json::json;
use support::{hpub, http, publish_raw, within, Loopguard, NatsServer};

/// JetStream on, every loop rule off: every message is approved in any run,
/// so "every approved message" is every message. Copies are confirmed by a
/// flush (`egress_acks` off, the default).
const JS_CONFIG: &str = "[nats.jetstream]\nenabled = true\nack_wait_seconds = 2\n\
    [rules.turns]\nmax = 0\n[rules.depth]\nmax = 0\n[rules.duplicate]\nwindow_seconds = 0\n[rules.rate]\nmax = 0\n";

/// [`JS_CONFIG`] with `egress_acks`: copies of a family a stream captures
/// (here the transcript, in `EGRESS`) are confirmed by the stream's answer.
fn js_acks_config() -> String {
    JS_CONFIG.replace("enabled = true\n", "enabled = true\negress_acks = true\n")
}

/// A stream that captures the public transcript and drops copies whose
/// `Nats-Msg-Id` it has seen in the last two minutes.
async fn egress_stream(js: &jetstream::Context) {
    create_stream(
        js,
        stream::Config {
            name: "EGRESS".into(),
            subjects: vec!["chat.public.>".into()],
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        },
    )
    .await;
}

/// Creates a stream, or fails the test.
async fn create_stream(js: &jetstream::Context, config: stream::Config) {
    let name = config.name.clone();
    within("create stream", js.create_stream(config))
        .await
        .unwrap_or_else(|e| panic!("stream {name}: {e}"));
}

/// The ingest stream as loopguard would create it, made before loopguard
/// starts (so that a test can put a consumer of its own in it).
async fn ingest_stream(js: &jetstream::Context) -> stream::Stream {
    ingest_stream_of(
        js,
        &["chat.raw.>", "chat.join.>"],
        stream::RetentionPolicy::WorkQueue,
    )
    .await
}

/// An ingest stream under loopguard's stream name, as a test shapes it.
async fn ingest_stream_of(
    js: &jetstream::Context,
    subjects: &[&str],
    retention: stream::RetentionPolicy,
) -> stream::Stream {
    create_stream(
        js,
        stream::Config {
            name: "LOOPGUARD_INGEST".into(),
            subjects: subjects.iter().map(|s| s.to_string()).collect(),
            retention,
            duplicate_window: loopguard::ingest::jetstream::INGEST_DUPLICATE_WINDOW,
            ..Default::default()
        },
    )
    .await;
    within("get stream", js.get_stream("LOOPGUARD_INGEST"))
        .await
        .expect("stream")
}

/// A client of `nats` and its JetStream context.
async fn connect(nats: &NatsServer) -> (async_nats::Client, jetstream::Context) {
    let client = within("client", async_nats::connect(nats.url()))
        .await
        .unwrap();
    let js = jetstream::new(client.clone());
    (client, js)
}

async fn stream_messages(js: &jetstream::Context, name: &str) -> u64 {
    let mut s = within("get stream", js.get_stream(name))
        .await
        .expect("stream");
    within("stream info", s.info())
        .await
        .expect("info")
        .state
        .messages
}

/// What a stream holds once it stops changing: copies a process sent just
/// before it died may still be on their way in.
async fn settled_stream_messages(js: &jetstream::Context, name: &str) -> u64 {
    let mut last = stream_messages(js, name).await;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = stream_messages(js, name).await;
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Waits until `name` holds `want` messages, or fails with what it holds,
/// where the ingest stream and loopguard's consumer stand, and loopguard's
/// log: enough to tell a message the server lost from one loopguard did.
async fn until_stream_holds(js: &jetstream::Context, name: &str, want: u64, lg: &Loopguard) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let have = stream_messages(js, name).await;
        if have >= want {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            let mut ingest = js.get_stream("LOOPGUARD_INGEST").await.unwrap();
            let state = ingest.info().await.unwrap().state.clone();
            let mut consumer: jetstream::consumer::PullConsumer =
                ingest.get_consumer("loopguard").await.unwrap();
            let info = consumer.info().await.unwrap().clone();
            panic!(
                "{name} holds {have}, expected {want}; ingest stream: {} held, sequences {}-{}; \
                 consumer: delivered {}, acknowledged up to {}, pending {}, ack pending {}, \
                 redelivered {}\n{}",
                state.messages,
                state.first_sequence,
                state.last_sequence,
                info.delivered.stream_sequence,
                info.ack_floor.stream_sequence,
                info.num_pending,
                info.num_ack_pending,
                info.num_redelivered,
                lg.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until loopguard's consumer has acknowledged every ingress message
/// (nothing left to deliver, nothing awaiting an acknowledgement), showing
/// its state if it never does. The consumer's state, not the work queue
/// stream's emptiness: after a kill -9 of the server the stream can keep
/// messages whose acknowledgements the consumer had already recorded.
async fn until_ingest_acknowledged(js: &jetstream::Context, lg: &Loopguard) {
    let deadline = tokio::time::Instant::now() + support::TIMEOUT;
    loop {
        let info = ingest_consumer(js).await;
        if info.num_pending == 0 && info.num_ack_pending == 0 {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "ingest not acknowledged: {} in the stream; pending {} ack_pending {} redelivered {}\n{}",
                stream_messages(js, "LOOPGUARD_INGEST").await,
                info.num_pending,
                info.num_ack_pending,
                info.num_redelivered,
                lg.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many deliveries of loopguard's consumer were repeats, once it has
/// delivered all `messages` the ingest stream holds (numbered from 1).
/// `None` when the consumer's count of deliveries is below that: a server
/// restart rewound it to what the server had stored of it, so it no longer
/// tells.
async fn ingest_redeliveries(js: &jetstream::Context, messages: u64) -> Option<u64> {
    let info = ingest_consumer(js).await;
    assert_eq!(info.delivered.stream_sequence, messages, "delivered all");
    info.delivered.consumer_sequence.checked_sub(messages)
}

/// loopguard's consumer of the ingest stream, as the server sees it now.
async fn ingest_consumer(js: &jetstream::Context) -> jetstream::consumer::Info {
    let stream = within("get stream", js.get_stream("LOOPGUARD_INGEST"))
        .await
        .expect("ingest stream");
    let mut consumer: jetstream::consumer::PullConsumer =
        within("get consumer", stream.get_consumer("loopguard"))
            .await
            .expect("consumer");
    within("consumer info", consumer.info())
        .await
        .expect("info")
        .clone()
}

/// Waits until the server has delivered some message again (past an
/// `ack_wait` with no acknowledgement).
async fn until_redelivered(js: &jetstream::Context) {
    within("a redelivery", async {
        while ingest_consumer(js).await.num_redelivered == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
}

/// Publishes messages `range` and waits for the ingest stream to confirm
/// each: a message counts as sent once JetStream holds it.
async fn publish_messages(js: &jetstream::Context, range: std::ops::Range<usize>) {
    publish_each(js, range, |i| {
        format!("chat.raw.w{}.agent.a{}", i % 5, i % 3)
    })
    .await;
}

/// [`publish_messages`], message `i` on subject `subject(i)`.
async fn publish_each(
    js: &jetstream::Context,
    range: std::ops::Range<usize>,
    subject: impl Fn(usize) -> String,
) {
    let mut acks = Vec::new();
    for i in range {
        let body = json!({"content": format!("message {i}"), "id": format!("m{i}")});
        let subject = subject(i);
        acks.push(
            within("publish", js.publish(subject, body.to_string().into()))
                .await
                .expect("publish"),
        );
        // The context bounds acknowledgements in flight: collect as we go.
        if acks.len() == 500 {
            for ack in acks.drain(..) {
                within("stream ack", ack.into_future())
                    .await
                    .expect("stored by the ingest stream");
            }
        }
    }
    for ack in acks {
        within("stream ack", ack.into_future())
            .await
            .expect("stored by the ingest stream");
    }
}

/// Starts loopguard again and waits until the transcript's stream holds all
/// `n` messages exactly once and every ingress message is acknowledged.
async fn a_second_run_finishes_all(
    nats: &NatsServer,
    js: &jetstream::Context,
    config: &str,
    n: u64,
) {
    let second = Loopguard::spawn(&nats.url(), config);
    second.until_ready().await;
    until_stream_holds(js, "EGRESS", n, &second).await;
    until_ingest_acknowledged(js, &second).await;
    assert_eq!(stream_messages(js, "EGRESS").await, n);
}

/// Agents may reuse ids (contract §9), and a `Nats-Msg-Id` header is a
/// message's id when its payload names none. nats-server deduplicates by
/// that header across a whole stream: with the ingest stream's default
/// window of two minutes, a message carrying an id another world's message
/// had carried a moment before was dropped unjudged, with no event and no
/// count. loopguard now creates the stream with the server's least window
/// (100 ms), and names an existing stream with a longer one in a warning.
#[tokio::test]
async fn raw_messages_that_reuse_a_header_id_are_each_judged() {
    let (_nats, js, lg) = jetstream_loopguard().await;
    let mut ingest = within("get stream", js.get_stream("LOOPGUARD_INGEST"))
        .await
        .expect("the ingest stream");
    let window = within("stream info", ingest.info())
        .await
        .unwrap()
        .config
        .duplicate_window;
    assert_eq!(window, Duration::from_millis(100));
    // Two humans in two worlds, each numbering its messages from 1; the
    // second a second after the first was stored: past the server's least
    // window (whose ids the server forgets on a timer, not at once), well
    // within its default.
    for world in ["w1", "w2"] {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", "1");
        let body = json!({"content": format!("hello from {world}")}).to_string();
        let stored = within(
            "publish",
            js.publish_with_headers(format!("chat.raw.{world}.human.h"), headers, body.into()),
        )
        .await
        .expect("publish");
        let ack = within("stored", stored.into_future())
            .await
            .expect("stored");
        assert!(!ack.duplicate, "{world}'s message taken for a duplicate");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    until_stream_holds(&js, "EGRESS", 2, &lg).await;
    assert_eq!(stream_messages(&js, "EGRESS").await, 2);
    assert!(
        !lg.logs().contains("within its duplicate window"),
        "{}",
        lg.logs()
    );

    // A stream made before, with the server's default window: named.
    let nats = NatsServer::start_jetstream();
    let (_, js) = connect(&nats).await;
    create_stream(
        &js,
        stream::Config {
            name: "LOOPGUARD_INGEST".into(),
            subjects: vec!["chat.raw.>".into(), "chat.join.>".into()],
            ..Default::default()
        },
    )
    .await;
    let lg = Loopguard::spawn(&nats.url(), JS_CONFIG);
    lg.until_logged("within its duplicate window", 1).await;
}

#[tokio::test]
async fn kill_9_mid_stream_then_restart_leaves_every_approved_message_exactly_once() {
    // Enough that the kill lands mid-stream however fast the machine is.
    const N: usize = 20_000;
    let nats = NatsServer::start_jetstream();
    let client = within(
        "client",
        async_nats::ConnectOptions::new()
            .subscription_capacity(1 << 20)
            .connect(nats.url()),
    )
    .await
    .unwrap();
    let js = jetstream::new(client.clone());
    egress_stream(&js).await;
    // A first start creates the stream and the durable consumer; the
    // messages then wait in the stream for the run that is killed.
    let mut setup = Loopguard::spawn(&nats.url(), JS_CONFIG);
    setup.until_ready().await;
    setup.kill9();
    publish_messages(&js, 0..N).await;

    // Two runtime threads: publishes and acknowledgements interleave across
    // threads, so a kill lands between "published" and "acknowledged" for
    // some messages, and their redelivery exercises deduplication. (On one
    // thread that window is so short a kill rarely hits it.)
    let killed_config = format!("[runtime]\nthreads = 2\n{}", js_acks_config());
    let mut first = Loopguard::spawn(&nats.url(), &killed_config);
    // Kill it once a tenth is out: mid-stream, with work in flight.
    within("a tenth of the egress", async {
        while stream_messages(&js, "EGRESS").await < (N / 10) as u64 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    first.kill9();
    let at_kill = settled_stream_messages(&js, "EGRESS").await;
    assert!(
        at_kill < N as u64,
        "killed too late to prove anything: {at_kill}"
    );

    let second = Loopguard::spawn(&nats.url(), &killed_config);
    second.until_ready().await;
    second.until_logged("egress answered by a stream", 1).await;
    let logs = second.logs();
    assert!(
        logs.contains(
            "egress answered by a stream (egress_acks) family=chat.public.* stream=EGRESS"
        ),
        "{logs}"
    );
    until_stream_holds(&js, "EGRESS", N as u64, &second).await;
    until_ingest_acknowledged(&js, &second).await;

    // Exactly once in the egress stream, although the second run republished
    // work the first had published but not acknowledged.
    let held = stream_messages(&js, "EGRESS").await;
    assert_eq!(
        held, N as u64,
        "egress holds each approved message exactly once"
    );
    let scrape = support::Scrape::take(&second.http_addr().await).await;
    let second_published =
        scrape.get("loopguard_deliveries_total", &[("visibility", "public")]) as u64;
    let republished = (at_kill + second_published).saturating_sub(N as u64);
    assert!(
        republished > 0,
        "the second run republished nothing the first had sent ({at_kill} + {second_published}), so deduplication was never tested"
    );
    println!("kill -9 after {at_kill} of {N}: second run published {second_published}, {republished} of them again; {held} held");
}

/// A worker that panics (a bug, injected in a debug build) in JetStream
/// mode loses nothing: the run stops (exit 1) having published and
/// acknowledged the other worlds' messages; what was for the failed
/// worker's worlds, and what the intake had pulled, is not acknowledged,
/// and the next run gets it after `ack_wait`: every message in the egress
/// stream exactly once. What the intake pulled is not handed back (a
/// world's later messages would come back ahead of those the failed worker
/// held): checked by the log, in the runs (about half) where the intake
/// still held part of a batch when it stopped.
#[cfg(debug_assertions)]
#[tokio::test]
async fn a_worker_that_panics_in_jetstream_mode_loses_nothing() {
    const N: usize = 2000;
    let (nats, js, _) = {
        let nats = NatsServer::start_jetstream();
        let (client, js) = connect(&nats).await;
        (nats, js, client)
    };
    egress_stream(&js).await;
    ingest_stream(&js).await;
    // All waiting before loopguard pulls: the intake holds a batch when
    // the worker fails. The doomed world's first message comes early.
    publish_each(&js, 0..N, |i| match i {
        10 => "chat.raw.doomed.agent.a0".to_string(),
        i => format!("chat.raw.w{}.agent.a{}", i % 7, i % 3),
    })
    .await;
    let mut first = Loopguard::spawn_env(
        &nats.url(),
        JS_CONFIG,
        &[("LOOPGUARD_TEST_PANIC_WORLD", "doomed")],
    );
    let status = first.exited().await;
    let logs = first.logs();
    assert_eq!(status.code(), Some(1), "{logs}");
    assert!(
        logs.contains("failed worker's worlds left undecided"),
        "{logs}"
    );
    assert!(!logs.contains("handed back for redelivery"), "{logs}");
    let at_failure = settled_stream_messages(&js, "EGRESS").await;
    assert!(
        at_failure < N as u64,
        "the panic came after everything: {logs}"
    );
    a_second_run_finishes_all(&nats, &js, JS_CONFIG, N as u64).await;
}

#[tokio::test]
async fn a_nats_restart_mid_traffic_loses_nothing() {
    // The first half waits in the stream, so loopguard publishes it as fast
    // as it can and the restart lands mid-burst. The transcript's copies are
    // confirmed by the egress stream's answers (`egress_acks`): a flush
    // proves only that the server received a copy, and a server that stops
    // drops what its streams have not stored yet. The server is stopped with
    // SIGTERM, as an operator stops it: after a SIGKILL mid-burst,
    // nats-server 2.9.10's consumer was seen to deliver nothing more,
    // messages pending and a pull request waiting (docs/operations.md).
    const N: usize = 10_000;
    let mut nats = NatsServer::start_jetstream();
    let (client, js) = connect(&nats).await;
    egress_stream(&js).await;
    let mut setup = Loopguard::spawn(&nats.url(), JS_CONFIG);
    setup.until_ready().await;
    setup.kill9();
    publish_messages(&js, 0..N / 2).await;

    let lg = Loopguard::spawn(&nats.url(), &js_acks_config());
    within("a tenth of the egress", async {
        while stream_messages(&js, "EGRESS").await < (N / 10) as u64 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // Frozen mid-burst, so the restart cannot come after it whatever the
    // machine's pace: what loopguard holds then is in flight.
    lg.signal("STOP");
    let at_restart = stream_messages(&js, "EGRESS").await;
    assert!(
        at_restart < (N / 2) as u64,
        "the burst ({at_restart} stored) was over before the restart"
    );
    nats.restart_after_sigterm();
    lg.signal("CONT");
    // Both clients reconnect by themselves.
    lg.until_ready().await;
    within("test client reconnect", async {
        while client.connection_state() != async_nats::connection::State::Connected {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    publish_messages(&js, N / 2..N).await;

    until_stream_holds(&js, "EGRESS", N as u64, &lg).await;
    until_ingest_acknowledged(&js, &lg).await;
    assert_eq!(stream_messages(&js, "EGRESS").await, N as u64);
    lg.until_logged("reconnected to NATS", 1).await;
    let logs = lg.logs();
    assert!(logs.contains("reconnected to NATS"), "{logs}");
    // The restart landed while messages were in flight: some had to be
    // delivered again (a restart after the burst would prove nothing),
    // unless the restart rewound the consumer's count.
    match ingest_redeliveries(&js, N as u64).await {
        Some(redelivered) => {
            assert!(
                redelivered > 0,
                "nothing was redelivered: the restart ({at_restart} stored before it) missed the burst"
            );
            println!(
                "restart with {at_restart} of the first {} stored; {redelivered} deliveries repeated",
                N / 2
            );
        }
        None => {
            println!(
                "restart with {at_restart} of the first {} stored; the consumer's delivery count was rewound",
                N / 2
            );
        }
    }
}

/// With `egress_acks`, a message waits for the stream's answer to its
/// copies, however long: the egress stream is deleted while loopguard runs
/// (a core subscriber still takes the copies, so nothing answers them), and
/// the messages published meanwhile stay unacknowledged and are redelivered
/// until the stream is back; then each is stored once.
#[tokio::test]
async fn egress_acks_acknowledge_only_what_the_stream_answered() {
    const N: usize = 10;
    let nats = NatsServer::start_jetstream();
    let (client, js) = connect(&nats).await;
    egress_stream(&js).await;
    let _transcript = client.subscribe("chat.public.>").await.unwrap();
    within("subscribed", client.flush()).await.unwrap();
    let lg = Loopguard::spawn(&nats.url(), &js_acks_config());
    lg.until_ready().await;
    within("delete the egress stream", js.delete_stream("EGRESS"))
        .await
        .expect("deleted");
    publish_messages(&js, 0..N).await;

    // Past an `ack_wait` (2 s): unacknowledged, and delivered again.
    until_redelivered(&js).await;
    let info = ingest_consumer(&js).await;
    assert_eq!(
        info.num_ack_pending as u64 + info.num_pending,
        N as u64,
        "acknowledged without the stream's answer\n{}",
        lg.logs()
    );

    egress_stream(&js).await;
    until_ingest_acknowledged(&js, &lg).await;
    assert_eq!(stream_messages(&js, "EGRESS").await, N as u64);
    lg.until_logged("no answer from a stream", 1).await;
    let logs = lg.logs();
    assert!(logs.contains("no answer from a stream"), "{logs}");
}

/// A pull asks for no more than `nats.subscription_capacity` can hold: with
/// a small one (16 here) and a backlog waiting in the stream, nothing
/// overflows the subscription (the client would drop it as a slow
/// consumer, counted as lost, and the server deliver it again after
/// `ack_wait`, out of order). async-nats's batch of 200 did.
#[tokio::test]
async fn a_small_subscription_capacity_bounds_the_pull_batch() {
    const N: usize = 2000;
    let nats = NatsServer::start_jetstream();
    let (_client, js) = connect(&nats).await;
    egress_stream(&js).await;
    ingest_stream(&js).await;
    // All waiting before loopguard pulls: the server sends each batch at once.
    publish_messages(&js, 0..N).await;
    // An ack wait no stall of a loaded machine outlasts: what is checked
    // is that nothing was dropped, so nothing delivered again.
    let config = format!("[nats]\nsubscription_capacity = 16\n{JS_CONFIG}")
        .replace("ack_wait_seconds = 2", "ack_wait_seconds = 60");
    let lg = Loopguard::spawn(&nats.url(), &config);
    until_stream_holds(&js, "EGRESS", N as u64, &lg).await;
    until_ingest_acknowledged(&js, &lg).await;
    let addr = lg.http_addr().await;
    let scrape = support::Scrape::take(&addr).await;
    let dropped = scrape.get("loopguard_dropped_total", &[("reason", "slow_consumer")]);
    assert_eq!(dropped, 0.0, "{}", lg.logs());
    assert_eq!(ingest_consumer(&js).await.num_redelivered, 0);
}

/// The decisions loopguard holds for redeliveries keep the newest once
/// full (twice `max_ack_pending`): moka's default policy admitted a new
/// entry only if asked for more often than the one it would evict, so past
/// the first 20 decisions here none was held, and a redelivered message was
/// decided afresh, as a duplicate of itself, and its copy never stored.
#[tokio::test]
async fn a_full_replay_still_holds_the_newest_decisions() {
    let nats = NatsServer::start_jetstream();
    let (_, js) = connect(&nats).await;
    egress_stream(&js).await;
    let config = js_acks_config()
        .replace("enabled = true\n", "enabled = true\nmax_ack_pending = 10\n")
        .replace("[rules.duplicate]\nwindow_seconds = 0\n", "");
    let lg = Loopguard::spawn(&nats.url(), &config);
    lg.until_ready().await;
    publish_messages(&js, 0..60).await;
    until_ingest_acknowledged(&js, &lg).await;

    within("delete the egress stream", js.delete_stream("EGRESS"))
        .await
        .expect("deleted");
    publish_messages(&js, 60..70).await;
    // Unanswered, so unacknowledged; then redelivered after `ack_wait`
    // (2 s), while the stream is still gone.
    lg.until_logged("no answer from a stream", 1).await;
    until_redelivered(&js).await;
    egress_stream(&js).await;
    until_ingest_acknowledged(&js, &lg).await;
    assert_eq!(
        stream_messages(&js, "EGRESS").await,
        10,
        "each redelivered message republished from its decision\n{}",
        lg.logs()
    );
}

/// A stream that stores without answering (`no_ack`) cannot confirm a
/// copy: it is not used for `egress_acks`, and its family is flushed.
#[tokio::test]
async fn egress_acks_leave_no_ack_streams_to_the_flush() {
    let nats = NatsServer::start_jetstream();
    let (_, js) = connect(&nats).await;
    create_stream(
        &js,
        stream::Config {
            name: "SILENT".into(),
            subjects: vec!["chat.public.*".into()],
            no_ack: true,
            ..Default::default()
        },
    )
    .await;
    let lg = Loopguard::spawn(&nats.url(), &js_acks_config());
    lg.until_ready().await;
    publish_messages(&js, 0..10).await;
    until_ingest_acknowledged(&js, &lg).await;
    lg.until_logged("does not answer publishes", 1).await;
    let logs = lg.logs();
    assert!(
        logs.contains("does not answer publishes") && logs.contains("stream=SILENT"),
        "{logs}"
    );
    assert!(!logs.contains("egress answered by a stream"), "{logs}");
}

/// A copy the egress stream refuses (here: full, discarding new messages) is
/// counted as a publish error, and its message acknowledged: the server
/// answered, and redelivering would be refused again, forever.
#[tokio::test]
async fn copies_a_full_egress_stream_refuses_are_counted_not_redelivered() {
    const N: usize = 20;
    const ROOM: usize = 5;
    let nats = NatsServer::start_jetstream();
    let (_, js) = connect(&nats).await;
    create_stream(
        &js,
        stream::Config {
            name: "EGRESS".into(),
            subjects: vec!["chat.public.>".into()],
            max_messages: ROOM as i64,
            discard: stream::DiscardPolicy::New,
            ..Default::default()
        },
    )
    .await;
    let lg = Loopguard::spawn(&nats.url(), &js_acks_config());
    lg.until_ready().await;
    publish_messages(&js, 0..N).await;
    // Were refusals retried, the messages would never all be acknowledged.
    until_ingest_acknowledged(&js, &lg).await;
    assert_eq!(stream_messages(&js, "EGRESS").await, ROOM as u64);
    let scrape = support::Scrape::take(&lg.http_addr().await).await;
    // At least: a redelivery (a slow machine, `ack_wait` of 2 s) is refused
    // and counted again.
    let refused = scrape.get("loopguard_dropped_total", &[("reason", "publish_error")]);
    assert!(refused >= (N - ROOM) as f64, "{refused}\n{}", lg.logs());
    // A delivery is a copy the stream stored (again, after a redelivery).
    let delivered = scrape.get("loopguard_deliveries_total", &[("visibility", "public")]);
    assert!(
        (ROOM as f64..N as f64).contains(&delivered),
        "{delivered} deliveries for {ROOM} copies stored"
    );
}

/// With `egress_acks`, a copy the server's permissions refuse is never
/// answered (the server tells the connection, not the stream's reply):
/// counted as a publish error and its message acknowledged, as a refused
/// core copy's is, rather than redelivered, refused again, for ever, each
/// holding one of the consumer's `max_ack_pending` places until ingest
/// stops; and at once, rather than when the wait for its answer times out.
#[tokio::test]
async fn a_copy_the_server_s_permissions_refuse_is_counted_not_redelivered() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            "jetstream {{ store_dir: {:?} }}\n\
             authorization {{ users = [\n\
             {{ user: lg, password: pw, permissions: {{ publish: {{ deny: [\"chat.public.w1\"] }} }} }}\n\
             {{ user: t, password: pw }}\n] }}\n",
            dir.path().join("js")
        ),
    )
    .unwrap();
    let nats = NatsServer::start_with(&["-c", conf.to_str().unwrap()]);
    let client = support::connect_as(&nats, "t").await;
    let js = jetstream::new(client);
    egress_stream(&js).await;
    // An `ack_wait` of 20 s: a wait for an answer times out after 5 s.
    let config = js_acks_config().replace("ack_wait_seconds = 2", "ack_wait_seconds = 20");
    let lg = Loopguard::spawn_env(
        &nats.url(),
        &config,
        &[
            ("LOOPGUARD__NATS__USER", "lg"),
            ("LOOPGUARD__NATS__PASSWORD", "pw"),
            ("RUST_LOG", "loopguard=debug"),
        ],
    );
    lg.until_ready().await;
    // w0's copies are stored, w1's refused; and a rejection, which
    // shows that debug lines are logged.
    publish_each(&js, 0..6, |i| format!("chat.raw.w{}.agent.a", i % 2)).await;
    publish_each(&js, 6..7, |_| "chat.raw.w0.robot.r".into()).await;
    until_ingest_acknowledged(&js, &lg).await;
    // Settled at the refusal: no wait for an answer timed out first.
    lg.until_logged("message rejected", 1).await;
    let logs = lg.logs();
    assert!(logs.contains("message rejected"), "{logs}");
    assert!(!logs.contains(loopguard::publish::NO_ANSWER), "{logs}");
    assert_eq!(stream_messages(&js, "EGRESS").await, 3);
    // A refusal settles every copy to its subject sent before it: the last
    // ones may be counted after their messages were acknowledged.
    let addr = lg.http_addr().await;
    let refused = || async {
        let scrape = support::Scrape::take(&addr).await;
        scrape.get("loopguard_dropped_total", &[("reason", "publish_error")])
    };
    within("three refusals counted", async {
        while refused().await < 3.0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(refused().await, 3.0, "{}", lg.logs());
    let scrape = support::Scrape::take(&addr).await;
    let delivered = scrape.get("loopguard_deliveries_total", &[("visibility", "public")]);
    assert_eq!(delivered, 3.0, "{}", lg.logs());
}

/// A stream that captures only part of an egress family cannot answer
/// every copy of it: loopguard says so at start-up and confirms that
/// family's copies by a flush, so no copy waits for an answer that never
/// comes (core subscribers get it either way).
#[tokio::test]
async fn egress_acks_with_a_stream_on_part_of_a_family_flush_that_family() {
    let nats = NatsServer::start_jetstream();
    let (client, js) = connect(&nats).await;
    create_stream(
        &js,
        stream::Config {
            name: "W1_ONLY".into(),
            subjects: vec!["chat.public.w1".into()],
            ..Default::default()
        },
    )
    .await;
    // A core subscriber on the transcript: with no stream to answer, a
    // JetStream publish that reached it would get no answer at all.
    let mut transcript = client.subscribe("chat.public.>").await.unwrap();
    within("subscribed", client.flush()).await.unwrap();
    let lg = Loopguard::spawn(&nats.url(), &js_acks_config());
    lg.until_ready().await;
    publish_messages(&js, 0..10).await;
    until_ingest_acknowledged(&js, &lg).await;
    for _ in 0..10 {
        within("transcript copy", transcript.next())
            .await
            .expect("a copy");
    }
    lg.until_logged("a stream captures part of an egress family", 1)
        .await;
    let logs = lg.logs();
    assert!(
        logs.contains("a stream captures part of an egress family")
            && logs.contains("stream=W1_ONLY"),
        "{logs}"
    );
    assert!(!logs.contains("egress answered by a stream"), "{logs}");
    // Its share of the copies is still stored (w1 is one of five worlds);
    // a stream stores after the server's answer to the flush, so wait.
    until_stream_holds(&js, "W1_ONLY", 2, &lg).await;
    assert_eq!(settled_stream_messages(&js, "W1_ONLY").await, 2);
}

#[tokio::test]
async fn sigterm_under_load_leaves_the_rest_for_redelivery_and_exits_within_the_grace_period() {
    const N: usize = 4000;
    let nats = NatsServer::start_jetstream();
    let (_, js) = connect(&nats).await;
    egress_stream(&js).await;
    // At most 100 delivered and not acknowledged: what the workers still
    // hold at SIGTERM is far from the whole burst.
    // The grace period is long, so that a loaded machine cannot run it out:
    // the test is that loopguard stops taking more and exits on its own.
    let config = format!("[shutdown]\ngrace_seconds = 45\n{JS_CONFIG}").replace(
        "enabled = true\n",
        "enabled = true\nmax_ack_pending = 100\n",
    );
    // All waiting before loopguard pulls, so a test starved while it
    // publishes cannot let loopguard keep pace and finish the burst; and
    // stopped early in it, read often.
    ingest_stream(&js).await;
    publish_messages(&js, 0..N).await;
    let mut first = Loopguard::spawn(&nats.url(), &config);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while stream_messages(&js, "EGRESS").await < (N / 10) as u64 {
        assert!(tokio::time::Instant::now() < deadline, "{}", first.logs());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Stopped mid-burst: loopguard holds at most max_ack_pending (100) of
    // the rest when SIGTERM comes, so the rest must be left in the stream.
    first.signal("STOP");
    let at_signal = stream_messages(&js, "EGRESS").await;
    assert!(
        at_signal + 100 < N as u64,
        "the first run had nearly finished all {N} ({at_signal}) before SIGTERM"
    );
    first.signal("TERM");
    first.signal("CONT");
    let status = first.exited().await;
    assert_eq!(status.code(), Some(0), "{}", first.logs());
    let logs = first.logs();
    assert!(
        logs.contains("shutdown: complete") && !logs.contains("grace period over"),
        "{logs}"
    );
    let stored = stream_messages(&js, "EGRESS").await;
    assert!(
        stored < N as u64,
        "the first run finished all {N} after SIGTERM, so nothing was left for redelivery"
    );

    a_second_run_finishes_all(&nats, &js, &config, N as u64).await;
}

/// Messages the pull brought in but no worker took when SIGTERM came are
/// handed back (nak'ed) once the workers are done, so the next run gets
/// them within seconds, not after `ack_wait` (two minutes here, past the
/// test's wait). The intake is held
/// by a policy service that answers only after the signal: the world's
/// messages wait behind an agent's, until the worker holds as many as it
/// may; its queue fills, and the pull's next messages stay in the client:
/// about 300 of them, more than a task's cooperative budget (128), which
/// once cut the hand-back short.
#[tokio::test]
async fn sigterm_hands_back_what_no_worker_took_for_prompt_redelivery() {
    const N: usize = HELD_PAST_THE_QUEUE;
    let HeldRun {
        nats,
        js,
        open,
        config,
        lg: mut first,
    } = held_past_the_worker_s_queue(45).await;
    first.signal("TERM");
    first.until_logged("shutdown", 1).await;
    let _ = open.send(());
    let status = first.exited().await;
    assert_eq!(status.code(), Some(0), "{}", first.logs());
    let logs = first.logs();
    assert!(
        !logs.contains("no longer than a shutdown's drain"),
        "ack_wait 120 s is longer than a drain of 45 + 3 s: {logs}"
    );
    let line = logs
        .lines()
        .find(|l| l.contains("handed back for redelivery"))
        .unwrap_or_else(|| panic!("nothing was handed back: {logs}"));
    let count = |key: &str| field(line, key);
    // Past the budget: all that was held, not the first 128. Fewer held
    // means the worker was not held at the signal (a policy timeout?).
    assert!(count("held") > 128, "held few: {line}");
    assert_eq!(count("handed_back"), count("held"), "{line}");
    assert!(
        stream_messages(&js, "EGRESS").await < N as u64,
        "nothing was left"
    );

    a_second_run_finishes_all(&nats, &js, &config, N as u64).await;
}

/// When the grace period runs out, what the worker still holds undecided
/// (a message waiting for the policy service, the messages its world holds
/// back, its queue) is handed back too: the next run gets it within
/// seconds, not after `ack_wait` (two minutes, past the test's wait).
#[tokio::test]
async fn when_the_grace_period_runs_out_the_undecided_messages_are_handed_back() {
    // The message that asks, all the worker holds back behind it, and
    // some of its queue.
    const N: usize = loopguard::ingest::MAX_PARKED + 1000;
    let (nats, js, open) = held_policy_server().await;
    // The service answers no one until after the first run: its question
    // outlasts the grace period (its timeout is 10 s).
    let config = held_policy_config(1, 120);
    let mut first = Loopguard::spawn(&nats.url(), &config);
    first.until_ready().await;
    // As in the test above: three humans' messages decided, the first
    // agent's waits, the rest wait behind it, then in the worker's queue.
    publish_each(&js, 0..N, held_world_subject).await;
    until_delivered(&js, N).await;
    // Delivered by the server is not yet read by loopguard: what is still
    // in its socket at the signal stays there, and comes back only after
    // `ack_wait`. Read within milliseconds; a starved machine gets time.
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.signal("TERM");
    let status = first.exited().await;
    assert_eq!(status.code(), Some(0), "{}", first.logs());
    let logs = first.logs();
    assert!(logs.contains("shutdown: grace period over"), "{logs}");
    let left = logs
        .lines()
        .find(|l| l.contains("left undecided when the grace period ran out"))
        .unwrap_or_else(|| panic!("no count of what was left: {logs}"));
    // What the pull still held at the signal, if anything, the intake
    // handed back after the workers.
    let by_intake = logs
        .lines()
        .find(|l| l.contains("handed back for redelivery"))
        .map_or(0, |l| field(l, "handed_back"));
    // All but the three humans' messages decided before the agent's.
    assert_eq!(field(left, "handed_back") + by_intake, N - 3, "{logs}");
    assert_eq!(
        field(left, "not_handed_back") + field(left, "dropped"),
        0,
        "{left}"
    );
    assert!(left.contains("finished=true"), "{left}");
    until_stream_holds(&js, "EGRESS", 3, &first).await;
    assert_eq!(
        stream_messages(&js, "EGRESS").await,
        3,
        "only the first three were decided"
    );

    let _ = open.send(());
    a_second_run_finishes_all(&nats, &js, &config, N as u64).await;
}

/// When the grace period runs out while a worker decides the messages a
/// world held back behind an answered policy request (each slowed here, as
/// a slow publish of the one before would slow it), the rest of them are
/// handed back with everything else undecided. Until 2026-11-23 the worker
/// decided the whole chain past the grace period: here all 20 within the
/// drain's bound, and where that bound cut a longer chain short, what was
/// left came back only after `ack_wait`.
#[cfg(debug_assertions)]
#[tokio::test]
async fn a_chain_of_held_back_messages_stops_where_the_grace_period_runs_out() {
    // Three humans' messages, an agent's that asks, 20 humans' behind it.
    const N: usize = 24;
    let (nats, js, open) = held_policy_server().await;
    let config = held_policy_config(4, 120);
    let mut first = Loopguard::spawn_env(
        &nats.url(),
        &config,
        &[("LOOPGUARD_TEST_STALL_HELD_MS", "250")],
    );
    first.until_ready().await;
    // The agent's question seen go out: the worker holds it, and what
    // follows it waits in the worker, not in the intake (which, at the
    // signal, would hand it back unjudged, leaving nothing to the grace
    // period).
    let (observer, _) = connect(&nats).await;
    let mut asked = within("subscribe", observer.subscribe("policy.check"))
        .await
        .unwrap();
    within("subscribed", observer.flush()).await.unwrap();
    let subject = |i: usize| match i {
        3 => "chat.raw.w0.agent.a1".to_owned(),
        _ => "chat.raw.w0.human.h1".to_owned(),
    };
    publish_each(&js, 0..N, subject).await;
    until_delivered(&js, N).await;
    within("the agent's question", asked.next()).await;
    first.signal("TERM");
    // The answer comes 0.3 s into the 4 s grace period (3.7 s of slack for
    // a loaded machine to decide the agent's message within it); the 20
    // behind it take 5 s to decide, so the old code was done 5.3 s after
    // the signal, within the 2 s the drain has after the period.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = open.send(());
    assert_eq!(first.exited().await.code(), Some(0), "{}", first.logs());
    let logs = first.logs();
    let left = logs
        .lines()
        .find(|l| l.contains("left undecided when the grace period ran out"))
        .unwrap_or_else(|| panic!("no count of what was left: {logs}"));
    assert!(left.contains("finished=true"), "{left}");
    assert_eq!(
        field(left, "not_handed_back") + field(left, "dropped"),
        0,
        "{left}"
    );
    let by_intake = logs
        .lines()
        .find(|l| l.contains("handed back for redelivery"))
        .map_or(0, |l| field(l, "handed_back"));
    let handed_back = field(left, "handed_back") + by_intake;
    assert!(handed_back > 0, "the whole chain was decided: {left}");
    // The agent's message decided: the answer came within the period, so
    // the chain behind it was under test (an answer after it would hand
    // the whole chain back whatever the worker does).
    assert!(handed_back <= N - 4, "the answer came too late: {left}");
    // Each decided message has its one public copy, the world's first
    // messages in the order they came; none of the rest.
    let decided = N - handed_back;
    until_stream_holds(&js, "EGRESS", decided as u64, &first).await;
    assert_eq!(
        stream_messages(&js, "EGRESS").await,
        decided as u64,
        "{left}"
    );
    let egress = within("get stream", js.get_stream("EGRESS"))
        .await
        .expect("stream");
    for at in 0..decided {
        let copy = within("get a copy", egress.get_raw_message(at as u64 + 1))
            .await
            .expect("a copy");
        let body: serde_json::Value = serde_json::from_slice(&copy.payload).expect("JSON");
        assert_eq!(body["id"], format!("m{at}"), "{left}");
    }

    a_second_run_finishes_all(&nats, &js, &config, N as u64).await;
}

/// When the grace period runs out with a world's messages both held by its
/// worker (one waiting for the policy service, the rest behind it and in
/// the worker's queue) and pulled but not yet taken (in the intake), the
/// worker's go back first: the server delivers them again in the order
/// they came, the intake's after them, so the next run decides the world's
/// messages in order. Until 2026-11-23 the intake handed its own back as
/// soon as it saw the signal: here, where it waits to hand the full worker
/// a message, as the grace period freed room in its queue, so its naks
/// came among the worker's and the server delivered them out of order.
#[tokio::test]
async fn messages_left_undecided_when_the_grace_period_runs_out_come_back_in_order() {
    // The service answers no one while this run lasts (`_open` is held):
    // its question outlasts the grace period.
    let HeldRun {
        nats: _nats,
        js,
        open: _open,
        lg: mut first,
        ..
    } = held_past_the_worker_s_queue(1).await;
    first.signal("TERM");
    assert_eq!(first.exited().await.code(), Some(0), "{}", first.logs());
    let logs = first.logs();
    let handed_back = |what: &str| {
        let line = logs
            .lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} in {logs}"));
        field(line, "handed_back")
    };
    // The drain finished within its bound past the grace period: so the
    // intake's hand-back ran too.
    assert!(logs.contains("finished=true"), "{logs}");
    let by_workers = handed_back("left undecided when the grace period ran out");
    let by_intake = handed_back("handed back for redelivery");
    assert!(by_intake > 0, "the intake held nothing: {logs}");

    // The redeliveries, read as a next run's pull would read them once the
    // last hand-back is due (a second after the server got it, which the
    // exit's flush confirmed): a pull any sooner gets the messages never
    // delivered first. What was still on its way at the signal comes back
    // only after ack_wait.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stream = within("get stream", js.get_stream("LOOPGUARD_INGEST"))
        .await
        .expect("ingest stream");
    let consumer: jetstream::consumer::PullConsumer =
        within("get consumer", stream.get_consumer("loopguard"))
            .await
            .expect("consumer");
    let mut messages = within("pull", consumer.messages()).await.expect("pull");
    let mut sequences = Vec::new();
    within("the handed-back messages to come again", async {
        while sequences.len() < by_workers + by_intake {
            let m = messages.next().await.expect("a message").expect("no error");
            sequences.push(m.info().expect("delivery info").stream_sequence);
        }
    })
    .await;
    let out_of_order = sequences.windows(2).position(|w| w[0] >= w[1]);
    assert_eq!(
        out_of_order,
        None,
        "{by_workers} from the workers, {by_intake} from the intake, first {:?}",
        &sequences[..8]
    );
    // The worker's first: the agent's message that asked (the 4th).
    assert_eq!(sequences[0], 4);
}

/// Messages a run left undecided come back to the next as redeliveries, of
/// which that run holds no first delivery: past a world's share (64) held
/// back behind a policy request, its agents' are rejected for the backlog as
/// new ones are, not all held back. The first run (observe mode, which
/// holds every message back) hands them all back when its grace period runs
/// out; the second asks about the first, holds back 64, rejects the rest.
#[tokio::test]
async fn redeliveries_of_another_run_s_messages_are_rejected_past_a_world_s_share() {
    const N: usize = 200;
    const SHARE: usize = loopguard::ingest::MAX_HELD_PER_WORLD;
    let (nats, js, open) = held_policy_server().await;
    // ack_wait 5 s: a message still on its way to the first run at the
    // signal comes back by then, before the second run's question (10 s)
    // times out.
    let config = held_policy_config(1, 5);
    let mut first = Loopguard::spawn(&nats.url(), &format!("mode = \"observe\"\n{config}"));
    first.until_ready().await;
    publish_each(&js, 0..N, |i| format!("chat.raw.w0.agent.a{}", i % 4)).await;
    until_delivered(&js, N).await;
    first.signal("TERM");
    assert_eq!(first.exited().await.code(), Some(0), "{}", first.logs());
    let logs = first.logs();
    let handed_back = logs
        .lines()
        .filter(|l| {
            l.contains("handed back for redelivery")
                || l.contains("left undecided when the grace period ran out")
        })
        .map(|l| field(l, "handed_back"))
        .sum::<usize>();
    // All, but for any still on its way at the signal (back after ack_wait).
    assert!(handed_back > 1 + SHARE, "{logs}");

    let second = Loopguard::spawn(&nats.url(), &config);
    second.until_ready().await;
    let addr = second.http_addr().await;
    let backlog = || async {
        let scrape = support::Scrape::take(&addr).await;
        scrape.get("loopguard_policy_requests_total", &[("outcome", "backlog")]) as usize
    };
    within(
        "the redeliveries past the world's share to be rejected",
        async {
            while backlog().await < N - 1 - SHARE {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        },
    )
    .await;
    let _ = open.send(());
    until_stream_holds(&js, "EGRESS", (1 + SHARE) as u64, &second).await;
    until_ingest_acknowledged(&js, &second).await;
    assert_eq!(stream_messages(&js, "EGRESS").await, (1 + SHARE) as u64);
    assert_eq!(backlog().await, N - 1 - SHARE);
}

/// A message held back behind its world's policy request can be delivered
/// again while its first delivery still waits (here the test naks each
/// delivery; in production a lost connection or a `+WPI` that did not reach
/// the server does it): past the world's share that redelivery is held back
/// too, not rejected for the backlog (which would give the message two
/// decisions, the rejection acknowledging it). The messages past the share
/// are rejected once, and a last new one after the redeliveries is too:
/// only those are counted.
#[tokio::test]
async fn redeliveries_of_messages_held_back_are_never_rejected_for_the_backlog() {
    const N: usize = 100;
    const SHARE: usize = loopguard::ingest::MAX_HELD_PER_WORLD;
    let nats = NatsServer::start_jetstream();
    let (client, js) = connect(&nats).await;
    egress_stream(&js).await;
    let open = held_policy_service(&client).await;
    // The pull's deliveries, as loopguard gets them (its inbox).
    let mut deliveries = within("subscribe", client.subscribe("_INBOX.>"))
        .await
        .unwrap();
    within("subscribed", client.flush()).await.unwrap();
    let lg = Loopguard::spawn(&nats.url(), &held_policy_config(45, 120));
    lg.until_ready().await;
    let agent = |i: usize| format!("chat.raw.w0.agent.a{}", i % 4);
    // The first asks, 64 wait behind it, the rest are rejected.
    publish_each(&js, 0..N, agent).await;
    // Every first delivery is nak'ed: the server delivers at once again
    // those not acknowledged yet, the first and the 64 waiting.
    let mut nak_ed = std::collections::HashSet::new();
    within("every message to be delivered", async {
        while nak_ed.len() < N {
            let m = deliveries.next().await.expect("inbox subscription");
            let Some(reply) = m.reply.clone().filter(|r| r.starts_with("$JS.ACK.")) else {
                continue;
            };
            let m = jetstream::Message {
                message: m,
                context: js.clone(),
            };
            let info = m.info().expect("a delivery's reply subject");
            if info.delivered == 1 && nak_ed.insert(info.stream_sequence) {
                client.publish(reply, "-NAK".into()).await.unwrap();
            }
        }
    })
    .await;
    drop(deliveries);
    within("the held messages to be delivered again", async {
        while ingest_consumer(&js).await.num_redelivered < 1 + SHARE {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // One more, new, behind those redeliveries on the world's worker: once
    // it is rejected, they were handled.
    publish_each(&js, N..N + 1, agent).await;
    let addr = lg.http_addr().await;
    let backlog = || async {
        let scrape = support::Scrape::take(&addr).await;
        scrape.get("loopguard_policy_requests_total", &[("outcome", "backlog")]) as usize
    };
    let rejected = N - 1 - SHARE + 1;
    within("the last message to be rejected", async {
        while backlog().await < rejected {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(backlog().await, rejected, "a redelivery was rejected");
    let _ = open.send(());
    until_stream_holds(&js, "EGRESS", (1 + SHARE) as u64, &lg).await;
    until_ingest_acknowledged(&js, &lg).await;
    assert_eq!(stream_messages(&js, "EGRESS").await, (1 + SHARE) as u64);
    assert_eq!(backlog().await, rejected);
}

/// Messages held back behind their world's policy request for longer than
/// `ack_wait` (6 s here, the service silent for 9 s) are not delivered
/// again: every third of it loopguard tells the server they are still in
/// progress, the one asking as well as those waiting behind it. Once
/// answered, each is published once and acknowledged.
#[tokio::test]
async fn messages_held_back_longer_than_ack_wait_are_not_delivered_again() {
    const N: usize = 11;
    let (nats, js, open) = held_policy_server().await;
    let lg = Loopguard::spawn(&nats.url(), &held_policy_config(45, 6));
    lg.until_ready().await;
    // The first asks, the other 10 wait behind it.
    publish_each(&js, 0..N, |i| format!("chat.raw.w0.agent.a{}", i % 4)).await;
    until_delivered(&js, N).await;
    // Past an `ack_wait` after a first word (2 s), short of the policy's
    // timeout (the harness stretches its 10 s to 120: fault::policy_timeout).
    tokio::time::sleep(Duration::from_secs(9)).await;
    let consumer = ingest_consumer(&js).await;
    // Had the question timed out (a machine stalled for seconds), the first
    // message would have been approved and acknowledged: say so, rather
    // than leave a count one short to explain.
    let addr = lg.http_addr().await;
    let timeouts = support::Scrape::take(&addr)
        .await
        .get("loopguard_policy_requests_total", &[("outcome", "timeout")]);
    assert_eq!(
        timeouts, 0.0,
        "the policy question timed out before the check"
    );
    assert_eq!(
        (consumer.num_redelivered, consumer.num_ack_pending),
        (0, N),
        "redelivered, waiting"
    );
    let _ = open.send(());
    until_stream_holds(&js, "EGRESS", N as u64, &lg).await;
    until_ingest_acknowledged(&js, &lg).await;
    assert_eq!(stream_messages(&js, "EGRESS").await, N as u64);
}

/// A message's `ack_wait` runs from its delivery, its wait in a worker's
/// queue included. Here the worker holds back as many messages as it may
/// behind its world's policy request, so the next one (an agent's) waits in
/// its queue for three quarters of `ack_wait` (60 s), then asks the policy
/// service itself, which takes 18 s to answer. Told in progress only a third
/// of `ack_wait` (20 s) after it asked (as until 2026-11-24), its `ack_wait`
/// ran out at least 3 s before the answer and the server delivered it
/// again; told at once, it is not, with 15 s for the worker to reach it (a
/// loaded machine's slack).
#[tokio::test]
async fn a_message_that_queued_most_of_ack_wait_is_told_in_progress_at_once() {
    const N: usize = loopguard::ingest::MAX_PARKED + 2;
    let nats = NatsServer::start_jetstream();
    let (client, js) = connect(&nats).await;
    egress_stream(&js).await;
    // The first question waits for `open`; later ones take 18 s each.
    let mut requests = within("subscribe", client.subscribe("policy.check"))
        .await
        .unwrap();
    within("subscribed", client.flush()).await.unwrap();
    let (open, mut opened) = tokio::sync::oneshot::channel::<()>();
    let answering = client.clone();
    tokio::spawn(async move {
        let Some(first) = requests.next().await.and_then(|m| m.reply) else {
            return;
        };
        let _ = (&mut opened).await;
        let _ = answering
            .publish(first, r#"{"decision":"approve"}"#.into())
            .await;
        while let Some(reply) = requests.next().await.and_then(|m| m.reply) {
            let answering = answering.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(18)).await;
                let _ = answering
                    .publish(reply, r#"{"decision":"approve"}"#.into())
                    .await;
            });
        }
    });
    // The pull's deliveries, as loopguard gets them (its inbox): the most
    // times one message was delivered.
    let mut deliveries = within("subscribe", client.subscribe("_INBOX.>"))
        .await
        .unwrap();
    within("subscribed", client.flush()).await.unwrap();
    let most = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counting = (most.clone(), js.clone());
    tokio::spawn(async move {
        while let Some(m) = deliveries.next().await {
            if m.reply.as_ref().is_some_and(|r| r.starts_with("$JS.ACK.")) {
                let m = jetstream::Message {
                    message: m,
                    context: counting.1.clone(),
                };
                let info = m.info().expect("a delivery's reply subject");
                counting
                    .0
                    .fetch_max(info.delivered as u64, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    let lg = Loopguard::spawn(&nats.url(), &held_policy_config(45, 60));
    lg.until_ready().await;
    // An agent's message asks, humans' fill what the worker may hold back
    // behind it, and the last, an agent's, waits in the worker's queue.
    publish_each(&js, 0..N, |i| match i {
        0 => "chat.raw.w0.agent.a1".to_owned(),
        i if i == N - 1 => "chat.raw.w0.agent.a2".to_owned(),
        _ => "chat.raw.w0.human.h1".to_owned(),
    })
    .await;
    until_delivered(&js, N).await;
    tokio::time::sleep(Duration::from_secs(45)).await;
    let _ = open.send(());
    // The last question is answered 18 s after it is asked: past the
    // `ack_wait` of the message's delivery.
    until_stream_holds(&js, "EGRESS", N as u64, &lg).await;
    until_ingest_acknowledged(&js, &lg).await;
    assert_eq!(
        most.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "a message was delivered again"
    );
    let addr = lg.http_addr().await;
    let scrape = support::Scrape::take(&addr).await;
    assert_eq!(
        scrape.get("loopguard_policy_requests_total", &[("outcome", "approve")]),
        2.0,
        "both agents' messages were asked about, once each"
    );
}

#[tokio::test]
async fn the_consumer_s_counts_follow_its_backlog_and_go_while_unknown() {
    const MESSAGES: usize = 100;
    let (nats, js, open) = held_policy_server().await;
    // The world held behind its policy request keeps 20 unacknowledged,
    // and the server delivers no more: the rest waits in the stream.
    let config = held_policy_config(10, 120)
        .replace("enabled = true\n", "enabled = true\nmax_ack_pending = 20\n");
    let lg = Loopguard::spawn_env(
        &nats.url(),
        &config,
        &[("LOOPGUARD_TEST_COUNTS_EVERY_MS", "100")],
    );
    lg.until_ready().await;
    let addr = lg.http_addr().await;
    // Five agents' messages, each held for the policy service's 10 s
    // timeout: the world holds for 50 s, whatever the machine's pace.
    publish_each(&js, 0..MESSAGES, |i| match i {
        3..8 => "chat.raw.w0.agent.a1".to_owned(),
        _ => "chat.raw.w0.human.h1".to_owned(),
    })
    .await;
    // loopguard's counts (pending, ack pending), where it shows them.
    let shown = async |addr: &str| {
        let scrape = support::Scrape::take(addr).await;
        let count = |name: &str| {
            let all = scrape.all(name);
            let ours = |l: &std::collections::BTreeMap<String, String>| {
                let label = |k: &str| l.get(k).map(String::as_str);
                l.len() == 2
                    && label("stream") == Some("LOOPGUARD_INGEST")
                    && label("consumer") == Some("loopguard")
            };
            assert!(
                all.len() <= 1 && all.iter().all(|(l, _)| ours(l)),
                "{all:?}"
            );
            all.first().map(|(_, v)| *v as u64)
        };
        (
            count("loopguard_jetstream_pending"),
            count("loopguard_jetstream_ack_pending"),
        )
    };
    within("loopguard to show the server's counts", async {
        loop {
            let server = ingest_consumer(&js).await;
            let want = (
                Some(server.num_pending),
                Some(server.num_ack_pending as u64),
            );
            if server.num_ack_pending == 20 && shown(&addr).await == want {
                assert!(server.num_pending > 0, "{server:?}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // A server that answers nothing: no counts, rather than stale ones.
    nats.freeze();
    within("the counts to go", async {
        while shown(&addr).await != (None, None) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    nats.thaw();
    // Logged as it starts and as it ends, once each.
    lg.until_logged("JetStream consumer counts read again", 1)
        .await;
    assert_eq!(
        lg.logs()
            .matches("JetStream consumer counts unknown")
            .count(),
        1
    );
    let _ = open.send(());
    within("the backlog to be decided, and shown as gone", async {
        while shown(&addr).await != (Some(0), Some(0)) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let server = ingest_consumer(&js).await;
    assert_eq!((server.num_pending, server.num_ack_pending), (0, 0));
}

/// Waits until the server has delivered the ingest stream's first `n`
/// messages to loopguard's consumer.
async fn until_delivered(js: &jetstream::Context, n: usize) {
    within("the pull to deliver every message", async {
        while ingest_consumer(js).await.delivered.stream_sequence < n as u64 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// The number a log line gives as ` key=N`.
fn field(line: &str, key: &str) -> usize {
    let at = line
        .find(&format!(" {key}="))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        + key.len()
        + 2;
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().expect(key)
}

/// A JetStream server with the egress stream and a [`held_policy_service`]:
/// where the tests of messages held behind a policy request start.
/// A JetStream server with the EGRESS stream, and loopguard on it
/// (`JS_CONFIG`), ready.
async fn jetstream_loopguard() -> (NatsServer, jetstream::Context, Loopguard) {
    let nats = NatsServer::start_jetstream();
    let (_, js) = connect(&nats).await;
    egress_stream(&js).await;
    let lg = Loopguard::spawn(&nats.url(), JS_CONFIG);
    lg.until_ready().await;
    (nats, js, lg)
}

async fn held_policy_server() -> (
    NatsServer,
    jetstream::Context,
    tokio::sync::oneshot::Sender<()>,
) {
    let nats = NatsServer::start_jetstream();
    let (client, js) = connect(&nats).await;
    egress_stream(&js).await;
    let open = held_policy_service(&client).await;
    (nats, js, open)
}

/// A policy service on `policy.check` (subscribed before it returns): it
/// holds every request until the returned sender is used, then approves
/// those and every later one at once.
async fn held_policy_service(client: &async_nats::Client) -> tokio::sync::oneshot::Sender<()> {
    let mut requests = within("subscribe", client.subscribe("policy.check"))
        .await
        .unwrap();
    within("subscribed", client.flush()).await.unwrap();
    let (open, mut opened) = tokio::sync::oneshot::channel::<()>();
    let answering = client.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        let mut gate_open = false;
        loop {
            tokio::select! {
                _ = &mut opened, if !gate_open => {
                    gate_open = true;
                    for reply in held.drain(..) {
                        let _ = answering.publish(reply, r#"{"decision":"approve"}"#.into()).await;
                    }
                }
                m = requests.next() => {
                    let Some(reply) = m.and_then(|m| m.reply) else { break };
                    if gate_open {
                        let _ = answering.publish(reply, r#"{"decision":"approve"}"#.into()).await;
                    } else {
                        held.push(reply);
                    }
                }
            }
        }
    });
    open
}

/// JetStream with the policy hook on [`held_policy_service`] (a 10 s
/// timeout, failing open), a grace period of `grace_seconds` and
/// `ack_wait_seconds` (120: past any wait of the tests).
fn held_policy_config(grace_seconds: u64, ack_wait_seconds: u64) -> String {
    format!(
        "[shutdown]\ngrace_seconds = {grace_seconds}\n[rules.policy]\nsubject = \"policy.check\"\ntimeout_ms = 10000\nfail = \"open\"\n{JS_CONFIG}"
    )
    .replace(
        "ack_wait_seconds = 2",
        &format!("ack_wait_seconds = {ack_wait_seconds}"),
    )
}

/// Messages [`held_past_the_worker_s_queue`] publishes: what the worker
/// holds back behind its world's policy request, its queue, and 1,000 more.
const HELD_PAST_THE_QUEUE: usize =
    loopguard::ingest::MAX_PARKED + loopguard::ingest::WORKER_QUEUE + 1000;

/// A run of loopguard holding one world's messages past its worker's
/// queue, and what it runs against.
struct HeldRun {
    nats: NatsServer,
    js: jetstream::Context,
    /// Opens [`held_policy_service`] (so does dropping it).
    open: tokio::sync::oneshot::Sender<()>,
    config: String,
    lg: Loopguard,
}

/// Starts loopguard in JetStream mode with the policy hook on
/// [`held_policy_service`] (`ack_wait` 120 s) and the grace period given,
/// and publishes [`HELD_PAST_THE_QUEUE`] messages of one world (see
/// [`held_world_subject`]). The worker asks about message 4 and holds back
/// 5 to 1028 behind it, then takes no more: its queue holds 1029 to 5124;
/// the intake waits to hand it 5125, just after the pull asked for 200 more
/// (the client asks when no more than 100 of what it asked for are still
/// to come). Returns once the pull's client holds much of the rest.
async fn held_past_the_worker_s_queue(grace_seconds: u64) -> HeldRun {
    const TAKEN: usize = loopguard::ingest::MAX_PARKED + loopguard::ingest::WORKER_QUEUE;
    let (nats, js, open) = held_policy_server().await;
    let config = held_policy_config(grace_seconds, 120);
    let lg = Loopguard::spawn(&nats.url(), &config);
    lg.until_ready().await;
    publish_each(&js, 0..HELD_PAST_THE_QUEUE, held_world_subject).await;
    within("the pull to deliver past the worker's queue", async {
        while ingest_consumer(&js).await.num_ack_pending < TAKEN + 250 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    HeldRun {
        nats,
        js,
        open,
        config,
        lg,
    }
}

/// One world, so one worker: three humans' messages (the policy is not
/// asked about those), then three agents' that each hold the world until
/// the policy answers (three, so that a slow machine running out one 10 s
/// timeout still holds it), then humans' again.
fn held_world_subject(i: usize) -> String {
    match i {
        3..6 => "chat.raw.w0.agent.a1".to_owned(),
        _ => "chat.raw.w0.human.h1".to_owned(),
    }
}

#[tokio::test]
async fn an_existing_stream_that_misses_the_subjects_stops_start_up_with_a_clear_error() {
    let nats = NatsServer::start_jetstream();
    let (_, js) = connect(&nats).await;
    create_stream(
        &js,
        stream::Config {
            name: "LOOPGUARD_INGEST".into(),
            subjects: vec!["chat.raw.>".into()],
            ..Default::default()
        },
    )
    .await;
    let mut lg = Loopguard::spawn(&nats.url(), JS_CONFIG);
    let status = within("loopguard to exit", async {
        loop {
            if let Some(status) = lg.exit_status() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let logs = lg.logs();
    // Exit 1, as docs/operations.md says (2 is a configuration error).
    assert_eq!(status.code(), Some(1), "{logs}");
    assert!(
        logs.contains("LOOPGUARD_INGEST") && logs.contains("chat.join.>"),
        "{logs}"
    );
}

/// A consumer that exists keeps the settings it was created with; loopguard
/// says so rather than run with settings other than its configuration's.
#[tokio::test]
async fn an_existing_consumer_with_other_settings_is_named_in_a_warning() {
    let nats = NatsServer::start_jetstream();
    let (_, js) = connect(&nats).await;
    let stream = ingest_stream(&js).await;
    within(
        "create consumer",
        stream.create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("loopguard".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            ..Default::default()
        }),
    )
    .await
    .expect("consumer");
    let lg = Loopguard::spawn(&nats.url(), JS_CONFIG);
    lg.until_ready().await;
    lg.until_logged("keeps its own ack_wait", 1).await;
}

/// A consumer whose ack wait is no longer than a shutdown's drain (the
/// grace period, 10 s by default, and 3 s) is named in a warning at
/// start-up: what a drain still holds can come back before what it hands
/// back. (A longer one is not: see
/// `sigterm_hands_back_what_no_worker_took_for_prompt_redelivery`.)
#[tokio::test]
async fn an_ack_wait_no_longer_than_a_drain_is_named_in_a_warning() {
    let nats = NatsServer::start_jetstream();
    let lg = Loopguard::spawn(&nats.url(), JS_CONFIG);
    lg.until_ready().await;
    lg.until_logged("no longer than a shutdown's drain", 1)
        .await;
}

/// A publisher may write a status line into its header block (`NATS/1.0
/// 408 Request Timeout`); nats-server stores it with the message. The pull
/// consumer used to take such a message for a heartbeat or the end of a
/// pull: it was never judged nor acknowledged, and came back after every
/// ack wait. Each is now judged like any other.
#[tokio::test]
async fn a_status_line_a_publisher_wrote_does_not_stall_its_message() {
    let (nats, js, lg) = jetstream_loopguard().await;
    let statuses = [
        "100 Idle Heartbeat",
        "404 No Messages",
        "408 Request Timeout",
        "409 Exceeded MaxWaiting",
    ];
    let mut ops = Vec::new();
    for (i, status) in statuses.iter().enumerate() {
        let body = json!({"content": format!("status {i}"), "id": format!("s{i}")});
        let headers = format!("NATS/1.0 {status}\r\n\r\n");
        ops.extend(hpub(
            &format!("chat.raw.w{i}.human.hank"),
            headers.as_bytes(),
            body.to_string().as_bytes(),
        ));
    }
    publish_raw(&nats.url(), &ops).await;
    until_stream_holds(&js, "EGRESS", statuses.len() as u64, &lg).await;
    until_ingest_acknowledged(&js, &lg).await;
    // The consumer is loopguard's own: no warning about its settings.
    assert!(!lg.logs().contains("keeps its own"), "{}", lg.logs());
}

/// The consumer is deleted while loopguard runs (`nats consumer rm`, which
/// loopguard's own warning about changed settings advises): the server
/// ends loopguard's pull. loopguard opens the consumer again and goes on;
/// it used to take the end for a shutdown, drain and exit 0. (Debug
/// builds: the reopening is held by a test fault.)
#[cfg(debug_assertions)]
#[tokio::test]
async fn a_consumer_deleted_under_loopguard_is_opened_again() {
    const N: usize = 20;
    let nats = NatsServer::start_jetstream();
    let (_, js) = connect(&nats).await;
    egress_stream(&js).await;
    // The reopening held until the test has read /readyz: it can otherwise
    // follow the loss within milliseconds (when the consumer was opened
    // over 2 s before).
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("release");
    let env = [("LOOPGUARD_TEST_HOLD_REOPEN", &release)];
    let mut lg = Loopguard::spawn_env(&nats.url(), JS_CONFIG, &env);
    lg.until_ready().await;
    publish_messages(&js, 0..N / 2).await;
    until_stream_holds(&js, "EGRESS", (N / 2) as u64, &lg).await;

    let ingest = within("get stream", js.get_stream("LOOPGUARD_INGEST"))
        .await
        .expect("ingest stream");
    within("delete consumer", ingest.delete_consumer("loopguard"))
        .await
        .expect("deleted");
    lg.until_logged("test fault: reopening held", 1).await;
    // Not ready from the loss noticed: until 2026-11-24 only from the
    // reopening.
    let addr = lg.http_addr().await;
    let (status, body) = http(&addr, "GET", "/readyz", &[]).await;
    assert_eq!(status, 503);
    assert!(body.contains("consumer was lost"), "{body}");
    std::fs::write(&release, "").unwrap();
    publish_messages(&js, N / 2..N).await;

    until_stream_holds(&js, "EGRESS", N as u64, &lg).await;
    until_ingest_acknowledged(&js, &lg).await;
    assert!(lg.is_running(), "loopguard exited\n{}", lg.logs());
    lg.until_ready().await;
}

/// With `storage = "memory"`, a restart of nats-server loses the ingest
/// stream and its consumer: loopguard's pulls then find no one to answer
/// them. It sets both up again, and what is published after goes through
/// (before, it pulled from the missing consumer for ever).
#[tokio::test]
async fn an_ingest_stream_lost_with_a_server_restart_is_set_up_again() {
    const N: usize = 20;
    let mut nats = NatsServer::start_jetstream();
    let (client, js) = connect(&nats).await;
    egress_stream(&js).await;
    let config = JS_CONFIG.replace("enabled = true\n", "enabled = true\nstorage = \"memory\"\n");
    let lg = Loopguard::spawn(&nats.url(), &config);
    lg.until_ready().await;
    publish_messages(&js, 0..N / 2).await;
    until_stream_holds(&js, "EGRESS", (N / 2) as u64, &lg).await;

    restart_losing_the_ingest_stream(&mut nats, &client, &js, &lg).await;
    publish_messages(&js, N / 2..N).await;

    until_stream_holds(&js, "EGRESS", N as u64, &lg).await;
    until_ingest_acknowledged(&js, &lg).await;
    // Its sequences started again: decisions held by the old ones are gone.
    lg.until_logged("the stream was created again", 1).await;
    assert!(
        lg.logs().contains("the stream was created again"),
        "{}",
        lg.logs()
    );
}

/// The ingest stream edited while loopguard runs to capture another
/// application's subjects: loopguard must not acknowledge those messages
/// (on a work queue that deletes them). It hands the first back, opens its
/// consumer again, finds the stream broader and stops with the error it
/// gives at start-up; the other application's message stays in the stream.
#[tokio::test]
async fn a_stream_edited_to_capture_others_subjects_stops_loopguard_and_keeps_their_messages() {
    let nats = NatsServer::start_jetstream();
    let (_, js) = connect(&nats).await;
    egress_stream(&js).await;
    let mut lg = Loopguard::spawn(&nats.url(), JS_CONFIG);
    lg.until_ready().await;
    publish_messages(&js, 0..1).await;
    until_stream_holds(&js, "EGRESS", 1, &lg).await;
    until_ingest_acknowledged(&js, &lg).await;
    let mut ingest = within("get stream", js.get_stream("LOOPGUARD_INGEST"))
        .await
        .expect("ingest stream");
    let mut config = within("stream info", ingest.info())
        .await
        .expect("info")
        .config
        .clone();
    config.subjects.push("billing.>".into());
    within("edit the stream", js.update_stream(config))
        .await
        .expect("stream edited");
    within("publish", js.publish("billing.invoice", "{}".into()))
        .await
        .expect("publish")
        .await
        .expect("stored");
    let status = within("loopguard stops", async {
        loop {
            if let Some(status) = lg.exit_status() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let logs = lg.logs();
    assert!(!status.success(), "{status:?}\n{logs}");
    assert!(logs.contains("captures billing.>"), "{logs}");
    // The work queue still holds it: not acknowledged.
    assert_eq!(stream_messages(&js, "LOOPGUARD_INGEST").await, 1, "{logs}");
}

/// Messages of an ingest stream that was lost and created again (memory
/// storage, a server restart) may still be held when the new stream's
/// messages come in, numbered from 1 again. An acknowledgement of an old
/// one names its stream sequence, which the server would take for the new
/// message of that number, settling it unfinished: they are not sent. Here
/// the old messages wait for the policy service (one 10 s timeout after
/// another) past the restart, the new ones of the same world wait behind
/// them, and only the old ones are answered: the new ones all stay
/// unacknowledged.
#[tokio::test]
async fn messages_of_a_stream_created_again_do_not_settle_the_new_stream_s() {
    const OLD: usize = 10;
    let mut nats = NatsServer::start_jetstream();
    let (client, js) = connect(&nats).await;
    egress_stream(&js).await;
    let open = old_only_policy_service(&client, OLD).await;
    let config = held_policy_config(45, 120)
        .replace("fail = \"open\"\n", "fail = \"open\"\ntrip_after = 0\n")
        .replace("enabled = true\n", "enabled = true\nstorage = \"memory\"\n");
    let lg = Loopguard::spawn(&nats.url(), &config);
    lg.until_ready().await;
    let agent = |i: usize| format!("chat.raw.w0.agent.a{}", i % 4);
    publish_each(&js, 0..OLD, agent).await;
    until_delivered(&js, OLD).await;

    restart_losing_the_ingest_stream(&mut nats, &client, &js, &lg).await;
    // The new stream's 1 to 10, behind what is left of the old ones.
    publish_each(&js, OLD..2 * OLD, agent).await;
    until_delivered(&js, OLD).await;
    let still_old = OLD - stream_messages(&js, "EGRESS").await as usize;
    let _ = open.send(());
    until_stream_holds(&js, "EGRESS", OLD as u64, &lg).await;
    assert!(
        still_old > 1,
        "the old messages all timed out before the new ones came"
    );
    // The old ones' acknowledgements would follow their flush, within
    // milliseconds: watched for 10 s, well short of the new ones' own
    // policy timeout (the harness stretches its 10 s to 120:
    // fault::policy_timeout; after it they are rightly acknowledged).
    let watch = std::time::Instant::now();
    while watch.elapsed() < Duration::from_secs(10) {
        let consumer = ingest_consumer(&js).await;
        assert_eq!(
            consumer.num_ack_pending,
            OLD,
            "new messages settled by old acknowledgements ({still_old} old ones were left) after {:?}\n{}",
            watch.elapsed(),
            lg.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A policy service on `policy.check` (subscribed before it returns) that,
/// once the returned sender is used, approves the requests about the
/// messages [`publish_each`] numbered below `old`, and never answers the
/// others.
async fn old_only_policy_service(
    client: &async_nats::Client,
    old: usize,
) -> tokio::sync::oneshot::Sender<()> {
    let mut requests = within("subscribe", client.subscribe("policy.check"))
        .await
        .unwrap();
    within("subscribed", client.flush()).await.unwrap();
    let (open, mut opened) = tokio::sync::oneshot::channel::<()>();
    let answering = client.clone();
    let is_old = move |m: &async_nats::Message| {
        let body: serde_json::Value = serde_json::from_slice(&m.payload).unwrap_or_default();
        let n = body["content"]
            .as_str()
            .and_then(|c| c.strip_prefix("message "));
        n.and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n < old)
    };
    tokio::spawn(async move {
        let mut held = Vec::new();
        let mut gate_open = false;
        let approve = r#"{"decision":"approve"}"#;
        loop {
            tokio::select! {
                _ = &mut opened, if !gate_open => {
                    gate_open = true;
                    for reply in held.drain(..) {
                        let _ = answering.publish(reply, approve.into()).await;
                    }
                }
                m = requests.next() => {
                    let Some(m) = m else { break };
                    let Some(reply) = m.reply.clone().filter(|_| is_old(&m)) else { continue };
                    if gate_open {
                        let _ = answering.publish(reply, approve.into()).await;
                    } else {
                        held.push(reply);
                    }
                }
            }
        }
    });
    open
}

/// Restarts a server that holds the ingest stream in memory, and waits
/// until loopguard has noticed its consumer lost and set the stream up
/// again.
async fn restart_losing_the_ingest_stream(
    nats: &mut NatsServer,
    client: &async_nats::Client,
    js: &jetstream::Context,
    lg: &Loopguard,
) {
    nats.restart_after_sigterm();
    // async-nats finds the consumer gone once it has retried its lookup
    // after the reconnect (about 15 s), so this waits longer than `within`.
    let lost = async {
        while !lg.logs().contains("opening the consumer again") {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(45), lost)
        .await
        .unwrap_or_else(|_| panic!("the lost consumer was not noticed\n{}", lg.logs()));
    within("the ingest stream set up again", async {
        while client.connection_state() != async_nats::connection::State::Connected
            || js.get_stream("LOOPGUARD_INGEST").await.is_err()
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// JetStream gone from the server loopguard reconnects to (restarted
/// without it): loopguard is connected, but its consumer is lost and cannot
/// be opened again, so `/readyz` answers 503 and `loopguard_ready` is 0
/// (`LoopguardNotReady` can fire) until JetStream is back and the consumer
/// is open again. Before, it stayed ready while nothing came in.
#[tokio::test]
async fn a_lost_consumer_is_not_ready_until_it_is_open_again() {
    const N: usize = 10;
    let mut nats = NatsServer::start_jetstream();
    let (client, js) = connect(&nats).await;
    egress_stream(&js).await;
    let lg = Loopguard::spawn(&nats.url(), JS_CONFIG);
    lg.until_ready().await;
    let addr = lg.http_addr().await;

    nats.stop();
    let without_jetstream = NatsServer::start_on(nats.port);
    let not_ready = async {
        while !lg.logs().contains("JetStream set-up failed")
            || http(&addr, "GET", "/readyz", &[]).await.0 != 503
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(45), not_ready)
        .await
        .unwrap_or_else(|_| panic!("not reported not ready\n{}", lg.logs()));
    // Connected all the while: what is missing is the consumer.
    let scrape = support::Scrape::take(&addr).await;
    assert_eq!(
        scrape.get("loopguard_nats_connected", &[]),
        1.0,
        "{}",
        lg.logs()
    );
    assert_eq!(scrape.get("loopguard_ready", &[]), 0.0, "{}", lg.logs());
    lg.until_logged("opening the consumer again", 1).await;
    assert!(
        lg.logs().contains("opening the consumer again"),
        "{}",
        lg.logs()
    );

    drop(without_jetstream);
    nats.restart();
    lg.until_ready().await;
    within("client reconnected", async {
        while client.connection_state() != async_nats::connection::State::Connected {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    publish_messages(&js, 0..N).await;
    until_stream_holds(&js, "EGRESS", N as u64, &lg).await;
    until_ingest_acknowledged(&js, &lg).await;
}

/// A stream or consumer already under loopguard's names that it cannot use
/// without losing messages stops it with an error that names it and says
/// what to do, rather than retry for ever or go on: a push consumer (it can
/// never serve pulls), a consumer whose acknowledgements settle more than
/// one message, one that delivers headers only, one whose filter leaves
/// out joins, and a stream that captures loopguard's own copies (a
/// consumer would read them and, on a work queue, delete them).
#[tokio::test]
async fn an_unusable_stream_or_consumer_in_loopguards_place_stops_it_with_a_clear_error() {
    use jetstream::consumer::{pull, push, AckPolicy};
    let pulls = |f: fn(&mut pull::Config)| {
        let mut c = pull::Config {
            durable_name: Some("loopguard".into()),
            ack_policy: AckPolicy::Explicit,
            ..Default::default()
        };
        f(&mut c);
        c
    };
    let cases: [(&str, Option<pull::Config>, &str); 4] = [
        ("push", None, "refuses loopguard's pulls"),
        (
            "ack all",
            Some(pulls(|c| c.ack_policy = AckPolicy::All)),
            "not explicit",
        ),
        (
            "headers only",
            Some(pulls(|c| c.headers_only = true)),
            "delivers headers only",
        ),
        (
            "raw only",
            Some(pulls(|c| c.filter_subject = "chat.raw.>".into())),
            "leaves out chat.join.>",
        ),
    ];
    let stops_with = async |nats: &NatsServer, expected: &str| {
        let mut lg = Loopguard::spawn(&nats.url(), JS_CONFIG);
        let status = within("loopguard stops", async {
            loop {
                if let Some(status) = lg.exit_status() {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        let logs = lg.logs();
        assert!(!status.success(), "{status:?}\n{logs}");
        assert!(logs.contains(expected), "{expected}: {logs}");
    };
    for (name, consumer, expected) in cases {
        let nats = NatsServer::start_jetstream();
        let (_, js) = connect(&nats).await;
        // Not a work queue, which takes explicit acknowledgements only.
        let limits = stream::RetentionPolicy::Limits;
        let stream = ingest_stream_of(&js, &["chat.raw.>", "chat.join.>"], limits).await;
        let created = match consumer {
            Some(config) => within("create the consumer", stream.create_consumer(config))
                .await
                .map(|_| ()),
            None => within(
                "create the push consumer",
                stream.create_consumer(push::Config {
                    durable_name: Some("loopguard".into()),
                    deliver_subject: "elsewhere".into(),
                    ack_policy: AckPolicy::Explicit,
                    ..Default::default()
                }),
            )
            .await
            .map(|_| ()),
        };
        created.unwrap_or_else(|e| panic!("consumer {name}: {e}"));
        stops_with(&nats, expected).await;
    }
    // A stream that captures an egress family too.
    let nats = NatsServer::start_jetstream();
    let (_, js) = connect(&nats).await;
    let subjects = ["chat.raw.>", "chat.join.>", "chat.public.*"];
    ingest_stream_of(&js, &subjects, stream::RetentionPolicy::Limits).await;
    stops_with(&nats, "captures chat.public.*").await;
}
