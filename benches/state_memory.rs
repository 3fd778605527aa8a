//! Memory per idle world, in process: a judge decides messages for N unique
//! worlds (100,000 and 1,000,000) and the growth of resident memory is
//! divided by N. No NATS, so no client buffers in the figure: only what the
//! state holds (moka's entry, the world's state, its remembered message).
//!
//!   cargo bench --bench state_memory
//!
//! Each size runs in a child process of its own, so one measurement's freed
//! pages cannot flatter the next. Two shapes of idle world: one that saw a
//! single agent message, and one that saw a short conversation (four agent
//! messages and a human's).

use std::process::Command;
use std::sync::Arc;

use loopguard::clock::SystemClock;
use loopguard::config::Config;
use loopguard::envelope::FallbackId;
use loopguard::judge::Judge;
use loopguard::metrics::Metrics;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

const WARM_WORLDS: u64 = 1000;

/// In the child: decide `turns` messages in each of `worlds` worlds, print
/// "bytes-per-world worlds-held" (the warm-up worlds not counted).
fn child(worlds: u64, turns: u64) {
    let mut c = Config::default();
    c.state.max_worlds = worlds * 2;
    c.state.max_bytes = 1 << 40; // every world held
    let judge = Judge::new(
        Arc::new(c.validate().expect("default config is valid")),
        Arc::new(SystemClock),
        Metrics::new(),
    );
    let filler = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua";
    // Warm the allocator and the judge's buffers before the baseline.
    for i in 0..WARM_WORLDS {
        let subject = format!("chat.raw.warm{i}.agent.a");
        let payload = format!("{{\"id\":\"{i}\",\"content\":\"{filler}\"}}");
        judge.decide(
            judge.subjects().parse(&subject),
            payload.as_bytes(),
            FallbackId::default(),
        );
    }
    judge.worlds().len();
    let before = rss_kib();
    for k in 0..turns {
        for w in 0..worlds {
            let (subject, content) = if k == 4 {
                (format!("chat.raw.w{w}.human.h"), format!("question {w}"))
            } else {
                (
                    format!("chat.raw.w{w}.agent.a{}", k % 4),
                    format!("@a{} answer {k} {w}: {filler}", (k + 1) % 4),
                )
            };
            let payload = format!("{{\"id\":\"{w}-{k}\",\"content\":\"{content}\"}}");
            judge.decide(
                judge.subjects().parse(&subject),
                payload.as_bytes(),
                FallbackId::default(),
            );
        }
    }
    let held = judge.worlds().len() - WARM_WORLDS;
    let after = rss_kib();
    println!(
        "{} {held}",
        (after - before) as f64 * 1024.0 / worlds as f64
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list" || a == "--test") {
        return; // `cargo test --benches` probes; nothing to run.
    }
    if let [_, flag, worlds, turns] = args.as_slice() {
        if flag == "--child" {
            child(
                worlds.parse().expect("worlds"),
                turns.parse().expect("turns"),
            );
            return;
        }
    }
    println!("| idle worlds | messages per world | resident bytes per world | target |");
    println!("|---:|---:|---:|---|");
    for turns in [1, 5] {
        for worlds in [100_000u64, 1_000_000] {
            let out = Command::new(&args[0])
                .args(["--child", &worlds.to_string(), &turns.to_string()])
                .output()
                .expect("run the measuring child");
            let text = String::from_utf8_lossy(&out.stdout);
            let mut fields = text.split_whitespace();
            let (Some(bytes), Some(held)) = (fields.next(), fields.next()) else {
                eprintln!("child failed: {}", String::from_utf8_lossy(&out.stderr));
                std::process::exit(1);
            };
            let bytes: f64 = bytes.parse().unwrap_or(f64::NAN);
            assert_eq!(held, worlds.to_string(), "every world is held");
            println!(
                "| {worlds} | {turns} | {bytes:.0} | {} |",
                if turns == 1 { "≤ 1024" } else { "—" }
            );
        }
    }
}
