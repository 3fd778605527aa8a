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
//! messages and a human's). Then busy worlds, at their caps: 200 worlds of
//! 2,000 agent messages each (the loop rules off, so all are approved), in
//! one thread or a thread for each message, with what the world cache
//! weighs each (`state.max_bytes` caps that sum) beside what it holds.

use std::process::Command;
use std::sync::Arc;

use loopguard::clock::SystemClock;
use loopguard::config::Config;
use loopguard::envelope::FallbackId;
use loopguard::judge::Judge;
use loopguard::metrics::{Metrics, Outcome};

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

/// In the child: decide `turns` messages in each of `worlds` worlds (with
/// `threads`, busy worlds: a thread for each agent message), print
/// "bytes-per-world worlds-held weight-per-world" (the warm-up worlds not
/// counted).
fn child(worlds: u64, turns: u64, threads: bool) {
    let mut c = Config::default();
    c.state.max_worlds = worlds * 2;
    c.state.max_bytes = 1 << 40; // every world held
    if turns > 5 {
        // Busy worlds: every message approved (checked below), so each
        // reaches its caps. Room for them all, and a least weight of
        // `max_bytes / max_worlds` = 1 KiB, far under a busy world's, so
        // what the cache weighs is the worlds' own footprint.
        c.state.max_worlds = 1 << 20;
        c.state.max_bytes = 1 << 30;
        c.rules.turns.max = 0;
        c.rules.depth.max = 0;
        c.rules.cooldown.seconds = 0;
        c.rules.rate.max = 0;
    }
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
    let weight_before = judge.worlds().bytes();
    let before = rss_kib();
    let mut approved = 0;
    for k in 0..turns {
        for w in 0..worlds {
            let (subject, content) = if k == 4 && turns <= 5 {
                (format!("chat.raw.w{w}.human.h"), format!("question {w}"))
            } else {
                (
                    format!("chat.raw.w{w}.agent.a{}", k % 4),
                    format!("@a{} answer {k} {w}: {filler}", (k + 1) % 4),
                )
            };
            let thread = match threads {
                true => format!(",\"thread_id\":\"t{w}-{k}\""),
                false => String::new(),
            };
            let payload = format!("{{\"id\":\"{w}-{k}\"{thread},\"content\":\"{content}\"}}");
            let decision = judge.decide(
                judge.subjects().parse(&subject),
                payload.as_bytes(),
                FallbackId::default(),
            );
            approved += usize::from(decision.is_some_and(|d| d.outcome == Outcome::Approved));
        }
    }
    if turns > 5 && approved as u64 != worlds * turns {
        eprintln!(
            "busy worlds: {approved} of {} messages approved",
            worlds * turns
        );
        std::process::exit(1);
    }
    let held = judge.worlds().len() - WARM_WORLDS;
    let after = rss_kib();
    let weight = judge.worlds().bytes() - weight_before;
    println!(
        "{} {held} {}",
        (after - before) as f64 * 1024.0 / worlds as f64,
        weight as f64 / worlds as f64
    );
}

/// Runs `child` in a process of its own: (resident bytes, weight) per world.
fn measure(program: &str, worlds: u64, turns: u64, threads: bool) -> (f64, f64) {
    let out = Command::new(program)
        .args(["--child", &worlds.to_string(), &turns.to_string()])
        .args(threads.then_some("threads"))
        .output()
        .expect("run the measuring child");
    let text = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<&str> = text.split_whitespace().collect();
    let [bytes, held, weight] = fields[..] else {
        eprintln!("child failed: {}", String::from_utf8_lossy(&out.stderr));
        std::process::exit(1);
    };
    assert_eq!(held, worlds.to_string(), "every world is held");
    let number = |f: &str| f.parse().unwrap_or(f64::NAN);
    (number(bytes), number(weight))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list" || a == "--test") {
        return; // `cargo test --benches` probes; nothing to run.
    }
    if let [_, flag, worlds, turns, rest @ ..] = args.as_slice() {
        if flag == "--child" {
            child(
                worlds.parse().expect("worlds"),
                turns.parse().expect("turns"),
                rest.iter().any(|a| a == "threads"),
            );
            return;
        }
    }
    println!("| idle worlds | messages per world | resident bytes per world | target |");
    println!("|---:|---:|---:|---|");
    for turns in [1, 5] {
        for worlds in [100_000u64, 1_000_000] {
            let (bytes, _) = measure(&args[0], worlds, turns, false);
            println!(
                "| {worlds} | {turns} | {bytes:.0} | {} |",
                if turns == 1 { "≤ 1024" } else { "—" }
            );
        }
    }
    println!();
    println!("| busy worlds | messages per world | threads | resident KiB per world | weighed KiB per world |");
    println!("|---:|---:|---|---:|---:|");
    for threads in [false, true] {
        let (worlds, turns) = (200, 2_000);
        let (bytes, weight) = measure(&args[0], worlds, turns, threads);
        println!(
            "| {worlds} | {turns} | {} | {:.0} | {:.0} |",
            if threads { "one a message" } else { "one" },
            bytes / 1024.0,
            weight / 1024.0
        );
    }
}
