//! What the relay benchmark's baseline relays share (examples/bare_relay.rs,
//! (b), and examples/copy_relay.rs, (b2)): the client as loopguard sets it
//! up, so they differ from each other and from loopguard by their work, not
//! by their NATS client.

/// Connects to the NATS URL given as the first argument (default
/// `nats://127.0.0.1:4222`) as `name`, the connection name the benchmark
/// finds the relay by in the server's `/connz`, and subscribes to
/// `chat.raw.>`.
pub async fn subscribe_raw(
    name: &str,
) -> Result<(async_nats::Client, async_nats::Subscriber), async_nats::Error> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let client = async_nats::ConnectOptions::new()
        .name(name)
        // As the benchmark configures loopguard (`nats.subscription_capacity`).
        .subscription_capacity(1 << 20)
        // As loopguard: no scan of each publish subject for whitespace.
        .skip_subject_validation(true)
        .connect(url)
        .await?;
    let raw = client.subscribe("chat.raw.>").await?;
    client.flush().await?;
    eprintln!("{name} ready");
    Ok((client, raw))
}
