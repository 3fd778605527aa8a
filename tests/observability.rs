//! Contract §7 and §8 end to end: the HTTP routes, exact metric deltas for a
//! scenario, readiness across a NATS outage, the admin API, and the
//! exposition checked by the real `promtool`.

mod support;

use serde_json::json;
use support::{http, http_with_head, msg, Harness, NatsServer, Scrape};

const TOKEN: &str = "s3cret-token";

#[tokio::test]
async fn a_scenario_moves_every_counter_by_exactly_what_happened() {
    let mut h = Harness::start(
        "[rules.turns]\nmax = 2\n[rules.depth]\nmax = 0\n[worlds.w]\nagents = [\"alice\", \"bob\"]\n",
    )
    .await;
    let addr = h.loopguard.http_addr().await;
    let before = Scrape::take(&addr).await;

    h.send_json("w", "human", "hank", msg("hello all")).await; // public + 2 inboxes
    h.send_json("w", "agent", "alice", msg("@bob over to you"))
        .await; // 1 inbox
    h.send_json("w", "agent", "bob", msg("@alice thanks")).await; // 1 inbox, turn 2
    h.send_json("w", "agent", "alice", msg("more")).await; // turns: rejected + notice
    h.send_json("w", "agent", "bob", msg("again")).await; // turns: rejected, no notice
    h.send_json("w", "agent", "bob", msg("<world>pass</world>"))
        .await; // edited, public
    h.send_json("w", "agent", "alice", msg("hello all")).await; // duplicate of hank's
    h.send("w", "agent", "alice", vec![0xff]).await; // invalid
    h.send("w", "system", "ops", "maintenance").await; // public
    h.settle("w").await; // two barriers: two more `invalid`
    let after = Scrape::take(&addr).await;

    let delta =
        |name: &str, labels: &[(&str, &str)]| after.get(name, labels) - before.get(name, labels);
    let m = "loopguard_messages_total";
    assert_eq!(
        delta(m, &[("decision", "approved"), ("kind", "human")]),
        1.0
    );
    assert_eq!(
        delta(m, &[("decision", "approved"), ("kind", "agent")]),
        2.0
    );
    assert_eq!(
        delta(m, &[("decision", "rejected"), ("kind", "agent")]),
        4.0
    );
    assert_eq!(delta(m, &[("decision", "edited"), ("kind", "agent")]), 1.0);
    assert_eq!(
        delta(m, &[("decision", "approved"), ("kind", "system")]),
        1.0
    );
    let s = "loopguard_suppressed_total";
    assert_eq!(delta(s, &[("rule", "turns")]), 2.0);
    assert_eq!(delta(s, &[("rule", "duplicate")]), 1.0);
    assert_eq!(
        delta(s, &[("rule", "invalid")]),
        3.0,
        "one bad payload, two barriers"
    );
    let hb = "loopguard_handoffs_total";
    assert_eq!(delta(hb, &[("reason", "turn_limit")]), 1.0);
    assert_eq!(delta(hb, &[("reason", "pass")]), 1.0);
    let d = "loopguard_deliveries_total";
    // public: hank, notice, pass, ops; private: 2 (broadcast) + 1 + 1
    assert_eq!(delta(d, &[("visibility", "public")]), 4.0);
    assert_eq!(delta(d, &[("visibility", "private")]), 4.0);
    // every decided message is timed (9 + 2 barriers)
    assert_eq!(
        delta("loopguard_decision_duration_seconds_count", &[]),
        11.0
    );
    // Every drop reason is exported from zero, so that `rate()` (the
    // LoopguardDroppingMessages alert) sees the first burst of drops.
    assert_eq!(
        after.all("loopguard_dropped_total").len(),
        4,
        "slow_consumer, server_slow_consumer, client_error, publish_error"
    );
    assert!(after.get("loopguard_worlds", &[]) >= 1.0);
    assert_eq!(after.get("loopguard_nats_connected", &[]), 1.0);
    assert_eq!(after.get("loopguard_ready", &[]), 1.0);
    assert!(
        after.get("process_resident_memory_bytes", &[]) > 0.0,
        "process collector"
    );
    // The capacity alert and the dashboard's CPU panel read this one (whole
    // seconds, so a short test may still read 0).
    assert_eq!(
        after.all("process_cpu_seconds_total").len(),
        1,
        "process collector"
    );
}

#[tokio::test]
async fn observe_mode_counts_would_suppress_not_suppressed() {
    let mut h = Harness::start("mode = \"observe\"\n[rules.turns]\nmax = 1\n").await;
    let addr = h.loopguard.http_addr().await;
    let before = Scrape::take(&addr).await;
    h.send_json("w", "agent", "alice", msg("one")).await;
    h.send_json("w", "agent", "bob", msg("two")).await;
    h.settle("w").await;
    let after = Scrape::take(&addr).await;
    let delta =
        |name: &str, labels: &[(&str, &str)]| after.get(name, labels) - before.get(name, labels);
    assert_eq!(
        delta("loopguard_would_suppress_total", &[("rule", "turns")]),
        1.0
    );
    assert_eq!(
        delta("loopguard_suppressed_total", &[("rule", "turns")]),
        0.0
    );
    assert_eq!(
        delta(
            "loopguard_messages_total",
            &[("decision", "approved"), ("kind", "agent")]
        ),
        2.0
    );
    assert_eq!(
        delta("loopguard_handoffs_total", &[("reason", "turn_limit")]),
        0.0
    );
}

#[tokio::test]
async fn no_metric_label_carries_a_world_agent_or_message_value() {
    let mut h = Harness::start("").await;
    let addr = h.loopguard.http_addr().await;
    h.send_json(
        "secretworld",
        "agent",
        "secretagent",
        json!({"content": "secretcontent", "id": "secretid"}),
    )
    .await;
    h.settle("secretworld").await;
    let (status, body) = http(&addr, "GET", "/metrics", &[]).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("loopguard_messages_total{"), "{body}");
    for needle in ["secretworld", "secretagent", "secretcontent", "secretid"] {
        assert!(!body.contains(needle), "{needle} leaked into /metrics");
    }
}

#[tokio::test]
async fn promtool_accepts_a_real_scrape() {
    let mut h = Harness::start("").await;
    let addr = h.loopguard.http_addr().await;
    h.send_json("w", "human", "hank", msg("hi")).await;
    h.settle("w").await;
    let (status, body) = http(&addr, "GET", "/metrics", &[]).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("loopguard_messages_total{"), "{body}");
    let promtool = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let mut child = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{promtool} not runnable ({e}): `make test` installs it"));
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn health_readiness_and_unknown_routes() {
    let h = Harness::start("").await;
    let addr = h.loopguard.http_addr().await;
    assert_eq!(http(&addr, "GET", "/healthz", &[]).await.0, 200);
    assert_eq!(http(&addr, "GET", "/readyz", &[]).await.0, 200);
    assert_eq!(http(&addr, "GET", "/nope", &[]).await.0, 404);
    assert_eq!(http(&addr, "GET", "/v1/worlds", &[]).await.0, 404);
    // A 405 names the methods the route takes (RFC 9110 §15.5.6).
    let allowed = |head: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix("allow: "))
            .map(str::to_string)
    };
    let (status, head, _) = http_with_head(&addr, "DELETE", "/metrics", &[]).await;
    assert_eq!(
        (status, allowed(&head).as_deref()),
        (405, Some("GET, HEAD"))
    );
    let (status, head, _) = http_with_head(&addr, "GET", "/v1/worlds/w/reset", &[]).await;
    assert_eq!((status, allowed(&head).as_deref()), (405, Some("POST")));
    // HEAD answers as GET does, without the body.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, head, body) = http_with_head(&addr, "HEAD", path, &[]).await;
        assert_eq!((status, body.as_str()), (200, ""), "HEAD {path}: {head}");
        assert!(
            head.contains("content-type: text/plain"),
            "HEAD {path}: {head}"
        );
    }
    assert_eq!(
        http(&addr, "POST", "/healthz", &[("Content-Length", "999999")])
            .await
            .0,
        413
    );
}

/// Clients that hold every HTTP connection, sending their request heads a
/// byte at a time, do not keep the probes out: a new connection displaces
/// the oldest one. Before, probes waited for a slot until a holder's head
/// timed out (10 s), and holders reconnecting could keep them out for good,
/// so the kubelet would restart the pod. The bound below is half that
/// timeout: the probe must be answered before any holder times out.
#[tokio::test]
async fn connections_holding_every_slot_do_not_keep_the_probes_out() {
    use tokio::io::AsyncReadExt;
    const HOLDERS: usize = 300; // MAX_CONNECTIONS is 256
    let h = Harness::start("").await;
    let addr = h.loopguard.http_addr().await;
    let mut holders = Vec::with_capacity(HOLDERS);
    for _ in 0..HOLDERS {
        holders.push(connected_with(&addr, b"GET /healthz HTTP/1.1\r\nHo").await);
    }
    let answered = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        http(&addr, "GET", "/healthz", &[]),
    )
    .await
    .expect("/healthz answered while every slot was held");
    assert_eq!(answered.0, 200);
    // The oldest holders were closed to make room; the newest still wait.
    let mut first = [0u8; 1];
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        holders[0].read(&mut first),
    )
    .await
    .expect("the oldest holder was closed");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed, not answered: {read:?}"
    );
    let newest = holders.last_mut().expect("holders");
    assert!(
        tokio::time::timeout(
            std::time::Duration::from_millis(200),
            newest.read(&mut first)
        )
        .await
        .is_err(),
        "the newest holder is still served"
    );
}

/// Clients that send a request and hang up at once do not make loopguard
/// hold a thread each. A request is answered on tokio's blocking pool, and
/// a handler whose client has gone still runs to its end: until 2026-11-23
/// nothing bounded how many ran, so such clients (here each request held up
/// until the test lets it go, as a scrape of many worlds is held up for a
/// tenth of a second, by a debug-only fault) grew the pool towards its 512
/// threads, and the probes, answered there too, queued behind them. Now at
/// most `HANDLERS` run at once (a request still waiting for its turn when
/// its client goes is never started), and the probes are answered at once,
/// ahead of requests waiting for their turn.
#[cfg(debug_assertions)]
#[tokio::test]
async fn requests_whose_clients_hang_up_do_not_pile_up_threads() {
    const CLIENTS: usize = 200;
    let nats = NatsServer::start();
    let gate = tempfile::tempdir().unwrap();
    let release = gate.path().join("release");
    let lg = support::Loopguard::spawn_env(
        &nats.url(),
        "",
        &[("LOOPGUARD_TEST_HOLD_HANDLERS", release.as_os_str())],
    );
    let addr = lg.http_addr().await;
    // Ready: connected, so the server's name was looked up (on the pool).
    support::until_readyz(&addr, 200).await;
    let threads = || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", lg.pid()))
            .expect("the process's status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|n| n.trim().parse::<usize>().ok())
            .expect("a thread count")
    };
    let before = threads();
    let hang_ups = (0..CLIENTS).map(|_| {
        let addr = addr.clone();
        tokio::spawn(async move {
            let hung_up = connected_with(&addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
            // Long enough for loopguard to read many requests and start on
            // them (those it read, the old code all started).
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            drop(hung_up);
        })
    });
    for client in futures::future::join_all(hang_ups).await {
        client.expect("a client");
    }
    // Every handler is taken, held up until the gate opens.
    const HELD: &str = "test fault: handler held";
    lg.until_logged(HELD, loopguard::admin::HANDLERS).await;
    assert_eq!(http(&addr, "GET", "/healthz", &[]).await.0, 200);
    let (after, started) = (threads(), lg.logs().matches(HELD).count());
    assert_eq!(
        started,
        loopguard::admin::HANDLERS,
        "handlers started for clients that hung up"
    );
    // (Two spare, for other work of the pool meanwhile.)
    assert!(
        after <= before + loopguard::admin::HANDLERS + 2,
        "{before} threads before {CLIENTS} requests hung up, {after} after"
    );

    // Every handler busy, and more requests waiting for their turn: the
    // probes, however their path is written, are answered before any of
    // them (queued with the rest, they would wait for the gate).
    let busy: Vec<_> = (0..=loopguard::admin::HANDLERS)
        .map(|_| {
            let addr = addr.clone();
            tokio::spawn(async move { http(&addr, "GET", "/metrics", &[]).await.0 })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    for probe in ["/healthz", "//readyz"] {
        assert_eq!(http(&addr, "GET", probe, &[]).await.0, 200, "{probe}");
    }
    assert!(
        busy.iter().all(|r| !r.is_finished()),
        "a scrape was answered before the gate opened"
    );
    // Each scrape is answered, in its turn, once the gate opens.
    std::fs::write(&release, "").unwrap();
    for status in futures::future::join_all(busy).await {
        assert_eq!(status.expect("a scrape"), 200);
    }
}

/// A client that never reads its replies does not hold its connection, and
/// the replies' memory, for good: once it has written none of its replies
/// for `WRITE_TIMEOUT`, loopguard closes the connection (here after a second, by a debug-only setting). Before, it
/// stayed open until a newer connection displaced it, which only happens
/// when every slot is taken. Pipelined probes, none read, fill the
/// client's small receive window and loopguard's send buffer; loopguard
/// then reads no more requests, so the client's writes stall too, until
/// the connection is closed and they fail.
#[cfg(debug_assertions)]
#[tokio::test]
async fn a_client_that_never_reads_its_replies_is_closed_after_the_write_timeout() {
    use tokio::io::AsyncWriteExt;
    let nats = NatsServer::start();
    let lg = support::Loopguard::spawn_env(
        &nats.url(),
        "",
        &[("LOOPGUARD_TEST_HTTP_WRITE_TIMEOUT_MS", "1000")],
    );
    let addr = lg.http_addr().await;
    support::until_readyz(&addr, 200).await;
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .set_recv_buffer_size(4096)
        .expect("a small receive buffer");
    let mut client = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        socket.connect(addr.parse().expect("an address")),
    )
    .await
    .expect("connected within 5 s")
    .expect("connect");
    let requests = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".repeat(1000);
    let started = std::time::Instant::now();
    let failed = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            if let Err(e) = client.write_all(&requests).await {
                return e;
            }
        }
    })
    .await
    .expect("loopguard closed the connection within 30 s");
    assert!(
        matches!(
            failed.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "closed by loopguard: {failed}"
    );
    // Not before the client had stalled for the timeout (a second).
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    // Others are still served.
    assert_eq!(http(&addr, "GET", "/healthz", &[]).await.0, 200);
}

#[tokio::test]
async fn readyz_is_503_while_nats_is_down_and_200_after_it_returns_on_the_same_port() {
    let mut h = Harness::start("").await;
    let addr = h.loopguard.http_addr().await;
    assert_eq!(http(&addr, "GET", "/readyz", &[]).await.0, 200);
    let before = Scrape::take(&addr).await;

    let port = h.nats.port;
    h.nats.stop();
    support::until_readyz(&addr, 503).await;
    let body = http(&addr, "GET", "/readyz", &[]).await.1;
    assert_eq!(
        body.trim(),
        "not ready: not connected to NATS: reconnecting"
    );
    assert_eq!(
        Scrape::take(&addr)
            .await
            .get("loopguard_nats_connected", &[]),
        0.0
    );
    assert_eq!(
        http(&addr, "GET", "/healthz", &[]).await.0,
        200,
        "still alive"
    );
    // A connection attempt failed: logged, but no message was lost by it.
    h.loopguard.until_logged("NATS client error", 1).await;

    let _nats = NatsServer::start_on(port);
    h.loopguard.until_logged("reconnected to NATS", 1).await;
    // routing resumes once both loopguard and the test client are back
    support::within("test client reconnect", async {
        while h.client.connection_state() != async_nats::connection::State::Connected {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    h.send_json("w", "human", "hank", msg("back again")).await;
    let out = h.settle("w").await;
    assert_eq!(out.public("w").len(), 1, "routing resumed after the outage");
    // The reconnect itself started the round trip that confirms the
    // subscriptions on the new connection (long since back: the settle
    // took several), so the first probe is already 200; a probe that had
    // to start the round trip would answer 503.
    assert_eq!(http(&addr, "GET", "/readyz", &[]).await.0, 200);
    let after = Scrape::take(&addr).await;
    assert_eq!(after.get("loopguard_nats_connected", &[]), 1.0);
    assert_eq!(
        after.get("loopguard_nats_reconnects_total", &[])
            - before.get("loopguard_nats_reconnects_total", &[]),
        1.0
    );
    let dropped = |s: &Scrape| s.get("loopguard_dropped_total", &[("reason", "client_error")]);
    assert_eq!(dropped(&after), dropped(&before), "an outage is not a drop");
    assert!(h.loopguard.is_running());
}

/// A server that stops answering but leaves the connection open (a power
/// loss, a partition, a firewall dropping the flow without a reset) is
/// found out by the client's pings: three `nats.ping_interval_seconds`
/// after its last word (two pings unanswered), `/readyz` answers
/// 503 and `loopguard_nats_connected` is 0. With the client's default
/// interval (60 s) that took three minutes, past this test's bound.
#[tokio::test]
async fn readyz_is_503_once_a_silent_server_leaves_its_pings_unanswered() {
    let h = Harness::start("[nats]\nping_interval_seconds = 1\n").await;
    let addr = h.loopguard.http_addr().await;
    assert_eq!(http(&addr, "GET", "/readyz", &[]).await.0, 200);

    h.nats.freeze();
    support::until_readyz(&addr, 503).await;
    let silent = Scrape::take(&addr).await;
    assert_eq!(silent.get("loopguard_nats_connected", &[]), 0.0);

    h.nats.thaw();
    support::until_readyz(&addr, 200).await;
    let back = Scrape::take(&addr).await;
    assert_eq!(back.get("loopguard_nats_connected", &[]), 1.0);
    assert!(back.get("loopguard_nats_reconnects_total", &[]) >= 1.0);
}

/// The client counts a new connection, and says it is connected, before it
/// has sent its subscriptions again: ready only once a round trip on that
/// connection confirms the server holds them (a message published after a
/// 200 then comes in). The count is moved by hand here, as a reconnect
/// moves it, so the window the check closes is open for certain.
#[tokio::test]
async fn readiness_waits_for_a_round_trip_on_each_new_connection() {
    use std::sync::atomic::Ordering;
    let nats = NatsServer::start();
    let client = support::within("client", async_nats::connect(nats.url()))
        .await
        .unwrap();
    let readiness = loopguard::admin::Readiness::default();
    // Subscribed, with a round trip on this connection.
    let connects = loopguard::admin::connects(&client);
    support::within("flush", client.flush()).await.unwrap();
    readiness.subscribed(client.clone(), Some(connects));
    assert!(readiness.is_ready());
    client.statistics().connects.fetch_add(1, Ordering::SeqCst);
    assert!(
        !readiness.is_ready(),
        "ready on a new connection before a round trip on it"
    );
    support::within("ready after a round trip", async {
        while !readiness.is_ready() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// From the signal on, `/readyz` answers 503 and says loopguard is
/// draining (a load balancer stops sending), while the drain still waits
/// for a policy answer.
#[tokio::test]
async fn readyz_says_draining_from_the_signal_on() {
    use futures::StreamExt;
    let nats = NatsServer::start();
    let client = support::within("connect", async_nats::connect(nats.url()))
        .await
        .unwrap();
    let mut asked = client.subscribe("policy.check").await.unwrap();
    support::within("subscribed", client.flush()).await.unwrap();
    let lg = support::Loopguard::spawn(
        &nats.url(),
        "[shutdown]\ngrace_seconds = 120\n[rules.policy]\nsubject = \"policy.check\"\ntimeout_ms = 10000\n",
    );
    lg.until_ready().await;
    let addr = lg.http_addr().await;
    client
        .publish("chat.raw.w.agent.a", "hello".into())
        .await
        .unwrap();
    support::within("the policy question", asked.next()).await;
    lg.signal("TERM");
    lg.until_logged("shutdown: signal received", 1).await;
    let (status, body) = http(&addr, "GET", "/readyz", &[]).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body.trim(),
        "not ready: draining: loopguard is shutting down"
    );
}

#[tokio::test]
async fn readyz_is_503_before_nats_is_reachable() {
    let (_held, port) = support::reserve_port();
    let lg = support::Loopguard::spawn(&format!("nats://127.0.0.1:{port}"), "");
    let addr = lg.http_addr().await;
    // It has tried NATS and failed, not merely not tried yet.
    lg.until_logged("NATS client error", 1).await;
    assert_eq!(http(&addr, "GET", "/healthz", &[]).await.0, 200);
    // The body says which reason holds, of all that could.
    let (status, body) = http(&addr, "GET", "/readyz", &[]).await;
    assert_eq!(status, 503);
    assert_eq!(body.trim(), "not ready: not subscribed yet: NATS not reached, or the JetStream stream and consumer still being set up");
}

#[tokio::test]
async fn admin_api_is_forbidden_without_a_configured_token() {
    let h = Harness::start("").await;
    let addr = h.loopguard.http_addr().await;
    let auth = format!("Bearer {TOKEN}");
    assert_eq!(
        http(
            &addr,
            "POST",
            "/v1/worlds/w/reset",
            &[("Authorization", &auth)]
        )
        .await
        .0,
        403
    );
}

#[tokio::test]
async fn world_view_and_reset_with_their_status_codes() {
    let mut h = Harness::start(&format!(
        "[http]\nadmin_token = \"{TOKEN}\"\n[rules.turns]\nmax = 1\n[worlds.w]\nagents = [\"alice\"]\n[worlds.quiet]\nagents = [\"carol\"]\n"
    ))
    .await;
    let addr = h.loopguard.http_addr().await;
    h.join("w", "bob").await;
    h.send_json("w", "agent", "alice", msg("one")).await;
    h.send_json("w", "agent", "bob", msg("two")).await;
    h.settle("w").await;

    let (status, body) = http(&addr, "GET", "/v1/worlds/w", &[]).await;
    assert_eq!(status, 200, "{body}");
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(view["turns"], 1);
    assert_eq!(view["paused"], true);
    assert_eq!(view["roster"], json!(["alice", "bob"]));
    assert_eq!(view["agents"]["alice"]["approved_in_rate_window"], 1);
    assert_eq!(view["agents"]["alice"]["pinned"], true);
    assert_eq!(
        view["agents"]["bob"]["last_approved_seconds_ago"],
        json!(null)
    );

    assert_eq!(http(&addr, "GET", "/v1/worlds/unknown", &[]).await.0, 404);
    // A world the config lists answers before its first message, as it
    // would start: its listed agents, nothing counted.
    let (status, body) = http(&addr, "GET", "/v1/worlds/quiet", &[]).await;
    assert_eq!(status, 200, "{body}");
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (
            &view["world"],
            &view["turns"],
            &view["paused"],
            &view["roster"]
        ),
        (&json!("quiet"), &json!(0), &json!(false), &json!(["carol"]))
    );
    assert_eq!(view["agents"]["carol"]["pinned"], true);
    assert_eq!(
        view["agents"]["carol"]["last_approved_seconds_ago"],
        json!(null)
    );
    assert_eq!(http(&addr, "GET", "/v1/worlds/b%C3%B8d", &[]).await.0, 400);

    let path = "/v1/worlds/w/reset";
    assert_eq!(http(&addr, "POST", path, &[]).await.0, 401, "missing token");
    assert_eq!(
        http(&addr, "POST", path, &[("Authorization", "Bearer wrong")])
            .await
            .0,
        401
    );
    assert_eq!(
        http(&addr, "POST", path, &[("Authorization", TOKEN)])
            .await
            .0,
        401,
        "not a bearer"
    );
    let auth = format!("Bearer {TOKEN}");
    assert_eq!(
        http(&addr, "POST", path, &[("Authorization", &auth)])
            .await
            .0,
        204
    );
    // The scheme's name in any case, and one or more spaces after it
    // (RFC 9110, 11.4); none is no bearer token.
    for (header, status) in [
        (format!("bearer {TOKEN}"), 204),
        (format!("Bearer   {TOKEN}"), 204),
        (format!("Bearer{TOKEN}"), 401),
    ] {
        let got = http(&addr, "POST", path, &[("Authorization", &header)]).await;
        assert_eq!(got.0, status, "{header}");
    }

    let (_, body) = http(&addr, "GET", "/v1/worlds/w", &[]).await;
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (view["turns"].clone(), view["paused"].clone()),
        (json!(0), json!(false))
    );
    assert_eq!(view["roster"], json!(["alice", "bob"]), "the roster stays");
    assert_eq!(
        view["agents"]["alice"]["approved_in_rate_window"], 0,
        "rate window cleared"
    );

    // the world is open again, and "one" is no longer a duplicate
    h.send_json("w", "agent", "alice", msg("one")).await;
    let out = h.settle("w").await;
    assert_eq!(out.event("w").body["decision"], "approved");
    assert!(
        !h.loopguard.logs().contains(TOKEN),
        "the admin token is never logged"
    );
}

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let mut h = Harness::start("[log]\nformat = \"json\"\nlevel = \"debug\"\n").await;
    h.send("w", "agent", "alice", vec![0xff]).await;
    h.settle("w").await;
    let logs = h.loopguard.logs();
    let rejection = logs
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .find(|v| v["fields"]["message"] == "message rejected" && v["fields"]["world"] == "w")
        .expect("a rejection line");
    assert_eq!(rejection["level"], "DEBUG");
    assert_eq!(rejection["fields"]["rule"], "invalid");
    assert_eq!(rejection["fields"]["sender"], "alice");
}

/// Ids, reasons and senders that are no name are a client's text: in text
/// logs they are quoted, and a newline in one must not start a line of its
/// own.
#[tokio::test]
async fn client_text_cannot_forge_a_log_line() {
    let mut h = Harness::start("[log]\nlevel = \"debug\"\n").await;
    let forged = "m1 rule=none\n2026-11-22T00:00:00.000000Z  INFO loopguard: FORGED world reset";
    for _ in 0..2 {
        // The second is a duplicate: rejected, and logged with its id.
        h.send_json(
            "w",
            "agent",
            "alice",
            json!({"content": "same", "id": forged}),
        )
        .await;
    }
    let out = h.settle("w").await;
    assert_eq!(out.field("w", "rule"), [json!(null), json!("duplicate")]);
    h.loopguard.until_logged("message rejected", 1).await;
    let logs = h.loopguard.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("message rejected") && l.contains("duplicate"))
        .expect("the rejection's line");
    assert!(
        line.contains(r#"id="m1 rule=none\n2026-11-22T00:00:00"#),
        "the id is on the rejection's line, quoted and escaped: {line}"
    );
    assert!(
        !logs.lines().any(|l| l.starts_with("2026-11-22T00:00:00")),
        "no line of the client's making"
    );

    // A sender token that is no name (a no-break space here, which the
    // server passes on) is quoted too: it cannot pass for a field of its own.
    let subject = "chat.raw.w.agent.x\u{a0}rule=pass";
    let op = format!("PUB {subject} 2\r\nhi\r\n");
    support::publish_raw(&h.nats.url(), op.as_bytes()).await;
    h.loopguard.until_logged(r#"world="w" sender="x"#, 1).await;
    let logs = h.loopguard.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("message rejected") && l.contains(r#"world="w" sender="x"#))
        .expect("the invalid message's line");
    assert!(
        line.contains(r#"sender="x\u{a0}rule=pass""#),
        "the sender is quoted and escaped: {line}"
    );
}

#[tokio::test]
async fn core_mode_slow_consumer_drops_are_counted_and_logged() {
    // A one-message subscription buffer and a flood far beyond what the
    // workers' queues absorb: NATS must drop, and loopguard must say so.
    let mut h = Harness::start(
        "[nats]\nsubscription_capacity = 1\n[rules.turns]\nmax = 0\n[rules.depth]\nmax = 0\n[rules.rate]\nmax = 0\n",
    )
    .await;
    let addr = h.loopguard.http_addr().await;
    // Drops before the flood: the start-up's readiness probes, of which a
    // late one can still be dropped during it too (at most one per 200 ms
    // of start-up).
    let before = Scrape::take(&addr)
        .await
        .get("loopguard_dropped_total", &[("reason", "slow_consumer")]);
    let flooded = std::time::Instant::now();
    for i in 0..60_000 {
        h.send("flood", "agent", "a", format!("m{i}")).await;
    }
    support::within("flush", h.client.flush()).await.unwrap();
    let slow_consumer = || async {
        Scrape::take(&addr)
            .await
            .get("loopguard_dropped_total", &[("reason", "slow_consumer")])
    };
    support::within("drops to be counted", async {
        while slow_consumer().await == 0.0 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    // Counted, then logged.
    h.loopguard.until_logged("messages dropped", 1).await;
    let dropped = slow_consumer().await;
    assert!(dropped >= 2.0, "a flood, not one drop: {dropped}");
    // Every message of the flood is decided or counted as dropped: none
    // is lost uncounted (the client's event queue, of 128, overflowed
    // under such a flood, and its drop events with it).
    let accounted = || async {
        let scrape = Scrape::take(&addr).await;
        let decided: f64 = scrape
            .all("loopguard_messages_total")
            .iter()
            .filter(|(labels, _)| labels["kind"] == "agent")
            .map(|(_, n)| n)
            .sum();
        let dropped = scrape.get("loopguard_dropped_total", &[("reason", "slow_consumer")]);
        (decided, dropped)
    };
    // Waits while the count grows, then judges it (a shortfall waits out
    // the minute, and says how far short it fell).
    let deadline = tokio::time::Instant::now() + support::TIMEOUT;
    let (mut decided, mut dropped) = accounted().await;
    while decided + dropped - before < 60_000.0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        (decided, dropped) = accounted().await;
    }
    let accounted = decided + dropped - before;
    assert!(
        (60_000.0..=60_010.0).contains(&accounted),
        "decided {decided} + dropped {dropped} - {before} before = {accounted}, not the 60,000 sent"
    );
    // Nothing lost outside the client's count: the connection held.
    let scrape = Scrape::take(&addr).await;
    assert_eq!(scrape.get("loopguard_nats_reconnects_total", &[]), 0.0);
    // One line at the first drop, then at most one every ten seconds.
    let lines = h
        .loopguard
        .logs()
        .lines()
        .filter(|l| l.contains("messages dropped"))
        .count() as u64;
    let most = flooded.elapsed().as_secs() / 10 + 1;
    assert!(
        lines <= most,
        "the log is rate-limited: {lines} lines for {dropped} drops, in at most {most} periods"
    );
    // Still alive and ready. (Not a settle: with a one-message buffer the
    // barriers themselves may be dropped, which is the point.)
    assert!(h.loopguard.is_running());
    assert_eq!(http(&addr, "GET", "/healthz", &[]).await.0, 200);
    assert_eq!(http(&addr, "GET", "/readyz", &[]).await.0, 200);
}

#[tokio::test]
async fn an_agents_context_is_its_inbox_and_its_own_messages_oldest_first() {
    let mut h = Harness::start(
        &format!("[http]\nadmin_token = \"{TOKEN}\"\n[state]\ncontext_messages = 10\n[rules.depth]\nmax = 0\n[worlds.w]\nagents = [\"alice\", \"bob\", \"carol\"]\n"),
    )
    .await;
    let addr = h.loopguard.http_addr().await;
    for (kind, who, content, id) in [
        ("human", "hank", "hello all", "h1"), // broadcast: every inbox
        ("agent", "alice", "@bob your view?", "a1"), // bob's inbox; alice's own
        ("agent", "carol", "@alice not for bob", "c1"), // alice's inbox
        ("agent", "bob", "I think it works", "b1"), // public; bob's own
        ("system", "ops", "maintenance at noon", "s1"), // public only: nobody's context
    ] {
        h.send_json("w", kind, who, json!({"content": content, "id": id}))
            .await;
    }
    h.settle("w").await;

    let ids = |body: &str| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    };
    let auth = format!("Bearer {TOKEN}");
    let with_token = [("Authorization", auth.as_str())];
    assert_eq!(
        http(&addr, "GET", "/v1/worlds/w/agents/bob/context", &[])
            .await
            .0,
        401,
        "an inbox is private"
    );
    let (status, body) = http(&addr, "GET", "/v1/worlds/w/agents/bob/context", &with_token).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids(&body), ["h1", "a1", "b1"]);
    let (_, body) = http(
        &addr,
        "GET",
        "/v1/worlds/w/agents/bob/context?limit=2",
        &with_token,
    )
    .await;
    assert_eq!(ids(&body), ["a1", "b1"], "the latest two, oldest first");
    let (_, body) = http(
        &addr,
        "GET",
        "/v1/worlds/w/agents/alice/context",
        &with_token,
    )
    .await;
    assert_eq!(ids(&body), ["h1", "a1", "c1"]);
    assert_eq!(
        http(
            &addr,
            "POST",
            "/v1/worlds/w/agents/bob/context",
            &with_token
        )
        .await
        .0,
        405
    );

    assert_eq!(
        http(
            &addr,
            "GET",
            "/v1/worlds/nope/agents/bob/context",
            &with_token
        )
        .await
        .0,
        404
    );
    assert_eq!(
        http(
            &addr,
            "GET",
            "/v1/worlds/w/agents/b%2Ab/context",
            &with_token
        )
        .await
        .0,
        400
    );
    assert_eq!(
        http(
            &addr,
            "GET",
            "/v1/worlds/w/agents/bob/context?limit=0",
            &with_token
        )
        .await
        .0,
        400
    );
}

#[tokio::test]
async fn no_context_is_kept_unless_configured() {
    let mut h = Harness::start(&format!("[http]\nadmin_token = \"{TOKEN}\"\n")).await;
    let addr = h.loopguard.http_addr().await;
    h.send_json("w", "agent", "alice", msg("@bob hi")).await;
    h.settle("w").await;
    let auth = format!("Bearer {TOKEN}");
    let (status, body) = http(
        &addr,
        "GET",
        "/v1/worlds/w/agents/bob/context",
        &[("Authorization", &auth)],
    )
    .await;
    assert_eq!(status, 404);
    assert!(body.contains("state.context_messages"), "{body}");
    // and with no admin token configured, the route is closed
    let h2 = Harness::start("[state]\ncontext_messages = 5\n").await;
    let addr2 = h2.loopguard.http_addr().await;
    assert_eq!(
        http(&addr2, "GET", "/v1/worlds/w/agents/bob/context", &[])
            .await
            .0,
        403
    );
}

/// A connection to `addr` that has sent `bytes` (a request, or part of one).
async fn connected_with(addr: &str, bytes: &[u8]) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    s
}
