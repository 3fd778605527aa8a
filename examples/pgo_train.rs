//! The training run of loopguard's profile-guided build (scripts/pgo.sh):
//! publishes the relay benchmark's workload to a running loopguard, so the
//! instrumented binary records where a real deployment spends its time —
//! the decision, the NATS client, the publish path — and the optimised build
//! lays out and inlines for that.
//!
//! usage: pgo_train <nats-url> <messages> <rate per second>
//!
//! Waits until loopguard answers (a system message comes back on the public
//! transcript), then sends open-loop at the given rate and flushes.

use std::time::{Duration, Instant};

#[path = "../benches/shared/workload.rs"]
#[allow(dead_code)] // the relays' half of it is the benchmark's
mod workload;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, messages, rate] = args.as_slice() else {
        return Err("usage: pgo_train <nats-url> <messages> <rate per second>".into());
    };
    let (messages, rate): (u64, u64) = (messages.parse()?, rate.parse()?);
    if rate == 0 {
        return Err("the rate must be at least 1 message per second".into());
    }
    let client = async_nats::connect(url.as_str()).await?;

    let (subject, echo) = ("chat.raw.pgo-train.system.trainer", "chat.public.pgo-train");
    if !workload::until_echoed(&client, subject, echo, 1, Duration::from_secs(30)).await? {
        return Err("loopguard did not answer within 30 s".into());
    }

    // Open loop, in batches every millisecond.
    let started = Instant::now();
    let mut sent = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    while sent < messages {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due.min(messages) {
            let (subject, _, payload, _) = workload::message(sent);
            client.publish(subject, payload.into()).await?;
            sent += 1;
        }
    }
    client.flush().await?;
    println!(
        "pgo_train: sent {sent} messages in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
