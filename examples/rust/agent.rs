//! A naive agent in Rust (async-nats), behind loopguard.
//!
//! It reads its inbox and answers its peer, forever; loopguard stops the
//! loop at the bus. The only loopguard-specific lines are the subjects:
//!
//! ```text
//! publish to   chat.raw.<world>.agent.<name>   (its raw output)
//! read from    chat.private.<world>.<name>     (what it should act on)
//! announce on  chat.join.<world>.<name>        (puts it on the roster)
//! ```
//!
//! (`chat` is loopguard's `nats.prefix`: `--prefix` when it runs with
//! another.) The twin of `../python/agent.py` and `../go/agent.go`:
//!
//! ```text
//! cargo run --example agent -- --world demo --name alice --peer bob
//! ```

use std::time::Duration;

use async_nats::Event;
use clap::Parser;
use futures::StreamExt;
use serde::Deserialize;
use tokio::signal::unix::{signal, SignalKind};

/// loopguard forgets an agent that only listens after `state.idle_seconds`
/// (an hour by default), and all of its roster on a restart: the agent
/// joins again this often (keep it below `state.idle_seconds`), and
/// whenever its connection comes back.
const JOIN_EVERY: Duration = Duration::from_secs(600);

/// How long a drain may take to get what was published to the server.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Parser)]
#[command(about = "A naive agent that answers its peer forever, behind loopguard")]
struct Args {
    /// NATS server URL.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    url: String,
    /// World (conversation) to speak in.
    #[arg(long, default_value = "demo", value_parser = canonical)]
    world: String,
    /// This agent's name.
    #[arg(long, value_parser = canonical)]
    name: String,
    /// The agent to answer.
    #[arg(long, value_parser = canonical)]
    peer: String,
    /// loopguard's nats.prefix.
    #[arg(long, default_value = "chat", value_parser = prefix)]
    prefix: String,
}

/// A world or agent name as loopguard reads it (contract §1): it lowercases
/// the token, which must then be 1-64 of a-z, 0-9, `_` and `-`. Inboxes are
/// named in that form, and NATS subjects are case-sensitive, so an agent
/// started as "Alice" would listen on an inbox loopguard never writes to.
fn canonical(name: &str) -> Result<String, String> {
    let valid = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    match valid {
        true => Ok(name.to_ascii_lowercase()),
        false => Err("a name is 1-64 of a-z, 0-9, '_' and '-'".to_owned()),
    }
}

/// loopguard's `nats.prefix`: one or more dot-separated tokens of the same
/// characters (a `*`, `>` or space would make a wildcard or bad subject).
fn prefix(prefix: &str) -> Result<String, String> {
    let token = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    match prefix.split('.').all(token) {
        true => Ok(prefix.to_owned()),
        false => Err("dot-separated tokens of A-Z, a-z, 0-9, '_' and '-'".to_owned()),
    }
}

/// The first 60 characters of `text` (not bytes), on one line and without
/// the pass tag: quoted as they came, a newline then `@carol` would address
/// the reply to carol too, and a quoted tag would make it a hand-back.
fn quote(text: &str) -> String {
    const PASS: &str = "<world>pass</world>";
    let mut line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    // The tag in any case: ASCII, so a lowercase copy has the same offsets.
    while let Some(at) = line.to_ascii_lowercase().find(PASS) {
        line.replace_range(at..at + PASS.len(), "");
    }
    line.chars().take(60).collect()
}

/// What loopguard delivers (docs/CONTRACT.md §4): `sender`, `sender_kind`,
/// `thread_id`, `depth` and `visibility` too, which this agent does not read.
#[derive(Deserialize)]
struct Message {
    id: String,
    content: String,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let (name, peer) = (&args.name, &args.peer);
    let raw = format!("{}.raw.{}.agent.{name}", args.prefix, args.world);
    let join = format!("{}.join.{}.{name}", args.prefix, args.world);
    let inbox = format!("{}.private.{}.{name}", args.prefix, args.world);

    // Connection events, to the loop below: every connect joins (again after
    // a reconnect: loopguard may have restarted meanwhile, its roster
    // empty), a close ends it.
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let client = async_nats::ConnectOptions::new()
        .name(format!("loopguard-example-{name}"))
        .event_callback(move |event| {
            let events_tx = events_tx.clone();
            async move {
                let _ = events_tx.send(event);
            }
        })
        .connect(&args.url)
        .await
        .unwrap_or_else(|e| fail(name, &format!("cannot connect to {}: {e}", args.url)));
    let mut messages = client
        .subscribe(inbox.clone())
        .await
        .unwrap_or_else(|e| fail(name, &format!("cannot subscribe to {inbox}: {e}")));
    if let Err(e) = client.publish(join.clone(), "".into()).await {
        fail(name, &format!("cannot join: {e}"));
    }
    // The server holds the subscription and has the join once this returns.
    if let Err(e) = client.flush().await {
        fail(name, &e.to_string());
    }
    println!("{name}: listening on {inbox}, publishing to {raw}");

    let mut terminate = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("a SIGINT handler");
    let mut rejoin = tokio::time::interval_at(tokio::time::Instant::now() + JOIN_EVERY, JOIN_EVERY);
    let mut n = 0;
    loop {
        tokio::select! {
            m = messages.next() => {
                // Ended: the connection is gone for good (async-nats
                // reconnects forever unless told otherwise).
                let Some(m) = m else { fail(name, "subscription ended") };
                let message: Message = match serde_json::from_slice(&m.payload) {
                    Ok(message) => message,
                    Err(e) => {
                        eprintln!("{name}: not a loopguard message on {}: {e}", m.subject);
                        continue;
                    }
                };
                n += 1;
                let reply = serde_json::json!({
                    "content": format!("@{peer} {name} replies (#{n}) to: {}", quote(&message.content)),
                    // The message answered: loopguard counts the chain's depth.
                    "parent_id": message.id,
                });
                if let Err(e) = client.publish(raw.clone(), reply.to_string().into()).await {
                    eprintln!("{name}: cannot publish: {e}");
                }
            }
            _ = rejoin.tick() => {
                let _ = client.publish(join.clone(), "".into()).await;
            }
            Some(event) = events.recv() => match event {
                Event::Connected => {
                    let _ = client.publish(join.clone(), "".into()).await;
                }
                // The connection ended for good: an agent that cannot hear.
                Event::Closed => fail(name, "connection closed"),
                _ => {}
            },
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    // Away from the server, there is nothing to drain (and a drain would
    // wait for it to come back): ends now, as the Go agent does.
    if client.connection_state() != async_nats::connection::State::Connected {
        eprintln!("{name}: not connected; nothing to drain");
        return;
    }
    // Drains the connection: what was published reaches the server, what
    // waits in the inbox is dropped. A second signal ends it at once.
    let drained = async {
        client.drain().await.map_err(|e| e.to_string())?;
        while let Some(event) = events.recv().await {
            if matches!(event, Event::Closed) {
                break;
            }
        }
        Ok::<_, String>(())
    };
    tokio::select! {
        ended = tokio::time::timeout(DRAIN_TIMEOUT, drained) => match ended {
            Ok(Ok(())) => {}
            Ok(Err(e)) => fail(name, &e),
            Err(_) => fail(name, "the drain did not finish"),
        },
        _ = terminate.recv() => fail(name, "stopped before the drain finished"),
        _ = interrupt.recv() => fail(name, "stopped before the drain finished"),
    }
}

/// Reports what stopped the agent and exits 1.
fn fail(name: &str, why: &str) -> ! {
    eprintln!("{name}: {why}");
    std::process::exit(1)
}
