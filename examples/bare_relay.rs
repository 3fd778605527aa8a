//! The benchmark's baseline (b): the least any relay can do. Subscribes to
//! `chat.raw.>` and republishes each payload unchanged to
//! `chat.public.<world>`: one extra hop, no judgement.
//!
//! usage: bare_relay <nats-url>

use futures::StreamExt;

/// The allocator loopguard uses (set in its library), so the baseline
/// differs from loopguard by the work, not by the allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<(), async_nats::Error> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let client = async_nats::ConnectOptions::new()
        .subscription_capacity(1 << 20)
        .connect(url)
        .await?;
    let mut raw = client.subscribe("chat.raw.>").await?;
    client.flush().await?;
    eprintln!("bare relay ready");
    while let Some(m) = raw.next().await {
        // chat.raw.<world>.<kind>.<name>
        let world = m.subject.split('.').nth(2).unwrap_or("unknown");
        client
            .publish(format!("chat.public.{world}"), m.payload)
            .await?;
    }
    Ok(())
}
