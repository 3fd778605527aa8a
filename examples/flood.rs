//! `make memory`: floods a running loopguard with unique worlds, agents,
//! threads and contents, and worlds of the longest ids, and prints the
//! state it weighs (`loopguard_state_bytes`) and its resident memory after
//! each phase.
//!
//! usage: flood <nats-url> <loopguard-pid> <loopguard-http-addr> <max_worlds>
//!
//! Each phase waits until loopguard has decided everything sent (its
//! `loopguard_messages_total` catches up), then reads VmRSS from /proc, and
//! what the phase cost loopguard a message: CPU time and minor page faults
//! (a page the process touched for the first time since it had it, or since
//! the allocator gave it back to the kernel).

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Error = Box<dyn std::error::Error + Send + Sync>;

fn rss_kib(pid: u32) -> Result<u64, Error> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or("no VmRSS")?;
    Ok(line.split_whitespace().nth(1).ok_or("bad VmRSS")?.parse()?)
}

/// loopguard's minor page faults and CPU time (user + system, in the
/// kernel's 10 ms ticks) so far, all its threads (proc(5)).
fn faults_and_ticks(pid: u32) -> Result<(u64, u64), Error> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command's closing bracket start at the third.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .ok_or("bad /proc/<pid>/stat")?
        .1
        .split_whitespace()
        .collect();
    let field = |n: usize| -> Result<u64, Error> {
        Ok(fields.get(n - 3).ok_or("short /proc/<pid>/stat")?.parse()?)
    };
    Ok((field(10)?, field(14)? + field(15)?))
}

/// Clock ticks a second (`CLK_TCK`), as /proc counts CPU time.
const TICKS_PER_SECOND: f64 = 100.0;

async fn metrics(addr: &str) -> Result<String, Error> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut body = String::new();
    s.read_to_string(&mut body).await?;
    Ok(body)
}

/// Sum of the series of `name` (any labels).
fn total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with(name)
                && (l[name.len()..].starts_with('{') || l[name.len()..].starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

struct Flood {
    client: async_nats::Client,
    pid: u32,
    addr: String,
    sent: u64,
    /// Decisions expected so far (joins make none; their phases end with a
    /// barrier that does).
    expected: u64,
    started: Instant,
    /// loopguard's page faults and CPU ticks at the end of the last phase.
    costs: (u64, u64),
}

impl Flood {
    /// Sends `n` messages made by `make`, then waits until loopguard decided
    /// them. `joins` phases send joins, which are followed by a barrier: an
    /// invalid join into the same world, decided after every join before it.
    async fn phase(
        &mut self,
        label: &str,
        n: u64,
        joins: Option<&str>,
        make: impl Fn(u64) -> (String, String),
    ) -> Result<(), Error> {
        for i in 0..n {
            let (subject, payload) = make(i);
            self.client.publish(subject, payload.into()).await?;
            // Keep at most ~20k in flight, so the flood measures state, not
            // buffers.
            if i % 5_000 == 4_999 {
                match joins {
                    Some(world) => {
                        self.join_barrier(world).await?;
                        self.client.flush().await?;
                        self.wait_decided(self.expected).await?;
                    }
                    None => {
                        self.client.flush().await?;
                        self.wait_decided((self.expected + i + 1).saturating_sub(20_000))
                            .await?;
                    }
                }
            }
        }
        match joins {
            Some(world) => self.join_barrier(world).await?,
            None => self.expected += n,
        }
        self.client.flush().await?;
        self.sent += n;
        self.wait_decided(self.expected).await?;
        let m = metrics(&self.addr).await?;
        let costs = faults_and_ticks(self.pid)?;
        let (faults, ticks) = (costs.0 - self.costs.0, costs.1 - self.costs.1);
        self.costs = costs;
        // Per message only over enough of them (a tick is 10 ms).
        let (cpu, faults) = match n {
            0..1000 => ("—".to_string(), "—".to_string()),
            _ => (
                format!("{:.1}", ticks as f64 / TICKS_PER_SECOND * 1e6 / n as f64),
                format!("{:.3}", faults as f64 / n as f64),
            ),
        };
        println!(
            "| {label:<44} | {:>9} | {:>8} | {:>9.1} | {:>8.1} | {:>6.1}s | {cpu:>10} | {faults:>12} |",
            self.sent,
            total(&m, "loopguard_worlds"),
            total(&m, "loopguard_state_bytes") / 1048576.0,
            rss_kib(self.pid)? as f64 / 1024.0,
            self.started.elapsed().as_secs_f64(),
        );
        Ok(())
    }

    /// An invalid join into `world`: decided (and counted) after every join
    /// sent before it.
    async fn join_barrier(&mut self, world: &str) -> Result<(), Error> {
        self.client
            .publish(format!("chat.join.{world}.barrier.x"), "".into())
            .await?;
        self.expected += 1;
        Ok(())
    }

    /// Waits until loopguard decided at least `target` messages (drops count
    /// as decided: they will never be).
    async fn wait_decided(&self, target: u64) -> Result<(), Error> {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let m = metrics(&self.addr).await?;
            let done = total(&m, "loopguard_decision_duration_seconds_count")
                + total(&m, "loopguard_dropped_total");
            if done as u64 >= target {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("loopguard decided {done} of {target}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, pid, addr, max_worlds] = args.as_slice() else {
        return Err(
            "usage: flood <nats-url> <loopguard-pid> <loopguard-http-addr> <max_worlds>".into(),
        );
    };
    let max_worlds: u64 = max_worlds.parse()?;
    let mut f = Flood {
        client: async_nats::connect(url.as_str()).await?,
        pid: pid.parse()?,
        addr: addr.clone(),
        sent: 0,
        expected: 0,
        started: Instant::now(),
        costs: (0, 0),
    };
    f.costs = faults_and_ticks(f.pid)?;
    println!(
        "| {:<44} | {:>9} | {:>8} | {:>9} | {:>8} | {:>7} | {:>10} | {:>12} |",
        "phase", "messages", "worlds", "state MiB", "RSS MiB", "time", "CPU µs/msg", "faults a msg"
    );
    println!(
        "|{}|{}:|{}:|{}:|{}:|{}:|{}:|{}:|",
        "-".repeat(46),
        "-".repeat(10),
        "-".repeat(9),
        "-".repeat(10),
        "-".repeat(9),
        "-".repeat(8),
        "-".repeat(11),
        "-".repeat(13)
    );
    f.phase("start (one message)", 1, None, |_| {
        ("chat.raw.w0.human.h".into(), "hi".into())
    })
    .await?;
    let mut worlds_sent = 0;
    for multiple in [1, 2, 5, 10, 20, 50] {
        let target = multiple * max_worlds;
        let base = worlds_sent;
        f.phase(
            &format!("unique worlds: {multiple}x max_worlds"),
            target - base,
            None,
            move |i| {
                (
                    format!("chat.raw.world{}.agent.a", base + i),
                    format!("message {}", base + i),
                )
            },
        )
        .await?;
        worlds_sent = target;
    }
    for agents in [10_000u64, 50_000, 100_000] {
        f.phase(
            &format!("one world, {agents} unique agents (joins)"),
            agents,
            Some("crowd"),
            |i| (format!("chat.join.crowd.agent{i}"), String::new()),
        )
        .await?;
    }
    f.phase("one world, 100000 unique threads", 100_000, None, |i| {
        (
            "chat.raw.threads.human.h".into(),
            format!("{{\"content\":\"t{i}\",\"id\":\"id{i}\",\"thread_id\":\"thread{i}\"}}"),
        )
    })
    .await?;
    f.phase("one world, 100000 unique contents", 100_000, None, |i| {
        (
            "chat.raw.contents.human.h".into(),
            format!("unique content number {i}"),
        )
    })
    .await?;
    // Worlds as large as a client can make them: human messages (always
    // approved) with 256-byte ids and thread ids, each held until a world's
    // 1024 remembered messages. state.max_bytes bounds them, not max_worlds.
    let mut long_sent = 0;
    for total in [250_000u64, 500_000, 1_000_000, 2_000_000] {
        let base = long_sent;
        f.phase(
            &format!("1000 worlds, 256-byte ids: {total} messages"),
            total - base,
            None,
            move |i| {
                let n = base + i;
                (
                    format!("chat.raw.long{}.human.h", n % 1000),
                    format!(
                        "{{\"content\":\"hi\",\"id\":\"{n:0>256}\",\"thread_id\":\"{:0>256}\"}}",
                        n + 1
                    ),
                )
            },
        )
        .await?;
        long_sent = total;
    }
    Ok(())
}
