//! The judge: one ingress message in, one [`Decision`] out, synchronously.
//!
//! This is where a message is parsed (`envelope`), placed in its world
//! (`state`), judged (`rules`), routed (`routing`) and serialised into the
//! exact bytes to publish. No I/O happens here, so the whole decision can be
//! tested and benchmarked in process; `publish` sends what it returns.

use std::borrow::Cow;
use std::cell::RefCell;
use std::hash::BuildHasher;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use bytes::Bytes;
use serde::Serialize;
use serde_json::{Map, Value};
use smol_str::SmolStr;

use crate::clock::{rfc3339, Clock, Rfc3339, Stamp};
use crate::config::{ConfigError, FailMode, Mode, Settings};
use crate::envelope::{self, EnvelopeError, FallbackId};
use crate::events;
use crate::json;
use crate::metrics::{Handoff, Metrics, Outcome};
use crate::names::{Name, MAX_NAME_LEN};
use crate::normalize::{normalize_into, substance_into};
use crate::routing::{self, Route, Visibility};
use crate::rules::{self, pass, Candidate, Context, Rejection, RuleName};
use crate::state::{self, Approved, ContextEntry, Lineage, WorldState, Worlds};
use crate::subject::{Origin, SenderKind, Subjects};

/// Namespace of the name-based UUIDs used as `Nats-Msg-Id`s, so one ingress
/// message always yields the same ids, whichever process decides it.
const MSG_ID_NAMESPACE: uuid::Uuid = uuid::uuid!("6f1c2a4e-9b1d-4c57-8a0e-6c6f6f706775");

/// Sender name of the notices loopguard itself publishes.
pub const LOOPGUARD_SENDER: &str = "loopguard";

/// One message to publish.
#[derive(Debug, Clone)]
pub struct Outbound {
    pub subject: String,
    /// `Nats-Msg-Id` header: unique per copy, stable across reprocessing.
    pub msg_id: Option<String>,
    pub payload: Bytes,
    /// Where `loopguard_deliveries_total` counts the copy once it is
    /// published (contract §3): the transcript (notices included) or an
    /// inbox. `None` for events and policy requests.
    pub delivery: Option<Visibility>,
}

/// Everything decided about one ingress message.
#[derive(Debug, Clone)]
pub struct Decision {
    /// The world, when the subject named a valid one (`None`: no event, the
    /// rejection is only counted and logged; contract §1).
    pub world: Option<Name>,
    /// The sender's kind, when the subject named a valid one.
    pub kind: Option<SenderKind>,
    /// The sender's canonical name, or the defused token of an invalid one.
    pub sender: SmolStr,
    /// The message's id: its own, or one loopguard made (contract §3).
    pub id: String,
    pub outcome: Outcome,
    /// The rule that rejected or edited the message, if one did.
    pub rule: Option<RuleName>,
    /// A sentence a person can read, for the event and the log line.
    pub reason: Cow<'static, str>,
    /// Observe mode: the rule that would have rejected an approved message.
    pub would_reject: Option<RuleName>,
    /// The message's computed reply depth (set on rejections too).
    pub depth: u32,
    /// The world's agent-turn count this message has, or would have had;
    /// 0 for human and system messages.
    pub turn: u32,
    /// Where the copies went (the event's field).
    pub delivered_to: DeliveredTo,
    /// Control handed to a human (a pass, or the turn limit's notice):
    /// counted in `loopguard_handoffs_total`.
    pub handoff: Option<Handoff>,
    /// Egress copies, then any notice, then the event: in publish order.
    pub outbound: Vec<Outbound>,
    /// Set when the policy hook must be asked before this decision is final
    /// (see `finish`); not yet reported.
    pub policy: Option<PolicyCheck>,
    /// When loopguard decided, as the event writes it.
    pub observed_at: Rfc3339,
}

impl Decision {
    fn rejected(
        origin_world: Option<Name>,
        kind: Option<SenderKind>,
        sender: SmolStr,
        id: String,
        rule: RuleName,
        reason: impl Into<Cow<'static, str>>,
        observed_at: Rfc3339,
    ) -> Decision {
        Decision {
            world: origin_world,
            kind,
            sender,
            id,
            outcome: Outcome::Rejected,
            rule: Some(rule),
            reason: reason.into(),
            would_reject: None,
            depth: 0,
            turn: 0,
            delivered_to: DeliveredTo::default(),
            handoff: None,
            outbound: Vec::new(),
            policy: None,
            observed_at,
        }
    }
}

/// Where an approved message's copies went: the event's `delivered_to`,
/// `public` and then `private.<agent>` for each inbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveredTo {
    pub public: bool,
    pub inboxes: Vec<Name>,
}

impl DeliveredTo {
    /// Each entry as the event writes it, in two parts.
    pub fn entries(&self) -> impl Iterator<Item = [&str; 2]> {
        let public = self.public.then_some(["public", ""]);
        let private = self.inboxes.iter().map(|a| ["private.", a.as_str()]);
        public.into_iter().chain(private)
    }
}

/// A pending question to the policy service.
#[derive(Debug, Clone)]
pub struct PolicyCheck {
    pub subject: String,
    pub timeout: std::time::Duration,
    pub fail: FailMode,
    /// Timeouts in a row after which the subject rests
    /// (`rules.policy.trip_after`).
    pub trip_after: u32,
    /// The message as it would be delivered (its egress JSON).
    pub request: Bytes,
    pub pending: Box<Pending>,
}

/// Everything a delivered message changes in its world, applied at once by
/// [`commit`]: right away, or once the policy service approved.
#[derive(Debug, Clone)]
struct Effects {
    /// An approved agent message: the world's turn count goes up by one.
    /// Added at commit, not set to the count the message was judged at: a
    /// reset while the policy hook answered (`POST …/reset`) stays a reset.
    takes_turn: bool,
    /// Content words for `similar` (none for an edited pass).
    words: Option<rules::similar::Words>,
    /// The id as the world remembers it: a thread's first message shares
    /// its thread's string.
    id: Arc<str>,
    lineage: Lineage,
    content_hash: u64,
    now: Stamp,
    /// The sending agent and how many approval times to keep for it.
    agent: Option<(Name, usize)>,
    kind: SenderKind,
    sender: Name,
    concludes: bool,
    /// How far back the conversation state looks (two of its windows).
    activity_keep: std::time::Duration,
    /// Where the message went: the agents it mentioned (not a broadcast's)
    /// for the conversation state; its inboxes for the context entry.
    route: Route,
    /// For the context route's entry: the sending agent, the egress JSON,
    /// and how many entries to keep.
    context: Option<(Option<Name>, Bytes, usize)>,
}

fn commit(w: &mut WorldState, e: Effects) {
    if e.takes_turn {
        w.turns = w.turns.saturating_add(1);
    }
    if let Some(words) = e.words {
        w.remember_words(e.now, words);
    }
    w.record_approved(Approved {
        id: &e.id,
        lineage: &e.lineage,
        content_hash: e.content_hash,
        now: e.now,
        agent: e.agent.as_ref().map(|(a, keep)| (a, *keep)),
        takes_turn: e.takes_turn,
    });
    w.forget_activity_older_than(e.now, e.activity_keep);
    w.observe_conversation(e.kind, &e.sender, e.concludes, e.route.mentions(), e.now);
    if let Some((agent_sender, body, keep)) = e.context {
        let entry = ContextEntry {
            agent_sender,
            inboxes: e.route.inboxes,
            body,
        };
        w.remember_context(entry, keep);
    }
}

/// A decision's state changes, held until the policy service answers.
#[derive(Debug, Clone)]
pub struct Pending {
    world: state::WorldHandle,
    effects: Effects,
    /// The settings the decision was made with (a reload may come between).
    settings: Arc<Settings>,
    /// Keeps the world within the admin API's reach meanwhile.
    waiting: state::Waiting,
}

/// What the policy service said, or why it said nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyOutcome {
    Approve,
    Reject(String),
    Failed { failure: PolicyFailure, why: String },
}

/// Why the policy service gave no answer (a label of
/// `loopguard_policy_requests_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyFailure {
    /// None within `timeout_ms`.
    Timeout,
    /// No responders, or an answer that is not one.
    Error,
    /// Not asked: it did not answer the last questions
    /// ([`crate::breaker`]), or, in core mode, the shutdown's grace period
    /// was over when the question was due (the contract counts both as
    /// `skipped`).
    Skipped,
}

/// The egress payload (contract §4): the ingress fields plus loopguard's.
struct Egress<'a> {
    fields: &'a Map<String, Value>,
    id: &'a str,
    world: &'a Name,
    sender: &'a str,
    sender_kind: SenderKind,
    content: &'a str,
    thread_id: &'a str,
    parent_id: Option<&'a str>,
    depth: u32,
    mentions: &'a [Name],
    visibility: &'static str,
    received_at: &'a str,
    /// Set on notices only.
    reason: Option<&'static str>,
}

impl Egress<'_> {
    /// The JSON body: loopguard's fields first, then the ingress ones.
    fn to_json(&self) -> Bytes {
        let mut o = json::Object::with_capacity(256 + self.content.len());
        // loopguard's keys first: serde_json reads an object whose first key
        // is one of its markers (`$serde_json::private::Number`) as that
        // marker, so a sender's field of that name, sorted first, made the
        // copy unreadable to a reader with `arbitrary_precision`.
        o.str("id", self.id)
            .str("world", self.world.as_str())
            .str("sender", self.sender)
            .str("sender_kind", self.sender_kind.as_str())
            .str("content", self.content)
            .str("thread_id", self.thread_id)
            .opt_str("parent_id", self.parent_id)
            .u32("depth", self.depth)
            .strs("mentions", self.mentions)
            .str("visibility", self.visibility)
            .str("received_at", self.received_at);
        for (key, value) in self.fields {
            o.value(key, value);
        }
        if let Some(reason) = self.reason {
            o.str("reason", reason);
        }
        o.finish()
    }
}

/// Keys loopguard sets on every egress copy; ingress copies of them are
/// dropped. (`reason` is set on notices only, so an ingress `reason` stays.)
const EGRESS_KEYS: [&str; 11] = [
    "id",
    "world",
    "sender",
    "sender_kind",
    "content",
    "thread_id",
    "parent_id",
    "depth",
    "mentions",
    "visibility",
    "received_at",
];

/// Decides messages. Shared by every worker; per-world exclusion is the
/// world's own lock (see `state`).
pub struct Judge {
    /// Swapped whole by a configuration reload; read once per decision.
    settings: RwLock<Arc<Settings>>,
    /// `state.context_messages`, fixed at start-up like the other `state` keys.
    context_messages: usize,
    worlds: Worlds,
    subjects: Subjects,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    /// Hashes normalised contents for the duplicate window; random per
    /// process, so contents cannot be crafted to collide.
    hasher: std::collections::hash_map::RandomState,
}

impl Judge {
    pub fn new(settings: Arc<Settings>, clock: Arc<dyn Clock>, metrics: Metrics) -> Judge {
        Judge {
            worlds: Worlds::new(&settings, metrics.evicted.clone()),
            context_messages: settings.config.state.context_messages,
            subjects: Subjects::new(&settings.config.nats.prefix),
            settings: RwLock::new(settings),
            clock,
            metrics,
            hasher: Default::default(),
        }
    }

    /// The settings in force now.
    pub fn settings(&self) -> Arc<Settings> {
        self.settings
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The settings in force now, if a reload replaced `read` since (no
    /// count of references taken otherwise: a decision asks this once).
    fn settings_since(&self, read: &Arc<Settings>) -> Option<Arc<Settings>> {
        let now = self.settings.read().unwrap_or_else(|p| p.into_inner());
        (!Arc::ptr_eq(&now, read)).then(|| now.clone())
    }

    /// Applies a reloaded configuration from the next decision on: rules,
    /// per-world overrides, mode, events, limits and conversation. Returns
    /// the sections that differ from those running but only take effect
    /// after a restart; those keep their running values here, so the next
    /// reload is compared with what runs, not with the last file read.
    /// Refused (the running settings stay) when a policy subject would be
    /// among the running prefix's subjects, from a file that also changes
    /// `nats.prefix`.
    pub fn reload(&self, mut new: Settings) -> Result<Vec<&'static str>, ConfigError> {
        let old = self.settings();
        let (running, read) = (&old.config, &mut new.config);
        fn differ<T: Serialize>(a: &T, b: &T) -> bool {
            serde_json::to_value(a).ok() != serde_json::to_value(b).ok()
        }
        let mut restart = Vec::new();
        // Each restart-only section: named if it differs, then kept as runs.
        macro_rules! restart_only {
            ($($section:ident),*) => {$(
                if differ(&running.$section, &read.$section) {
                    restart.push(stringify!($section));
                    read.$section = running.$section.clone();
                }
            )*};
        }
        // The file's policy subjects were checked against its own prefix;
        // they meet the running one. (Checked on the file as read, with
        // only the prefix changed: the running section's credential and
        // TLS files are not read again.)
        if read.nats.prefix != running.nats.prefix {
            let mut check = read.clone();
            check.nats.prefix.clone_from(&running.nats.prefix);
            check.validate()?;
        }
        restart_only!(nats, http, state, shutdown, log, runtime, reload);
        *self.settings.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(new);
        Ok(restart)
    }

    /// The world cache's upkeep, for a moment with nothing to decide (see
    /// [`Worlds::upkeep`]).
    pub fn upkeep(&self) {
        self.worlds.upkeep();
    }

    /// The world cache's upkeep between two decisions, when due (see
    /// [`Worlds::upkeep_between`]).
    pub fn upkeep_between(&self) {
        self.worlds.upkeep_between();
    }

    pub fn worlds(&self) -> &Worlds {
        &self.worlds
    }

    pub fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Decides one ingress message. `None` for a join, which only updates
    /// the roster and produces no event. `fallback_id` is the message's id
    /// when the payload names none: its `Nats-Msg-Id` header or, in
    /// JetStream mode, its stream position.
    pub fn decide(
        &self,
        origin: Origin,
        payload: &[u8],
        fallback_id: FallbackId<'_>,
    ) -> Option<Decision> {
        self.decide_in(origin, payload, fallback_id, false)
    }

    /// Decides a join, or a message whose subject is invalid, of a world
    /// whose messages wait behind a policy request, ahead of them (the
    /// worker holds back no more than [`crate::ingest::MAX_HELD_PER_WORLD`]
    /// of one world's): neither publishes a copy, so the order of the
    /// world's copies holds. As [`Judge::decide`], but the world is the one
    /// that waits (not looked up in the cache, nor renewed there: its
    /// answer counts as use, and a lookup meanwhile could forget a world
    /// idle past a short `state.idle_seconds` under its waiting message).
    /// Any other message is decided as `decide` would.
    pub fn decide_beside_waiting(
        &self,
        origin: Origin,
        payload: &[u8],
        fallback_id: FallbackId<'_>,
    ) -> Option<Decision> {
        self.decide_in(origin, payload, fallback_id, true)
    }

    fn decide_in(
        &self,
        origin: Origin,
        payload: &[u8],
        fallback_id: FallbackId<'_>,
        beside_waiting: bool,
    ) -> Option<Decision> {
        let started = Instant::now();
        let settings = self.settings();
        let mut decision = match origin {
            Origin::Join { world, agent } => {
                let now = self.clock.now();
                let ws = settings.world(&world);
                let waiting = beside_waiting
                    .then(|| self.worlds.get(&world, now))
                    .flatten();
                let handle = waiting.unwrap_or_else(|| self.worlds.get_or_create(&world, ws, now));
                let now = Stamp::of(now);
                let mut w = state::lock(&handle);
                // Under the lock, as a decision reads them (`decide_raw`).
                let fresh = self.settings_since(&settings);
                let settings = fresh.as_ref().unwrap_or(&settings);
                w.bring_onto(settings.world(&world), settings.config.mode, now);
                w.touch_agent(&agent, now);
                self.worlds.weigh(&world, &handle, &w);
                return None;
            }
            Origin::Invalid {
                world,
                kind,
                sender,
                reason,
            } => {
                if let Some(world) = world.as_ref().filter(|_| !beside_waiting) {
                    self.worlds
                        .renew(world, settings.world(world), self.clock.now());
                }
                // The payload is not read: the subject refuses it.
                let limit = settings.config.limits.max_payload_bytes;
                let id = rejected_id(None, fallback_id, limit);
                Decision::rejected(
                    world,
                    kind,
                    sender.into(),
                    id,
                    RuleName::Invalid,
                    reason,
                    self.observed_at(),
                )
            }
            Origin::Raw {
                world,
                kind,
                sender,
            } => {
                // The decision's own clock reading serves the rules too.
                let now = self.clock.now_at(started);
                self.decide_raw(&settings, world, kind, sender, payload, fallback_id, now)
            }
        };
        self.metrics
            .decision_duration
            .observe(started.elapsed().as_secs_f64());
        if decision.policy.is_none() {
            self.report(&mut decision, &settings);
        }
        Some(decision)
    }

    /// Rejects an agent message undecided, as rule `policy`, because
    /// `held` earlier messages of its world already wait for the policy
    /// service (the one asking, and behind it the worker's bound for one
    /// world, see `ingest::MAX_HELD_PER_WORLD`). Reads none of the world's state and
    /// changes none: a message that is not held back has no place in the
    /// world's order. One the rules could not read at all is rejected for
    /// that, as `decide` would. A pass too, though the policy service is
    /// never asked about one: held back without bound, an agent's passes
    /// could fill the worker's room and stop the intake for every world.
    /// `None` in observe mode, which rejects nothing (read here, with the
    /// limit, from one reading of the settings): it is held back, to be
    /// decided in its turn.
    pub fn shed(
        &self,
        world: &Name,
        sender: &Name,
        payload: &[u8],
        fallback_id: FallbackId<'_>,
        held: usize,
    ) -> Option<Decision> {
        let started = Instant::now();
        let settings = self.settings();
        if settings.config.mode == Mode::Observe {
            return None;
        }
        let limit = settings.config.limits.max_payload_bytes;
        let (rule, reason, id) = match envelope::parse(payload, fallback_id, limit) {
            Ok(env) => (
                RuleName::Policy,
                format!("policy check backlog: {held} earlier messages of this world wait for the policy service"),
                env.id.unwrap_or_else(new_id),
            ),
            Err(e) => (
                unreadable(&e.why),
                e.to_string(),
                rejected_id(e.id, fallback_id, limit),
            ),
        };
        if rule == RuleName::Policy {
            self.metrics.policy_backlog();
        }
        let mut d = Decision::rejected(
            Some(world.clone()),
            Some(SenderKind::Agent),
            sender.clone().into(),
            id,
            rule,
            reason,
            self.observed_at(),
        );
        // Timed as every decision is.
        self.metrics
            .decision_duration
            .observe(started.elapsed().as_secs_f64());
        self.report(&mut d, &settings);
        Some(d)
    }

    /// Logs and counts a final decision and queues its event.
    fn report(&self, d: &mut Decision, settings: &Settings) {
        if let Some(event) = events::report(d, &settings.config, &self.subjects, &self.metrics) {
            d.outbound.push(event);
        }
    }

    /// Completes a decision that waited for the policy hook: applies the
    /// answer (or the configured failure mode), then reports it.
    pub fn finish(&self, mut d: Decision, check: PolicyCheck, outcome: PolicyOutcome) -> Decision {
        let Pending {
            world,
            effects,
            settings,
            waiting,
        } = *check.pending;
        self.metrics.policy(&outcome);
        let rejection = match outcome {
            PolicyOutcome::Approve => None,
            PolicyOutcome::Reject(reason) => Some(format!("policy: {reason}")),
            PolicyOutcome::Failed { why, .. } => match check.fail {
                FailMode::Open => {
                    d.reason =
                        format!("{}; policy check failed ({why}), failing open", d.reason).into();
                    None
                }
                FailMode::Closed => Some(format!("policy check failed ({why}), failing closed")),
            },
        };
        let delivered = rejection.is_none() || settings.config.mode == Mode::Observe;
        if let Some(reason) = rejection {
            if settings.config.mode == Mode::Observe {
                d.would_reject = Some(RuleName::Policy);
                let shown = reason.strip_prefix("policy: ").unwrap_or(&reason);
                d.reason = format!("observe mode: policy would reject: {shown}").into();
            } else {
                d.outcome = Outcome::Rejected;
                d.rule = Some(RuleName::Policy);
                d.reason = reason.into();
                d.outbound.clear();
                d.delivered_to = DeliveredTo::default();
            }
        }
        {
            let mut w = state::lock(&world);
            if delivered {
                let takes_turn = effects.takes_turn;
                commit(&mut w, effects);
                if takes_turn {
                    // The count it has now: a reset while the hook answered
                    // started the count again.
                    d.turn = w.turns;
                }
            }
            if let Some(name) = &d.world {
                self.worlds.weigh(name, &world, &w);
                self.worlds.keep(name, &world, self.clock.now());
            }
        }
        // Back in the cache: `get` finds it there now.
        drop(waiting);
        self.report(&mut d, &settings);
        d
    }

    /// What the rules and the state read of a content: the hash of its
    /// normalised form, and whether it holds a conclusion phrase. The text is
    /// normalised once, into a per-thread buffer, so the hot path allocates
    /// nothing for it. With `substance`, its substance (see
    /// `normalize::substance`) is written there, from the same normalisation.
    fn content_facts(
        &self,
        content: &str,
        settings: &Settings,
        substance: Option<&mut String>,
    ) -> (u64, bool) {
        thread_local! {
            static BUFFER: RefCell<String> = const { RefCell::new(String::new()) };
        }
        BUFFER.with(|buffer| {
            let mut buffer = buffer.borrow_mut();
            buffer.clear();
            normalize_into(content, &mut buffer);
            let hash = self.hasher.hash_one(buffer.as_str());
            let concludes = settings.conclusions.found_in_normalized(&buffer);
            if let Some(substance) = substance {
                substance.reserve(buffer.len());
                substance_into(&buffer, substance);
            }
            if buffer.capacity() > 64 * 1024 {
                *buffer = String::new(); // do not keep a huge one around
            }
            (hash, concludes)
        })
    }

    fn observed_at(&self) -> Rfc3339 {
        rfc3339(self.clock.wall())
    }

    // The subject's three parts, the message's two and the time.
    #[allow(clippy::too_many_arguments)]
    fn decide_raw(
        &self,
        settings: &Arc<Settings>,
        world: Name,
        kind: SenderKind,
        sender: Name,
        payload: &[u8],
        fallback_id: FallbackId<'_>,
        now: Instant,
    ) -> Decision {
        let config = &settings.config;
        let received_at = self.observed_at();
        let mut env = match envelope::parse(payload, fallback_id, config.limits.max_payload_bytes) {
            Ok(env) => env,
            Err(e) => {
                self.worlds.renew(&world, settings.world(&world), now);
                let reason = e.to_string();
                let id = rejected_id(e.id, fallback_id, config.limits.max_payload_bytes);
                return Decision::rejected(
                    Some(world),
                    Some(kind),
                    sender.into(),
                    id,
                    unreadable(&e.why),
                    reason,
                    received_at,
                );
            }
        };
        let id = env.id.take().unwrap_or_else(new_id);
        // Most messages carry no other fields: nothing to look up then.
        env.fields
            .retain(|key, _| !EGRESS_KEYS.contains(&key.as_str()));

        let handle = self
            .worlds
            .get_or_create(&world, settings.world(&world), now);
        // The time as the world's state keeps it.
        let now = Stamp::of(now);
        let mut w = state::lock(&handle);
        // Read again under the world's lock, where every reader of it sees
        // reloads in order: settings a view or another decision brought the
        // world onto since this decision began are never undone (a view
        // that unpaused a world under a raised turn limit, undone, sent a
        // second hand-back notice for one pause).
        let fresh = self.settings_since(settings);
        let settings = fresh.as_ref().unwrap_or(settings);
        let config = &settings.config;
        let ws = settings.world(&world);
        w.bring_onto(ws, config.mode, now);
        let limits = &ws.rules;
        let is_agent = kind == SenderKind::Agent;
        if is_agent {
            w.touch_agent(&sender, now);
        }
        let lineage = w.lineage(
            &id,
            env.thread_id.as_deref(),
            env.parent_id.as_deref(),
            is_agent,
        );
        // The substance and the content words only for the optional rules
        // that read them (each costs a pass over the content).
        let mut substance = String::new();
        let (content_hash, concludes) = self.content_facts(
            &env.content,
            settings,
            limits.reads_substance().then_some(&mut substance),
        );
        let words = if limits.similar.is_on() {
            rules::similar::words(&substance)
        } else {
            rules::similar::Words::default()
        };

        let mut d = Decision {
            world: Some(world.clone()),
            kind: Some(kind),
            sender: sender.clone().into(),
            id,
            outcome: Outcome::Approved,
            rule: None,
            reason: Cow::Borrowed(""),
            would_reject: None,
            depth: lineage.depth,
            turn: 0,
            delivered_to: DeliveredTo::default(),
            handoff: None,
            outbound: Vec::new(),
            policy: None,
            observed_at: received_at,
        };

        let route = if !is_agent {
            // Human and system messages are always approved and reset turns.
            w.reset_turns();
            d.reason = Cow::Borrowed(match kind {
                SenderKind::Human => "human messages are always approved",
                _ => "system messages are always approved",
            });
            routing::route(kind, &sender, &env.content, &w, now)
        } else if pass::is_pass(&env.content) {
            w.reset_turns();
            env.content = pass::handback_content(&sender).into();
            d.outcome = Outcome::Edited;
            d.rule = Some(RuleName::Pass);
            d.handoff = Some(Handoff::Pass);
            d.reason = format!("{sender} passed control to a human; turns reset").into();
            Route::public()
        } else {
            let candidate = Candidate {
                sender: &sender,
                substance: &substance,
                parent_is_agent: lineage.parent_is_agent,
                words: &words,
                depth: lineage.depth,
                content_hash,
                now,
            };
            let failure = rules::first_failure(&Context {
                msg: &candidate,
                world: &w,
                limits,
            });
            d.turn = w.turns.saturating_add(1);
            match (failure, config.mode) {
                (Some(rejection), Mode::Enforce) => {
                    self.reject(&mut d, &mut w, &world, rejection, &lineage);
                    // Its sender may be new to the roster.
                    self.worlds.weigh(&world, &handle, &w);
                    return d;
                }
                (Some(rejection), Mode::Observe) => {
                    d.would_reject = Some(rejection.rule);
                    d.reason = format!(
                        "observe mode: {} would reject: {}",
                        rejection.rule, rejection.reason
                    )
                    .into();
                }
                (None, _) => d.reason = Cow::Borrowed("passed every rule"),
            }
            routing::route(kind, &sender, &env.content, &w, now)
        };

        let body = self.deliver(&mut d, &world, kind, &env, &lineage, &route);
        let keep = self.context_messages;
        // A pass was rewritten into the hand-back: the state keeps the facts
        // of the new content.
        let (content_hash, concludes) = if d.outcome == Outcome::Edited {
            self.content_facts(&env.content, settings, None)
        } else {
            (content_hash, concludes)
        };
        let id = if *lineage.thread_id == *d.id {
            lineage.thread_id.clone()
        } else {
            Arc::from(d.id.as_str())
        };
        let effects = Effects {
            // A pass reset the turns above and takes none.
            takes_turn: is_agent && d.outcome != Outcome::Edited,
            words: (d.outcome != Outcome::Edited).then_some(words),
            id,
            lineage,
            content_hash,
            now,
            agent: is_agent.then(|| (sender.clone(), limits.rate.max as usize)),
            kind,
            sender: sender.clone(),
            concludes,
            activity_keep: std::time::Duration::from_secs(
                2 * settings.config.conversation.window_seconds,
            ),
            // The route is done with: its list moves rather than copies.
            route,
            context: (keep > 0).then(|| (is_agent.then(|| sender.clone()), body.clone(), keep)),
        };
        let policy = &limits.policy;
        if is_agent
            && !policy.subject.is_empty()
            && d.outcome == Outcome::Approved
            && d.would_reject.is_none()
        {
            // Nothing is recorded yet: the worker decides this world's next
            // message only after the answer, so no burst can overshoot a
            // limit meanwhile, and a rejected message changes no state.
            d.policy = Some(PolicyCheck {
                subject: policy.subject.clone(),
                timeout: policy_timeout(policy.timeout_ms),
                fail: policy.fail,
                trip_after: policy.trip_after,
                request: body,
                pending: Box::new(Pending {
                    waiting: self.worlds.wait(&world, &handle),
                    world: handle.clone(),
                    effects,
                    settings: settings.clone(),
                }),
            });
        } else {
            commit(&mut w, effects);
            self.worlds.weigh(&world, &handle, &w);
        }
        d
    }

    /// Fills in a rejection, and on the first turn-limit trip pauses the
    /// world and queues the hand-back notice.
    fn reject(
        &self,
        d: &mut Decision,
        w: &mut WorldState,
        world: &Name,
        rejection: Rejection,
        lineage: &Lineage,
    ) {
        d.outcome = Outcome::Rejected;
        d.rule = Some(rejection.rule);
        d.reason = rejection.reason.into();
        if rejection.rule == RuleName::Turns && !w.paused {
            w.paused = true;
            d.handoff = Some(Handoff::TurnLimit);
            d.reason
                .to_mut()
                .push_str("; a hand-back notice went to the public transcript");
            let mut key = uuid::Uuid::encode_buffer();
            let key = message_key(world, SenderKind::Agent.as_str(), &d.sender, &d.id)
                .hyphenated()
                .encode_lower(&mut key);
            let notice_id = copy_id(key, &["notice"]);
            let content = format!(
                "@human the agents in {world} reached the limit of {} turns without a human; they are paused until a human or system message arrives",
                w.settings.rules.turns.max
            );
            let body = Egress {
                fields: &Map::new(),
                id: &notice_id,
                world,
                sender: LOOPGUARD_SENDER,
                sender_kind: SenderKind::System,
                content: &content,
                thread_id: &lineage.thread_id,
                parent_id: None,
                depth: 0,
                mentions: &[],
                visibility: Visibility::Public.as_str(),
                received_at: d.observed_at.as_str(),
                reason: Some(Handoff::TurnLimit.as_str()),
            };
            d.outbound.push(Outbound {
                subject: self.subjects.public(world),
                payload: body.to_json(),
                msg_id: Some(notice_id),
                delivery: Some(Visibility::Public),
            });
        }
    }

    /// Serialises the approved message once and queues one copy per
    /// destination, each with its own stable `Nats-Msg-Id`; returns the body.
    fn deliver(
        &self,
        d: &mut Decision,
        world: &Name,
        kind: SenderKind,
        env: &envelope::Envelope<'_>,
        lineage: &Lineage,
        route: &Route,
    ) -> Bytes {
        let body = Egress {
            fields: &env.fields,
            id: &d.id,
            world,
            sender: &d.sender,
            sender_kind: kind,
            content: &env.content,
            thread_id: &lineage.thread_id,
            parent_id: lineage.parent_id.as_deref(),
            depth: lineage.depth,
            mentions: route.mentions(),
            visibility: route.visibility.as_str(),
            received_at: d.observed_at.as_str(),
            reason: None,
        }
        .to_json();
        // One name-based UUID per message, written out once on the stack;
        // each copy adds its destination.
        let mut key = uuid::Uuid::encode_buffer();
        let key = message_key(world, kind.as_str(), &d.sender, &d.id)
            .hyphenated()
            .encode_lower(&mut key);
        let copies = route.inboxes.len() + usize::from(route.public);
        d.outbound.reserve(copies + 1);
        d.delivered_to = DeliveredTo {
            public: route.public,
            inboxes: route.inboxes.clone(),
        };
        if route.public {
            d.outbound.push(Outbound {
                subject: self.subjects.public(world),
                msg_id: Some(copy_id(key, &["public"])),
                payload: body.clone(),
                delivery: Some(Visibility::Public),
            });
        }
        for agent in &route.inboxes {
            d.outbound.push(Outbound {
                subject: self.subjects.private(world, agent),
                msg_id: Some(copy_id(key, &["private.", agent.as_str()])),
                payload: body.clone(),
                delivery: Some(Visibility::Private),
            });
        }
        body
    }
}

/// The rule that rejects a message the envelope could not be read from.
fn unreadable(e: &EnvelopeError) -> RuleName {
    match e {
        EnvelopeError::TooLarge { .. } | EnvelopeError::IdTooLarge { .. } => RuleName::TooLarge,
        _ => RuleName::Invalid,
    }
}

/// A fresh id for a message that came without one.
fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// What an egress copy (its JSON and `Nats-Msg-Id` header) holds beyond
/// [`COPY_FACTOR`] times the payload limit, at most: loopguard's keys,
/// names (≤ 64 bytes), a remembered thread and parent id (≤ 256 bytes
/// each, up to six times that in JSON: 3,072), the time, the header (its
/// destination, and a JetStream stable id: a stream name ≤ 255 bytes and a
/// sequence).
const COPY_OVERHEAD: usize = 4096;

/// How many times the payload limit a copy's variable part can reach: its
/// content, six times at most in JSON (plain text of control characters),
/// and the parent and thread id it inherits from the world's latest message
/// when that one's ids were too long to remember (each within the payload
/// limit in JSON, as the parent's id was).
const COPY_FACTOR: usize = 8;

/// What an event holds beyond the message's id (within the payload limit):
/// `delivered_to` naming up to every roster agent's inbox (1,024 ×
/// `"private.<name ≤ 64>",`), a reason of up to 500 characters from the
/// policy service (six bytes each at most in JSON), loopguard's fields.
const EVENT_OVERHEAD: usize = state::MAX_AGENTS * (MAX_NAME_LEN + 11) + 4096;

/// The largest message loopguard publishes, in bytes as the server counts
/// them, for ingress messages within `max_payload_bytes`: a copy of plain
/// text of control characters, each written as the six bytes `\u00XX`,
/// replying to a message whose id was too long to remember (and so is
/// written whole as the reply's parent and thread id), or an event
/// delivering to a full roster. (Anything else grows less: a JSON payload's
/// content is written as it came, once more at most when it came as
/// `text`; a header id counts toward the limit at its length in JSON, and
/// is written twice at most.)
pub fn largest_output(max_payload_bytes: usize) -> usize {
    let copy = max_payload_bytes
        .saturating_mul(COPY_FACTOR)
        .saturating_add(COPY_OVERHEAD);
    copy.max(max_payload_bytes.saturating_add(EVENT_OVERHEAD))
}

/// The largest `limits.max_payload_bytes` whose outputs all fit in
/// `server_max_payload` (the inverse of [`largest_output`]).
pub fn payload_limit_for(server_max_payload: usize) -> usize {
    let copies = server_max_payload.saturating_sub(COPY_OVERHEAD) / COPY_FACTOR;
    copies.min(server_max_payload.saturating_sub(EVENT_OVERHEAD))
}

/// The id of an `invalid` or `too_large` message's event: the id its JSON
/// gave (`stated`), else its fallback id, but not a header id larger in
/// JSON than a payload may be (the event would carry it whole).
fn rejected_id(
    stated: Option<String>,
    fallback: FallbackId<'_>,
    max_payload_bytes: usize,
) -> String {
    if let Some(id) = stated {
        return id;
    }
    let header = fallback
        .header
        .filter(|id| json::escaped_len(id) <= max_payload_bytes);
    header
        .or(fallback.stable)
        .map_or_else(new_id, str::to_owned)
}

/// What identifies one ingress message across processes: a name-based UUID
/// of its world, sender and id (hashed, so no byte of a client-chosen id
/// reaches a header).
pub(crate) fn message_key(world: &Name, kind: &str, sender: &str, id: &str) -> uuid::Uuid {
    use sha1::Digest;
    // Uuid::new_v5, hashed part by part (no joined copy) with the `sha1`
    // crate, which uses the CPU's SHA extensions where it has them.
    let mut sha = sha1::Sha1::new_with_prefix(MSG_ID_NAMESPACE.as_bytes());
    for part in [world.as_str(), kind, sender, id] {
        sha.update(part.as_bytes());
        sha.update([0]);
    }
    let digest = sha.finalize();
    let mut first = [0; 16];
    first.copy_from_slice(&digest[..16]);
    uuid::Builder::from_sha1_bytes(first).into_uuid()
}

/// The `Nats-Msg-Id` of one copy: the message key and the destination
/// (`public`, `private.<agent>`, `notice`, given in parts), unique per
/// copy and stable. An event's is the key and its decision
/// (`events::event_id`).
fn copy_id(key: &str, dest: &[&str]) -> String {
    let mut id = String::with_capacity(key.len() + 1 + dest.iter().map(|d| d.len()).sum::<usize>());
    id.push_str(key);
    id.push(':');
    for part in dest {
        id.push_str(part);
    }
    id
}

/// How long a policy question waits for its answer: `timeout_ms` (in a
/// debug build, a test may stretch the longest: see
/// `fault::policy_timeout`).
fn policy_timeout(timeout_ms: u64) -> std::time::Duration {
    let configured = std::time::Duration::from_millis(timeout_ms);
    #[cfg(debug_assertions)]
    let configured = crate::fault::policy_timeout(configured);
    configured
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::sync::Mutex;
    use std::time::{Duration, SystemTime};

    /// The egress body as serde's derive wrote it before `json::Object`
    /// (with the message's other fields after loopguard's, since
    /// 2026-11-24).
    #[derive(Serialize)]
    struct DerivedEgress<'a> {
        id: &'a str,
        world: &'a Name,
        sender: &'a str,
        sender_kind: SenderKind,
        content: &'a str,
        thread_id: &'a str,
        parent_id: Option<&'a str>,
        depth: u32,
        mentions: &'a [Name],
        visibility: &'static str,
        received_at: &'a str,
        #[serde(flatten)]
        fields: &'a Map<String, Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<&'static str>,
    }

    #[test]
    fn egress_json_is_byte_for_byte_what_the_serde_derive_wrote() {
        let fields: Map<String, Value> = serde_json::from_str(
            r#"{"lang":"en","a \"quoted\"\nkey":[1.50,-0,1e400,{"z":null,"y":true}],"z":"tab\there"}"#,
        )
        .unwrap();
        let world = Name::parse("w1").unwrap();
        let mentions = [Name::parse("bob").unwrap(), Name::parse("carol").unwrap()];
        let none = Map::new();
        for (fields, parent_id, reason, content) in [
            (&fields, Some("p\"1"), None, "plain words"),
            (
                &none,
                None,
                Some("turn_limit"),
                "\u{1}ctl \"quoted\" back\\slash\nnew é 🎉",
            ),
            (&fields, None, None, ""),
        ] {
            let (id, sender, thread_id, received_at) =
                ("m\"1", "alice", "t\\1", "2026-11-21T00:00:00Z");
            // The same values in both shapes.
            macro_rules! body {
                ($shape:ident) => {
                    $shape {
                        fields,
                        id,
                        world: &world,
                        sender,
                        sender_kind: SenderKind::Agent,
                        content,
                        thread_id,
                        parent_id,
                        depth: 7,
                        mentions: &mentions,
                        visibility: "private",
                        received_at,
                        reason,
                    }
                };
            }
            let ours = body!(Egress).to_json();
            let derived = serde_json::to_vec(&body!(DerivedEgress)).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&derived)
            );
        }
    }

    /// A clock the test moves by hand.
    struct ManualClock(Mutex<Instant>);

    impl Clock for ManualClock {
        fn now(&self) -> Instant {
            *self.0.lock().unwrap()
        }
        fn wall(&self) -> SystemTime {
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
        }
    }

    struct Rig {
        judge: Judge,
        clock: Arc<ManualClock>,
    }

    impl Rig {
        fn new(edit: impl FnOnce(&mut Config)) -> Rig {
            let mut config = Config::default();
            edit(&mut config);
            let clock = Arc::new(ManualClock(Mutex::new(Instant::now())));
            let judge = Judge::new(
                Arc::new(config.validate().unwrap()),
                clock.clone(),
                Metrics::new(),
            );
            Rig { judge, clock }
        }

        fn advance(&self, secs: u64) {
            *self.clock.0.lock().unwrap() += Duration::from_secs(secs);
        }

        fn send(&self, kind: &str, sender: &str, payload: &str) -> Decision {
            let origin = self
                .judge
                .subjects()
                .parse(&format!("chat.raw.w.{kind}.{sender}"));
            self.judge
                .decide(origin, payload.as_bytes(), FallbackId::default())
                .expect("not a join")
        }
    }

    fn json(out: &Outbound) -> Value {
        serde_json::from_slice(&out.payload).unwrap()
    }

    fn event(d: &Decision) -> Value {
        let last = d.outbound.last().expect("an event");
        assert!(last.subject.starts_with("chat.events."), "{}", last.subject);
        json(last)
    }

    /// The ids documented in docs/CONTRACT.md: a v5 UUID of the parts,
    /// each followed by a NUL, then `:` and the destination. Ids of one and
    /// of several SHA-1 blocks.
    #[test]
    fn message_ids_are_the_v5_uuid_of_the_nul_separated_parts() {
        let world = Name::parse("w1").unwrap();
        for (kind, sender, id) in [
            (SenderKind::Agent, "alice", "m-1".to_string()),
            (SenderKind::Human, "hank", "x".repeat(300)),
            (SenderKind::System, "ops", String::new()),
        ] {
            let joined = format!("w1\0{}\0{sender}\0{id}\0", kind.as_str());
            let expected = uuid::Uuid::new_v5(&MSG_ID_NAMESPACE, joined.as_bytes());
            let key = message_key(&world, kind.as_str(), sender, &id);
            assert_eq!(key, expected);
            assert_eq!(
                copy_id(&key.hyphenated().to_string(), &["private.bob"]),
                format!("{}:private.bob", expected.hyphenated())
            );
        }
    }

    /// The largest copies and events, as the server counts them (payload
    /// and header), stay within `largest_output`, and the bound is close:
    /// plain text of control characters replying to a message whose id
    /// fills the limit reaches eight times it, an event of a broadcast to a
    /// full roster names 1,024 inboxes.
    #[test]
    fn no_output_is_larger_than_largest_output_says() {
        const MAX: usize = 4096;
        let rig = Rig::new(|c| {
            c.limits.max_payload_bytes = MAX;
            c.rules.duplicate.window_seconds = 0;
        });
        let (world, agent, human) = ("w".repeat(64), "a".repeat(64), "h".repeat(64));
        let decide = |kind: &str, sender: &str, payload: &[u8], header: Option<&str>| {
            let subject = format!("chat.raw.{world}.{kind}.{sender}");
            let origin = rig.judge.subjects().parse(&subject);
            rig.judge
                .decide(
                    origin,
                    payload,
                    header.map(FallbackId::header).unwrap_or_default(),
                )
                .expect("not a join")
        };
        // Ids of 256 control characters (the longest remembered), each six
        // bytes in JSON: a parent whose id and thread a reply carries.
        let control_id = "\\u0001".repeat(256);
        let parent = format!(r#"{{"content":"p","id":"{control_id}","thread_id":"{control_id}"}}"#);
        let control = "\u{1}".repeat(MAX);
        let mentions = format!("@{agent} ").repeat(MAX / 67);
        let escaped = "\\u0001".repeat(MAX / 6 - 60);
        let json_text = format!(r#"{{"text":"{escaped}","parent_id":"i"}}"#);
        let half_control = "\u{1}".repeat(MAX / 2);
        let header = "\u{1}".repeat(MAX / 12);
        // In order: each message may be the parent of the next.
        let cases: [(&str, &str, &[u8], Option<&str>); 9] = [
            ("human", &human, control.as_bytes(), None),
            ("human", &human, parent.as_bytes(), None),
            ("agent", &agent, control.as_bytes(), None),
            ("human", &human, mentions.as_bytes(), None),
            ("human", &human, json_text.as_bytes(), None),
            ("human", &human, half_control.as_bytes(), Some(&header)),
            ("human", &human, b"", Some(&"x".repeat(MAX))),
            // Its reply carries that id whole, as parent and thread.
            ("agent", &agent, control.as_bytes(), None),
            // Counted raw, this header would make copies of 12 × MAX.
            ("human", &human, b"", Some(&control)),
        ];
        let (mut largest_copy, mut largest_event) = (0, 0);
        let mut measure = |d: &Decision| {
            for out in &d.outbound {
                let header = out
                    .msg_id
                    .as_ref()
                    .map_or(0, |id| "NATS/1.0\r\nNats-Msg-Id: \r\n\r\n".len() + id.len());
                let size = out.payload.len() + header;
                // Copies against their own bound: the event's is larger here.
                let bound = match out.delivery {
                    Some(_) => COPY_FACTOR * MAX + COPY_OVERHEAD,
                    None => largest_output(MAX),
                };
                assert!(size <= bound, "{size} bytes to {}", out.subject);
                let largest = match out.delivery {
                    Some(_) => &mut largest_copy,
                    None => &mut largest_event,
                };
                *largest = size.max(*largest);
            }
        };
        for (kind, sender, payload, header) in cases {
            let d = decide(kind, sender, payload, header);
            let expected = match header {
                Some(h) if h == control => Outcome::Rejected,
                _ => Outcome::Approved,
            };
            assert_eq!(d.outcome, expected, "{}", d.reason);
            measure(&d);
        }
        // A full roster of the longest names, then a human's broadcast: its
        // event names every inbox.
        for i in 0..state::MAX_AGENTS {
            let origin = rig
                .judge
                .subjects()
                .parse(&format!("chat.join.{world}.{i:0>64}"));
            assert!(rig
                .judge
                .decide(origin, b"", FallbackId::default())
                .is_none());
        }
        let d = decide("human", &human, b"hi", None);
        assert_eq!(d.delivered_to.entries().count(), state::MAX_AGENTS + 1);
        measure(&d);
        assert!(largest_copy > 8 * MAX, "nearly the bound: {largest_copy}");
        assert!(largest_event > 75_000, "nearly the bound: {largest_event}");
        for max in [MAX, 1 << 20] {
            assert_eq!(payload_limit_for(largest_output(max)), max);
            assert!(largest_output(payload_limit_for(max) + 1) > max);
        }
    }

    /// A header id too large for the event gives way to the stable id
    /// (JetStream), so a redelivery's event has the same id.
    #[test]
    fn a_rejected_message_keeps_its_stable_id_when_the_header_cannot_be_its_id() {
        let rig = Rig::new(|c| c.limits.max_payload_bytes = 64);
        let huge = "h".repeat(100);
        let fallback = FallbackId {
            header: Some(&huge),
            stable: Some("raw-7"),
        };
        for subject in ["chat.raw.w.human.hank", "chat.raw.w.robot.r2"] {
            let origin = rig.judge.subjects().parse(subject);
            let d = rig.judge.decide(origin, b"hi", fallback).unwrap();
            assert_eq!(d.outcome, Outcome::Rejected);
            assert_eq!(event(&d)["id"], "raw-7", "{subject}");
        }
        // A header that fits stays the id of the rejection's event.
        let fallback = FallbackId {
            header: Some("h-1"),
            stable: Some("raw-8"),
        };
        let origin = rig.judge.subjects().parse("chat.raw.w.robot.r2");
        let d = rig.judge.decide(origin, b"hi", fallback).unwrap();
        assert_eq!(event(&d)["id"], "h-1");
    }

    #[test]
    fn an_invalid_payload_s_event_has_the_id_its_json_gave() {
        let rig = Rig::new(|_| {});
        let fallback = FallbackId {
            header: Some("h-1"),
            stable: Some("raw-9"),
        };
        for payload in [
            r#"{"id":"m1","content":5}"#,
            r#"{"id":"m1","content":"hi","parent_id":7}"#,
        ] {
            let origin = rig.judge.subjects().parse("chat.raw.w.agent.a");
            let d = rig
                .judge
                .decide(origin, payload.as_bytes(), fallback)
                .unwrap();
            assert_eq!(d.rule, Some(RuleName::Invalid), "{payload}");
            assert_eq!(event(&d)["id"], "m1", "{payload}");
        }
        // An id that is not a string is no id: the header's.
        let origin = rig.judge.subjects().parse("chat.raw.w.agent.a");
        let d = rig
            .judge
            .decide(origin, br#"{"id":1,"content":"hi"}"#, fallback)
            .unwrap();
        assert_eq!(event(&d)["id"], "h-1");
    }

    #[test]
    fn an_invalid_subject_event_has_zero_depth_and_turn_and_no_kind() {
        let rig = Rig::new(|_| {});
        let d = rig
            .judge
            .decide(
                rig.judge.subjects().parse("chat.raw.w.robot.r2"),
                b"hi",
                FallbackId::default(),
            )
            .unwrap();
        let e = event(&d);
        assert_eq!(
            (e["depth"].clone(), e["turn"].clone()),
            (Value::from(0), Value::from(0))
        );
        assert_eq!(e["sender_kind"], Value::Null);
        assert_eq!(e["sender"], "r2");
        assert_eq!(d.outbound.len(), 1, "nothing but the event");
    }

    /// Every message to a world counts as use, rejected ones too, those
    /// whose payload or subject cannot be read among them: a paused world
    /// written to stays paused past `idle_seconds` after its last readable
    /// message. Such a message to a world not held makes none.
    #[test]
    fn an_unreadable_message_counts_as_use_of_its_world() {
        let rig = Rig::new(|c| {
            c.rules.turns.max = 1;
            c.state.idle_seconds = 60;
        });
        rig.send("agent", "alice", r#"{"content":"one"}"#);
        assert_eq!(event(&rig.send("agent", "bob", "two"))["rule"], "turns");
        let unreadable = |world: &str| {
            let subject = format!("chat.raw.{world}.agent.alice");
            let origin = rig.judge.subjects().parse(&subject);
            rig.judge
                .decide(origin, b"\xff", FallbackId::default())
                .expect("not a join")
        };
        rig.advance(50);
        assert_eq!(event(&unreadable("w"))["rule"], "invalid");
        rig.advance(50);
        assert_eq!(
            event(&rig.send("agent", "bob", "three"))["rule"],
            "turns",
            "still paused 100 s after its last readable message"
        );
        // So does one whose subject names the world but no valid kind.
        rig.advance(50);
        let origin = rig.judge.subjects().parse("chat.raw.w.robot.r2");
        let d = rig.judge.decide(origin, b"x", FallbackId::default());
        assert_eq!(event(&d.expect("not a join"))["rule"], "invalid");
        rig.advance(50);
        assert_eq!(event(&rig.send("agent", "bob", "four"))["rule"], "turns");
        unreadable("elsewhere");
        assert!(rig
            .judge
            .worlds
            .get(&Name::parse("elsewhere").unwrap(), rig.clock.now())
            .is_none());
    }

    #[test]
    fn the_turn_limit_notice_precedes_the_event_and_carries_its_fields() {
        let rig = Rig::new(|c| c.rules.turns.max = 1);
        rig.send("agent", "alice", r#"{"content":"one","thread_id":"t9"}"#);
        let d = rig.send("agent", "bob", r#"{"content":"two","id":"b2"}"#);
        assert_eq!(d.outbound.len(), 2);
        assert_eq!(d.outbound[0].subject, "chat.public.w");
        let notice = json(&d.outbound[0]);
        assert_eq!(notice["sender"], "loopguard");
        assert_eq!(notice["sender_kind"], "system");
        assert_eq!(notice["reason"], "turn_limit");
        assert_eq!(notice["depth"], 0);
        assert_eq!(notice["mentions"], serde_json::json!([]));
        assert_eq!(
            notice["thread_id"], "t9",
            "the thread of the rejected message"
        );
        assert_eq!(notice["visibility"], "public");
        assert_eq!(
            Some(notice["id"].as_str().unwrap()),
            d.outbound[0].msg_id.as_deref()
        );
        assert_eq!(event(&d)["rule"], "turns");
        // the same rejected message again yields the same notice id
        let again = Rig::new(|c| c.rules.turns.max = 1);
        again.send("agent", "alice", r#"{"content":"one","thread_id":"t9"}"#);
        let d2 = again.send("agent", "bob", r#"{"content":"two","id":"b2"}"#);
        assert_eq!(d2.outbound[0].msg_id, d.outbound[0].msg_id);
    }

    /// A rejected message has no copy to take its key from, so its event's
    /// id hashes the key itself: it must be the key its copies have when
    /// the same message is approved, so that every output of one message
    /// shares one key.
    #[test]
    fn a_rejected_message_s_event_has_the_key_its_copies_would_have() {
        let rig = Rig::new(|_| {});
        let payload = r#"{"content":"hello","id":"m1"}"#;
        let approved = rig.send("agent", "alice", payload);
        let ids: Vec<&str> = approved
            .outbound
            .iter()
            .filter_map(|o| o.msg_id.as_deref())
            .collect();
        assert_eq!(ids.len(), 2, "the public copy and the event: {ids:?}");
        let (key, _) = ids[0].split_once(':').unwrap();
        assert!(ids.iter().all(|id| id.starts_with(&format!("{key}:"))));

        // The same message again: a duplicate, with no copy at all.
        let rejected = rig.send("agent", "alice", payload);
        assert_eq!(rejected.outcome, Outcome::Rejected);
        assert_eq!(rejected.outbound.len(), 1, "nothing but the event");
        let rule = event(&rejected)["rule"].as_str().unwrap().to_string();
        assert_eq!(
            rejected.outbound[0].msg_id.as_deref(),
            Some(format!("{key}:event.rejected.{rule}").as_str())
        );
    }

    #[test]
    fn text_is_the_content_when_content_is_not_a_string_and_is_kept() {
        let rig = Rig::new(|_| {});
        let d = rig.send(
            "human",
            "hank",
            r#"{"content":7,"text":"from text","reason":"mine"}"#,
        );
        let copy = json(&d.outbound[0]);
        assert_eq!(copy["content"], "from text");
        assert_eq!(copy["text"], "from text");
        assert_eq!(copy["reason"], "mine", "an ingress reason is kept");
    }

    #[test]
    fn a_human_keeps_its_own_parent_id_at_depth_zero() {
        let rig = Rig::new(|_| {});
        let d = rig.send(
            "human",
            "hank",
            r#"{"content":"x","parent_id":"elsewhere"}"#,
        );
        let copy = json(&d.outbound[0]);
        assert_eq!(
            (copy["parent_id"].clone(), copy["depth"].clone()),
            ("elsewhere".into(), 0.into())
        );
        assert_eq!(event(&d)["turn"], 0);
    }

    #[test]
    fn a_pass_counts_toward_cooldown() {
        let rig = Rig::new(|c| c.rules.cooldown.seconds = 60);
        assert_eq!(
            rig.send("agent", "bob", "<world>pass</world>").outcome,
            Outcome::Edited
        );
        assert_eq!(
            rig.send("agent", "bob", "later").rule,
            Some(RuleName::Cooldown)
        );
        rig.advance(60);
        assert_eq!(rig.send("agent", "bob", "later").outcome, Outcome::Approved);
    }

    /// A pass hands the floor back (contract §9: `alternation` counts since
    /// the last pass) and is edited, not approved (`budget` counts
    /// approvals): it joins neither.
    #[test]
    fn a_pass_joins_neither_the_speaking_order_nor_the_budget() {
        let rig = Rig::new(|c| {
            c.rules.alternation.max_cycles = 1;
            c.rules.budget.max = 2;
            c.rules.turns.max = 0;
        });
        assert_eq!(
            rig.send("agent", "a", "<world>pass</world>").outcome,
            Outcome::Edited
        );
        // Counted, the pass would make a, b, a one cycle and a half: the
        // second "a" would continue the cycle a-b.
        assert_eq!(rig.send("agent", "b", "one").outcome, Outcome::Approved);
        assert_eq!(rig.send("agent", "a", "two").outcome, Outcome::Approved);
        // Two approvals: the budget is spent now, and only now (a third
        // agent, so no cycle is continued).
        assert_eq!(rig.send("agent", "c", "three").rule, Some(RuleName::Budget));
    }

    #[test]
    fn windows_expire_as_the_injected_clock_moves() {
        let rig = Rig::new(|c| {
            c.rules.rate.max = 2;
            c.rules.rate.window_seconds = 60;
            c.rules.duplicate.window_seconds = 300;
            c.rules.depth.max = 0;
        });
        rig.send("agent", "alice", "a");
        rig.send("agent", "alice", "b");
        assert_eq!(rig.send("agent", "alice", "c").rule, Some(RuleName::Rate));
        rig.advance(60);
        assert_eq!(rig.send("agent", "alice", "c").outcome, Outcome::Approved);
        assert_eq!(
            rig.send("agent", "bob", "A").rule,
            Some(RuleName::Duplicate)
        );
        rig.advance(300);
        assert_eq!(rig.send("agent", "bob", "A").outcome, Outcome::Approved);
    }

    #[test]
    fn observe_mode_still_rejects_too_large_and_still_performs_pass() {
        let rig = Rig::new(|c| {
            c.mode = Mode::Observe;
            c.limits.max_payload_bytes = 32;
            c.rules.turns.max = 1;
        });
        assert_eq!(
            rig.send("agent", "a", &"x".repeat(33)).rule,
            Some(RuleName::TooLarge)
        );
        rig.send("agent", "a", "one");
        let d = rig.send("agent", "b", "<world>pass</world>");
        assert_eq!((d.outcome, d.would_reject), (Outcome::Edited, None));
        assert_eq!(
            json(&d.outbound[0])["content"],
            "@human b is passing control to you"
        );
    }

    /// A pass read from `text` (no `content` field) sets `content` to the
    /// hand-back; `text`, an ingress field, is kept as written (contract
    /// §4: every ingress field kept), as are the others.
    #[test]
    fn a_pass_read_from_text_sets_content_and_keeps_the_fields() {
        let rig = Rig::new(|_| {});
        let d = rig.send(
            "agent",
            "b",
            r#"{"text":"stuck, <world>pass</world> sorry","lang":"en"}"#,
        );
        assert_eq!(d.outcome, Outcome::Edited);
        let copy = json(&d.outbound[0]);
        assert_eq!(copy["content"], "@human b is passing control to you");
        assert_eq!(copy["text"], "stuck, <world>pass</world> sorry");
        assert_eq!(copy["lang"], "en");
    }

    /// A sender's top-level field named after a serde_json marker, which
    /// sorts first among the fields, is not the copy's first key: a reader
    /// with `arbitrary_precision` or `raw_value` (this crate's `Value`)
    /// reads the copy (found by review: it failed on a trailing comma). A
    /// nested object led by one is the sender's own to write (§9).
    #[test]
    fn a_field_named_after_a_serde_json_marker_leaves_the_copy_readable() {
        for marker in [
            "$serde_json::private::Number",
            "$serde_json::private::RawValue",
        ] {
            let rig = Rig::new(|_| {});
            // Not first in the payload, where it would read as the marker.
            let payload = format!(r#"{{"content":"hi","{marker}":"1"}}"#);
            let d = rig.send("agent", &format!("a{}", marker.len()), &payload);
            let copy: Value = serde_json::from_slice(&d.outbound[0].payload)
                .unwrap_or_else(|e| panic!("{e}: {:?}", d.outbound[0].payload));
            assert_eq!(copy["content"], "hi");
            assert_eq!(copy[marker], "1");
        }
    }

    /// A decision that read the settings before a reload, when the world
    /// view brought its world onto the new ones meanwhile, decides under
    /// the new ones: it does not undo them. Under the old turn limit the
    /// view's unpausing was undone, the message rejected, and a second
    /// hand-back notice sent for the same pause.
    #[test]
    fn a_decision_does_not_undo_newer_settings_a_view_applied() {
        let limited = |turns: u32| {
            let mut c = Config::default();
            c.rules.turns.max = turns;
            c.rules.depth.max = 0;
            c.rules.rate.max = 0;
            c.validate().unwrap()
        };
        let rig = Rig::new(|c| *c = limited(3).config);
        for (i, agent) in ["a", "b", "a"].iter().enumerate() {
            let d = rig.send("agent", agent, &format!("{{\"content\":\"m{i}\"}}"));
            assert_eq!(d.outcome, Outcome::Approved);
        }
        let paused = rig.send("agent", "b", r#"{"content":"m3"}"#);
        assert_eq!(paused.handoff, Some(Handoff::TurnLimit));
        // A message's decision begins: its settings read.
        let before = rig.judge.settings();
        // Meanwhile the limit goes up, and the view shows the world on it.
        rig.judge.reload(limited(5)).unwrap();
        let world = Name::parse("w").unwrap();
        let now = rig.clock.now();
        let handle = rig.judge.worlds().get(&world, now).unwrap();
        {
            let mut w = state::lock(&handle);
            let new = rig.judge.settings();
            w.bring_onto(new.world(&world), new.config.mode, Stamp::of(now));
            assert!(!w.paused);
        }
        // The decision goes on with what it read first.
        let d = rig.judge.decide_raw(
            &before,
            world,
            SenderKind::Agent,
            Name::parse("a").unwrap(),
            br#"{"content":"m4"}"#,
            FallbackId::default(),
            now,
        );
        assert_eq!(
            (d.outcome, d.handoff),
            (Outcome::Approved, None),
            "{}",
            d.reason
        );
    }

    /// A reload names the restart-only sections that differ from what
    /// runs: again on the next reload while the file still differs, and
    /// not once the file is back to what runs.
    #[test]
    fn a_reload_names_sections_that_differ_from_what_runs() {
        let rig = Rig::new(|_| {});
        let reload = |listen: &str, turns: u32| {
            let mut config = Config::default();
            config.http.listen = listen.into();
            config.rules.turns.max = turns;
            rig.judge.reload(config.validate().unwrap()).unwrap()
        };
        assert_eq!(reload("127.0.0.1:1", 20), ["http"]);
        assert_eq!(reload("127.0.0.1:1", 5), ["http"], "still not running");
        assert_eq!(rig.judge.settings().config.rules.turns.max, 5);
        assert!(reload("0.0.0.0:9464", 5).is_empty(), "back to what runs");
    }

    /// A file that moves `nats.prefix` (a restart-only change) and puts the
    /// policy subject under the running prefix is valid on its own, but
    /// the running prefix is what the subject would meet: refused, the
    /// running settings kept; one outside both prefixes is applied.
    #[test]
    fn a_reload_checks_the_policy_subject_against_the_running_prefix() {
        let rig = Rig::new(|_| {});
        let reload = |prefix: &str, subject: &str| {
            let mut config = Config::default();
            config.nats.prefix = prefix.into();
            config.rules.policy.subject = subject.into();
            config.validate().and_then(|s| rig.judge.reload(s))
        };
        for subject in [
            "chat.events.policy",
            "chat.raw.x.agent.a",
            "chat.private.w.a",
        ] {
            let e = reload("loop", subject).unwrap_err().to_string();
            assert!(
                e.contains("rules.policy.subject") && e.contains("chat."),
                "{e}"
            );
            assert_eq!(rig.judge.settings().config.rules.policy.subject, "");
        }
        // Under the file's own prefix: refused by the file's own check, as
        // at start-up.
        assert!(reload("loop", "loop.events.policy").is_err());
        assert_eq!(reload("loop", "audit.policy").unwrap(), ["nats"]);
        assert_eq!(
            rig.judge.settings().config.rules.policy.subject,
            "audit.policy"
        );
        assert_eq!(rig.judge.settings().config.nats.prefix, "chat");
    }

    #[test]
    fn with_approved_events_off_a_plain_approval_publishes_no_event() {
        let rig = Rig::new(|c| c.events.approved = false);
        let d = rig.send("system", "ops", "notice");
        assert!(d
            .outbound
            .iter()
            .all(|o| !o.subject.starts_with("chat.events.")));
        assert_eq!(d.outbound.len(), 1);
    }

    #[test]
    fn a_join_changes_the_roster_and_decides_nothing() {
        let rig = Rig::new(|_| {});
        let origin = rig.judge.subjects().parse("chat.join.w.zed");
        assert!(rig
            .judge
            .decide(origin, b"", FallbackId::default())
            .is_none());
        let d = rig.send("agent", "alice", "@zed hi");
        let to: Vec<String> = d.delivered_to.entries().map(|e| e.concat()).collect();
        assert_eq!(to, ["private.zed"]);
    }

    /// A reset that lands while the policy hook answers stays a reset: the
    /// approval then adds its one turn to the cleared count, instead of
    /// writing back the count it was judged at (which paused the world
    /// again right after an operator's reset).
    #[test]
    fn a_reset_during_a_policy_answer_is_not_undone() {
        let rig = Rig::new(|c| {
            c.rules.turns.max = 3;
            (
                c.rules.depth.max,
                c.rules.rate.max,
                c.rules.cooldown.seconds,
            ) = (0, 0, 0);
            c.rules.policy.subject = "policy.check".into();
        });
        let world = Name::parse("w").unwrap();
        let turns = || state::lock(&rig.judge.worlds().get(&world, rig.clock.now()).unwrap()).turns;
        let mut last = None;
        for (i, reset) in [false, false, true].into_iter().enumerate() {
            let mut d = rig.send("agent", "alice", &format!("point {i}"));
            let check = d.policy.take().expect("asks the policy hook");
            if reset {
                state::lock(&rig.judge.worlds().get(&world, rig.clock.now()).unwrap()).reset();
            }
            let d = rig.judge.finish(d, check, PolicyOutcome::Approve);
            assert_eq!(d.outcome, Outcome::Approved);
            last = Some(d);
            rig.advance(1);
        }
        assert_eq!(turns(), 1, "the reset's 0, and this message's turn");
        let d = last.unwrap();
        assert_eq!(d.turn, 1);
        assert_eq!(event(&d)["turn"], 1, "the event says the count it has");
    }

    /// A message shed for its world's backlog is rejected as rule `policy`
    /// with its own id, counted, and reads or changes nothing of the world;
    /// one that cannot be read is rejected for that instead, and a pass is
    /// not shed.
    #[test]
    fn a_shed_message_is_a_policy_rejection_that_touches_no_state() {
        let rig = Rig::new(|c| c.rules.policy.subject = "policy.check".into());
        let (w, alice) = (Name::parse("w").unwrap(), Name::parse("alice").unwrap());
        let shed = |payload: &[u8]| {
            rig.judge
                .shed(&w, &alice, payload, FallbackId::default(), 64)
        };
        let d = shed(br#"{"id":"m-1","content":"hello"}"#).expect("shed");
        assert_eq!(
            (d.outcome, d.rule, d.id.as_str()),
            (Outcome::Rejected, Some(RuleName::Policy), "m-1")
        );
        assert!(d.reason.contains("64 earlier messages"), "{}", d.reason);
        assert_eq!(event(&d)["rule"], "policy");
        assert_eq!(d.outbound.len(), 1, "the event only");
        assert!(
            rig.judge.worlds().get(&w, rig.clock.now()).is_none(),
            "no world was made"
        );

        let d = shed(b"\xff\xfe").expect("shed");
        assert_eq!(d.rule, Some(RuleName::Invalid));
        assert!(rig.judge.worlds().get(&w, rig.clock.now()).is_none());
        // A pass too: held back without bound, passes could fill the
        // worker's room.
        let d = shed(b"<world>pass</world>").expect("shed");
        assert_eq!(d.rule, Some(RuleName::Policy));
        assert!(rig.judge.worlds().get(&w, rig.clock.now()).is_none());
        let scrape = String::from_utf8(rig.judge.metrics().encode()).unwrap();
        assert!(
            scrape.contains("loopguard_policy_requests_total{outcome=\"backlog\"} 2"),
            "{scrape}"
        );
        // Each rejection is a decision the histogram times.
        assert!(
            scrape.contains("loopguard_decision_duration_seconds_count 3"),
            "{scrape}"
        );
    }

    /// A world the cache evicts while its message waits for the policy hook
    /// (it is the least recently used then) is still found: the admin API
    /// shows it, and a reset reaches the state the answer is applied to,
    /// instead of finding no world and being undone when the answer puts
    /// the world back.
    #[test]
    fn a_world_evicted_while_it_waits_is_still_found_and_a_reset_holds() {
        let rig = Rig::new(|c| {
            c.state.max_worlds = 1;
            (
                c.rules.depth.max,
                c.rules.rate.max,
                c.rules.cooldown.seconds,
            ) = (0, 0, 0);
            c.rules.policy.subject = "policy.check".into();
        });
        let (w, x) = (Name::parse("w").unwrap(), Name::parse("x").unwrap());
        let held = || {
            let mut names = Vec::new();
            rig.judge.worlds().for_each(|n, _| names.push(n.clone()));
            names
        };
        for i in 0..3 {
            let mut d = rig.send("agent", "alice", &format!("point {i}"));
            let check = d.policy.take().expect("asks the policy hook");
            if i < 2 {
                rig.judge.finish(d, check, PolicyOutcome::Approve);
                rig.advance(1);
                continue;
            }
            // While it waits, world x takes the cache's one place.
            let origin = rig.judge.subjects().parse("chat.raw.x.agent.bob");
            let mut other = rig
                .judge
                .decide(origin, b"hello", FallbackId::default())
                .unwrap();
            let other_check = other.policy.take().unwrap();
            assert_eq!(rig.judge.worlds().len(), 1);
            assert_eq!(held(), std::slice::from_ref(&x), "w was evicted");
            let found = rig
                .judge
                .worlds()
                .get(&w, rig.clock.now())
                .expect("found while it waits");
            assert_eq!(state::lock(&found).turns, 2);
            state::lock(&found).reset();
            let d = rig.judge.finish(d, check, PolicyOutcome::Approve);
            assert_eq!(d.turn, 1, "the reset's 0, and this message's turn");
            let back = rig
                .judge
                .worlds()
                .get(&w, rig.clock.now())
                .expect("back in the cache");
            assert_eq!(state::lock(&back).turns, 1);
            rig.judge.finish(other, other_check, PolicyOutcome::Approve);
        }
        // Neither waits now: a world evicted since is gone.
        rig.judge.worlds().len();
        let kept = held();
        assert_eq!(kept.len(), 1);
        let gone = if kept[0] == w { &x } else { &w };
        assert!(
            rig.judge.worlds().get(gone, rig.clock.now()).is_none(),
            "{gone} still found"
        );
    }
}
