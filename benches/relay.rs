//! `make bench`: loopguard beside its baselines, on one workload, in one run.
//!
//! Set-ups, each fed by the same open-loop producer through one nats-server on
//! loopback:
//! - (a) direct: producers publish straight to the egress subjects — the
//!   server's own ceiling on this machine;
//! - (a2) direct, loopguard's copies: two producers publish every copy
//!   (c1) would, with its headers, inbox copies and rejection events, and
//!   no raw hop — a rough ceiling of loopguard's output on this machine
//!   (server, producers and consumer fill it), not a proven one: its
//!   producers build each copy with string formatting, in the process that
//!   also consumes them, and may limit it before the server does;
//! - (b) bare relay: `examples/bare_relay.rs`, subscribe `chat.raw.>` and
//!   republish each payload unchanged, on one runtime thread as loopguard
//!   runs by default — the floor any relay pays;
//! - (b2) copying relay: `examples/copy_relay.rs`, the same but publishing
//!   the copies (c1) publishes (inbox copies, headers, rejection events)
//!   with no decision, state or parsing — the floor of any relay with
//!   loopguard's output. Side by side, the benchmark checks from the
//!   server's connection counts that it publishes as many messages and
//!   bytes as (c1);
//! - (c1) loopguard, `events.approved = false`, every rule of the contract
//!   on (pass, turns, depth, duplicate, cooldown, rate); the rules loopguard
//!   adds (alternation, similar, low_content, budget, concluded) are off, as
//!   by default;
//! - (c2) the same, every event published;
//! - (c3) (c1) with the rules loopguard adds on too
//!   (benches/shared/optional_rules.toml), set so that they seldom reject
//!   this workload: every rule loopguard has, on.
//!
//! loopguard is the binary `LOOPGUARD_BIN` names when set (`make bench`
//! sets the profile-guided build of `make release`, which the image ships),
//! else cargo's plain release build; the report says which.
//!
//! Workload: 100,000 worlds, four agents each, a human message after every
//! four agent messages (a broadcast to the four inboxes), agent messages that
//! @mention the next agent (one inbox copy), ~200-byte unique contents, and
//! one message in ten (always an agent's, so one agent message in eight)
//! repeating the previous one, so loopguard rejects ~10% (as `duplicate`)
//! and approves ~90%. Each set-up is one process whose
//! worlds live on from step to step: an unmeasured warm-up of eight turns
//! opens every world and lets each world's four agents speak, then every
//! measured message is a later turn of a world already held.
//!
//! Loss counts every copy a set-up should publish (a broadcast's five),
//! and a copy beyond those fails the step. Latency is that of a message's
//! first copy, from when it was due on the producer's schedule: a stalled
//! producer does not hide its stall.
//!
//! For each set-up: the highest open-loop rate sustained with < 0.1% loss and
//! p99 < 50 ms; latency percentiles at a common moderate rate; CPU µs per
//! message of the relay process (its CPU clock, in nanoseconds); its peak
//! resident memory (the kernel's high-water mark, over its whole life);
//! and, for loopguard, the slow-consumer drops it counted from the warm-up
//! to the last step that passed. Then (b), (b2) and (c1) run side by side
//! on one stream at the common rate, so their CPU per message is compared
//! in the same seconds (`BENCH_ONLY=pair` runs that alone). Printed as a markdown
//! section (`make bench` keeps it in docs/benchmarks.md). Numbers are only
//! comparable within one run: server, producer and relay share the CPUs.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

#[path = "shared/nats.rs"]
mod nats;
#[path = "shared/rank.rs"]
mod rank;
#[path = "shared/workload.rs"]
mod workload;
use workload::{id_of, message, AGENTS, WORLDS};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Sending time of one measured step.
const STEP: Duration = Duration::from_secs(3);
/// After the last send, how long stragglers may take.
const DRAIN: Duration = Duration::from_millis(1500);
const MAX_LOSS: f64 = 0.001;
const MAX_P99: Duration = Duration::from_millis(50);
/// The common moderate rate for latency and CPU comparisons.
const COMMON_RATE: u64 = 20_000;
/// Rate of the unmeasured warm-up (`WARM_UP_TURNS` turns of every world).
const WARM_UP_RATE: u64 = 40_000;
/// Steps of the side-by-side CPU measurement of (b), (b2) and (c1).
const PAIRED_STEPS: usize = 3;
/// Turns of every world in the unmeasured warm-up of each set-up: by then
/// each world's four agents have spoken (a world with world % 10 of 2 or 7
/// hears its fourth at turn 7, of 1 or 6 at turn 8), so loopguard's roster
/// is whole and a human's
/// message goes to all four inboxes and an agent's to the inbox it
/// mentions, as (a2) and (b2) send them.
const WARM_UP_TURNS: u64 = 8;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Setup {
    Direct,
    DirectCopies,
    BareRelay,
    CopyRelay,
    LoopguardQuiet,
    LoopguardEvents,
    /// (c1) with loopguard's own rules on too (benches/shared/optional_rules.toml).
    LoopguardEveryRule,
}

impl Setup {
    fn label(self) -> &'static str {
        match self {
            Setup::Direct => "(a) direct to egress",
            Setup::DirectCopies => "(a2) direct, loopguard's copies",
            Setup::BareRelay => "(b) bare relay",
            Setup::CopyRelay => "(b2) copying relay",
            Setup::LoopguardQuiet => "(c1) loopguard, approved events off",
            Setup::LoopguardEvents => "(c2) loopguard, all events",
            Setup::LoopguardEveryRule => {
                "(c3) loopguard, its optional rules on too, approved events off"
            }
        }
    }
    /// The set-up's tag in the step log.
    fn key(self) -> &'static str {
        match self {
            Setup::Direct => "(a)",
            Setup::DirectCopies => "(a2)",
            Setup::BareRelay => "(b)",
            Setup::CopyRelay => "(b2)",
            Setup::LoopguardQuiet => "(c1)",
            Setup::LoopguardEvents => "(c2)",
            Setup::LoopguardEveryRule => "(c3)",
        }
    }
    fn is_loopguard(self) -> bool {
        matches!(
            self,
            Setup::LoopguardQuiet | Setup::LoopguardEvents | Setup::LoopguardEveryRule
        )
    }
    /// Producers publish egress themselves: no relay process.
    fn is_direct(self) -> bool {
        matches!(self, Setup::Direct | Setup::DirectCopies)
    }
    /// Copies of message `seq` expected on the public and private subjects:
    /// one, or as loopguard publishes it (contract §3: a human's broadcast
    /// to the transcript and the four inboxes, an agent's to its
    /// addressee's inbox, a duplicate only as an event).
    fn copies_of(self, seq: u64) -> u8 {
        if !self.drops_duplicates() {
            return 1;
        }
        let (subject, _, _, approved) = message(seq);
        match (approved, subject.contains(".human.")) {
            (false, _) => 0,
            (true, true) => 1 + AGENTS as u8,
            (true, false) => 1,
        }
    }

    /// Only what loopguard would approve is expected out.
    fn drops_duplicates(self) -> bool {
        self.is_loopguard() || matches!(self, Setup::DirectCopies | Setup::CopyRelay)
    }
}

/// What (c1) publishes for message `seq`, for set-up (a2): (subject,
/// `Nats-Msg-Id`, payload). A human's message goes to the transcript and
/// the four agents' inboxes; an agent's, which starts with a mention, to
/// that agent's inbox only (contract §3). Each copy is egress JSON about as
/// long as loopguard's; a duplicate becomes a rejection event.
fn copies(seq: u64) -> Vec<(String, Option<String>, String)> {
    let (ingress, _, payload, approved) = message(seq);
    // chat.raw.<world>.<kind>.<name>
    let mut parts = ingress.split('.').skip(2);
    let (world, kind, sender) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let at = "2026-11-21T20:00:00.000Z";
    if !approved {
        let event = format!(
            "{{\"id\":\"{seq}\",\"world\":\"{world}\",\"sender\":\"{sender}\",\"sender_kind\":\"{kind}\",\"decision\":\"rejected\",\"rule\":\"duplicate\",\"reason\":\"the same content was already approved in this world within the last 300s\",\"depth\":2,\"turn\":2,\"delivered_to\":[],\"observed_at\":\"{at}\"}}"
        );
        return vec![(format!("chat.events.{world}"), None, event)];
    }
    let human = kind == "human";
    let inboxes: Vec<String> = match human {
        true => (0..AGENTS).map(|a| format!("a{a}")).collect(),
        false => {
            let agent: u64 = sender[1..].parse().unwrap_or_default();
            vec![format!("a{}", (agent + 1) % AGENTS)]
        }
    };
    // A broadcast mentions no one; an agent's message its addressee.
    let mentions = match human {
        true => String::new(),
        false => format!("\"{}\"", inboxes[0]),
    };
    let content = payload
        .split("\"content\":\"")
        .nth(1)
        .and_then(|c| c.strip_suffix("\"}"))
        .unwrap_or_default();
    let egress = |visibility: &str| {
        format!(
            "{{\"id\":\"{seq}\",\"content\":\"{content}\",\"world\":\"{world}\",\"sender\":\"{sender}\",\"sender_kind\":\"{kind}\",\"thread_id\":\"{}\",\"parent_id\":\"{}\",\"depth\":2,\"mentions\":[{mentions}],\"visibility\":\"{visibility}\",\"received_at\":\"{at}\"}}",
            seq % WORLDS,
            seq.saturating_sub(WORLDS),
        )
    };
    let id = |copy: usize| format!("{:08x}-0000-5000-8000-{:012x}", seq as u32, copy);
    let mut out = Vec::new();
    if human {
        out.push((
            format!("chat.public.{world}"),
            Some(id(0)),
            egress("public"),
        ));
    }
    for (i, inbox) in inboxes.iter().enumerate() {
        out.push((
            format!("chat.private.{world}.{inbox}"),
            Some(id(i + 1)),
            egress("private"),
        ));
    }
    out
}

struct Outcome {
    rate: u64,
    offered: u64,
    loss: f64,
    /// Copies beyond those expected: wrong output, which fails the step.
    extra: u64,
    p50: Duration,
    p99: Duration,
    p999: Duration,
}

impl Outcome {
    /// Whether the step held its rate: loss < 0.1%, p99 < 50 ms, no extra
    /// copy, and the producer kept up (sent 95% of the offered rate).
    fn sustained(&self) -> bool {
        self.loss < MAX_LOSS
            && self.p99 < MAX_P99
            && self.extra == 0
            && self.rate >= self.offered * 95 / 100
    }
}

/// Sends `total` messages at `rate` msg/s, open loop, from sequence number
/// `*next` on, and measures loss and latency.
async fn send(
    url: &str,
    setup: Setup,
    rate: u64,
    total: u64,
    next: &mut u64,
) -> Result<Outcome, Error> {
    let base = *next;
    *next += total;
    // Every copy counts: each of a broadcast's five, not only its first.
    let wanted: Arc<Vec<u8>> = Arc::new((0..total).map(|s| setup.copies_of(base + s)).collect());
    let expected: u64 = wanted.iter().map(|&c| u64::from(c)).sum();
    let got: Arc<Vec<AtomicU8>> = Arc::new((0..total).map(|_| AtomicU8::new(0)).collect());
    // Copies counted against `expected`, and copies beyond a message's own
    // (a duplicate approved, a copy twice): these fail the step rather
    // than make up for lost ones.
    let received = Arc::new(AtomicU64::new(0));
    let extra = Arc::new(AtomicU64::new(0));

    let consumer = async_nats::ConnectOptions::new()
        .subscription_capacity(1 << 22)
        .connect(url)
        .await?;
    let mut public = consumer.subscribe("chat.public.>").await?;
    let mut private = consumer.subscribe("chat.private.>").await?;
    let mut events = consumer.subscribe("chat.events.>").await?;
    consumer.flush().await?;
    // One producer; two for (a2), whose producers also do the publishing a
    // relay would do in its own process (each takes every other message).
    let producers = if setup == Setup::DirectCopies { 2 } else { 1 };
    let mut clients = Vec::new();
    for _ in 0..producers {
        clients.push(async_nats::connect(url).await?);
    }
    // The schedule starts once every connection is up.
    let start = Instant::now();
    let latencies = Arc::new(std::sync::Mutex::new(Vec::with_capacity(total as usize)));
    let record = {
        let (got, wanted, latencies) = (got.clone(), wanted.clone(), latencies.clone());
        let (received, extra) = (received.clone(), extra.clone());
        move |payload: &[u8]| {
            let Some(id) = id_of(payload).and_then(|id| id.checked_sub(base)) else {
                return;
            };
            let Some(count) = got.get(id as usize) else {
                return;
            };
            let before = count.fetch_add(1, Ordering::Relaxed);
            if before >= wanted[id as usize] {
                extra.fetch_add(1, Ordering::Relaxed);
                return;
            }
            received.fetch_add(1, Ordering::Relaxed);
            if before == 0 {
                // Latency from when the message was due, not from when the
                // producer got to it: a producer that stalled and caught up
                // does not hide the stall (no coordinated omission). Due
                // at the first of the producer's 1 ms ticks at or after
                // its place in the schedule, which is when an unstalled
                // producer sends it.
                let now = start.elapsed().as_nanos() as u64;
                let due = ((id + 1) * 1_000_000_000)
                    .div_ceil(rate)
                    .next_multiple_of(1_000_000);
                latencies.lock().unwrap().push(now.saturating_sub(due));
            }
        }
    };
    let collector = tokio::spawn(async move {
        loop {
            tokio::select! {
                Some(m) = public.next() => record(&m.payload),
                Some(m) = private.next() => record(&m.payload),
                Some(_) = events.next() => {}
                else => break,
            }
        }
    });

    let mut tasks = Vec::new();
    for (first, producer) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut sent = first as u64;
            let mut tick = tokio::time::interval_at(start.into(), Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            while sent < total {
                tick.tick().await;
                let due = ((start.elapsed().as_nanos() * rate as u128) / 1_000_000_000) as u64;
                while sent < due.min(total) {
                    publish(&producer, setup, base + sent).await?;
                    sent += producers;
                }
            }
            producer.flush().await?;
            Ok::<_, Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let sending = start.elapsed();
    // Stragglers: until everything expected arrived, or the drain time is up.
    let deadline = Instant::now() + DRAIN;
    while Instant::now() < deadline && received.load(Ordering::Relaxed) < expected {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    collector.abort();
    let mut l = std::mem::take(&mut *latencies.lock().unwrap());
    l.sort_unstable();
    let pct = |p: f64| rank::nearest(&l, p).map_or(Duration::MAX, Duration::from_nanos);
    Ok(Outcome {
        rate: (total as f64 / sending.as_secs_f64()) as u64,
        offered: rate,
        loss: 1.0 - received.load(Ordering::Relaxed) as f64 / expected as f64,
        extra: extra.load(Ordering::Relaxed),
        p50: pct(0.50),
        p99: pct(0.99),
        p999: pct(0.999),
    })
}

/// Publishes message `seq` as `setup` feeds it: to the raw subject, or
/// (direct set-ups) straight to egress.
async fn publish(producer: &async_nats::Client, setup: Setup, seq: u64) -> Result<(), Error> {
    let (subject, direct, payload, _) = message(seq);
    match setup {
        Setup::Direct => producer.publish(direct, payload.into()).await?,
        Setup::DirectCopies => {
            for (subject, id, payload) in copies(seq) {
                match id {
                    Some(id) => {
                        let mut headers = async_nats::HeaderMap::new();
                        headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
                        producer
                            .publish_with_headers(subject, headers, payload.into())
                            .await?
                    }
                    None => producer.publish(subject, payload.into()).await?,
                }
            }
        }
        _ => producer.publish(subject, payload.into()).await?,
    }
    Ok(())
}

/// A relay process under test, and what /proc says about it.
struct Relay {
    child: Child,
    http: Option<String>,
}

impl Relay {
    fn start(setup: Setup, url: &str, dir: &std::path::Path) -> Result<Option<Relay>, Error> {
        let root = env!("CARGO_MANIFEST_DIR");
        match setup {
            Setup::Direct | Setup::DirectCopies => Ok(None),
            Setup::BareRelay | Setup::CopyRelay => {
                let example = match setup {
                    Setup::BareRelay => "bare_relay",
                    _ => "copy_relay",
                };
                let child = Command::new(format!("{root}/target/release/examples/{example}"))
                    .arg(url)
                    .stderr(Stdio::null())
                    .spawn()?;
                Ok(Some(Relay { child, http: None }))
            }
            Setup::LoopguardQuiet | Setup::LoopguardEvents | Setup::LoopguardEveryRule => {
                let port = std::net::TcpListener::bind("127.0.0.1:0")?
                    .local_addr()?
                    .port();
                let config = dir.join("bench.toml");
                std::fs::write(
                    &config,
                    format!(
                        "[nats]\nurl = \"{url}\"\nsubscription_capacity = 1048576\n\
                         [http]\nlisten = \"127.0.0.1:{port}\"\n\
                         [events]\napproved = {}\n{}{}",
                        setup == Setup::LoopguardEvents,
                        include_str!("shared/loopguard.toml"),
                        match setup {
                            Setup::LoopguardEveryRule => include_str!("shared/optional_rules.toml"),
                            _ => "",
                        },
                    ),
                )?;
                let child = Command::new(loopguard_bin())
                    .arg("--config")
                    .arg(&config)
                    .env_remove("RUST_LOG")
                    .stderr(Stdio::null())
                    .spawn()?;
                Ok(Some(Relay {
                    child,
                    http: Some(format!("127.0.0.1:{port}")),
                }))
            }
        }
    }

    /// user + system CPU time so far.
    fn cpu(&self) -> Result<Duration, Error> {
        cpu_of(&self.child.id().to_string())
    }

    /// The relay's minor page faults so far, all its threads.
    fn minor_faults(&self) -> Result<u64, Error> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // Fields after the command's closing bracket (a command may hold
        // spaces and brackets) start at the third, the state; minflt is the
        // tenth (proc(5)).
        stat.rsplit_once(')')
            .and_then(|(_, fields)| fields.split_whitespace().nth(10 - 3))
            .ok_or("no minflt in /proc/<pid>/stat")?
            .parse()
            .map_err(Into::into)
    }

    /// The highest resident memory (MiB) of the relay's life so far: the
    /// kernel's own high-water mark, warm-up and failed steps included.
    fn peak_rss(&self) -> Result<f64, Error> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let kib: u64 = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .ok_or("no VmHWM in /proc/<pid>/status")?
            .parse()?;
        Ok(kib as f64 / 1024.0)
    }

    /// Waits until the relay is idle (under 5% of a CPU over 200 ms), so a
    /// backlog a failed step left does not count against the next; at most
    /// 15 s, and says so if the relay was still busy then.
    async fn until_idle(&self) -> Result<(), Error> {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut last = self.cpu()?;
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = self.cpu()?;
            if now - last <= Duration::from_millis(10) {
                return Ok(());
            }
            if Instant::now() > deadline {
                eprintln!("a relay was still busy 15 s after its step; going on");
                return Ok(());
            }
            last = now;
        }
    }

    async fn dropped(&self) -> Result<f64, Error> {
        self.metric("loopguard_dropped_total{").await
    }

    /// The sum of loopguard's metric series that start with `series` (0
    /// for a relay with no metrics).
    async fn metric(&self, series: &str) -> Result<f64, Error> {
        let Some(addr) = &self.http else {
            return Ok(0.0);
        };
        Ok(http_get(addr, "/metrics")
            .await?
            .lines()
            .filter(|l| l.starts_with(series))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The body (and head) of `GET path` at `addr` (host:port).
async fn http_get(addr: &str, path: &str) -> Result<String, Error> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    // HTTP/1.0: the answer is not chunked, and ends when the server closes.
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await?;
    let mut text = String::new();
    s.read_to_string(&mut text).await?;
    let status = text.lines().next().unwrap_or_default();
    if status.split(' ').nth(1) != Some("200") {
        return Err(format!("GET {path} at {addr}: {status}").into());
    }
    Ok(text)
}

/// Messages and payload bytes published so far by each client connection
/// with a name, from the server's monitoring endpoint (`/connz`).
async fn published_by_name(monitor: &str) -> Result<Vec<(String, [u64; 2])>, Error> {
    let text = http_get(monitor, "/connz?limit=1024").await?;
    let body = text.split_once("\r\n\r\n").ok_or("no /connz body")?.1;
    let connz: serde_json::Value = serde_json::from_str(body)?;
    Ok(connz["connections"]
        .as_array()
        .ok_or("no connections in /connz")?
        .iter()
        .filter_map(|c| {
            let counts = [c["in_msgs"].as_u64()?, c["in_bytes"].as_u64()?];
            Some((c["name"].as_str()?.to_string(), counts))
        })
        .collect())
}

/// The loopguard binary measured: `LOOPGUARD_BIN` when set (`make bench`
/// sets the profile-guided build of scripts/pgo.sh, which the image ships),
/// else cargo's plain release build.
fn loopguard_bin() -> String {
    std::env::var("LOOPGUARD_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_loopguard").to_string())
}

/// CPU time so far of process `pid` (or `self`), all its threads, those
/// ended included: the kernel's process CPU clock, in nanoseconds. (The
/// user and system times of /proc/<pid>/stat come in 10 ms ticks: ±8% of
/// a bare relay's figure over one step.)
fn cpu_of(pid: &str) -> Result<Duration, Error> {
    let pid: libc::pid_t = match pid {
        "self" => 0,
        pid => pid.parse()?,
    };
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `clock` is a valid place for the id; a pid that is gone is
    // an error (ESRCH), returned, not undefined.
    let e = unsafe { libc::clock_getcpuclockid(pid, &mut clock) };
    if e != 0 {
        return Err(format!(
            "clock_getcpuclockid({pid}): {}",
            std::io::Error::from_raw_os_error(e)
        )
        .into());
    }
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write to.
    if unsafe { libc::clock_gettime(clock, &mut t) } != 0 {
        return Err(format!(
            "clock_gettime of {pid}: {}",
            std::io::Error::last_os_error()
        )
        .into());
    }
    Ok(Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
}

/// Where the machine's CPU went during one step: the relay, the server and
/// this process (producer and consumer), each in % of one CPU. With two
/// CPUs, a sum near 200% means the step was limited by the machine, not by
/// one process.
struct Shares {
    server: String,
    relay: Option<String>,
    before: [Duration; 3],
    started: Instant,
}

impl Shares {
    fn start(server: u32, relay: Option<&Relay>) -> Result<Shares, Error> {
        let server = server.to_string();
        let relay = relay.map(|r| r.child.id().to_string());
        let mut shares = Shares {
            server,
            relay,
            before: [Duration::ZERO; 3],
            started: Instant::now(),
        };
        shares.before = shares.now()?;
        Ok(shares)
    }

    fn now(&self) -> Result<[Duration; 3], Error> {
        Ok([
            self.relay.as_deref().map_or(Ok(Duration::ZERO), cpu_of)?,
            cpu_of(&self.server)?,
            cpu_of("self")?,
        ])
    }

    /// "relay x% server y% bench z%" since `start`.
    fn report(&self) -> Result<String, Error> {
        let now = self.now()?;
        let wall = self.started.elapsed().as_secs_f64();
        let pct = |i: usize| (now[i] - self.before[i]).as_secs_f64() * 100.0 / wall;
        Ok(format!(
            "cpu: relay {:>3.0}% server {:>3.0}% bench {:>3.0}%",
            pct(0),
            pct(1),
            pct(2)
        ))
    }
}

/// Waits until a message sent through the set-up comes out.
async fn until_ready(url: &str, setup: Setup) -> Result<(), Error> {
    let client = async_nats::connect(url).await?;
    let subject = if setup.is_direct() {
        "chat.public.ready"
    } else {
        "chat.raw.ready.system.bench"
    };
    let limit = Duration::from_secs(20);
    if !workload::until_echoed(&client, subject, "chat.public.ready", 1, limit).await? {
        return Err(format!("{} never became ready", setup.label()).into());
    }
    Ok(())
}

struct Row {
    setup: Setup,
    max: Outcome,
    common: Outcome,
    cpu_us: Option<f64>,
    rss: Option<PeakRss>,
    dropped: f64,
    /// One line per step of the rate search, with where the CPU went.
    steps: Vec<String>,
}

/// The highest resident memory a relay reached in its life, and how many
/// turns each world had taken by its last step. loopguard holds each
/// world's history, which grows with every turn (and in steps, as every
/// world's maps and queues reach a power of two at the same turn), so its
/// peak depends on how many messages its steps sent, failed ones included.
#[derive(Clone, Copy)]
struct PeakRss {
    mib: f64,
    turns: u64,
}

async fn measure(
    url: &str,
    server: u32,
    setup: Setup,
    dir: &std::path::Path,
) -> Result<Row, Error> {
    // One process per set-up: the worlds it holds live on from step to step.
    let relay = Relay::start(setup, url, dir)?;
    until_ready(url, setup).await?;
    let mut next = 0;
    // Warm-up, not measured: the first turns of every world, so the
    // measured steps find the worlds held and their agents known, as a
    // long-running sidecar would. Direct set-ups hold nothing to warm: they
    // skip to the same turn.
    match &relay {
        Some(relay) => {
            send(url, setup, WARM_UP_RATE, WARM_UP_TURNS * WORLDS, &mut next).await?;
            relay.until_idle().await?;
        }
        None => next = WARM_UP_TURNS * WORLDS,
    }

    // Latency and CPU at the common rate.
    let cpu_before = relay.as_ref().map(|r| r.cpu()).transpose()?;
    let total = COMMON_RATE * STEP.as_secs();
    let common = send(url, setup, COMMON_RATE, total, &mut next).await?;
    let cpu_us = match (&relay, cpu_before) {
        (Some(r), Some(before)) => Some((r.cpu()? - before).as_secs_f64() * 1e6 / total as f64),
        _ => None,
    };

    // The highest sustained rate: grow by 25% until a rate fails, then
    // halve the gap between the last pass and the failure twice (to ~6%).
    // A rate that fails once is not sustained: there is no second try.
    let mut best: Option<Outcome> = None;
    // Slow-consumer drops over the warm-up, the common rate and the steps
    // that passed (the common rate's marked in the table if it failed);
    // those of a failed step and of its drain are not counted.
    let mut dropped_so_far = match &relay {
        Some(r) => r.dropped().await?,
        None => 0.0,
    };
    let mut dropped = dropped_so_far;
    let mut failed: Option<u64> = None;
    let mut rate = 40_000;
    let mut halvings = 0;
    let mut steps = Vec::new();
    loop {
        let shares = Shares::start(server, relay.as_ref())?;
        let o = send(url, setup, rate, rate * STEP.as_secs(), &mut next).await?;
        let step_dropped = match &relay {
            Some(r) => {
                let total = r.dropped().await?;
                let step = total - dropped_so_far;
                dropped_so_far = total;
                step
            }
            None => 0.0,
        };
        let passed = o.sustained();
        let step = format!(
            "{:<5} offered {:>7}/s sent {:>7}/s loss {:>6.3}% p99 {:>8.2?} {:<4} {}",
            setup.key(),
            o.offered,
            o.rate,
            o.loss * 100.0,
            o.p99,
            if passed { "ok" } else { "FAIL" },
            shares.report()?
        );
        eprintln!("  {step}");
        steps.push(step);
        if passed {
            dropped += step_dropped;
            best = Some(o);
        } else {
            // Let a backlog left by the failure clear before the next step;
            // drops in it are the failed step's.
            match &relay {
                Some(r) => {
                    r.until_idle().await?;
                    dropped_so_far = r.dropped().await?;
                }
                None => tokio::time::sleep(DRAIN).await,
            }
            failed = Some(rate);
        }
        let Some(ceiling) = failed else {
            rate = rate * 5 / 4;
            if rate > 1_000_000 {
                break;
            }
            continue;
        };
        let Some(floor) = best.as_ref().map(|b| b.offered) else {
            break; // failed at the first rate
        };
        if halvings == 2 {
            break;
        }
        halvings += 1;
        rate = (floor + ceiling) / 2;
    }
    let max = best.ok_or_else(|| format!("{} failed even at the lowest rate", setup.label()))?;
    let rss = match &relay {
        Some(r) => Some(PeakRss {
            mib: r.peak_rss()?,
            turns: next / WORLDS,
        }),
        None => None,
    };
    Ok(Row {
        setup,
        max,
        common,
        cpu_us,
        rss,
        dropped,
        steps,
    })
}

/// CPU per message of (b), (b2) and (c1) side by side: the three processes
/// subscribed to the same raw stream at the common rate, so all are
/// measured in the same seconds. Measured one after the other, as in the
/// table, the figures come minutes apart, and the shared machine's state
/// between them moved the (c1)/(b) ratio from 1.38 to 2.35 over one day's
/// runs (against the old, multi-threaded (b)). After a warm-up that opens every world for loopguard, each of
/// `PAIRED_STEPS` steps gives the three figures.
async fn paired_cpu(url: &str, monitor: &str, dir: &std::path::Path) -> Result<Side, Error> {
    let bare = Relay::start(Setup::BareRelay, url, dir)?.ok_or("no bare relay")?;
    let copying = Relay::start(Setup::CopyRelay, url, dir)?.ok_or("no copying relay")?;
    let loopguard = Relay::start(Setup::LoopguardQuiet, url, dir)?.ok_or("no loopguard")?;
    // All ready: a system message comes back once from each.
    let client = async_nats::connect(url).await?;
    let (subject, echo) = ("chat.raw.paired.system.bench", "chat.public.paired");
    if !workload::until_echoed(&client, subject, echo, 3, Duration::from_secs(20)).await? {
        return Err("the relays side by side never all became ready".into());
    }
    let relays = [&bare, &copying, &loopguard];
    let idle = || async {
        for relay in relays {
            relay.until_idle().await?;
        }
        Ok::<_, Error>(())
    };
    let mut next = 0;
    send(
        url,
        Setup::LoopguardQuiet,
        WARM_UP_RATE,
        WARM_UP_TURNS * WORLDS,
        &mut next,
    )
    .await?;
    idle().await?;
    let total = COMMON_RATE * STEP.as_secs();
    let per_message = |d: Duration| d.as_secs_f64() * 1e6 / total as f64;
    let first = next;
    let before = Output::now(monitor, &loopguard).await?;
    let mut steps = Vec::new();
    for _ in 0..PAIRED_STEPS {
        let [b0, copying0, c0] = relays.map(Relay::cpu);
        let faults0 = relays.map(Relay::minor_faults);
        send(url, Setup::LoopguardQuiet, COMMON_RATE, total, &mut next).await?;
        // Each step's CPU includes the relay's whole backlog.
        idle().await?;
        let mut faults_per_message = [0.0; 3];
        for ((f, relay), before) in faults_per_message.iter_mut().zip(relays).zip(faults0) {
            *f = (relay.minor_faults()? - before?) as f64 / total as f64;
        }
        steps.push(Paired {
            bare: per_message(bare.cpu()? - b0?),
            copying: per_message(copying.cpu()? - copying0?),
            loopguard: per_message(loopguard.cpu()? - c0?),
            faults_per_message,
        });
    }
    let mirrored = Output::now(monitor, &loopguard)
        .await?
        .since(&before)?
        .check((first..next).flat_map(copies));
    Ok(Side { steps, mirrored })
}

/// What the side-by-side measurement gives.
struct Side {
    steps: Vec<Paired>,
    /// Whether (b2) published what (c1) did, and (c1) routed as the
    /// workload says: `Err` says how they differed.
    mirrored: Result<String, String>,
}

/// One step side by side: CPU µs per message of each relay.
struct Paired {
    bare: f64,
    copying: f64,
    loopguard: f64,
    /// Minor page faults per message of (b), (b2) and (c1).
    faults_per_message: [f64; 3],
}

/// Counters of what (b2) and (c1) published: from the server, messages and
/// bytes of each client; from loopguard, its public and private copies.
struct Output {
    copying: [u64; 2],
    loopguard: [u64; 2],
    public: u64,
    private: u64,
}

impl Output {
    async fn now(monitor: &str, loopguard: &Relay) -> Result<Output, Error> {
        let counts = published_by_name(monitor).await?;
        let of = |name: &str| {
            counts
                .iter()
                .find(|(n, _)| n == name)
                .map(|c| c.1)
                .ok_or_else(|| format!("the server lists no {name} client"))
        };
        let deliveries = |v: &'static str| async move {
            let series = format!("loopguard_deliveries_total{{visibility=\"{v}\"}}");
            loopguard.metric(&series).await
        };
        Ok(Output {
            copying: of("copy_relay")?,
            loopguard: of("loopguard")?,
            public: deliveries("public").await? as u64,
            private: deliveries("private").await? as u64,
        })
    }

    /// The counts from `before` to `self`. A counter that went back (a
    /// client that reconnected, a relay restarted) is an error.
    fn since(&self, before: &Output) -> Result<Output, Error> {
        let sub = |a: u64, b: u64| {
            a.checked_sub(b)
                .ok_or("a counter went back: a relay reconnected or restarted")
        };
        Ok(Output {
            copying: [
                sub(self.copying[0], before.copying[0])?,
                sub(self.copying[1], before.copying[1])?,
            ],
            loopguard: [
                sub(self.loopguard[0], before.loopguard[0])?,
                sub(self.loopguard[1], before.loopguard[1])?,
            ],
            public: sub(self.public, before.public)?,
            private: sub(self.private, before.private)?,
        })
    }

    /// Compares these counts with the `copies` the workload's messages
    /// should yield: loopguard's public and private copies exactly, (b2)'s
    /// messages with (c1)'s exactly and their bytes within 1%.
    fn check(
        &self,
        copies: impl Iterator<Item = (String, Option<String>, String)>,
    ) -> Result<String, String> {
        let (mut public, mut private) = (0, 0);
        for (subject, _, _) in copies {
            if subject.starts_with("chat.public.") {
                public += 1;
            } else if subject.starts_with("chat.private.") {
                private += 1;
            }
        }
        let ([b2, b2_bytes], [c1, c1_bytes]) = (self.copying, self.loopguard);
        let said = format!(
            "(b2) published {b2} messages ({b2_bytes} bytes), (c1) {c1} ({c1_bytes} bytes); \
             (c1) sent {} public and {} private copies, the workload {public} and {private}",
            self.public, self.private
        );
        if b2 != c1
            || b2_bytes.abs_diff(c1_bytes) * 100 > c1_bytes
            || (self.public, self.private) != (public, private)
        {
            return Err(said);
        }
        Ok(said)
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
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
        monitor,
    } = nats::start(dir.path()).await?;

    let mut rows = Vec::new();
    // BENCH_ONLY=b,c1 measures a subset while iterating (the report needs all).
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    for (key, setup) in [
        ("a", Setup::Direct),
        ("a2", Setup::DirectCopies),
        ("b", Setup::BareRelay),
        ("b2", Setup::CopyRelay),
        ("c1", Setup::LoopguardQuiet),
        ("c2", Setup::LoopguardEvents),
        ("c3", Setup::LoopguardEveryRule),
    ] {
        if !only.is_empty() && !only.split(',').any(|k| k == key) {
            continue;
        }
        eprintln!("{}", setup.label());
        rows.push(measure(&url, nats.id(), setup, dir.path()).await?);
    }
    // BENCH_ONLY=pair runs it alone.
    let side = if only.is_empty() || only.split(',').any(|k| k == "pair") {
        eprintln!("(b), (b2) and (c1) side by side");
        Some(paired_cpu(&url, &monitor, dir.path()).await?)
    } else {
        None
    };
    let _ = nats.kill();

    let machine = format!(
        "{} CPUs ({}), {} GiB",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(
                |c| c.lines().find(|l| l.starts_with("model name")).map(|l| l
                    .split(':')
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .to_string())
            )
            .unwrap_or_default(),
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| m
                .lines()
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse::<u64>()
                .ok())
            .map_or(0, |kib| kib / 1024 / 1024)
    );
    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    println!("## Relay benchmark — {date}\n");
    println!("Machine: {machine}; nats-server, producer, consumer and relay share it.");
    let build = match std::env::var("LOOPGUARD_BIN") {
        Ok(bin) => {
            format!("`{bin}`, the profile-guided build of scripts/pgo.sh (as the image ships)")
        }
        Err(_) => "cargo's plain release build (no profile-guided optimisation)".to_string(),
    };
    println!("loopguard: {build}.");
    println!("Workload: {WORLDS} worlds × {AGENTS} agents, a human message after every 4 agent messages, @mentions, ~200-byte unique contents, 10% duplicates (loopguard approves ~90%). loopguard runs the contract's six rules (its own optional rules off, as by default), and in (c3) its optional rules too. Steps of {}s; sustained = loss < 0.1% and p99 < 50 ms; latency at {COMMON_RATE} msg/s.\n", STEP.as_secs());
    println!("| set-up | max sustained msg/s | p50 ms | p99 ms | p99.9 ms | relay CPU µs/msg | relay peak RSS MiB (at turn) | loopguard drops |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        // The common rate is meant to be easy for every set-up; a step that
        // failed there is marked, not hidden.
        let failed = if r.common.sustained() { "" } else { " †" };
        println!(
            "| {}{failed} | {} | {} | {} | {} | {} | {} | {} |",
            r.setup.label(),
            r.max.rate,
            ms(r.common.p50),
            ms(r.common.p99),
            ms(r.common.p999),
            r.cpu_us.map_or("—".into(), |c| format!("{c:.2}")),
            r.rss
                .map_or("—".into(), |p| format!("{:.1} ({})", p.mib, p.turns)),
            if r.setup.is_loopguard() {
                format!("{}", r.dropped as u64)
            } else {
                "—".into()
            }
        );
    }
    for r in rows.iter().filter(|r| !r.common.sustained()) {
        println!(
            "\n† {} failed at the common rate: sent {}/s of {}/s, loss {:.3}%, {} extra copies, p99 {}: its latency and CPU there are of a step it did not sustain.",
            r.setup.label(),
            r.common.rate,
            r.common.offered,
            r.common.loss * 100.0,
            r.common.extra,
            ms(r.common.p99)
        );
    }
    println!();
    println!("Peak RSS is the kernel's high-water mark over the relay's whole life (VmHWM), warm-up and failed steps included; the turn in brackets is how many messages each world had been sent by its last step: loopguard keeps each world's recent history, so its memory grows with the turns, not with the rate.");
    let get = |s: Setup| rows.iter().find(|r| r.setup == s);
    // A subset (BENCH_ONLY) has no ratios.
    if let (Some(b), Some(c1), Some(c2)) = (
        get(Setup::BareRelay),
        get(Setup::LoopguardQuiet),
        get(Setup::LoopguardEvents),
    ) {
        println!();
        println!("| ratio | value | target |");
        println!("|---|---:|---|");
        println!(
            "| (c1)/(b) sustained rate | {:.2} | ≥ 0.90 |",
            c1.max.rate as f64 / b.max.rate as f64
        );
        println!(
            "| (c2)/(b) sustained rate | {:.2} | ≥ 0.60 |",
            c2.max.rate as f64 / b.max.rate as f64
        );
        if let Some(a2) = get(Setup::DirectCopies) {
            println!(
                "| (a2)/(b) sustained rate: (c1)'s copies published straight, a rough ceiling | {:.2} | — |",
                a2.max.rate as f64 / b.max.rate as f64
            );
        }
        let b2 = get(Setup::CopyRelay);
        if let Some(b2) = b2 {
            println!(
                "| (b2)/(b) sustained rate: a relay publishing (c1)'s copies, no decisions | {:.2} | — |",
                b2.max.rate as f64 / b.max.rate as f64
            );
        }
        if let (Some(x), Some(y)) = (c1.cpu_us, b.cpu_us) {
            println!("| (c1)/(b) CPU per message | {:.2} | ≤ 1.5 |", x / y);
        }
        if let Some((x, y)) = b2.and_then(|b2| b2.cpu_us.zip(b.cpu_us)) {
            println!(
                "| (b2)/(b) CPU per message: the cost of (c1)'s output alone | {:.2} | — |",
                x / y
            );
        }
        if let (Some(x), Some(y)) = (c2.cpu_us, b.cpu_us) {
            println!("| (c2)/(b) CPU per message | {:.2} | — |", x / y);
        }
        if let Some(c3) = get(Setup::LoopguardEveryRule) {
            println!(
                "| (c3)/(b) sustained rate: every rule on | {:.2} | — |",
                c3.max.rate as f64 / b.max.rate as f64
            );
            if let (Some(x), Some(y)) = (c3.cpu_us, b.cpu_us) {
                println!(
                    "| (c3)/(b) CPU per message: every rule on | {:.2} | — |",
                    x / y
                );
            }
        }
    }
    if let Some(Side {
        steps: paired,
        mirrored,
    }) = &side
    {
        println!("\n### CPU per message, side by side: (b), (b2) and (c1)\n");
        println!("The three relays subscribed to the same stream at {COMMON_RATE} msg/s, so all are measured in the same seconds; {} steps of {}s after the warm-up, each measured until the three are idle again. (b2), `examples/copy_relay.rs`, publishes the copies (c1) publishes (headers, inbox copies, rejection events) with no parsing, state or rules: (b2)/(b) is what loopguard's output costs over the bare relay's, (c1)/(b2) what its parsing, state and decisions cost on top.\n", paired.len(), STEP.as_secs());
        match mirrored {
            Ok(said) => println!("Same output, checked over the steps: {said}.\n"),
            Err(said) => println!(
                "**(b2) did not mirror (c1)**, so its column is not loopguard's output: {said}.\n"
            ),
        }
        println!("| step | (b) µs/msg | (b2) µs/msg | (c1) µs/msg | (b2)/(b) | (c1)/(b2) | (c1)/(b) | (c1)/(b) target | minor page faults a message, (b) / (b2) / (c1) |");
        println!("|---|---:|---:|---:|---:|---:|---:|---|---:|");
        for (i, p) in paired.iter().enumerate() {
            println!(
                "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | ≤ 1.5 | {:.4} / {:.4} / {:.4} |",
                i + 1,
                p.bare,
                p.copying,
                p.loopguard,
                p.copying / p.bare,
                p.loopguard / p.copying,
                p.loopguard / p.bare,
                p.faults_per_message[0],
                p.faults_per_message[1],
                p.faults_per_message[2],
            );
        }
        let median = |f: &dyn Fn(&Paired) -> f64| {
            let mut v: Vec<f64> = paired.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "| median | | | | {:.2} | {:.2} | {:.2} | ≤ 1.5 | |",
            median(&|p| p.copying / p.bare),
            median(&|p| p.loopguard / p.copying),
            median(&|p| p.loopguard / p.bare)
        );
    }
    println!("\nSteps of the rate search (CPU in % of one CPU, over the step and its drain):\n");
    println!("```");
    for r in &rows {
        for step in &r.steps {
            println!("{step}");
        }
    }
    println!("```");
    // Printed above; a failed check still fails the run.
    if let Some(Side {
        mirrored: Err(said),
        ..
    }) = side
    {
        return Err(format!("(b2) did not mirror (c1): {said}").into());
    }
    Ok(())
}
