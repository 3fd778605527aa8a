//! loopguard: a NATS sidecar that stops multi-agent chat loops at the bus.
//!
//! # Layout
//!
//! The path of a message is the architecture:
//!
//! - [`ingest`]: core subscriptions or a JetStream consumer; hands each
//!   message to the worker that owns its world (per-world order lives here).
//!   A worker asks the optional policy service before publishing.
//! - [`subject`]: parses ingress subjects into an [`subject::Origin`]; the only
//!   place subjects are built, from validated [`names`] only.
//! - [`judge`]: one message in, one [`judge::Decision`] out, synchronously
//!   (`Judge::decide`):
//!   - [`envelope`]: payload bytes → content, ids and kept fields;
//!   - [`state`]: per-world state in a bounded moka cache (roster, turns,
//!     lineage, windows);
//!   - `pass` first (an edit, not a rule: `rules::pass`), then [`rules`]:
//!     the loop rules, one per file — the contract's `turns`, `depth`,
//!     `duplicate`, `cooldown`, `rate`, then `alternation`, `similar`,
//!     `low_content`, `budget`, `concluded` — with [`normalize`] for the
//!     text they compare;
//!   - [`routing`]: public transcript or inboxes, from [`mentions`];
//!   - [`json`]: the copies and events written straight into a buffer.
//!
//!   A decision the policy service must confirm waits for its answer
//!   (`ingest::Worker` asks through [`publish`]), then `Judge::finish`
//!   completes it.
//! - [`events`]: the one place a decision is logged, counted ([`metrics`]) and
//!   turned into its event.
//! - [`publish`]: sends the decided copies, notice and event to NATS, and
//!   asks the policy service ([`breaker`]: not while it does not answer).
//! - [`admin`]: HTTP — `/metrics`, `/healthz`, `/readyz`, the world view and
//!   reset, an agent's context.
//! - [`app`]: wiring, start-up and the graceful drain; [`shutdown`]: signals.
//! - [`config`]: the TOML file and `LOOPGUARD__…` overrides, validated whole.
//! - [`clock`]: injected time, so rules are tested without sleeping, and
//!   [`clock::Stamp`], the 8-byte time world state keeps;
//!   `fault` (debug builds only): the faults tests inject, by environment.
#![forbid(unsafe_code)]

/// The allocator of every binary built on this crate — the sidecar, its
/// tests and its benchmarks, so the benchmarks measure what ships. mimalloc,
/// not the system's: loopguard's heap is millions of small, short-lived
/// allocations beside long-lived per-world state, and under that mix glibc's
/// free lists fragmented until `malloc` and `free` took a fifth of the CPU
/// and the sustained rate fell by a third (docs/benchmarks.md). Built
/// without transparent huge pages (the `no_thp` feature): faulting in 2 MiB
/// pages as state grew stalled messages for milliseconds (p99 at 20k msg/s
/// 4-5 ms with them, 1.1-1.7 ms without).
///
/// Fuzz builds (`cargo fuzz` sets `cfg(fuzzing)`) keep the system allocator,
/// which the sanitizers instrument.
#[cfg(not(fuzzing))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod admin;
pub mod app;
pub mod breaker;
pub mod clock;
pub mod config;
pub mod envelope;
pub mod events;
#[cfg(debug_assertions)]
mod fault;
pub mod ingest;
pub mod json;
pub mod judge;
pub mod mentions;
pub mod metrics;
pub mod names;
pub mod normalize;
pub mod publish;
pub mod routing;
pub mod rules;
pub mod shutdown;
pub mod state;
pub mod subject;
