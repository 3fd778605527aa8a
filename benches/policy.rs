//! `cargo bench --bench policy`: what the policy hook (`rules.policy`) costs
//! the worlds it does not concern, beside loopguard without it, in one run.
//!
//! Set-ups, each a fresh loopguard on one nats-server on loopback:
//! - (p0) the hook off: the baseline;
//! - (p1) the hook on, a service that answers at once: the round trip alone;
//! - (p2) the hook on, a service that answers each request 20 ms after it
//!   came (requests answered concurrently, as a real classifier would).
//!
//! Workload: 400 worlds, each a human's message then one message from each
//! of four agents (nothing mentioned: every message public), sent in rounds
//! (every world's first message, then every world's second...) as fast as
//! the producer can, three times over with a pause between (past the
//! cooldown). The agent messages are the ones the hook is asked about.
//!
//! For each: the agent messages delivered a second (from the first publish
//! of a burst to the last delivery), and the latency of agent messages from
//! publish to delivery, p50, p99 and max. With the service's 20 ms, a world's
//! four agent messages can take no less than 80 ms end to end (each waits
//! for the answer to the one before, in order); a world's wait should not
//! add to other worlds'.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

#[path = "shared/nats.rs"]
#[allow(dead_code)] // the monitoring endpoint is for the relay benchmark
mod nats;
#[path = "shared/rank.rs"]
mod rank;
#[path = "shared/workload.rs"]
#[allow(dead_code)]
mod workload;

type Error = Box<dyn std::error::Error + Send + Sync>;

const WORLDS: u64 = 400;
const AGENTS: u64 = 4;
const BURSTS: u64 = 3;
/// Between bursts: past the cooldown, so a world's agents may speak again.
const PAUSE: Duration = Duration::from_millis(1200);

#[derive(Clone, Copy)]
struct Setup {
    label: &'static str,
    /// The policy service's delay; None: the hook is off.
    service: Option<Duration>,
}

const SETUPS: [Setup; 3] = [
    Setup {
        label: "(p0) no policy hook",
        service: None,
    },
    Setup {
        label: "(p1) policy hook, service answers at once",
        service: Some(Duration::ZERO),
    },
    Setup {
        label: "(p2) policy hook, service answers in 20 ms",
        service: Some(Duration::from_millis(20)),
    },
];

/// Message `k` (0 the human's, 1-4 the agents') of `world` in `burst`: its
/// sequence number (its id), subject and payload.
fn message(burst: u64, k: u64, world: u64) -> (u64, String, String) {
    let seq = (burst * (AGENTS + 1) + k) * WORLDS + world;
    let subject = match k {
        0 => format!("chat.raw.w{world}.human.h"),
        _ => format!("chat.raw.w{world}.agent.a{}", k - 1),
    };
    let payload = format!(
        "{{\"id\":\"{seq}\",\"content\":\"message {seq}: lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore\"}}"
    );
    (seq, subject, payload)
}

struct Loopguard(Child);

impl Drop for Loopguard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn loopguard_bin() -> String {
    std::env::var("LOOPGUARD_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_loopguard").to_string())
}

/// Answers every policy request with an approval, `delay` after it came.
async fn policy_service(url: &str, delay: Duration) -> Result<tokio::task::JoinHandle<()>, Error> {
    let client = async_nats::connect(url).await?;
    let mut requests = client.subscribe("policy.check").await?;
    client.flush().await?;
    Ok(tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            let Some(reply) = request.reply else { continue };
            let client = client.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = client
                    .publish(reply, "{\"decision\":\"approve\"}".into())
                    .await;
            });
        }
    }))
}

struct Row {
    label: &'static str,
    delivered: usize,
    expected: usize,
    rate: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
}

async fn measure(url: &str, dir: &std::path::Path, setup: Setup) -> Result<Row, Error> {
    let service = match setup.service {
        Some(delay) => Some(policy_service(url, delay).await?),
        None => None,
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let config = dir.join("policy.toml");
    std::fs::write(
        &config,
        format!(
            "[nats]\nurl = \"{url}\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n\
             [log]\nlevel = \"warn\"\n\
             [rules.turns]\nmax = 20\n[rules.depth]\nmax = 8\n\
             [rules.cooldown]\nseconds = 1\n[rules.rate]\nmax = 1000\n{}",
            match setup.service {
                Some(_) => "[rules.policy]\nsubject = \"policy.check\"\ntimeout_ms = 5000\n",
                None => "",
            }
        ),
    )?;
    let _loopguard = Loopguard(
        Command::new(loopguard_bin())
            .arg("--config")
            .arg(&config)
            .env_remove("RUST_LOG")
            .stderr(Stdio::null())
            .spawn()?,
    );
    let client = async_nats::connect(url).await?;
    if !workload::until_echoed(
        &client,
        "chat.raw.ready.system.bench",
        "chat.public.ready",
        1,
        Duration::from_secs(20),
    )
    .await?
    {
        return Err(format!("{} never became ready", setup.label).into());
    }

    let total = (BURSTS * (AGENTS + 1) * WORLDS) as usize;
    let sent_at: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; total]));
    let mut public = client.subscribe("chat.public.>").await?;
    client.flush().await?;
    let (mut latencies, mut rates, mut delivered) = (Vec::new(), Vec::new(), 0);
    for burst in 0..BURSTS {
        let start = Instant::now();
        for k in 0..=AGENTS {
            for world in 0..WORLDS {
                let (seq, subject, payload) = message(burst, k, world);
                sent_at.lock().unwrap()[seq as usize] = Some(Instant::now());
                client.publish(subject, payload.into()).await?;
            }
        }
        client.flush().await?;
        // Every agent message of the burst delivered, or 60 s of silence.
        let (mut got, mut last) = (0, start);
        while got < (AGENTS * WORLDS) as usize {
            let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(60), public.next()).await
            else {
                break;
            };
            let Some(seq) = workload::id_of(&m.payload) else {
                continue; // the readiness probe's echo
            };
            let is_agent = !(seq / WORLDS).is_multiple_of(AGENTS + 1);
            if !is_agent {
                continue;
            }
            last = Instant::now();
            if let Some(at) = sent_at.lock().unwrap()[seq as usize] {
                latencies.push(last - at);
            }
            got += 1;
        }
        delivered += got;
        if got > 0 {
            rates.push(got as f64 / (last - start).as_secs_f64());
        }
        tokio::time::sleep(PAUSE).await;
    }
    if let Some(service) = service {
        service.abort();
    }
    latencies.sort_unstable();
    let pct = |p: f64| rank::nearest(&latencies, p).unwrap_or_default();
    rates.sort_by(f64::total_cmp);
    Ok(Row {
        label: setup.label,
        delivered,
        expected: (BURSTS * AGENTS * WORLDS) as usize,
        rate: rates.get(rates.len() / 2).copied().unwrap_or(0.0),
        p50: pct(0.5),
        p99: pct(0.99),
        max: pct(1.0),
    })
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return Ok(()); // `cargo test --benches` probes; nothing to run.
    }
    let dir = tempfile::tempdir()?;
    let nats::Server {
        child: mut nats,
        url,
        ..
    } = nats::start(dir.path()).await?;
    let mut rows = Vec::new();
    for setup in SETUPS {
        eprintln!("{}", setup.label);
        rows.push(measure(&url, dir.path(), setup).await?);
    }
    let _ = nats.kill();
    let _ = nats.wait();

    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    println!("## Policy hook benchmark — {date}\n");
    let bin = loopguard_bin();
    let bin = bin.trim_start_matches(concat!(env!("CARGO_MANIFEST_DIR"), "/"));
    println!("loopguard: `{bin}`. Workload: {WORLDS} worlds, a human's message then one from each of {AGENTS} agents, in {BURSTS} bursts sent as fast as the producer can; rates are the median burst's, latencies over all agent messages.\n");
    println!("| set-up | agent messages delivered | agent messages/s | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} of {} | {:.0} | {} | {} | {} |",
            r.label,
            r.delivered,
            r.expected,
            r.rate,
            ms(r.p50),
            ms(r.p99),
            ms(r.max)
        );
    }
    println!(
        "\n| ratio | value |\n|---|---:|\n| (p1)/(p0) agent messages/s | {:.2} |\n| (p2)/(p0) agent messages/s | {:.2} |",
        rows[1].rate / rows[0].rate,
        rows[2].rate / rows[0].rate
    );
    Ok(())
}
