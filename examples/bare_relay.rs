//! The benchmark's baseline (b): the least any relay can do. Subscribes to
//! `chat.raw.>` and republishes each payload unchanged to
//! `chat.public.<world>`: one extra hop, no judgement.
//!
//! usage: bare_relay <nats-url>

use futures::StreamExt;

#[path = "../benches/shared/baseline.rs"]
mod baseline;

/// The allocator loopguard uses (set in its library), so the baseline
/// differs from loopguard by the work, not by the allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One runtime thread, as loopguard runs by default (`runtime.threads = 1`),
/// so the baseline differs by the work, not by the runtime either. Until
/// 2026-11-22 this was `#[tokio::main]`'s multi-threaded runtime, whose
/// hand-offs between threads cost more than the relaying: 5.3-6.0 µs of
/// CPU per message at 20k msg/s, against 2.2-2.8 µs on one thread.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), async_nats::Error> {
    let (client, mut raw) = baseline::subscribe_raw("bare_relay").await?;
    while let Some(m) = raw.next().await {
        // chat.raw.<world>.<kind>.<name>
        let world = m.subject.split('.').nth(2).unwrap_or("unknown");
        client
            .publish(format!("chat.public.{world}"), m.payload)
            .await?;
    }
    Ok(())
}
