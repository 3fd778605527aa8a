//! `make demo`: two scripted agents that would talk forever, and loopguard
//! cutting them off. Needs a nats-server and loopguard on their defaults
//! (the Makefile starts both).
//!
//! Each agent is what a naive agent looks like on any framework: it reads
//! its inbox and answers whoever wrote to it, always. Three scenes:
//! 1. an echo loop where each reply answers the last one: `depth` cuts it;
//! 2. a brainstorm where every reply cites the human's question, so depth
//!    stays low: the `turns` limit cuts it and hands control back to the
//!    human with a notice on the public transcript;
//! 3. an agent that hands back on its own with `<world>pass</world>`.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

/// Where NATS is: `NATS_URL`, else the local default.
fn url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_string())
}

#[derive(Clone, Copy)]
enum Style {
    /// Reply to the message received (a reply chain).
    Chain,
    /// Reply citing the human's question (a flat thread).
    Flat,
    /// Hand control back at once.
    Pass,
}

/// This run's tag, in every message it sends: loopguard keeps its state
/// between runs, and a second run's replies, the same text within the
/// duplicate rule's window, would be stopped by that rule instead.
fn run_tag() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64 % 1_000_000)
}

/// An agent: answers every inbox message by addressing its peer.
async fn agent(
    run: u64,
    world: &'static str,
    me: &'static str,
    peer: &'static str,
    style: Style,
) -> Result<(), async_nats::Error> {
    let client = async_nats::connect(url()).await?;
    let mut inbox = client
        .subscribe(format!("chat.private.{world}.{me}"))
        .await?;
    client.flush().await?;
    let mut n = 0;
    while let Some(m) = inbox.next().await {
        let Ok(msg) = serde_json::from_slice::<Value>(&m.payload) else {
            continue;
        };
        n += 1;
        let (content, parent) = match style {
            Style::Chain => (
                format!("@{peer} good point; {me} adds take #{n} (run {run})"),
                msg["id"].clone(),
            ),
            // Every reply answers the question, so the chain stays one
            // deep: the question's id is the thread's, as it names no
            // thread (a message naming one would be answered by its id).
            Style::Flat => (
                format!("@{peer} building on that: idea #{n} from {me} (run {run})"),
                msg["thread_id"].clone(),
            ),
            Style::Pass => (
                "I have nothing to add. <world>pass</world>".to_string(),
                msg["id"].clone(),
            ),
        };
        tokio::time::sleep(Duration::from_millis(40)).await;
        let reply = json!({ "content": content, "parent_id": parent });
        client
            .publish(
                format!("chat.raw.{world}.agent.{me}"),
                reply.to_string().into(),
            )
            .await?;
    }
    Ok(())
}

/// Prints the world's events until a rejection (or an edit) ends the scene.
async fn watch(
    run: u64,
    client: &async_nats::Client,
    world: &str,
    question: &str,
    ends_on: &str,
) -> Result<(), async_nats::Error> {
    let mut events = client.subscribe(format!("chat.events.{world}")).await?;
    let mut public = client.subscribe(format!("chat.public.{world}")).await?;
    client.flush().await?;
    let question = json!({ "content": question, "id": format!("{world}-q-{run}") });
    client
        .publish(
            format!("chat.raw.{world}.human.hank"),
            question.to_string().into(),
        )
        .await?;
    let deadline = tokio::time::sleep(Duration::from_secs(20));
    tokio::pin!(deadline);
    let mut done = false;
    loop {
        tokio::select! {
            Some(e) = events.next() => {
                let e: Value = serde_json::from_slice(&e.payload)?;
                let decision = e["decision"].as_str().unwrap_or("?");
                let to = e["delivered_to"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(","));
                match decision {
                    "approved" => println!(
                        "  ok    {:<6} depth {:>2} turn {:>2} -> {}",
                        e["sender"].as_str().unwrap_or(""), e["depth"], e["turn"], to.unwrap_or_default()
                    ),
                    _ => println!(
                        "  {:<5} {:<6} rule {}: {}",
                        if decision == "rejected" { "STOP" } else { "EDIT" },
                        e["sender"].as_str().unwrap_or(""), e["rule"].as_str().unwrap_or(""), e["reason"].as_str().unwrap_or("")
                    ),
                }
                if e["rule"] == ends_on {
                    done = true;
                    deadline.as_mut().reset(tokio::time::Instant::now() + Duration::from_millis(300));
                }
            }
            Some(p) = public.next() => {
                let p: Value = serde_json::from_slice(&p.payload)?;
                if p["sender"] == "loopguard" || ends_on == "pass" {
                    println!("  >>> public transcript, from {}: {}", p["sender"].as_str().unwrap_or(""), p["content"].as_str().unwrap_or(""));
                }
            }
            _ = &mut deadline => break,
        }
    }
    if !done {
        return Err(format!(
            "no `{ends_on}` decision in {world}: is loopguard running on its defaults? \
             (A loopguard that played the demo in the last minute still holds its \
             worlds: give the demo LOOPGUARD__HTTP__ADMIN_TOKEN to reset them.)"
        )
        .into());
    }
    Ok(())
}

/// Where loopguard's HTTP server is: its own setting
/// (`LOOPGUARD__HTTP__LISTEN`), else its default.
fn http_addr() -> String {
    std::env::var("LOOPGUARD__HTTP__LISTEN").unwrap_or_else(|_| "127.0.0.1:9464".to_string())
}

/// Waits (20 s at most) until loopguard's `/readyz` says 200: it is then
/// connected to NATS and subscribed, so nothing the demo sends is missed.
async fn until_ready() -> Result<(), async_nats::Error> {
    let addr = http_addr();
    let waited = tokio::time::timeout(Duration::from_secs(20), async {
        while !ready(&addr).await {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    waited
        .await
        .map_err(|_| format!("loopguard is not ready at http://{addr}/readyz"))?;
    Ok(())
}

/// One `GET /readyz`: true on a 200.
async fn ready(addr: &str) -> bool {
    status(addr, "GET /readyz HTTP/1.0\r\nHost: loopguard\r\n\r\n").await == Some(200)
}

/// Sends one HTTP request to loopguard; the status it answers.
async fn status(addr: &str, request: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut line = [0u8; 12]; // "HTTP/1.1 200"
    stream.read_exact(&mut line).await.ok()?;
    std::str::from_utf8(&line[9..]).ok()?.parse().ok()
}

/// With loopguard's admin token (`LOOPGUARD__HTTP__ADMIN_TOKEN`, as compose
/// gives both), clears the demo's worlds first: a loopguard that played the
/// demo before still holds their state, and within a minute of that run the
/// agents' rate windows, not the scenes' rules, would stop them.
async fn reset_worlds(worlds: &[&str]) -> Result<(), async_nats::Error> {
    let Ok(token) = std::env::var("LOOPGUARD__HTTP__ADMIN_TOKEN") else {
        return Ok(());
    };
    let addr = http_addr();
    for world in worlds {
        let request = format!(
            "POST /v1/worlds/{world}/reset HTTP/1.0\r\nHost: loopguard\r\n\
             Authorization: Bearer {token}\r\nContent-Length: 0\r\n\r\n"
        );
        let answer = status(&addr, &request).await;
        if answer != Some(204) {
            return Err(format!("resetting world {world} at http://{addr}: {answer:?}").into());
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), async_nats::Error> {
    until_ready().await?;
    let client = tokio::time::timeout(Duration::from_secs(5), async_nats::connect(url()))
        .await
        .map_err(|_| format!("no nats-server at {}", url()))??;
    let run = run_tag();
    reset_worlds(&["echo", "brainstorm", "handback"]).await?;
    for (world, me, peer, style) in [
        ("echo", "alice", "bob", Style::Chain),
        ("echo", "bob", "alice", Style::Chain),
        ("brainstorm", "alice", "bob", Style::Flat),
        ("brainstorm", "bob", "alice", Style::Flat),
        ("handback", "carol", "hank", Style::Pass),
    ] {
        tokio::spawn(async move {
            if let Err(e) = agent(run, world, me, peer, style).await {
                eprintln!("agent {me} in {world} stopped: {e}");
            }
        });
        // Agents announce themselves so they are on the roster.
        client
            .publish(format!("chat.join.{world}.{me}"), "".into())
            .await?;
    }
    client.flush().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    println!("\n== 1. Echo loop: every reply answers the previous one (world `echo`)");
    watch(
        run,
        &client,
        "echo",
        "@alice what do you think of the plan? Discuss it with bob.",
        "depth",
    )
    .await?;
    println!("\n== 2. Brainstorm: every reply cites the question, so depth stays at 1 (world `brainstorm`)");
    watch(
        run,
        &client,
        "brainstorm",
        "@alice brainstorm names for the product with bob",
        "turns",
    )
    .await?;
    println!("\n== 3. An agent hands control back itself (world `handback`)");
    watch(run, &client, "handback", "@carol anything to add?", "pass").await?;
    println!("\nAll three loops ended by loopguard; the agents were never changed.");
    Ok(())
}
