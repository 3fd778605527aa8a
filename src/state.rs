//! Per-world state: the roster, the turn counter, remembered messages and the
//! windows the rules read. Held in a bounded moka cache with an idle expiry.
//!
//! Every per-world structure has a cap (`MAX_*` below), so neither a flood of
//! worlds nor a flood of agents in one world grows memory without bound.
//!
//! Atomicity and order: a world's state sits behind its own mutex, and all
//! messages of one world are decided by the same worker task, one at a time,
//! in arrival order (see `ingest`). The mutex is held for a whole decision,
//! so the admin API never sees or changes a world half-way through one,
//! except a decision that asks the policy service: judged under one lock,
//! committed under another once the answer is in (`Judge::finish`), so an
//! admin reset in between stays a reset.

use std::collections::{HashMap, VecDeque};
use std::mem::size_of;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::clock::Stamp;
use crate::config::{Mode, Settings, WorldSettings};
use crate::names::Name;
use crate::rules::similar::Words;
use crate::subject::SenderKind;

/// Most agents on one world's roster; the least recently seen go first.
pub const MAX_AGENTS: usize = 1024;
/// Most agents a world's config may list (pin): half the roster, so an
/// agent it does not list always finds a place, and its cooldown and rate
/// are counted (a roster full of pinned agents had none to give up).
pub const MAX_PINNED: usize = MAX_AGENTS / 2;
/// Most approved messages remembered per world for parent lookups.
pub const MAX_REMEMBERED: usize = 1024;
/// Most contents held in a world's duplicate window.
pub const MAX_DUPLICATE_WINDOW: usize = 1024;
/// Most agent speakers remembered since the last human or system message
/// (the longest cycle, 8, times the most repetitions, 32, plus one).
pub const MAX_SPEAKERS: usize = 8 * 33;
/// Most approved messages whose content words the `similar` rule compares.
pub const MAX_SIMILAR_WINDOW: usize = 64;
/// Longest id (and thread id) remembered for parent lookups; a message with
/// a longer one is not remembered (replies fall back to the thread or the
/// world's latest message).
pub const MAX_REMEMBERED_ID: usize = 256;
/// Most recent messages whose times and speakers the conversation state reads.
pub const MAX_ACTIVITY: usize = 512;
/// Most agents remembered as mentioned since a conclusion.
pub const MAX_MENTIONED: usize = 64;
/// Most approval times held for the `budget` rule (its `max` is capped too).
pub const MAX_BUDGET_WINDOW: usize = 10_000;
/// Least `state.max_bytes` accepted (16 MiB): room for several worlds at
/// every cap (about 2 MiB weighed each), context entries aside.
pub const MIN_STATE_BYTES: u64 = 16 << 20;

/// The most a world can hold in the parts that grow with its settings
/// rather than within a fixed cap: its roster's approval times (each of
/// [`MAX_AGENTS`] agents keeps its last `rules.rate.max`, in a queue that
/// grows by doubling), its context entries (`state.context_messages`,
/// each counted at twice the largest copy), and its latest message when
/// its ids are too long to remember ([`MAX_REMEMBERED_ID`]): kept whole, id
/// and thread id, each up to `limits.max_payload_bytes`. A world is weighed
/// at half of `state.max_bytes` at most, so that one world cannot empty the
/// cache: only through these parts can it hold more than that.
pub fn heaviest_parts(settings: &Settings) -> usize {
    let max_payload = settings.config.limits.max_payload_bytes;
    let largest_copy = crate::judge::largest_output(max_payload);
    // Each entry's body, and its inbox list: a broadcast to a full roster
    // of the longest names.
    let inboxes = MAX_AGENTS * (size_of::<Name>() + name_bytes_at_most());
    let context = settings
        .config
        .state
        .context_messages
        .saturating_mul(largest_copy.saturating_mul(2).saturating_add(inboxes));
    let latest_long = max_payload.saturating_mul(2);
    let approval_times = std::iter::once(&settings.default_world)
        .chain(settings.worlds.values())
        .map(|w| {
            // As `footprint` counts a roster too large to read.
            let kept = (w.rules.rate.max.max(1) as usize + 1).next_power_of_two();
            MAX_AGENTS * kept * size_of::<Stamp>()
        })
        .max()
        .unwrap_or(0);
    approval_times
        .saturating_add(context)
        .saturating_add(latest_long)
}

/// A per-world map. foldhash (randomly seeded per map) rather than the
/// standard SipHash: these maps are looked up several times per message, and
/// each is capped (`MAX_*`), so even a crafted flood of colliding keys could
/// slow only its own world, and only boundedly.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A remembered message's key: its id hashed with a seed random per process,
/// not the id itself. A busy world remembers a thousand messages; keyed by
/// their ids, each was an allocation that a lookup compared and that its
/// eviction freed, long out of the CPU's caches by then. Two ids sharing a
/// key (about one chance in 10^16 per lookup in a full world) would give a
/// reply the other's depth and thread: what any agent gets by naming that
/// message as its parent.
fn message_key(id: &str) -> u64 {
    static SEED: std::sync::LazyLock<foldhash::quality::RandomState> =
        std::sync::LazyLock::new(Default::default);
    use std::hash::BuildHasher;
    SEED.hash_one(id)
}

/// One agent known to a world.
#[derive(Debug, Clone)]
pub struct Agent {
    /// Listed in config: never forgotten.
    pub pinned: bool,
    /// Last publish or join; entries idle past `state.idle_seconds` leave the
    /// roster.
    pub last_seen: Stamp,
    /// Times of this agent's recent approved messages, newest last; only as
    /// many as the rate rule can look at.
    pub approvals: VecDeque<Stamp>,
}

impl Agent {
    fn new(pinned: bool, now: Stamp) -> Agent {
        Agent {
            pinned,
            last_seen: now,
            approvals: VecDeque::new(),
        }
    }

    pub fn last_approved(&self) -> Option<Stamp> {
        self.approvals.back().copied()
    }

    /// This agent's approved messages younger than `window` at `now`.
    pub fn approvals_within(&self, now: Stamp, window: Duration) -> usize {
        count_since(&self.approvals, Since::new(now, window))
    }
}

/// Rosters up to this size are a list searched in order; larger ones a map.
const ROSTER_LIST_MAX: usize = 8;

/// A world's agents by name. Most worlds have a handful, and a hash map's
/// smallest table has room for four, so a short roster is a list (searched
/// in order) and becomes a map only past [`ROSTER_LIST_MAX`] agents.
/// Names of up to 23 bytes sit inside the entry (see [`Name`]), so the
/// search reads no other memory.
#[derive(Debug)]
enum Roster {
    List(Vec<(Name, Agent)>),
    /// Boxed: the rare large roster pays for the pointer, not every world.
    Map(Box<Map<Name, Agent>>),
}

impl Roster {
    fn new(agents: impl Iterator<Item = (Name, Agent)>) -> Roster {
        let mut roster = Roster::List(Vec::new());
        for (name, agent) in agents {
            roster.insert(name, agent);
        }
        roster
    }

    fn len(&self) -> usize {
        match self {
            Roster::List(list) => list.len(),
            Roster::Map(map) => map.len(),
        }
    }

    fn get_key_value(&self, name: &str) -> Option<(&Name, &Agent)> {
        match self {
            Roster::List(list) => list
                .iter()
                .find(|(n, _)| n.as_str() == name)
                .map(|(n, a)| (n, a)),
            Roster::Map(map) => map.get_key_value(name),
        }
    }

    fn get(&self, name: &str) -> Option<&Agent> {
        self.get_key_value(name).map(|(_, a)| a)
    }

    fn get_mut(&mut self, name: &str) -> Option<&mut Agent> {
        match self {
            Roster::List(list) => list
                .iter_mut()
                .find(|(n, _)| n.as_str() == name)
                .map(|(_, a)| a),
            Roster::Map(map) => map.get_mut(name),
        }
    }

    /// Adds or replaces `name`'s entry.
    fn insert(&mut self, name: Name, agent: Agent) {
        if let Some(existing) = self.get_mut(name.as_str()) {
            *existing = agent;
            return;
        }
        match self {
            Roster::List(list) if list.len() < ROSTER_LIST_MAX => {
                if list.capacity() == 0 {
                    list.reserve_exact(1);
                }
                list.push((name, agent));
            }
            Roster::List(list) => {
                let mut map: Box<Map<Name, Agent>> =
                    Box::new(std::mem::take(list).into_iter().collect());
                map.insert(name, agent);
                *self = Roster::Map(map);
            }
            Roster::Map(map) => {
                map.insert(name, agent);
            }
        }
    }

    fn remove(&mut self, name: &str) {
        match self {
            Roster::List(list) => list.retain(|(n, _)| n.as_str() != name),
            Roster::Map(map) => {
                map.remove(name);
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = (&Name, &Agent)> {
        let (list, map) = match self {
            Roster::List(list) => (Some(list), None),
            Roster::Map(map) => (None, Some(map)),
        };
        let list = list.into_iter().flatten().map(|(n, a)| (n, a));
        list.chain(map.into_iter().flat_map(|m| m.iter()))
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut Agent> {
        let (list, map) = match self {
            Roster::List(list) => (Some(list), None),
            Roster::Map(map) => (None, Some(map)),
        };
        let list = list.into_iter().flatten().map(|(_, a)| a);
        list.chain(map.into_iter().flat_map(|m| m.values_mut()))
    }
}

/// What the depth rule needs of an approved message.
#[derive(Debug, Clone)]
pub struct Remembered {
    pub depth: u32,
    pub thread_id: Arc<str>,
    /// Sent by an agent (the `low_content` rule judges agent-to-agent replies).
    pub agent: bool,
}

/// The resolved place of a new message in its world's threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lineage {
    pub parent_id: Option<Arc<str>>,
    pub thread_id: Arc<str>,
    pub depth: u32,
    /// The parent was an agent's message.
    pub parent_is_agent: bool,
}

/// All state of one world.
#[derive(Debug)]
pub struct WorldState {
    /// Rules and roster seed in force: those of the world's creation, or of
    /// the last reload that brought it onto new settings.
    pub settings: Arc<WorldSettings>,
    /// Approved agent messages since the last ingress human or system message.
    pub turns: u32,
    /// Set with the turn-limit notice; agents stay rejected until a reset.
    pub paused: bool,
    agents: Roster,
    /// Approved messages remembered for parent lookups, oldest first.
    memory: Memory,
    /// Latest approved message id of each thread but `latest`'s own, so a
    /// world talking in one thread keeps no index at all (and none boxed).
    thread_latest: Option<Box<Map<Arc<str>, Arc<str>>>>,
    /// The latest approved message, and so the latest of its thread.
    latest: Option<Arc<str>>,
    /// The latest approved message when its id or thread id is too long to
    /// remember ([`MAX_REMEMBERED_ID`]): held alone, ahead of `latest`, until
    /// a message that can be remembered is approved. Replies still find it,
    /// so a human's message with a long id still starts depth again, and
    /// agents answering each other with long ids still go deeper.
    latest_long: Option<Box<(Arc<str>, Remembered)>>,
    /// The duplicate window.
    contents: Contents,
    /// (approved at, speaker key) of recent messages, for the conversation
    /// state: a key, not a name, so an entry holds no allocation.
    activity: VecDeque<(Stamp, u64)>,
    /// A conclusion phrase was approved and no human has spoken since.
    concluded: bool,
    /// What only optional rules and features keep; none until one needs it.
    extras: Option<Box<Extras>>,
    /// `state.idle_seconds`, as whole seconds: four bytes, not sixteen.
    idle_seconds: u32,
    /// Bytes of the thread ids `memory` holds, each counted as often as it
    /// is held (see [`WorldState::footprint`]).
    remembered_bytes: u32,
    /// Bytes of the thread ids and ids `thread_latest` holds, counted apart
    /// from `memory`'s even where they share them (never too few).
    index_bytes: u32,
}

/// The state of the rules and features that are off by default
/// (`alternation`, `similar`, `budget`, `concluded`, agents' context). Kept
/// apart and allocated on first use, since idle worlds are most of the
/// memory and most of them never need it.
#[derive(Debug, Default)]
struct Extras {
    /// (approved at, content words) for the `similar` rule, oldest first.
    word_sets: VecDeque<(Stamp, Words)>,
    /// Agents that spoke since the last human or system message, in order
    /// (kept while `alternation` is on).
    speakers: VecDeque<Name>,
    /// Bytes of the long names `speakers` holds: each message's name is
    /// its own, and one over 23 bytes its own allocation.
    speaker_bytes: usize,
    /// Times of the world's recent approved agent messages (for `budget`).
    agent_approvals: VecDeque<Stamp>,
    /// Recent delivered messages, for agents' clean context (opt-in).
    context: VecDeque<ContextEntry>,
    /// Bytes of the bodies and inbox lists `context` holds.
    context_bytes: usize,
    /// Agents mentioned since the conclusion, each allowed one reply.
    mentioned: Vec<Name>,
}

impl Extras {
    fn forget_speakers(&mut self) {
        self.speakers.clear();
        self.speaker_bytes = 0;
    }
}

/// What a world without [`Extras`] reads.
static NO_EXTRAS: Extras = Extras {
    word_sets: VecDeque::new(),
    speakers: VecDeque::new(),
    speaker_bytes: 0,
    agent_approvals: VecDeque::new(),
    context: VecDeque::new(),
    context_bytes: 0,
    mentioned: Vec::new(),
};

impl WorldState {
    pub fn new(settings: Arc<WorldSettings>, idle: Duration, now: Stamp) -> WorldState {
        let agents = Roster::new(
            settings
                .agents
                .iter()
                .map(|a| (a.clone(), Agent::new(true, now))),
        );
        WorldState {
            settings,
            turns: 0,
            paused: false,
            agents,
            memory: Memory::default(),
            thread_latest: None,
            latest: None,
            latest_long: None,
            contents: Contents::default(),
            activity: VecDeque::new(),
            concluded: false,
            extras: None,
            idle_seconds: u32::try_from(idle.as_secs()).unwrap_or(u32::MAX),
            remembered_bytes: 0,
            index_bytes: 0,
        }
    }

    fn idle(&self) -> Duration {
        Duration::from_secs(self.idle_seconds.into())
    }

    fn extras(&self) -> &Extras {
        self.extras.as_deref().unwrap_or(&NO_EXTRAS)
    }

    fn extras_mut(&mut self) -> &mut Extras {
        self.extras.get_or_insert_with(Default::default)
    }

    /// Brings the world onto the configuration in force: its own settings
    /// (see [`WorldState::apply_settings`]), and in observe mode no pause:
    /// that mode pauses no world, so one paused under enforce is not paused
    /// now, and back under enforce its next turn-limit rejection tells a
    /// human again. Whether its settings changed (its weight may have).
    pub fn bring_onto(&mut self, settings: &Arc<WorldSettings>, mode: Mode, now: Stamp) -> bool {
        let changed = self.apply_settings(settings, now);
        if mode == Mode::Observe {
            self.paused = false;
        }
        changed
    }

    /// Brings the world onto `settings` after a configuration reload: new
    /// rules apply from the next decision, agents now listed in config are
    /// pinned, and agents no longer listed may expire like any other.
    /// Whether they were other settings.
    fn apply_settings(&mut self, settings: &Arc<WorldSettings>, now: Stamp) -> bool {
        if Arc::ptr_eq(&self.settings, settings) {
            return false;
        }
        for agent in self.agents.values_mut() {
            agent.pinned = false;
        }
        for name in &settings.agents {
            match self.agents.get_mut(name.as_str()) {
                Some(agent) => agent.pinned = true,
                None => {
                    self.agents.insert(name.clone(), Agent::new(true, now));
                }
            }
        }
        // Newly pinned agents may overfill a full roster: the least
        // recently seen unpinned ones leave (config lists at most
        // MAX_PINNED, so this ends).
        while self.agents.len() > MAX_AGENTS {
            let Some(oldest) = self.least_recently_seen_unpinned() else {
                break;
            };
            self.agents.remove(oldest.as_str());
        }
        let max = settings.rules.turns.max;
        if self.paused && (max == 0 || self.turns < max) {
            // The limit went up (or off) past the turns taken: agents are
            // approved again, so the next time they reach the limit its
            // first rejection sends a hand-back notice again.
            self.paused = false;
        }
        let keep = (settings.rules.rate.max as usize).max(1);
        if keep < (self.settings.rules.rate.max as usize).max(1) {
            // The rate limit went down: each agent keeps its last `keep`
            // approval times and gives the room back, which `footprint`
            // (reading no agent of a long roster) counts by the limit.
            for agent in self.agents.values_mut() {
                let over = agent.approvals.len().saturating_sub(keep);
                agent.approvals.drain(..over);
                // To the power of two `footprint` counts: trimmed to `keep`
                // exactly, a deque raised again would double from there,
                // to past what it counts.
                agent.approvals.shrink_to((keep + 1).next_power_of_two());
            }
        }
        // A rule turned off keeps no history: turned on again, it counts
        // from then, never across messages it did not see (none is
        // recorded while it is off), and the memory goes back meanwhile.
        if let Some(extras) = &mut self.extras {
            let rules = &settings.rules;
            if rules.alternation.max_cycles == 0 {
                extras.forget_speakers();
            }
            if rules.budget.max == 0 {
                extras.agent_approvals = VecDeque::new();
            }
            if !rules.similar.is_on() {
                extras.word_sets = VecDeque::new();
            }
        }
        if settings.rules.duplicate.window_seconds == 0 {
            self.contents = Contents::default();
        }
        self.settings = settings.clone();
        true
    }

    /// The roster entry for a lowercase name, if it is on the roster now.
    pub fn roster_get(&self, name: &str, now: Stamp) -> Option<(&Name, &Agent)> {
        self.agents
            .get_key_value(name)
            .filter(|(_, a)| a.pinned || now.since(a.last_seen) <= self.idle())
    }

    /// Names on the roster now, sorted for stable output.
    pub fn roster(&self, now: Stamp) -> Vec<Name> {
        let mut names: Vec<Name> = self
            .agents
            .iter()
            .filter(|(_, a)| a.pinned || now.since(a.last_seen) <= self.idle())
            .map(|(n, _)| n.clone())
            .collect();
        names.sort();
        names
    }

    pub fn agent(&self, name: &Name) -> Option<&Agent> {
        self.agents.get(name.as_str())
    }

    /// Puts `name` on the roster (join or publish), evicting the least
    /// recently seen unpinned agent when the roster is full.
    pub fn touch_agent(&mut self, name: &Name, now: Stamp) {
        if let Some(agent) = self.agents.get_mut(name.as_str()) {
            agent.last_seen = now;
            return;
        }
        if self.agents.len() >= MAX_AGENTS {
            match self.least_recently_seen_unpinned() {
                Some(n) => {
                    self.agents.remove(n.as_str());
                }
                None => return,
            }
        }
        self.agents.insert(name.clone(), Agent::new(false, now));
    }

    fn least_recently_seen_unpinned(&self) -> Option<Name> {
        self.agents
            .iter()
            .filter(|(_, a)| !a.pinned)
            .min_by_key(|(_, a)| a.last_seen)
            .map(|(n, _)| n.clone())
    }

    /// Where a message with these ids sits (contract §5.3). `own_id` starts
    /// a new thread when nothing else applies.
    pub fn lineage(
        &self,
        own_id: &str,
        thread_id: Option<&str>,
        parent_id: Option<&str>,
        is_agent: bool,
    ) -> Lineage {
        if !is_agent {
            return Lineage {
                parent_id: parent_id.map(Arc::from),
                thread_id: Arc::from(thread_id.unwrap_or(own_id)),
                depth: 0,
                parent_is_agent: false,
            };
        }
        // The long-id latest is newer than anything remembered. A parent
        // named by the message is found by its text, which is shared when it
        // is the latest message (the usual reply) and copied otherwise.
        let long = self.latest_long.as_deref();
        let parent = parent_id
            .and_then(|p| match long {
                Some((id, m)) if &**id == p => Some((id.clone(), m)),
                _ => {
                    let meta = self.remembered(p)?;
                    let latest = self.latest.as_ref().filter(|id| &***id == p);
                    Some((latest.map_or_else(|| Arc::from(p), Arc::clone), meta))
                }
            })
            .or_else(|| {
                let t = thread_id?;
                match long {
                    Some((id, m)) if *m.thread_id == *t => Some((id.clone(), m)),
                    _ => {
                        let id = self.latest_in_thread(t)?;
                        Some((id.clone(), self.remembered(id)?))
                    }
                }
            })
            .or_else(|| match long {
                Some((id, m)) => Some((id.clone(), m)),
                None => {
                    let id = self.latest.as_ref()?;
                    Some((id.clone(), self.remembered(id)?))
                }
            });
        match parent {
            Some((pid, meta)) => Lineage {
                parent_id: Some(pid),
                thread_id: thread_id
                    .map(Arc::from)
                    .unwrap_or_else(|| meta.thread_id.clone()),
                depth: meta.depth.saturating_add(1),
                parent_is_agent: meta.agent,
            },
            None => Lineage {
                parent_id: None,
                thread_id: Arc::from(thread_id.unwrap_or(own_id)),
                depth: 1,
                parent_is_agent: false,
            },
        }
    }

    /// The remembered message with this id (its latest approval).
    fn remembered(&self, id: &str) -> Option<&Remembered> {
        self.memory.get(message_key(id))
    }

    /// The latest remembered message of `thread`.
    fn latest_in_thread(&self, thread: &str) -> Option<&Arc<str>> {
        match &self.latest {
            Some(id) if self.remembered(id).is_some_and(|m| &*m.thread_id == thread) => Some(id),
            _ => self.thread_latest.as_ref()?.get(thread),
        }
    }

    /// Records an approved (or edited) message: lineage, duplicate window and,
    /// for agents, the rate/cooldown history (the turn counter is the
    /// caller's, `judge::commit`).
    pub fn record_approved(&mut self, approved: Approved<'_>) {
        // Lineage memory holds ids; a very long one (a client's choice) is
        // not remembered, so no single message can pin kilobytes per world.
        let rememberable = approved.id.len() <= MAX_REMEMBERED_ID
            && approved.lineage.thread_id.len() <= MAX_REMEMBERED_ID;
        if !rememberable {
            self.latest_long = Some(Box::new((
                approved.id.clone(),
                Remembered {
                    depth: approved.lineage.depth,
                    thread_id: approved.lineage.thread_id.clone(),
                    agent: approved.agent.is_some(),
                },
            )));
        } else {
            self.latest_long = None;
            let thread = &approved.lineage.thread_id;
            // The message latest until now hands its thread to the index
            // (read before a reused id is re-filed under another thread).
            let previous = self.latest.take().and_then(|id| {
                let its_thread = self.remembered(&id)?.thread_id.clone();
                Some((id, its_thread))
            });
            let id = approved.id.clone();
            let key = message_key(&id);
            // A reused id is remembered again, newest: lookups find this
            // approval, and the older one stays until its turn to go.
            let gone = self.memory.push(
                key,
                Remembered {
                    depth: approved.lineage.depth,
                    thread_id: approved.lineage.thread_id.clone(),
                    agent: approved.agent.is_some(),
                },
            );
            // Ids are at most MAX_REMEMBERED_ID bytes: the sum fits a u32.
            self.remembered_bytes += text_bytes(thread);
            if let Some((old_key, old)) = gone {
                self.forget_message(old_key, old);
            }
            if let Some((previous, its_thread)) = previous {
                // Another thread, and the message still remembered in it (the
                // new one may have pushed it out, or re-filed its id under
                // another thread). Most messages stay in the thread, so the
                // second lookup is rare.
                let still_there = || {
                    self.remembered(&previous)
                        .is_some_and(|m| m.thread_id == its_thread)
                };
                if its_thread != *thread && still_there() {
                    let key = text_bytes(&its_thread);
                    let value = text_bytes(&previous);
                    let index = self.thread_latest.get_or_insert_with(Default::default);
                    // An existing entry keeps its key: only the id changes.
                    self.index_bytes += value;
                    match index.insert(its_thread, previous) {
                        Some(old) => self.index_bytes -= text_bytes(&old),
                        None => self.index_bytes += key,
                    }
                }
            }
            if let Some(index) = &mut self.thread_latest {
                if let Some((key, value)) = index.remove_entry(thread) {
                    self.index_bytes -= text_bytes(&key) + text_bytes(&value);
                }
                // Each entry names a message remembered in its thread (one
                // that leaves takes its entry along, see `forget_message`),
                // and each remembered message backs one entry at most.
                debug_assert!(index.len() <= MAX_REMEMBERED, "{}", index.len());
                if index.len() > 2 * MAX_REMEMBERED {
                    // A guard the bound above keeps from running, so that
                    // a bug there cannot grow a world without end: replies
                    // in other threads then fall back to the latest message.
                    index.clear();
                    self.index_bytes = 0;
                }
            }
            self.latest = Some(id);
        }

        // Contents older than the duplicate window can never match again:
        // dropping them as new ones come keeps a busy world's window to what
        // its traffic put there lately, not its last MAX_DUPLICATE_WINDOW.
        let window = Duration::from_secs(self.settings.rules.duplicate.window_seconds);
        self.contents
            .push(approved.now, approved.content_hash, window);

        if let Some((agent, keep)) = approved.agent {
            if let Some(a) = self.agents.get_mut(agent.as_str()) {
                push_window(&mut a.approvals, approved.now, keep.max(1));
                // A reload may have lowered the rate limit.
                while a.approvals.len() > keep.max(1) {
                    a.approvals.pop_front();
                }
            }
            if approved.takes_turn && self.settings.rules.alternation.max_cycles > 0 {
                let extras = self.extras_mut();
                extras.speaker_bytes += name_bytes(agent);
                if let Some(gone) = push_window(&mut extras.speakers, agent.clone(), MAX_SPEAKERS) {
                    extras.speaker_bytes -= name_bytes(&gone);
                }
            }
            let budget = self.settings.rules.budget.max as usize;
            if approved.takes_turn && budget > 0 {
                let approvals = &mut self.extras_mut().agent_approvals;
                push_window(approvals, approved.now, budget.min(MAX_BUDGET_WINDOW));
                // A reload may have lowered the budget.
                while approvals.len() > budget.min(MAX_BUDGET_WINDOW) {
                    approvals.pop_front();
                }
            }
        }
    }

    /// Remembers an approved message's content words for `similar`, while
    /// the rule is on: a reload may have turned it off while the message
    /// waited for the policy service, and turned on again it counts from
    /// then.
    pub fn remember_words(&mut self, now: Stamp, words: Words) {
        if words.is_empty() || !self.settings.rules.similar.is_on() {
            return;
        }
        push_window(
            &mut self.extras_mut().word_sets,
            (now, words),
            MAX_SIMILAR_WINDOW,
        );
    }

    /// Content words of approved messages younger than `window`.
    pub fn recent_words(&self, now: Stamp, window: Duration) -> impl Iterator<Item = &Words> {
        let since = Since::new(now, window);
        self.extras()
            .word_sets
            .iter()
            .rev()
            .take_while(move |(at, _)| since.holds(*at))
            .map(|(_, w)| w)
    }

    /// Agents that spoke since the last human or system message, oldest first.
    pub fn speakers(&self) -> &VecDeque<Name> {
        &self.extras().speakers
    }

    /// Approved agent messages of the world younger than `window`.
    pub fn agent_approvals_within(&self, now: Stamp, window: Duration) -> usize {
        count_since(&self.extras().agent_approvals, Since::new(now, window))
    }

    /// Accounts for a remembered message that left the memory (`key`, and
    /// what was remembered of it), and drops its thread's index entry if
    /// that names it, unless the id's latest approval still remembered is
    /// in that thread too. `latest` is left alone: its one caller has
    /// taken it, and a latest message no longer remembered is what lineage
    /// treats as none.
    fn forget_message(&mut self, key: u64, gone: Remembered) {
        self.remembered_bytes -= text_bytes(&gone.thread_id);
        let Some(index) = &mut self.thread_latest else {
            return;
        };
        let names_it = index
            .get(&gone.thread_id)
            .is_some_and(|id| message_key(id) == key);
        let still_in_thread = || {
            self.memory
                .get(key)
                .is_some_and(|m| m.thread_id == gone.thread_id)
        };
        if names_it && !still_in_thread() {
            if let Some((key, value)) = index.remove_entry(&gone.thread_id) {
                self.index_bytes -= text_bytes(&key) + text_bytes(&value);
            }
        }
    }

    /// True when an approved message with this normalised-content hash is
    /// younger than `window`.
    pub fn seen_content(&self, hash: u64, now: Stamp, window: Duration) -> bool {
        self.contents.seen(hash, Since::new(now, window))
    }

    /// Clears the turn counter (and so the pause).
    /// A human or system message (or a pass, or a reset) starts a new
    /// exchange: turns and the speaker sequence begin again.
    pub fn reset_turns(&mut self) {
        self.turns = 0;
        self.paused = false;
        if let Some(extras) = &mut self.extras {
            extras.forget_speakers();
        }
    }

    /// The admin reset: turns, pause, cooldown, rate and duplicate windows.
    /// The roster and thread memory stay.
    pub fn reset(&mut self) {
        self.reset_turns();
        self.contents.clear();
        if let Some(extras) = &mut self.extras {
            extras.word_sets.clear();
            extras.agent_approvals.clear();
        }
        for agent in self.agents.values_mut() {
            agent.approvals.clear();
        }
    }

    /// About how many bytes this world holds: what the world cache weighs it
    /// by (`state.max_bytes`). Counted from its containers' capacities and
    /// the lengths of the ids and bodies they hold, not the allocator's own
    /// overhead, nor thread ids only the thread index still holds. Reads no
    /// entry but those of a short roster (up to [`ROSTER_LIST_MAX`]).
    pub fn footprint(&self) -> usize {
        let roster = match &self.agents {
            Roster::List(list) => {
                list.capacity() * size_of::<(Name, Agent)>()
                    + list
                        .iter()
                        .map(|(n, a)| name_bytes(n) + deque_bytes(&a.approvals))
                        .sum::<usize>()
            }
            Roster::Map(map) => {
                // Each agent's name and times at their most, unread.
                let times = (self.settings.rules.rate.max as usize).max(1) + 1;
                let agent = name_bytes_at_most() + times.next_power_of_two() * size_of::<Stamp>();
                size_of::<Map<Name, Agent>>()
                    + table_bytes(map.capacity(), size_of::<(Name, Agent)>())
                    + map.len() * agent
            }
        };
        let threads = self.thread_latest.as_ref().map_or(0, |index| {
            size_of::<Map<Arc<str>, Arc<str>>>()
                + table_bytes(index.capacity(), size_of::<(Arc<str>, Arc<str>)>())
                + self.index_bytes as usize
        });
        let extras = self.extras.as_ref().map_or(0, |e| {
            size_of::<Extras>()
                + deque_bytes(&e.word_sets)
                + e.word_sets.len() * crate::rules::similar::MAX_WORDS * size_of::<u64>()
                + deque_bytes(&e.speakers)
                + e.speaker_bytes
                + deque_bytes(&e.agent_approvals)
                + deque_bytes(&e.context)
                + e.context_bytes
                + e.mentioned.capacity() * size_of::<Name>()
        });
        size_of::<World>()
            + roster
            + self.memory.bytes()
            + self.remembered_bytes as usize
            + self
                .latest
                .as_deref()
                .map_or(0, |id| text_bytes(id) as usize)
            + self.latest_long.as_deref().map_or(0, |(id, m)| {
                size_of::<(Arc<str>, Remembered)>()
                    + (text_bytes(id) + text_bytes(&m.thread_id)) as usize
            })
            + threads
            + self.contents.bytes()
            + deque_bytes(&self.activity)
            + extras
    }
}

/// Bytes an `Arc<str>` of `text` holds: its two counts and the text.
fn text_bytes(text: &str) -> u32 {
    (2 * size_of::<usize>() + text.len()) as u32
}

/// Bytes a name holds beyond its own size: none up to 23 bytes (kept
/// inline), else a shared `Arc<str>`.
fn name_bytes(name: &Name) -> usize {
    match name.as_str().len() {
        0..=23 => 0,
        _ => text_bytes(name.as_str()) as usize,
    }
}

/// [`name_bytes`] of the longest name.
fn name_bytes_at_most() -> usize {
    2 * size_of::<usize>() + crate::names::MAX_NAME_LEN
}

/// Bytes of a hash table with room for `capacity` entries of `entry` bytes:
/// hashbrown keeps a bucket and a control byte for each, at most 7/8 full.
fn table_bytes(capacity: usize, entry: usize) -> usize {
    capacity * 8 / 7 * (entry + 1)
}

fn deque_bytes<T>(deque: &VecDeque<T>) -> usize {
    deque.capacity() * size_of::<T>()
}

/// The start of a window of some length that ends now: what happened after
/// it is in the window. One comparison an item, where `now - at < length`
/// was a subtraction with its overflow checks an item: most of a decision in
/// a busy world, whose windows hold hundreds of items. The same test for
/// every time up to `now` (a later one, which the monotonic clock never
/// gives, is in the window).
#[derive(Debug, Clone, Copy)]
struct Since(Stamp);

impl Since {
    fn new(now: Stamp, length: Duration) -> Since {
        // A length further back than a stamp reaches saturates: the window
        // starts about 292 years back, or at the earliest stamp, before
        // any time a clock gives (`Stamp::of` never gives the earliest).
        Since(now - length)
    }

    /// Whether `at` is in the window (younger than its length).
    fn holds(self, at: Stamp) -> bool {
        at > self.0
    }
}

/// A world's remembered messages ([`MAX_REMEMBERED`]), oldest first: their
/// keys ([`message_key`]) in one queue and what the depth rule needs of
/// them in another, so that a search reads 8 bytes an entry. A reply's
/// parent is most often the latest message, found first. A hash map kept
/// them before: at 1,024 messages its table alone held 66 KiB (2,048
/// buckets of 33 bytes), 74 bytes a message with its order queue, against
/// 32 here; and every approval probed it, and removed from it, in memory
/// long out of the CPU's caches.
#[derive(Debug, Default)]
struct Memory {
    keys: VecDeque<u64>,
    messages: VecDeque<Remembered>,
}

impl Memory {
    /// The latest approval remembered with this key.
    fn get(&self, key: u64) -> Option<&Remembered> {
        newest(&self.keys, key).map(|i| &self.messages[i])
    }

    /// Remembers a message, newest; returns the oldest if it had to go.
    fn push(&mut self, key: u64, message: Remembered) -> Option<(u64, Remembered)> {
        let gone = push_window(&mut self.keys, key, MAX_REMEMBERED);
        let gone_message = push_window(&mut self.messages, message, MAX_REMEMBERED);
        gone.zip(gone_message)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.keys.len()
    }

    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = &Remembered> {
        self.messages.iter()
    }

    fn bytes(&self) -> usize {
        deque_bytes(&self.keys) + deque_bytes(&self.messages)
    }
}

/// Where the newest entry equal to `hash` is in `hashes` (oldest first):
/// the newest entry first, then from the newest end on (see [`last_of`]).
fn newest(hashes: &VecDeque<u64>, hash: u64) -> Option<usize> {
    if hashes.back() == Some(&hash) {
        return Some(hashes.len() - 1);
    }
    let (older, newer) = hashes.as_slices();
    last_of(newer, hash)
        .map(|i| older.len() + i)
        .or_else(|| last_of(older, hash))
}

/// Where the last entry equal to `hash` is in `hashes`: a block of them at
/// a time from the end, with no early exit inside a block, so that the
/// compiler compares a block in a few vector instructions, then the block
/// that holds it. Most searched hashes are not there at all (a new
/// content), and a busy world's windows are a thousand hashes: searched
/// one by one, the duplicate window was a tenth of a decision there.
fn last_of(hashes: &[u64], hash: u64) -> Option<usize> {
    const BLOCK: usize = 16;
    let blocks = hashes.rchunks_exact(BLOCK);
    let front = blocks.remainder();
    let mut end = hashes.len();
    for block in blocks {
        if block.iter().fold(false, |found, h| found | (*h == hash)) {
            return block
                .iter()
                .rposition(|h| *h == hash)
                .map(|i| end - BLOCK + i);
        }
        end -= BLOCK;
    }
    front.iter().rposition(|h| *h == hash)
}

/// A world's duplicate window: the times and hashes of approved contents,
/// oldest first, in two queues so that a lookup reads the hashes alone. A
/// busy world's window holds hundreds of them, seldom in the CPU's caches:
/// 8 bytes an entry to scan, where (time, hash) pairs made it 16 (24
/// before times were [`Stamp`]s).
#[derive(Debug, Default)]
struct Contents {
    times: VecDeque<Stamp>,
    hashes: VecDeque<u64>,
}

impl Contents {
    /// Appends a content approved at `at`, first dropping those older than
    /// `window` then (they can never match again), and the oldest beyond
    /// [`MAX_DUPLICATE_WINDOW`].
    fn push(&mut self, at: Stamp, hash: u64, window: Duration) {
        if window.is_zero() {
            // The rule is off: nothing is kept for it to count later.
            return;
        }
        // Every window of times is oldest first (`seen` and `count_since`
        // rely on it).
        debug_assert!(
            self.times.back().is_none_or(|last| *last <= at),
            "a world's decisions come in time order"
        );
        let since = Since::new(at, window);
        while self.times.front().is_some_and(|t| !since.holds(*t)) {
            self.times.pop_front();
            self.hashes.pop_front();
        }
        if push_window(&mut self.times, at, MAX_DUPLICATE_WINDOW).is_some() {
            self.hashes.pop_front();
        }
        push_window(&mut self.hashes, hash, MAX_DUPLICATE_WINDOW);
    }

    /// Whether a content with this hash was approved within the window.
    fn seen(&self, hash: u64, since: Since) -> bool {
        // Most contents are new, so the whole window is read. The newest
        // entry with this hash decides: if that one is too old, so is
        // every other.
        newest(&self.hashes, hash).is_some_and(|i| since.holds(self.times[i]))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.hashes.len()
    }

    fn clear(&mut self) {
        self.times.clear();
        self.hashes.clear();
    }

    fn bytes(&self) -> usize {
        deque_bytes(&self.times) + deque_bytes(&self.hashes)
    }
}

/// How many of `times` are in the window: a binary search, as every window
/// of times here is oldest first (one worker decides a world's messages in
/// order, on a monotonic clock), so a long window costs what a short one
/// does.
fn count_since(times: &VecDeque<Stamp>, since: Since) -> usize {
    times.len() - times.partition_point(|at| !since.holds(*at))
}

/// Appends `item` to a per-world window of at most `cap` items and returns
/// the oldest one if it fell out. An empty window gets room for one item,
/// not the four `VecDeque` starts with: most worlds hold few messages, and
/// idle worlds are most of the memory. A full window lets its oldest item go
/// before it takes the new one, so it never grows past `cap` for a moment:
/// that would double its room (a busy world's four longest windows held
/// about 50 KiB they never used).
fn push_window<T>(window: &mut VecDeque<T>, item: T, cap: usize) -> Option<T> {
    let out = if window.len() >= cap {
        window.pop_front()
    } else {
        None
    };
    if window.capacity() == 0 {
        window.reserve_exact(1);
    }
    window.push_back(item);
    out
}

/// A speaker's key in the activity log (senders of different kinds with the
/// same name stay apart).
fn speaker_key(kind: SenderKind, name: &Name) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (kind, name.as_str()).hash(&mut h);
    h.finish()
}

/// Where a world's conversation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Conversation {
    /// Nothing in the last window.
    Cold,
    /// Active, and not less than in the window before.
    Warming,
    /// At least `conversation.hot_messages` from two or more speakers.
    Hot,
    /// Less active than in the window before.
    Cooling,
    /// A conclusion was approved; no human has spoken since.
    Concluded,
}

impl Conversation {
    pub const ALL: [Conversation; 5] = [
        Conversation::Cold,
        Conversation::Warming,
        Conversation::Hot,
        Conversation::Cooling,
        Conversation::Concluded,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Conversation::Cold => "cold",
            Conversation::Warming => "warming",
            Conversation::Hot => "hot",
            Conversation::Cooling => "cooling",
            Conversation::Concluded => "concluded",
        }
    }
}

impl WorldState {
    /// Forgets conversation activity at least `keep` old: the conversation
    /// state reads two windows back, no further.
    pub fn forget_activity_older_than(&mut self, now: Stamp, keep: Duration) {
        while self
            .activity
            .front()
            .is_some_and(|(at, _)| now.since(*at) >= keep)
        {
            self.activity.pop_front();
        }
    }

    /// Records an approved message for the conversation state: its time and
    /// speaker; a conclusion concludes, a human reopens, and after a
    /// conclusion the agents a message mentions (`mentioned`: routed to by
    /// mention, not by broadcast) may each reply once. A speaker is its
    /// kind and name: a system sender named as an agent is another one.
    pub fn observe_conversation(
        &mut self,
        kind: SenderKind,
        speaker: &Name,
        concludes: bool,
        mentioned: &[Name],
        now: Stamp,
    ) {
        push_window(
            &mut self.activity,
            (now, speaker_key(kind, speaker)),
            MAX_ACTIVITY,
        );
        // A conclusion starts afresh when the world is open or a human
        // concludes; an agent's or system's conclusion in a concluded world
        // ("thanks everyone, that's all" in a reply) is one more message
        // since the conclusion, and takes no allowance left to others.
        if concludes && (kind == SenderKind::Human || !self.concluded) {
            // "@bob thanks everyone": concluded, and bob may still answer.
            self.concluded = true;
            let allowed = &mut self.extras_mut().mentioned;
            allowed.clear();
            allowed.extend(mentioned.iter().take(MAX_MENTIONED).cloned());
            return;
        }
        if kind == SenderKind::Human {
            self.concluded = false;
            if let Some(extras) = &mut self.extras {
                extras.mentioned.clear();
            }
            return;
        }
        if self.concluded {
            let allowed = &mut self.extras_mut().mentioned;
            if kind == SenderKind::Agent {
                allowed.retain(|a| a != speaker); // its reply is used
            }
            for agent in mentioned {
                if !allowed.contains(agent) && allowed.len() < MAX_MENTIONED {
                    allowed.push(agent.clone());
                }
            }
        }
    }

    pub fn is_concluded(&self) -> bool {
        self.concluded
    }

    /// After a conclusion: `agent` was mentioned and has not replied yet.
    pub fn may_reply_after_conclusion(&self, agent: &Name) -> bool {
        self.extras().mentioned.contains(agent)
    }

    /// The conversation state at `now`.
    pub fn conversation(&self, now: Stamp, window: Duration, hot_messages: u32) -> Conversation {
        if self.concluded {
            return Conversation::Concluded;
        }
        let age = |at: &Stamp| now.since(*at);
        // Whether two or more spoke is all that is read: the first speaker,
        // and whether another followed (a list of all was quadratic in the
        // 512 activity entries, for every world at each scrape).
        let (mut first, mut several) = (None, false);
        let (mut recent, mut previous) = (0u32, 0u32);
        for (at, who) in self.activity.iter().rev() {
            let a = age(at);
            if a < window {
                recent += 1;
                match first {
                    None => first = Some(*who),
                    Some(f) => several |= f != *who,
                }
            } else if a < window * 2 {
                previous += 1;
            } else {
                break;
            }
        }
        if recent == 0 {
            Conversation::Cold
        } else if recent >= hot_messages.max(1) && several {
            Conversation::Hot
        } else if recent >= previous {
            Conversation::Warming
        } else {
            Conversation::Cooling
        }
    }
}

/// One delivered message, as an agent's context needs it.
#[derive(Debug, Clone)]
pub struct ContextEntry {
    /// The agent that sent it (none for human and system messages).
    pub agent_sender: Option<Name>,
    /// Agents it was delivered to privately.
    pub inboxes: Vec<Name>,
    /// The egress JSON, shared with the published copies.
    pub body: bytes::Bytes,
}

impl ContextEntry {
    /// What the entry holds beyond its own size: the body (shared with the
    /// published copies, and kept alive by the entry) and the inbox list,
    /// with its names' text (shared with the roster while they are on it,
    /// but held here alone once roster churn let them go: found by review).
    /// The body is counted twice: it was built in a growing buffer, whose
    /// spare room (less than its length) stays with it.
    fn bytes(&self) -> usize {
        2 * self.body.len()
            + self.inboxes.capacity() * size_of::<Name>()
            + self.inboxes.iter().map(name_bytes).sum::<usize>()
            + self.agent_sender.as_ref().map_or(0, name_bytes)
    }
}

impl WorldState {
    /// Keeps a delivered message for the context endpoint, at most `keep`.
    pub fn remember_context(&mut self, entry: ContextEntry, keep: usize) {
        if keep == 0 {
            return;
        }
        let extras = self.extras_mut();
        extras.context_bytes += entry.bytes();
        extras.context.push_back(entry);
        // The oldest beyond `keep` (more than one after a reload lowered it).
        let over = extras.context.len().saturating_sub(keep);
        for old in extras.context.drain(..over) {
            extras.context_bytes -= old.bytes();
        }
    }

    /// What `agent` was expected to act on (its inbox) plus its own
    /// messages, the last `limit`, oldest first.
    pub fn context_of(&self, agent: &Name, limit: usize) -> Vec<bytes::Bytes> {
        let mut picked: Vec<bytes::Bytes> = self
            .extras()
            .context
            .iter()
            .rev()
            .filter(|e| e.agent_sender.as_ref() == Some(agent) || e.inboxes.contains(agent))
            .take(limit)
            .map(|e| e.body.clone())
            .collect();
        picked.reverse();
        picked
    }
}

/// What `GET /v1/worlds/{world}` shows of a world.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorldView {
    pub world: Name,
    pub turns: u32,
    pub paused: bool,
    pub conversation: Conversation,
    pub roster: Vec<Name>,
    /// Recent activity of each roster agent.
    pub agents: std::collections::BTreeMap<Name, AgentView>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct AgentView {
    /// Listed in config (never forgotten).
    pub pinned: bool,
    /// Seconds since the agent last published or joined.
    pub last_seen_seconds_ago: f64,
    /// Seconds since its last approved message, if any is remembered.
    pub last_approved_seconds_ago: Option<f64>,
    /// Approved messages within the world's rate window.
    pub approved_in_rate_window: usize,
}

impl WorldState {
    /// A snapshot for the HTTP view.
    pub fn view(&self, world: &Name, now: Stamp, conversation: Conversation) -> WorldView {
        let rate_window = Duration::from_secs(self.settings.rules.rate.window_seconds);
        let ago = |t: Stamp| now.since(t).as_secs_f64();
        let roster = self.roster(now);
        let agents = roster
            .iter()
            .filter_map(|name| self.agents.get(name.as_str()).map(|a| (name, a)))
            .map(|(name, a)| {
                let view = AgentView {
                    pinned: a.pinned,
                    last_seen_seconds_ago: ago(a.last_seen),
                    last_approved_seconds_ago: a.last_approved().map(ago),
                    // By binary search, as the rule counts: the view holds
                    // the world's lock, and a full roster reads up to
                    // 1,024 agents' windows of up to 10,000 times each.
                    approved_in_rate_window: a.approvals_within(now, rate_window),
                };
                (name.clone(), view)
            })
            .collect();
        WorldView {
            world: world.clone(),
            turns: self.turns,
            paused: self.paused,
            conversation,
            roster,
            agents,
        }
    }
}

/// An approved message as [`WorldState::record_approved`] needs it.
pub struct Approved<'a> {
    /// The id as the world keeps it. A message that starts a thread names
    /// it, so the judge passes the thread's own string: one for both.
    pub id: &'a Arc<str>,
    pub lineage: &'a Lineage,
    pub content_hash: u64,
    pub now: Stamp,
    /// The sending agent and how many approval times to keep for it.
    pub agent: Option<(&'a Name, usize)>,
    /// An agent's message that takes a turn: it joins the speaking order
    /// (`alternation`) and the `budget`. A pass takes none: it hands the
    /// floor back, as a human message does, and is edited, not approved.
    pub takes_turn: bool,
}

/// One world in the cache: its state, the weight the cache last took for it
/// (read by the cache's weigher, which must not take the lock), and when a
/// message last used it.
#[derive(Debug)]
pub struct World {
    state: Mutex<WorldState>,
    weight: AtomicU32,
    /// Whole seconds after the cache was made (see [`Worlds::second`]).
    /// The cache's own idle clock counts every lookup, the admin API's
    /// too: this one counts messages alone. It fills the padding after
    /// `weight`, so a world weighs no more for it.
    used: AtomicU32,
}

/// Shared handle to one world.
pub type WorldHandle = Arc<World>;

/// Locks a world. A poisoned lock (a panic mid-decision, which the code is
/// written never to cause) still yields the state rather than a second panic.
pub fn lock(world: &WorldHandle) -> MutexGuard<'_, WorldState> {
    world
        .state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What moka keeps for each world beyond the world itself: its table slot
/// and bucket, entry and access-order node, and the key's copy (estimated
/// from moka 0.12's types; the idle-world benchmark measures the whole).
const CACHE_ENTRY_BYTES: usize = 256;

/// The allocator rounds each block up to a size class: a world's blocks
/// hold about an eighth more than their contents (mimalloc's classes are
/// an eighth to a quarter apart).
const ALLOCATOR_ROUNDING: usize = 8;

/// Most worlds the world cache's table is sized for at start (its bucket
/// array, 16-32 bytes a world, is resident from the start).
const PRESIZED_WORLDS: u64 = 1 << 20;

/// Every world's state, bounded by `state.max_worlds` and `state.max_bytes`
/// and expired after `state.idle_seconds` without a message.
///
/// The cache weighs each world by its [`WorldState::footprint`], and at
/// least `max_bytes / max_worlds`, against a capacity of `max_bytes`: so it
/// holds at most `max_worlds` worlds and about `max_bytes` of them, and a
/// client that fills a few worlds with long ids and many agents evicts idle
/// worlds instead of growing memory.
#[derive(Clone)]
pub struct Worlds {
    /// Hashed with foldhash's quality variant, randomly seeded: the world
    /// lookup is on every message, and SipHash cost more than the lookup's
    /// own work.
    cache: moka::sync::Cache<Name, WorldHandle, foldhash::quality::RandomState>,
    idle: Duration,
    /// The least a world weighs: `max_bytes / max_worlds`.
    least_weight: u32,
    /// The most a world weighs: half the capacity. A heavier one would
    /// empty the cache, then be evicted itself (or, re-weighed after an
    /// eviction, refused), losing its state at every turn.
    most_weight: u32,
    upkeep: Arc<Upkeep>,
    /// Worlds with a message waiting for the policy service, and how many
    /// (see [`Worlds::wait`]).
    waiting: Arc<Mutex<HashMap<Name, (WorldHandle, usize)>>>,
    /// Worlds let go: by the cache (its listener counts those) and, idle
    /// by loopguard's own clock, here.
    evicted: crate::metrics::Evicted,
}

/// Holds a world out of reach of eviction's consequences while a message of
/// it waits for the policy service: [`Worlds::get`] finds it until this is
/// dropped, even if the cache has evicted it meanwhile (see
/// [`Worlds::wait`]). A clone is one more hold.
#[derive(Debug)]
pub struct Waiting {
    waiting: Arc<Mutex<HashMap<Name, (WorldHandle, usize)>>>,
    name: Name,
}

impl Clone for Waiting {
    fn clone(&self) -> Waiting {
        if let Some((_, holds)) = lock_waiting(&self.waiting).get_mut(&self.name) {
            *holds += 1;
        }
        Waiting {
            waiting: self.waiting.clone(),
            name: self.name.clone(),
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut waiting = lock_waiting(&self.waiting);
        if let Some((_, holds)) = waiting.get_mut(&self.name) {
            *holds -= 1;
            if *holds == 0 {
                waiting.remove(&self.name);
            }
        }
    }
}

/// The waiting worlds' map; a panic elsewhere while it was held left it
/// whole (each change is one map operation).
fn lock_waiting(
    waiting: &Mutex<HashMap<Name, (WorldHandle, usize)>>,
) -> MutexGuard<'_, HashMap<Name, (WorldHandle, usize)>> {
    waiting.lock().unwrap_or_else(|p| p.into_inner())
}

/// What [`Worlds::upkeep`] goes by.
#[derive(Debug)]
struct Upkeep {
    /// World lookups since the last upkeep.
    lookups: AtomicU32,
    /// When the last upkeep ran, in milliseconds after `start`.
    at: AtomicU64,
    start: Instant,
}

/// Lookups after which [`Worlds::upkeep`] applies the cache's log: half of
/// the 64 at which moka applies it itself, inside a lookup.
const UPKEEP_AFTER: u32 = 32;

/// Time after which [`Worlds::upkeep`] applies the cache's log however few
/// lookups it holds: moka applies it itself, inside a lookup, 300 ms after
/// its last upkeep, so at a low rate this comes first.
const UPKEEP_EVERY: Duration = Duration::from_millis(200);

impl Worlds {
    /// Bounds come from `settings` once: they are not reloadable. Worlds
    /// the cache lets go are counted into `evicted`.
    pub fn new(settings: &Settings, evicted: crate::metrics::Evicted) -> Worlds {
        let state = &settings.config.state;
        let idle = Duration::from_secs(state.idle_seconds);
        let max_worlds = state.max_worlds.max(1);
        let least_weight = (state.max_bytes / max_worlds).clamp(1, u32::MAX.into());
        // Below max_bytes when the least weight was clamped: no more than
        // max_worlds worlds of it fit.
        let capacity = state.max_bytes.min(least_weight.saturating_mul(max_worlds));
        // LRU, not moka's default TinyLFU: TinyLFU may refuse to admit a new
        // world when full, and a refused world would lose its state after
        // every message, so a loop in it would never be counted.
        let cache = moka::sync::Cache::builder()
            .max_capacity(capacity)
            .weigher(|_, world: &WorldHandle| world.weight.load(Ordering::Relaxed))
            // The table sized for `max_worlds` at start: it never grows (a
            // rehash of every world, on the message thread), and lookups
            // probe less (callgrind: -7% instructions per lookup). Larger
            // bounds than PRESIZED_WORLDS grow past it as worlds come.
            .initial_capacity(max_worlds.min(PRESIZED_WORLDS) as usize)
            .time_to_idle(idle)
            .eviction_policy(moka::policy::EvictionPolicy::lru())
            // Counted as moka lets them go, in its upkeep. Those removed
            // or replaced here are counted where that happens: idle by
            // the injected clock (`get`, `get_or_create`), else not let
            // go at all (re-weighed).
            .eviction_listener({
                let evicted = evicted.clone();
                move |_, world: WorldHandle, cause| {
                    // Held elsewhere too (beside moka's own entry and the
                    // copy it hands here): a worker deciding it, or its
                    // message waiting for the policy service. That one
                    // puts it back, state and all (`weigh`, `keep`): not
                    // let go. (A look from the admin API at that moment
                    // hides one that is.)
                    if Arc::strong_count(&world) > 2 {
                        return;
                    }
                    match cause {
                        moka::notification::RemovalCause::Size => evicted.size.inc(),
                        moka::notification::RemovalCause::Expired => evicted.idle.inc(),
                        moka::notification::RemovalCause::Explicit
                        | moka::notification::RemovalCause::Replaced => {}
                    }
                }
            })
            .build_with_hasher(foldhash::quality::RandomState::default());
        Worlds {
            cache,
            idle,
            least_weight: least_weight as u32,
            most_weight: u32::try_from(capacity / 2).unwrap_or(u32::MAX),
            upkeep: Arc::new(Upkeep {
                lookups: AtomicU32::new(0),
                at: AtomicU64::new(0),
                start: Instant::now(),
            }),
            waiting: Arc::default(),
            evicted,
        }
    }

    /// The world's state, created on first use with `settings`.
    pub fn get_or_create(
        &self,
        world: &Name,
        settings: &Arc<WorldSettings>,
        now: Instant,
    ) -> WorldHandle {
        self.upkeep.lookups.fetch_add(1, Ordering::Relaxed);
        let second = self.second(now);
        let handle = self.cache.get_with_by_ref(world, || {
            Arc::new(World {
                state: Mutex::new(WorldState::new(settings.clone(), self.idle, Stamp::of(now))),
                weight: AtomicU32::new(self.least_weight),
                used: AtomicU32::new(second),
            })
        });
        let used = handle.used.load(Ordering::Relaxed);
        if used != second {
            handle.used.store(second, Ordering::Relaxed);
            if self.idle_between(used, second) {
                // Kept past `state.idle_seconds` by lookups that were no
                // message (the admin API's): forgotten now, as the cache
                // would have forgotten it. Put back after `used` is
                // stored, in case the admin API took it out meanwhile
                // (`get`, which then sees it in use).
                *lock(&handle) = WorldState::new(settings.clone(), self.idle, Stamp::of(now));
                self.cache.insert(world.clone(), handle.clone());
                self.evicted.idle.inc();
            }
        }
        handle
    }

    /// Counts a message the rules never read (its payload or subject
    /// rejected as invalid or too large) as use of `world`, if held: the
    /// contract counts every message to a world as use, rejected ones too.
    /// None is made for it. (A message rejected for a world's backlog needs
    /// none: the world waits for the policy service, and its answer counts
    /// as use, see [`Worlds::keep`]. Looking it up meanwhile could forget
    /// a world idle past a short `idle_seconds` while its message waits.)
    pub fn renew(&self, world: &Name, settings: &Arc<WorldSettings>, now: Instant) {
        if self.cache.contains_key(world) {
            let handle = self.get_or_create(world, settings, now);
            // Idle past `state.idle_seconds`, it starts again from its
            // settings (the agents a reload listed, say): weighed as such,
            // as a message's decision would weigh it (found by review).
            self.weigh(world, &handle, &lock(&handle));
        }
    }

    /// `now` as whole seconds after the cache was made: the time a
    /// [`World`] keeps of its last message.
    fn second(&self, now: Instant) -> u32 {
        let since = now.saturating_duration_since(self.upkeep.start);
        u32::try_from(since.as_secs()).unwrap_or(u32::MAX)
    }

    /// Whether a world last used at second `used` has been idle longer
    /// than `state.idle_seconds` at second `now`. In whole seconds it can
    /// only be late: a world the cache would still hold never counts.
    fn idle_between(&self, used: u32, now: u32) -> bool {
        u64::from(now.saturating_sub(used)) > self.idle.as_secs()
    }

    /// Whether `world` has had no message for longer than
    /// `state.idle_seconds` at `now` (see [`World::used`]).
    fn forgotten(&self, world: &World, now: Instant) -> bool {
        self.idle_between(world.used.load(Ordering::Relaxed), self.second(now))
    }

    /// Tells the cache what `world` holds now: `state` (its locked state),
    /// by its [`WorldState::footprint`]. The cache weighs that, with its own entry
    /// and the allocator's rounding, and at least `max_bytes / max_worlds`.
    /// Re-weighing is a write to the cache, so a growing world is weighed a
    /// quarter ahead of what it holds and re-weighed only once it outgrows
    /// that (or shrinks to half): a few times over its life, not at every
    /// message, and never weighed at less than it holds, but for a world
    /// heavier than half of `max_bytes` ([`heaviest_parts`]: weighed at that
    /// half, so that it does not empty the cache).
    ///
    /// A world evicted since its lookup is put back: its message was
    /// decided, and what it changed would be lost with it. Another thread
    /// can evict it meanwhile: a worker on another runtime thread, or the
    /// admin API's (a scrape applies the cache's pending work), and the
    /// cache logs a lookup's recency and applies it later, so a world just
    /// looked up can still be the least recently used. One worker decides
    /// all of a world's messages, so no newer state of it exists.
    pub fn weigh(&self, name: &Name, world: &WorldHandle, state: &WorldState) {
        match self.new_weight(name, world, state) {
            Some(weight) => {
                world.weight.store(weight, Ordering::Relaxed);
                // Same world, new weight (and back in, if it was evicted
                // meanwhile: it is in use).
                self.cache.insert(name.clone(), world.clone());
            }
            None => self.put_back(name, world),
        }
    }

    /// Weighs `world` again, as [`Worlds::weigh`], for a caller that is not
    /// its worker (the admin API's view): only while the cache still holds
    /// it. Evicted meanwhile, a message may have made the world anew, whose
    /// state a put back would replace with this older one.
    pub fn weigh_if_held(&self, name: &Name, world: &WorldHandle, state: &WorldState) {
        let Some(weight) = self.new_weight(name, world, state) else {
            return;
        };
        self.cache
            .entry_by_ref(name)
            .and_compute_with(|entry| match entry {
                Some(e) if Arc::ptr_eq(e.value(), world) => {
                    world.weight.store(weight, Ordering::Relaxed);
                    moka::ops::compute::Op::Put(world.clone())
                }
                _ => moka::ops::compute::Op::Nop,
            });
    }

    /// The weight `world` should take for `state`, when it is not its
    /// weight now: it outgrew it or shrank to half of it (then weighed a
    /// quarter ahead).
    fn new_weight(&self, name: &Name, world: &WorldHandle, state: &WorldState) -> Option<u32> {
        let bytes = state.footprint() + CACHE_ENTRY_BYTES + name_bytes(name);
        let bytes = bytes + bytes / ALLOCATOR_ROUNDING;
        let held = world.weight.load(Ordering::Relaxed) as usize;
        (bytes > held || bytes < held / 2)
            .then(|| {
                u32::try_from(bytes + bytes / 4)
                    .unwrap_or(u32::MAX)
                    .clamp(self.least_weight, self.most_weight.max(self.least_weight))
            })
            .filter(|&weight| weight as usize != held)
    }

    /// Puts `world` in the cache again if it is not there (evicted while
    /// in use); a world held is left as it is.
    fn put_back(&self, name: &Name, world: &WorldHandle) {
        if !self.cache.contains_key(name) {
            self.cache.insert(name.clone(), world.clone());
        }
    }

    /// Puts `world` back in the cache if it was evicted while in use: after
    /// a message of it waited for the policy service, during which nothing
    /// else of the world was decided (so no newer state of it exists), and
    /// its commit would otherwise be lost with it. The answer, at `now`,
    /// counts as use.
    pub fn keep(&self, name: &Name, world: &WorldHandle, now: Instant) {
        world.used.store(self.second(now), Ordering::Relaxed);
        self.put_back(name, world);
    }

    /// Calls `f` for every world held.
    pub fn for_each(&self, mut f: impl FnMut(&Name, &WorldHandle)) {
        for (name, handle) in self.cache.iter() {
            f(&name, &handle);
        }
    }

    /// The world's state if it is held, or if a message of it waits for
    /// the policy service; for the admin API, at `now`.
    ///
    /// Moka has no lookup that leaves its idle clock and its eviction
    /// order alone, so this one restarts the clock and makes the world the
    /// most recently used, as a message would (CONTRACT §9, *Bounds*). A
    /// world with no message for `state.idle_seconds` (by [`World::used`])
    /// is not found, then, and is taken out of the cache: a dashboard that
    /// polls a world does not keep it, its pause included, past the time
    /// the cache would have forgotten it.
    pub fn get(&self, world: &Name, now: Instant) -> Option<WorldHandle> {
        // The waiting first: an answer puts its world back in the cache
        // before it lets go of it here, so one missed here is in the cache.
        let waiting = lock_waiting(&self.waiting)
            .get(world)
            .map(|(h, _)| h.clone());
        if waiting.is_some() {
            return waiting;
        }
        // A lookup in the cache's log like a message's (see `upkeep`).
        self.upkeep.lookups.fetch_add(1, Ordering::Relaxed);
        let handle = self.cache.get(world)?;
        // A second's grace: a worker's clock reading may be a second
        // behind this one when it stores the world's use.
        let now = now.checked_sub(Duration::from_secs(1)).unwrap_or(now);
        if !self.forgotten(&handle, now) {
            return Some(handle);
        }
        // Out only if it is still that world, still unused: a message
        // that took it meanwhile stored its use first.
        let taken_out = self
            .cache
            .entry_by_ref(world)
            .and_compute_with(|entry| match entry {
                Some(e) if Arc::ptr_eq(e.value(), &handle) && self.forgotten(&handle, now) => {
                    moka::ops::compute::Op::Remove
                }
                _ => moka::ops::compute::Op::Nop,
            });
        if let moka::ops::compute::CompResult::Removed(_) = taken_out {
            self.evicted.idle.inc();
        }
        None
    }

    /// Marks `world` as waiting for the policy service until the returned
    /// hold is dropped. The cache may evict it meanwhile (a waiting world
    /// is the least recently used: its later messages are held back), and
    /// [`Worlds::keep`] puts it back once its answer is applied; until
    /// then [`Worlds::get`] still finds it here, so the admin API shows it
    /// and a reset reaches the state the answer is applied to, rather than
    /// finding no world and being undone by `keep`.
    pub fn wait(&self, name: &Name, world: &WorldHandle) -> Waiting {
        lock_waiting(&self.waiting)
            .entry(name.clone())
            .or_insert_with(|| (world.clone(), 0))
            .1 += 1;
        Waiting {
            waiting: self.waiting.clone(),
            name: name.clone(),
        }
    }

    /// Applies the cache's log of recent lookups (its LRU order and idle
    /// expiry) once [`UPKEEP_AFTER`] lookups have built up, or any after
    /// [`UPKEEP_EVERY`]. Moka applies it itself on every 64th lookup (or
    /// the first after 300 ms), and that lookup takes several microseconds
    /// longer: 64 list updates in memory mostly out of the CPU caches. The
    /// workers call this when none of them has a message queued, and
    /// [`Worlds::upkeep_between`] between two messages, so no decision
    /// applies the log itself. The work is the same, done between them.
    pub fn upkeep(&self) {
        // Nothing logged: not even a clock read (this runs whenever the
        // workers run dry, at moderate rates after most messages).
        if self.upkeep.lookups.load(Ordering::Relaxed) != 0 {
            self.upkeep_at(self.upkeep.start.elapsed());
        }
    }

    /// [`Worlds::upkeep`] between two decisions of a busy worker: only once
    /// [`UPKEEP_AFTER`] lookups have built up, however long ago the last
    /// upkeep was, and otherwise with no clock read (it runs after every
    /// decision). At saturation, where the workers' queues never run dry,
    /// this keeps the log below the 64 lookups at which moka would apply
    /// it inside a decision. (Moka still does so after 64 writes, new
    /// worlds and re-weighings, or while evictions are backlogged: rarer.)
    pub fn upkeep_between(&self) {
        if self.upkeep.lookups.load(Ordering::Relaxed) >= UPKEEP_AFTER {
            self.upkeep_at(self.upkeep.start.elapsed());
        }
    }

    /// [`Worlds::upkeep`] at `now`, as time since the cache was made.
    fn upkeep_at(&self, now: Duration) {
        let upkeep = &*self.upkeep;
        let lookups = upkeep.lookups.load(Ordering::Relaxed);
        if lookups == 0 {
            return;
        }
        let now = now.as_millis() as u64;
        if lookups < UPKEEP_AFTER
            && now.saturating_sub(upkeep.at.load(Ordering::Relaxed))
                < UPKEEP_EVERY.as_millis() as u64
        {
            return;
        }
        // One caller does it (with several runtime threads, two workers
        // may both get here); lookups counted meanwhile count on. One that
        // loses the race leaves the count at UPKEEP_AFTER or more: the
        // next message's `upkeep_between` tries again.
        if upkeep
            .lookups
            .compare_exchange(lookups, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            upkeep.at.store(now, Ordering::Relaxed);
            self.cache.run_pending_tasks();
        }
    }

    /// Number of worlds held, after pending evictions are applied.
    pub fn len(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.entry_count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of world state held, as the cache weighs them (pending
    /// evictions applied).
    pub fn bytes(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.weighted_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RulesConfig;

    fn name(s: &str) -> Name {
        Name::parse(s).unwrap()
    }

    fn world(agents: &[&str]) -> (WorldState, Stamp) {
        let now = Stamp::of(Instant::now());
        let settings = Arc::new(WorldSettings {
            agents: agents.iter().map(|a| name(a)).collect(),
            rules: RulesConfig::default(),
        });
        (WorldState::new(settings, Duration::from_secs(60), now), now)
    }

    /// `agent`'s message `id` approved at `now`, keeping `keep` of its
    /// approval times.
    fn approve_agent(
        w: &mut WorldState,
        agent: &Name,
        id: &str,
        keep: usize,
        takes_turn: bool,
        now: Stamp,
    ) {
        let l = w.lineage(id, None, None, true);
        w.record_approved(Approved {
            id: &Arc::from(id),
            lineage: &l,
            content_hash: 0,
            now,
            agent: Some((agent, keep)),
            takes_turn,
        });
    }

    /// Settings with no agents listed and the default rules, edited.
    fn with_rules(edit: impl FnOnce(&mut RulesConfig)) -> Arc<WorldSettings> {
        let mut rules = RulesConfig::default();
        edit(&mut rules);
        Arc::new(WorldSettings {
            agents: Vec::new(),
            rules,
        })
    }

    fn approve(w: &mut WorldState, id: &str, lineage: &Lineage, now: Stamp) {
        w.record_approved(Approved {
            id: &Arc::from(id),
            lineage,
            content_hash: 0,
            now,
            agent: None,
            takes_turn: true,
        });
    }

    #[test]
    fn config_agents_stay_and_others_expire_when_idle() {
        let (mut w, t0) = world(&["alice"]);
        w.touch_agent(&name("bob"), t0);
        assert_eq!(w.roster(t0), [name("alice"), name("bob")]);
        let later = t0 + Duration::from_secs(61);
        assert_eq!(w.roster(later), [name("alice")]);
        assert!(w.roster_get("bob", later).is_none());
        assert!(w.roster_get("alice", later).is_some());
    }

    #[test]
    fn a_roster_is_the_same_as_a_list_and_as_a_map() {
        let t0 = Stamp::of(Instant::now());
        let mut roster = Roster::new(std::iter::empty());
        for size in 1..=ROSTER_LIST_MAX + 3 {
            roster.insert(name(&format!("a{size}")), Agent::new(false, t0));
            assert_eq!(
                matches!(roster, Roster::List(_)),
                size <= ROSTER_LIST_MAX,
                "{size}"
            );
            assert_eq!(roster.len(), size);
            for i in 1..=size {
                let key = format!("a{i}");
                assert_eq!(
                    roster.get_key_value(&key).map(|(n, _)| n.as_str()),
                    Some(&*key)
                );
            }
            assert!(roster.get("a0").is_none());
            // Replacing keeps one entry per name.
            roster.insert(name("a1"), Agent::new(true, t0));
            assert_eq!(roster.len(), size);
            assert!(roster.get("a1").is_some_and(|a| a.pinned));
            if let Some(a) = roster.get_mut("a1") {
                a.pinned = false;
            }
            assert_eq!(roster.iter().count(), size);
            assert_eq!(roster.values_mut().filter(|a| !a.pinned).count(), size);
        }
        roster.remove("a2");
        assert!(roster.get("a2").is_none());
        assert_eq!(roster.len(), ROSTER_LIST_MAX + 2);
        let mut short = Roster::new([(name("x"), Agent::new(false, t0))].into_iter());
        short.remove("x");
        assert_eq!(short.len(), 0);
    }

    #[test]
    fn roster_is_capped_by_evicting_the_least_recently_seen() {
        let (mut w, t0) = world(&[]);
        for i in 0..MAX_AGENTS + 5 {
            w.touch_agent(
                &name(&format!("a{i}")),
                t0 + Duration::from_millis(i as u64),
            );
        }
        let later = t0 + Duration::from_secs(1);
        assert_eq!(w.roster(later).len(), MAX_AGENTS);
        assert!(w.roster_get("a0", later).is_none());
        assert!(w
            .roster_get(&format!("a{}", MAX_AGENTS + 4), later)
            .is_some());
    }

    /// A reload that pins new agents on a full roster keeps it at the cap:
    /// the least recently seen unpinned agents make room.
    #[test]
    fn agents_pinned_by_a_reload_do_not_overfill_the_roster() {
        let (mut w, t0) = world(&[]);
        for i in 0..MAX_AGENTS {
            w.touch_agent(
                &name(&format!("a{i}")),
                t0 + Duration::from_millis(i as u64),
            );
        }
        let pinned: Vec<Name> = (0..10).map(|i| name(&format!("p{i}"))).collect();
        let settings = Arc::new(WorldSettings {
            agents: pinned.clone(),
            rules: RulesConfig::default(),
        });
        let later = t0 + Duration::from_secs(1);
        w.apply_settings(&settings, later);
        assert_eq!(w.roster(later).len(), MAX_AGENTS);
        for p in &pinned {
            assert!(w.roster_get(p.as_str(), later).is_some(), "{p}");
        }
        assert!(w.roster_get("a0", later).is_none(), "the oldest left");
        assert!(w.roster_get("a10", later).is_some());
    }

    /// However many agents a world's config pins (at most MAX_PINNED), an
    /// agent it does not list gets a place on a full roster, so its
    /// cooldown and rate are counted. Configs could pin the whole roster
    /// before: then it had none (this fails if MAX_PINNED is MAX_AGENTS).
    #[test]
    fn an_unlisted_agent_finds_a_place_beside_the_most_pinned() {
        let pinned: Vec<String> = (0..MAX_PINNED).map(|i| format!("p{i}")).collect();
        let pinned: Vec<&str> = pinned.iter().map(String::as_str).collect();
        let (mut w, t0) = world(&pinned);
        for i in 0..2 * MAX_AGENTS {
            w.touch_agent(
                &name(&format!("u{i}")),
                t0 + Duration::from_millis(i as u64),
            );
        }
        let later = t0 + Duration::from_secs(10);
        w.touch_agent(&name("mallory"), later);
        assert!(w.agent(&name("mallory")).is_some());
        assert_eq!(w.roster(later).len(), MAX_AGENTS);
        assert!(pinned.iter().all(|p| w.roster_get(p, later).is_some()));
    }

    /// A pause ends when a reload lifts the turn limit past the turns
    /// taken (or turns it off), and stays when the limit is still reached.
    #[test]
    fn a_reload_lifting_the_turn_limit_ends_the_pause() {
        let with_turns = |max| with_rules(|r| r.turns.max = max);
        for (max, paused) in [(3, true), (2, true), (4, false), (0, false)] {
            let (mut w, t0) = world(&[]);
            (w.turns, w.paused) = (3, true);
            w.apply_settings(&with_turns(max), t0);
            assert_eq!(w.paused, paused, "max {max}");
            assert_eq!(w.turns, 3, "max {max}: turns are kept");
        }
    }

    #[test]
    fn lineage_prefers_parent_then_thread_then_latest() {
        let (mut w, t0) = world(&[]);
        let h = w.lineage("h1", None, None, false);
        assert_eq!((h.depth, &*h.thread_id), (0, "h1"));
        approve(&mut w, "h1", &h, t0);
        let a = w.lineage("a1", None, None, true);
        assert_eq!(
            (a.depth, a.parent_id.as_deref(), &*a.thread_id),
            (1, Some("h1"), "h1")
        );
        approve(&mut w, "a1", &a, t0);
        let other = w.lineage("h2", Some("t2"), None, false);
        approve(&mut w, "h2", &other, t0);

        // parent_id wins when remembered
        let p = w.lineage("x", None, Some("a1"), true);
        assert_eq!((p.depth, p.parent_id.as_deref()), (2, Some("a1")));
        // unknown parent_id: latest of its thread
        let t = w.lineage("y", Some("h1"), Some("nope"), true);
        assert_eq!(
            (t.depth, t.parent_id.as_deref(), &*t.thread_id),
            (2, Some("a1"), "h1")
        );
        // no thread known: latest of the world, joining its thread
        let l = w.lineage("z", None, None, true);
        assert_eq!(
            (l.depth, l.parent_id.as_deref(), &*l.thread_id),
            (1, Some("h2"), "t2")
        );
    }

    /// A message whose id is too long to remember is still the world's
    /// latest: a human's resets depth, and agents answering each other with
    /// long ids go deeper (found by review: both resolved to an older
    /// message, so a world at its depth limit stayed stuck, and a long-id
    /// ping-pong never got deeper).
    #[test]
    fn a_message_with_an_id_too_long_to_remember_is_still_the_latest() {
        let (mut w, t0) = world(&[]);
        let long = |c: char| c.to_string().repeat(MAX_REMEMBERED_ID + 1);
        let h = w.lineage("h1", None, None, false);
        approve(&mut w, "h1", &h, t0);
        let a = w.lineage("a1", None, None, true);
        approve(&mut w, "a1", &a, t0);
        assert_eq!(a.depth, 1);
        // A human answers with a long id: the next agent reply is depth 1.
        let human = w.lineage(&long('h'), None, None, false);
        approve(&mut w, &long('h'), &human, t0);
        let reply = w.lineage("a2", None, None, true);
        assert_eq!(
            (reply.depth, reply.parent_id.as_deref()),
            (1, Some(&*long('h')))
        );
        // Agents with long ids, by parent_id or with none: deeper each time.
        let b = w.lineage(&long('b'), None, Some(&long('h')), true);
        assert_eq!(b.depth, 1);
        approve(&mut w, &long('b'), &b, t0);
        let c = w.lineage(&long('c'), None, None, true);
        assert_eq!((c.depth, c.parent_id.as_deref()), (2, Some(&*long('b'))));
        approve(&mut w, &long('c'), &c, t0);
        // (The chain's thread is the human's long id: d names its own.)
        let d = w.lineage("d", Some("t"), Some(&long('c')), true);
        assert_eq!(d.depth, 3);
        // One that can be remembered takes the latest's place again.
        approve(&mut w, "d", &d, t0);
        assert!(w.latest_long.is_none());
        let e = w.lineage("e", None, None, true);
        assert_eq!((e.depth, e.parent_id.as_deref()), (4, Some("d")));
    }

    #[test]
    fn an_agent_message_with_no_parent_starts_its_own_thread() {
        let (w, _) = world(&[]);
        let l = w.lineage("m1", None, None, true);
        assert_eq!(
            l,
            Lineage {
                parent_id: None,
                thread_id: Arc::from("m1"),
                depth: 1,
                parent_is_agent: false,
            }
        );
    }

    #[test]
    fn remembered_messages_are_capped() {
        let (mut w, t0) = world(&[]);
        let l = w.lineage("m", None, None, false);
        for i in 0..MAX_REMEMBERED + 10 {
            approve(&mut w, &format!("m{i}"), &l, t0);
        }
        assert_eq!(w.memory.len(), MAX_REMEMBERED);
        assert!(w.remembered("m0").is_none());
        assert!(w.remembered(&format!("m{}", MAX_REMEMBERED + 9)).is_some());
    }

    /// A reused id is remembered as its latest approval, which stays (and
    /// stays its thread's latest) when the earlier approval's turn to be
    /// forgotten comes. (A map kept one entry a key in its first place, so
    /// the latest approval went then, and the thread fell back to the
    /// world's latest message.)
    #[test]
    fn a_reused_id_is_remembered_as_its_latest_approval_until_that_goes() {
        let (mut w, t0) = world(&[]);
        let first = w.lineage("x", Some("t1"), None, false);
        approve(&mut w, "x", &first, t0);
        for i in 1..MAX_REMEMBERED - 2 {
            let l = w.lineage(&format!("m{i}"), Some("t2"), None, false);
            approve(&mut w, &format!("m{i}"), &l, t0);
        }
        // The agent's "x" in thread t1, three deep this time.
        let again = Lineage {
            parent_id: None,
            thread_id: Arc::from("t1"),
            depth: 3,
            parent_is_agent: false,
        };
        approve(&mut w, "x", &again, t0);
        let found = |w: &WorldState| w.remembered("x").map(|m| (m.depth, m.thread_id.clone()));
        assert_eq!(found(&w), Some((3, Arc::from("t1"))));
        // Three more messages in another thread: the first makes thread t1's
        // latest ("x") an entry of the thread index, the next fill the
        // memory and push its oldest out, the first "x" first.
        for id in ["y1", "y2", "y3"] {
            let l = w.lineage(id, Some("t3"), None, false);
            approve(&mut w, id, &l, t0);
            // Both approvals are held after "y1", neither the newest entry.
            assert_eq!(found(&w), Some((3, Arc::from("t1"))), "after {id}");
        }
        assert_eq!(w.memory.len(), MAX_REMEMBERED);
        let reply = w.lineage("z", Some("t1"), None, true);
        assert_eq!(
            (reply.parent_id.as_deref(), reply.depth),
            (Some("x"), 4),
            "thread t1's latest is still the second x"
        );
        assert_eq!(w.remembered_bytes, remembered_text(&w));
    }

    /// A reload lowering the rate limit trims each agent's approval times
    /// and their room: a long roster's footprint counts them by the limit
    /// without reading them, and must not come out under what is held.
    #[test]
    fn a_reload_lowering_the_rate_limit_gives_the_agents_times_back() {
        let with_rate = |max| with_rules(|r| r.rate.max = max);
        let t0 = Stamp::of(Instant::now());
        let mut w = WorldState::new(with_rate(1000), Duration::from_secs(60), t0);
        let agents: Vec<Name> = (0..20).map(|i| name(&format!("a{i}"))).collect();
        for (i, agent) in agents.iter().enumerate() {
            w.touch_agent(agent, t0);
            for j in 0..1000 {
                approve_agent(&mut w, agent, &format!("{i}-{j}"), 1000, false, t0);
            }
        }
        let held = |w: &WorldState| -> usize {
            agents
                .iter()
                .map(|a| deque_bytes(&w.agent(a).unwrap().approvals))
                .sum()
        };
        assert!(held(&w) >= 20 * 1000 * size_of::<Stamp>());
        w.apply_settings(&with_rate(10), t0);
        assert!(agents
            .iter()
            .all(|a| w.agent(a).unwrap().approvals.len() == 10));
        assert!(held(&w) <= 20 * 16 * size_of::<Stamp>(), "{}", held(&w));
        assert!(w.footprint() >= held(&w));
        // Raised again: nothing to trim, the times grow with the traffic.
        w.apply_settings(&with_rate(1000), t0);
        assert!(agents
            .iter()
            .all(|a| w.agent(a).unwrap().approvals.len() == 10));
        // Lowered to one short of a power of two, then raised: the times'
        // room stays what the footprint counts (it doubled from 63 to 252).
        w.apply_settings(&with_rate(63), t0);
        w.apply_settings(&with_rate(127), t0);
        for (i, agent) in agents.iter().enumerate() {
            for j in 0..200 {
                approve_agent(&mut w, agent, &format!("again-{i}-{j}"), 127, false, t0);
            }
        }
        for agent in &agents {
            let room = w.agent(agent).unwrap().approvals.capacity();
            assert!(room <= 128, "{room}");
        }
    }

    #[test]
    fn a_full_roster_holds_no_more_approval_times_than_the_heaviest_parts_say() {
        let (settings, _) = worlds_with(|c| c.rules.rate.max = 100);
        let t0 = Stamp::of(Instant::now());
        let mut w = WorldState::new(settings.default_world.clone(), Duration::from_secs(60), t0);
        let agents: Vec<Name> = (0..MAX_AGENTS).map(|i| name(&format!("a{i}"))).collect();
        for agent in &agents {
            w.touch_agent(agent, t0);
            for _ in 0..100 {
                approve_agent(&mut w, agent, "i", 100, false, t0);
            }
        }
        let held: usize = agents
            .iter()
            .map(|a| deque_bytes(&w.agent(a).unwrap().approvals))
            .sum();
        let bound = heaviest_parts(&settings);
        assert!(held <= bound && held > bound / 2, "{held} of {bound}");
        // With 10,000 kept, a world's roster alone outweighs half of the
        // least max_bytes: what start-up warns of.
        let (heavy, _) = worlds_with(|c| {
            c.rules.rate.max = crate::config::MAX_RATE;
            c.state.max_bytes = MIN_STATE_BYTES;
        });
        assert!(heaviest_parts(&heavy) > MIN_STATE_BYTES as usize / 2);
        // So does a latest message kept whole, its ids too long to
        // remember, with payloads of up to 8 MiB (the server allows 64).
        let (long_ids, _) = worlds_with(|c| {
            c.limits.max_payload_bytes = 8 << 20;
            c.state.max_bytes = MIN_STATE_BYTES;
        });
        let t0 = Stamp::of(Instant::now());
        let mut w = WorldState::new(long_ids.default_world.clone(), Duration::from_secs(60), t0);
        let empty = w.footprint();
        let id = "i".repeat(4 << 20);
        let thread = "t".repeat(4 << 20);
        let lineage = w.lineage(&id, None, Some(&thread), false);
        w.record_approved(Approved {
            id: &Arc::from(id.as_str()),
            lineage: &lineage,
            content_hash: 0,
            now: t0,
            agent: None,
            takes_turn: false,
        });
        let grown = w.footprint() - empty;
        let bound = heaviest_parts(&long_ids);
        assert!(grown >= 8 << 20 && grown <= bound, "{grown} of {bound}");
        assert!(bound > MIN_STATE_BYTES as usize / 2);
    }

    #[test]
    fn alternation_history_is_kept_only_while_the_rule_is_on() {
        let with_cycles = |cycles| with_rules(|r| r.alternation.max_cycles = cycles);
        let t0 = Stamp::of(Instant::now());
        let mut w = WorldState::new(with_cycles(2), Duration::from_secs(60), t0);
        let speak = |w: &mut WorldState, who: &str, id: &str| {
            approve_agent(w, &name(who), id, 10, true, t0);
        };
        speak(&mut w, "a", "1");
        speak(&mut w, "b", "2");
        assert_eq!(w.speakers().len(), 2);
        w.apply_settings(&with_cycles(0), t0);
        assert!(w.speakers().is_empty(), "off keeps no history");
        speak(&mut w, "a", "3");
        assert!(w.speakers().is_empty(), "nothing recorded while off");
        w.apply_settings(&with_cycles(2), t0);
        speak(&mut w, "b", "4");
        assert_eq!(
            w.speakers().iter().map(Name::as_str).collect::<Vec<_>>(),
            ["b"]
        );
    }

    /// As for the speakers: a budget, `similar` or `duplicate` turned off
    /// forgets its window, so turned on again it does not count approvals
    /// from before (and miss those made meanwhile), and the world gives the
    /// memory back.
    #[test]
    fn budget_similar_and_duplicate_history_is_kept_only_while_the_rule_is_on() {
        let on = with_rules(|r| {
            r.budget.max = 100;
            r.similar.threshold = 0.8;
            r.turns.max = 0;
        });
        let off = with_rules(|r| {
            r.turns.max = 0;
            r.duplicate.window_seconds = 0;
        });
        let t0 = Stamp::of(Instant::now());
        let mut w = WorldState::new(on.clone(), Duration::from_secs(60), t0);
        for i in 0..5 {
            approve_agent(&mut w, &name("a"), &i.to_string(), 10, true, t0);
            w.remember_words(t0, crate::rules::similar::words("plan the launch"));
        }
        let window = Duration::from_secs(600);
        assert_eq!(w.agent_approvals_within(t0, window), 5);
        assert_eq!(w.recent_words(t0, window).count(), 5);
        assert!(w.seen_content(0, t0, window));
        let before = w.footprint();
        w.apply_settings(&off, t0);
        assert_eq!(w.agent_approvals_within(t0, window), 0);
        assert_eq!(w.recent_words(t0, window).count(), 0);
        assert!(!w.seen_content(0, t0, window));
        assert!(w.footprint() < before, "{} of {before}", w.footprint());
        // Approved while off: recorded for none of them (the words too,
        // as a message decided before the reload commits them after it).
        approve_agent(&mut w, &name("a"), "5", 10, true, t0);
        w.remember_words(t0, crate::rules::similar::words("plan the launch"));
        w.apply_settings(&on, t0);
        assert_eq!(w.recent_words(t0, window).count(), 0);
        assert!(!w.seen_content(0, t0, window), "approved while off");
        approve_agent(&mut w, &name("a"), "6", 10, true, t0);
        assert_eq!(w.agent_approvals_within(t0, window), 1);
        assert!(w.seen_content(0, t0, window));
    }

    /// A long name is its own allocation in each speaker entry (each
    /// message's name is parsed anew): counted, where only the entries
    /// were.
    #[test]
    fn long_speaker_names_are_weighed() {
        let alternating = with_rules(|r| {
            r.alternation.max_cycles = 2;
            r.turns.max = 0;
        });
        let t0 = Stamp::of(Instant::now());
        let filled = |len: usize| {
            let mut w = WorldState::new(alternating.clone(), Duration::from_secs(60), t0);
            for i in 0..MAX_SPEAKERS + 10 {
                let agent = name(&format!("{}{}", "a".repeat(len - 1), i % 2));
                approve_agent(&mut w, &agent, &i.to_string(), 10, true, t0);
            }
            w
        };
        let (short, long) = (filled(1), filled(64));
        assert_eq!(long.speakers().len(), MAX_SPEAKERS);
        let more = long.footprint() - short.footprint();
        assert!(more >= MAX_SPEAKERS * 64, "{more}");
        let mut long = long;
        long.reset_turns();
        assert_eq!(long.extras().speaker_bytes, 0);
    }

    #[test]
    fn the_duplicate_window_holds_only_contents_young_enough_to_match() {
        let (mut w, t0) = world(&[]); // default duplicate window: 300 s
        let window = Duration::from_secs(300);
        let l = w.lineage("m", None, None, false);
        for i in 0..600u64 {
            let now = t0 + Duration::from_secs(i);
            w.record_approved(Approved {
                id: &Arc::from(format!("m{i}")),
                lineage: &l,
                content_hash: i,
                now,
                agent: None,
                takes_turn: true,
            });
        }
        let now = t0 + Duration::from_secs(599);
        assert_eq!(w.contents.len(), 300, "only the last 300 s");
        assert!(w.seen_content(599, now, window));
        assert!(w.seen_content(300, now, window));
        assert!(!w.seen_content(299, now, window));
    }

    #[test]
    fn a_full_window_takes_a_new_item_in_the_room_it_has() {
        let mut window = VecDeque::new();
        for i in 0..1024 {
            assert_eq!(push_window(&mut window, i, 1024), None);
        }
        let room = window.capacity();
        for i in 1024..5000 {
            assert_eq!(push_window(&mut window, i, 1024), Some(i - 1024));
        }
        assert_eq!(window.len(), 1024);
        assert_eq!(window.capacity(), room, "no room added when full");
        assert_eq!(room, 1024);
    }

    #[test]
    fn the_duplicate_window_finds_every_hash_it_holds_wherever_its_ring_wraps() {
        // Hashes in blocks and in the rest before the first block, at every
        // place, some twice: the last of them is found.
        for len in 0..40u64 {
            let hashes: Vec<u64> = (0..len).map(|i| 100 + i % 7).collect();
            for h in 99..=107 {
                let last = hashes.iter().rposition(|x| *x == h);
                assert_eq!(last_of(&hashes, h), last, "{len} {h}");
            }
        }
        // And in a ring, wherever it wraps.
        let mut ring = VecDeque::with_capacity(64);
        for i in 0..200u64 {
            push_window(&mut ring, 1000 + i % 37, 50);
            for h in 999..1040 {
                let last = ring.iter().rposition(|x| *x == h);
                assert_eq!(newest(&ring, h), last, "{i} {h}");
            }
        }
        let t0 = Stamp::of(Instant::now());
        let window = Duration::from_secs(3600);
        let mut contents = Contents::default();
        for i in 0..(MAX_DUPLICATE_WINDOW + 500) as u64 {
            contents.push(t0 + Duration::from_millis(i), i, window);
        }
        let (older, newer) = contents.hashes.as_slices();
        assert!(
            !older.is_empty() && !newer.is_empty(),
            "the ring has wrapped"
        );
        let now = t0 + Duration::from_secs(10);
        let since = Since::new(now, window);
        for i in 0..(MAX_DUPLICATE_WINDOW + 600) as u64 {
            let held = (500..(MAX_DUPLICATE_WINDOW + 500) as u64).contains(&i);
            assert_eq!(contents.seen(i, since), held, "hash {i}");
        }
    }

    #[test]
    fn forgotten_activity_does_not_change_the_conversation_state() {
        let (mut kept, t0) = world(&[]);
        let (mut trimmed, _) = world(&[]);
        let window = Duration::from_secs(60);
        let (a, b) = (name("a"), name("b"));
        for i in 0..600u64 {
            let now = t0 + Duration::from_secs(i) / 2 + Duration::from_secs(i / 100 * 50);
            let who = if i % 3 == 0 { &a } else { &b };
            kept.observe_conversation(SenderKind::Agent, who, false, &[], now);
            trimmed.forget_activity_older_than(now, window * 2);
            trimmed.observe_conversation(SenderKind::Agent, who, false, &[], now);
            for later in [0, 30, 61, 119, 121] {
                let at = now + Duration::from_secs(later);
                assert_eq!(
                    kept.conversation(at, window, 10),
                    trimmed.conversation(at, window, 10),
                    "message {i}, {later} s later"
                );
            }
        }
        assert!(trimmed.activity.len() < kept.activity.len());
        assert!(trimmed.activity.len() <= 240, "{}", trimmed.activity.len());
    }

    #[test]
    fn each_thread_resolves_to_its_latest_and_one_thread_keeps_no_index() {
        let (mut w, t0) = world(&[]);
        let parent = |w: &WorldState, thread: &str| {
            w.lineage("x", Some(thread), None, true)
                .parent_id
                .map(|p| p.to_string())
        };
        let l = w.lineage("a1", Some("a"), None, false);
        approve(&mut w, "a1", &l, t0);
        let l = w.lineage("a2", Some("a"), None, true);
        approve(&mut w, "a2", &l, t0);
        assert!(w.thread_latest.is_none(), "one thread, no index");
        let l = w.lineage("b1", Some("b"), None, false);
        approve(&mut w, "b1", &l, t0);
        assert_eq!(parent(&w, "a").as_deref(), Some("a2"));
        assert_eq!(parent(&w, "b").as_deref(), Some("b1"));
        let l = w.lineage("a3", Some("a"), None, true);
        approve(&mut w, "a3", &l, t0);
        assert_eq!(parent(&w, "a").as_deref(), Some("a3"));
        assert_eq!(parent(&w, "b").as_deref(), Some("b1"));
        assert_eq!(
            w.thread_latest.as_ref().map(|i| i.len()),
            Some(1),
            "only b: a is the latest's own"
        );
    }

    #[test]
    fn thread_index_stays_bounded_when_ids_are_reused_across_threads() {
        let (mut w, t0) = world(&[]);
        for i in 0..10 * MAX_REMEMBERED {
            let l = Lineage {
                parent_id: None,
                thread_id: Arc::from(format!("t{i}")),
                depth: 0,
                parent_is_agent: false,
            };
            approve(&mut w, "same-id", &l, t0);
        }
        assert!(
            w.thread_latest.as_ref().map_or(0, |i| i.len()) <= 2 * MAX_REMEMBERED + 1,
            "{:?}",
            w.thread_latest.as_ref().map(|i| i.len())
        );
        // a stale thread no longer resolves to a message filed elsewhere:
        // a reply in it falls back to the world's latest message
        let l = w.lineage("n", Some("t0"), None, true);
        assert_eq!(&*l.thread_id, "t0");
        assert_eq!(l.parent_id.as_deref(), Some("same-id"));
        assert!(w.thread_latest.as_ref().is_none_or(|i| i.is_empty()));
    }

    /// Settings from the defaults edited by `edit`, and a world cache of them.
    fn worlds_with(edit: impl FnOnce(&mut crate::config::Config)) -> (Settings, Worlds) {
        let mut config = crate::config::Config::default();
        edit(&mut config);
        let settings = config.validate().unwrap();
        let worlds = Worlds::new(&settings, crate::metrics::Metrics::new().evicted);
        (settings, worlds)
    }

    #[test]
    fn upkeep_applies_the_cache_log_once_enough_lookups_built_up() {
        let settings = crate::config::Config::default().validate().unwrap();
        let worlds = Worlds::new(&settings, crate::metrics::Metrics::new().evicted);
        let now = Instant::now();
        let fresh = |i: u32| {
            worlds.get_or_create(&name(&format!("w{i}")), &settings.default_world, now);
        };
        for i in 0..UPKEEP_AFTER {
            fresh(i);
        }
        // moka counts a new world once its log is applied, and applies it
        // itself only after 64 entries (or 300 ms).
        worlds.upkeep();
        assert_eq!(worlds.cache.entry_count(), u64::from(UPKEEP_AFTER));
        let lookups = || worlds.upkeep.lookups.load(Ordering::Relaxed);
        assert_eq!(lookups(), 0);
        fresh(UPKEEP_AFTER);
        // One lookup since: too few to bother, until UPKEEP_EVERY has passed.
        let last = Duration::from_millis(worlds.upkeep.at.load(Ordering::Relaxed));
        worlds.upkeep_at(last);
        assert_eq!(lookups(), 1);
        worlds.upkeep_at(last + UPKEEP_EVERY - Duration::from_millis(1));
        assert_eq!(lookups(), 1);
        worlds.upkeep_at(last + UPKEEP_EVERY);
        assert_eq!(lookups(), 0);
        assert_eq!(worlds.cache.entry_count(), u64::from(UPKEEP_AFTER) + 1);
    }

    #[test]
    fn between_messages_the_cache_log_is_applied_by_lookups_alone() {
        let settings = crate::config::Config::default().validate().unwrap();
        let built = Instant::now();
        let mut worlds = Worlds::new(&settings, crate::metrics::Metrics::new().evicted);
        // The cache made a second ago, its last upkeep then: past
        // UPKEEP_EVERY, after which `upkeep` would apply any lookup.
        let start = Instant::now().checked_sub(Duration::from_secs(1)).unwrap();
        worlds.upkeep = Arc::new(Upkeep {
            lookups: AtomicU32::new(0),
            at: AtomicU64::new(0),
            start,
        });
        let now = Instant::now();
        let lookups = || worlds.upkeep.lookups.load(Ordering::Relaxed);
        let look = |i: u32| {
            worlds.get_or_create(&name(&format!("w{i}")), &settings.default_world, now);
        };
        for i in 0..UPKEEP_AFTER {
            worlds.upkeep_between();
            assert_eq!(lookups(), i, "too few lookups: left for later");
            look(i);
        }
        // Not applied yet: moka counts a new world only once it is (unless
        // this thread was held up past moka's own 300 ms, when its next
        // write applies the log: a loaded machine, not the code).
        if built.elapsed() < Duration::from_millis(250) {
            assert_eq!(worlds.cache.entry_count(), 0);
        }
        // However little time passed: a busy worker's next lookups would
        // otherwise reach moka's own 64 inside a decision.
        worlds.upkeep_between();
        assert_eq!(lookups(), 0);
        assert_eq!(worlds.cache.entry_count(), u64::from(UPKEEP_AFTER));
        // Lookups of worlds held count alike, and so do the admin API's.
        for i in 0..UPKEEP_AFTER - 1 {
            look(i);
        }
        worlds.get(&name("w0"), now);
        assert_eq!(lookups(), UPKEEP_AFTER);
        worlds.upkeep_between();
        assert_eq!(lookups(), 0);
    }

    #[test]
    fn a_full_cache_still_admits_new_worlds_and_evicts_the_least_recently_used() {
        let (settings, worlds) = worlds_with(|c| c.state.max_worlds = 3);
        let now = Instant::now();
        for i in 0..50 {
            let w = name(&format!("w{i}"));
            lock(&worlds.get_or_create(&w, &settings.default_world, now)).turns = 7;
            assert!(worlds.get(&w, now).is_some(), "w{i} admitted");
        }
        assert_eq!(worlds.len(), 3);
        assert!(worlds.get(&name("w0"), now).is_none());
        // Each made room for another: counted, as evicted for size.
        assert_eq!(worlds.evicted.size.get(), 47);
        assert_eq!(worlds.evicted.idle.get(), 0);
    }

    #[test]
    fn a_world_evicted_while_in_use_and_put_back_is_not_counted_as_let_go() {
        let (settings, worlds) = worlds_with(|c| c.state.max_worlds = 3);
        let now = Instant::now();
        let world = |i: u32| name(&format!("w{i}"));
        let held = worlds.get_or_create(&world(0), &settings.default_world, now);
        lock(&held).turns = 7;
        // Room made for others while w0's message is decided: w0, the
        // least recently used, is evicted, but its worker still holds it.
        for i in 1..=3 {
            worlds.get_or_create(&world(i), &settings.default_world, now);
        }
        assert_eq!(worlds.len(), 3);
        assert!(!worlds.cache.contains_key(&world(0)), "w0 evicted");
        assert_eq!(worlds.evicted.size.get(), 0, "w0 is still in use");
        // Its worker puts it back, state and all: it was not let go.
        worlds.weigh(&world(0), &held, &lock(&held));
        assert_eq!(lock(&worlds.get(&world(0), now).unwrap()).turns, 7);
        drop(held);
        // One that nobody holds is let go: counted.
        worlds.get_or_create(&world(4), &settings.default_world, now);
        assert_eq!(worlds.len(), 3);
        assert_eq!(worlds.evicted.size.get(), 2);
    }

    #[test]
    fn looking_at_a_world_does_not_keep_it_past_its_idle_time() {
        let (settings, worlds) = worlds_with(|c| c.state.idle_seconds = 60);
        let start = Instant::now();
        let w = name("lobby");
        let paused = || {
            let handle = worlds.get_or_create(&w, &settings.default_world, start);
            let mut state = lock(&handle);
            state.turns = 20;
            state.paused = true;
        };
        paused();
        // The admin API looks (on the cache's own clock each look would
        // restart the idle time); no message comes. (61 s: a second's grace
        // for a worker's clock reading.)
        for at in [30, 60, 61] {
            let seen = worlds.get(&w, start + Duration::from_secs(at));
            assert!(seen.is_some_and(|h| lock(&h).paused), "held at {at} s");
        }
        // 62 s after its last message: not found, and out of the cache.
        assert!(worlds.get(&w, start + Duration::from_secs(62)).is_none());
        assert_eq!(worlds.len(), 0);
        assert_eq!(worlds.evicted.idle.get(), 1, "counted as let go idle");
        // A world still in the cache past its idle time (the cache's
        // clock is the real one, the test's is 200 s ahead) is forgotten
        // at its next message instead.
        paused();
        let later = start + Duration::from_secs(200);
        let handle = worlds.get_or_create(&w, &settings.default_world, later);
        let state = lock(&handle);
        assert_eq!((state.turns, state.paused), (0, false), "starts as new");
        drop(state);
        assert_eq!(worlds.evicted.idle.get(), 2);
        assert_eq!(worlds.evicted.size.get(), 0);
        // And a message counts as use: the world is found 60 s after it.
        let at = later + Duration::from_secs(60);
        assert!(worlds.get(&w, at).is_some());
        // as does a policy answer applied to it (`keep`).
        worlds.keep(&w, &handle, at + Duration::from_secs(30));
        assert!(worlds.get(&w, at + Duration::from_secs(89)).is_some());
    }

    #[test]
    fn a_world_evicted_while_in_use_is_kept() {
        let (settings, worlds) = worlds_with(|c| c.state.max_worlds = 1);
        let now = Instant::now();
        let waiting = worlds.get_or_create(&name("waiting"), &settings.default_world, now);
        lock(&waiting).turns = 3;
        let other = worlds.get_or_create(&name("other"), &settings.default_world, now);
        assert_eq!(worlds.len(), 1);
        assert!(worlds.get(&name("waiting"), now).is_none(), "evicted");
        worlds.keep(&name("waiting"), &waiting, now);
        let held = worlds
            .get(&name("waiting"), now)
            .expect("back in the cache");
        assert!(Arc::ptr_eq(&held, &waiting));
        assert_eq!(lock(&held).turns, 3);
        // A world held is left as it is.
        worlds.keep(&name("waiting"), &other, now);
        assert!(Arc::ptr_eq(
            &worlds.get(&name("waiting"), now).unwrap(),
            &waiting
        ));
    }

    /// A world an invalid message renews past `state.idle_seconds` starts
    /// again from its settings, and is weighed as such: with 512 long names
    /// listed, past the least weight it had.
    #[test]
    fn a_world_renewed_by_an_invalid_message_is_weighed_anew() {
        let (settings, worlds) = worlds_with(|c| {
            c.state.max_bytes = 16 << 20;
            c.state.max_worlds = 10_000;
            c.state.idle_seconds = 60;
        });
        let t0 = Instant::now();
        let w = name("renewed");
        let handle = worlds.get_or_create(&w, &settings.default_world, t0);
        let least = handle.weight.load(Ordering::Relaxed);
        let listed = Arc::new(WorldSettings {
            agents: (0..MAX_PINNED)
                .map(|i| name(&format!("{}{i}", "a".repeat(60))))
                .collect(),
            rules: RulesConfig::default(),
        });
        worlds.renew(&w, &listed, t0 + Duration::from_secs(120));
        let renewed = worlds.get(&w, t0 + Duration::from_secs(120)).expect("held");
        assert_eq!(lock(&renewed).roster(Stamp::of(t0)).len(), MAX_PINNED);
        let weight = renewed.weight.load(Ordering::Relaxed);
        assert!(weight > least, "{least} -> {weight}");
    }

    /// The admin view's weighing puts no world back: one evicted meanwhile
    /// may have been made anew by a message, which it would replace with
    /// the older state (found by review). A world held is weighed anew.
    #[test]
    fn a_view_weighs_a_world_only_while_it_is_held() {
        let (settings, worlds) = worlds_with(|c| {
            c.state.max_bytes = 16 << 20;
            c.state.max_worlds = 10_000;
        });
        let now = Instant::now();
        let grow = |state: &mut WorldState| {
            for i in 0..1000 {
                state.touch_agent(&name(&format!("{}-{i}", "a".repeat(50))), Stamp::of(now));
            }
        };
        let w = name("viewed");
        let viewed = worlds.get_or_create(&w, &settings.default_world, now);
        worlds.cache.invalidate(&w); // evicted, as by another thread
        let anew = worlds.get_or_create(&w, &settings.default_world, now);
        lock(&anew).turns = 4;
        // The view's world grew (newly listed agents), so is weighed anew.
        grow(&mut lock(&viewed));
        worlds.weigh_if_held(&w, &viewed, &lock(&viewed));
        let held = worlds.get(&w, now).expect("the new one held");
        assert!(Arc::ptr_eq(&held, &anew), "the old state put back");
        assert_eq!(lock(&held).turns, 4);
        // Held, it is weighed anew.
        let before = anew.weight.load(Ordering::Relaxed);
        grow(&mut lock(&anew));
        worlds.weigh_if_held(&w, &anew, &lock(&anew));
        assert!(anew.weight.load(Ordering::Relaxed) > before);
        assert!(Arc::ptr_eq(&worlds.get(&w, now).unwrap(), &anew));
    }

    #[test]
    fn a_world_evicted_while_decided_is_put_back() {
        let (settings, worlds) = worlds_with(|c| c.state.max_worlds = 1);
        let now = Instant::now();
        let w = name("decided");
        let handle = worlds.get_or_create(&w, &settings.default_world, now);
        // Another thread's lookup (and a scrape's upkeep) evicts it before
        // its commit.
        worlds.get_or_create(&name("other"), &settings.default_world, now);
        assert_eq!(worlds.len(), 1);
        assert!(worlds.get(&w, now).is_none(), "evicted");
        let mut state = lock(&handle);
        state.turns = 3;
        // Weighed as before: only a put back brings it in again.
        worlds.weigh(&w, &handle, &state);
        drop(state);
        let held = worlds.get(&w, now).expect("put back");
        assert!(Arc::ptr_eq(&held, &handle));
        assert_eq!(lock(&held).turns, 3);
    }

    /// What `remembered_bytes` should be: counted from the messages held.
    fn remembered_text(w: &WorldState) -> u32 {
        w.memory.iter().map(|m| text_bytes(&m.thread_id)).sum()
    }

    #[test]
    fn remembered_and_index_bytes_follow_the_ids_a_world_holds() {
        let (mut w, t0) = world(&[]);
        for i in 0..3 * MAX_REMEMBERED {
            // Lengths up to MAX_REMEMBERED_ID; every fifth id reused under
            // another thread; threads shared by a few messages each.
            let id = match i % 5 {
                0 => "reused".to_string(),
                _ => format!("{i}-{}", "i".repeat(i % MAX_REMEMBERED_ID)),
            };
            let id = &id[..id.len().min(MAX_REMEMBERED_ID)];
            let thread = format!("t{}-{}", i / 3, "t".repeat(i % 200));
            let l = w.lineage(id, Some(&thread), None, i % 2 == 0);
            approve(&mut w, id, &l, t0);
            if i % 97 == 0 || i + 1 == 3 * MAX_REMEMBERED {
                assert_eq!(w.remembered_bytes, remembered_text(&w), "after {i}");
                let index: u32 = w.thread_latest.as_ref().map_or(0, |index| {
                    index
                        .iter()
                        .map(|(t, id)| text_bytes(t) + text_bytes(id))
                        .sum()
                });
                assert_eq!(w.index_bytes, index, "after {i}");
            }
        }
        assert_eq!(w.memory.len(), MAX_REMEMBERED);
    }

    #[test]
    fn the_footprint_counts_long_ids_and_context_bodies() {
        let (mut w, t0) = world(&[]);
        let empty = w.footprint();
        for i in 0..MAX_REMEMBERED {
            let id = format!("{i:0>256}");
            let l = w.lineage(&id, Some(&format!("t{i:0>255}")), None, false);
            approve(&mut w, &id, &l, t0);
        }
        let full = w.footprint();
        assert!(
            full - empty > MAX_REMEMBERED * 2 * 256,
            "{empty} -> {full}: the thread ids and the index's ids alone are 512 KiB"
        );
        let body = |n: usize| ContextEntry {
            agent_sender: None,
            inboxes: vec![name("bob")],
            body: bytes::Bytes::from(vec![b'x'; n]),
        };
        for n in [10_000, 20_000, 30_000] {
            w.remember_context(body(n), 2);
        }
        // Bodies counted twice (their buffers' spare room).
        assert_eq!(w.extras().context_bytes, 2 * 50_000 + 2 * size_of::<Name>());
        let with_context = w.footprint();
        assert!(with_context - full >= 50_000, "{full} -> {with_context}");
        // Long names' text too: the roster may have let them go, and the
        // entries hold them alone.
        let long = name(&"b".repeat(64));
        let named = ContextEntry {
            agent_sender: Some(long.clone()),
            inboxes: vec![long.clone(), long.clone()],
            body: bytes::Bytes::new(),
        };
        let before = w.extras().context_bytes;
        w.remember_context(named, 3);
        assert_eq!(
            w.extras().context_bytes - before,
            2 * size_of::<Name>() + 3 * name_bytes(&long)
        );
        assert!(name_bytes(&long) > 0);
    }

    /// Settings with the least `state.max_bytes`, and their world cache.
    fn smallest_cache() -> (Settings, Worlds) {
        let (settings, worlds) = worlds_with(|c| c.state.max_bytes = MIN_STATE_BYTES);
        (settings, worlds)
    }

    #[test]
    fn the_cache_holds_about_max_bytes_of_worlds_however_few() {
        let (settings, worlds) = smallest_cache();
        let now = Instant::now();
        // Worlds of 200 messages, each with a 250-byte id and thread id of
        // its own: a few hundred KiB each, so far fewer than max_worlds fit.
        let fill = |i: usize| {
            let world = name(&format!("w{i}"));
            let handle = worlds.get_or_create(&world, &settings.default_world, now);
            for m in 0..200 {
                let mut w = lock(&handle);
                let id = format!("{i}-{m:0>250}");
                let l = w.lineage(&id, Some(&format!("t{id}")), None, false);
                approve(&mut w, &id, &l, Stamp::of(now));
                worlds.weigh(&world, &handle, &w);
            }
            handle.weight.load(Ordering::Relaxed) as u64
        };
        let weight = fill(0);
        assert!(weight > 200 * 2 * 250, "{weight}");
        let fit = MIN_STATE_BYTES / weight;
        for i in 1..3 * fit as usize {
            fill(i);
        }
        let held = worlds.len();
        assert!(
            held <= fit && held >= fit * 3 / 4,
            "{MIN_STATE_BYTES} bytes hold {fit} worlds of {weight}, held {held}"
        );
        assert!(worlds.bytes() <= MIN_STATE_BYTES, "{}", worlds.bytes());
        let last = 3 * fit as usize - 1;
        assert!(
            worlds.get(&name(&format!("w{last}")), now).is_some(),
            "the latest stays"
        );
        assert!(worlds.get(&name("w0"), now).is_none(), "the oldest went");
    }

    #[test]
    fn a_world_heavier_than_half_the_cache_is_weighed_at_half_and_kept() {
        let (settings, worlds) = smallest_cache();
        let now = Instant::now();
        let heavy = name("heavy");
        let handle = worlds.get_or_create(&heavy, &settings.default_world, now);
        for _ in 0..256 {
            let mut w = lock(&handle);
            w.remember_context(
                ContextEntry {
                    agent_sender: None,
                    inboxes: Vec::new(),
                    body: bytes::Bytes::from(vec![b'x'; 60_000]),
                },
                256,
            );
            worlds.weigh(&heavy, &handle, &w);
        }
        assert!(lock(&handle).footprint() > MIN_STATE_BYTES as usize);
        // Half the capacity: max_bytes rounded down to max_worlds times the
        // least weight.
        let weight = u64::from(handle.weight.load(Ordering::Relaxed));
        assert_eq!(weight, u64::from(worlds.most_weight));
        assert!(weight <= MIN_STATE_BYTES / 2 && weight > MIN_STATE_BYTES / 2 * 99 / 100);
        for i in 0..100 {
            worlds.get_or_create(&name(&format!("w{i}")), &settings.default_world, now);
        }
        assert!(worlds.get(&heavy, now).is_some(), "kept, with its state");
        assert!(worlds.bytes() <= MIN_STATE_BYTES);
        assert_eq!(worlds.len(), 101);
    }

    #[test]
    fn an_idle_world_weighs_max_bytes_over_max_worlds() {
        let (settings, worlds) = worlds_with(|c| {
            c.state.max_worlds = 1000;
            c.state.max_bytes = 4 * MIN_STATE_BYTES;
        });
        let now = Instant::now();
        for i in 0..1500 {
            let world = name(&format!("w{i}"));
            let handle = worlds.get_or_create(&world, &settings.default_world, now);
            let w = lock(&handle);
            assert!(w.footprint() < 4 * 1024 * 1024 / 1000, "{}", w.footprint());
            worlds.weigh(&world, &handle, &w);
        }
        assert_eq!(worlds.len(), 1000, "max_worlds still counts");
        assert_eq!(worlds.bytes(), 1000 * (4 * MIN_STATE_BYTES / 1000));
    }

    #[test]
    fn conversation_state_follows_activity_speakers_and_conclusions() {
        let (mut w, t0) = world(&[]);
        let (win, hot) = (Duration::from_secs(60), 4);
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(w.conversation(t0, win, hot), Conversation::Cold);
        let (a, b, h) = (name("a"), name("b"), name("h"));
        w.observe_conversation(SenderKind::Agent, &a, false, &[], at(0));
        assert_eq!(w.conversation(at(1), win, hot), Conversation::Warming);
        for i in 0..4 {
            w.observe_conversation(
                SenderKind::Agent,
                if i % 2 == 0 { &a } else { &b },
                false,
                &[],
                at(10 + i),
            );
        }
        assert_eq!(w.conversation(at(20), win, hot), Conversation::Hot);
        // one speaker alone is not hot, however many messages
        let (mut solo, _) = world(&[]);
        for i in 0..10 {
            solo.observe_conversation(SenderKind::Agent, &a, false, &[], at(i));
        }
        assert_eq!(solo.conversation(at(11), win, hot), Conversation::Warming);
        // a quieter minute after a busy one is cooling, then cold
        w.observe_conversation(SenderKind::Agent, &a, false, &[], at(70));
        assert_eq!(w.conversation(at(75), win, hot), Conversation::Cooling);
        assert_eq!(w.conversation(at(200), win, hot), Conversation::Cold);
        // concluded until a human speaks
        w.observe_conversation(SenderKind::Human, &h, true, &[], at(201));
        assert_eq!(w.conversation(at(202), win, hot), Conversation::Concluded);
        w.observe_conversation(SenderKind::Human, &h, false, &[], at(203));
        assert_ne!(w.conversation(at(204), win, hot), Conversation::Concluded);
    }

    /// After "@bob thanks everyone", agent bob may reply once: a system
    /// sender named bob is another speaker, and uses none of it.
    #[test]
    fn a_reply_after_a_conclusion_is_the_mentioned_agent_s_alone() {
        let (mut w, t0) = world(&[]);
        let (a, bob) = (name("a"), name("bob"));
        w.observe_conversation(SenderKind::Agent, &a, true, std::slice::from_ref(&bob), t0);
        w.observe_conversation(SenderKind::System, &bob, false, &[], t0);
        assert!(w.may_reply_after_conclusion(&bob));
        w.observe_conversation(SenderKind::Agent, &bob, false, &[], t0);
        assert!(!w.may_reply_after_conclusion(&bob), "its reply is used");
    }

    /// "@bob @carol thanks everyone", then bob's "thanks everyone, that's
    /// all": carol may still reply once; a human's conclusion starts afresh.
    #[test]
    fn a_concluding_reply_leaves_the_others_their_replies() {
        let (mut w, t0) = world(&[]);
        let (a, bob, carol, dave) = (name("a"), name("bob"), name("carol"), name("dave"));
        w.observe_conversation(
            SenderKind::Agent,
            &a,
            true,
            &[bob.clone(), carol.clone()],
            t0,
        );
        w.observe_conversation(
            SenderKind::Agent,
            &bob,
            true,
            std::slice::from_ref(&dave),
            t0,
        );
        assert!(!w.may_reply_after_conclusion(&bob), "its reply is used");
        assert!(
            w.may_reply_after_conclusion(&carol),
            "carol's reply is left"
        );
        assert!(
            w.may_reply_after_conclusion(&dave),
            "dave was mentioned since"
        );
        w.observe_conversation(
            SenderKind::Human,
            &name("hank"),
            true,
            std::slice::from_ref(&bob),
            t0,
        );
        assert!(w.is_concluded());
        assert!(
            w.may_reply_after_conclusion(&bob),
            "a human concludes afresh"
        );
        assert!(!w.may_reply_after_conclusion(&carol));
        assert!(!w.may_reply_after_conclusion(&dave));
    }

    #[test]
    fn a_window_holds_what_is_younger_than_its_length() {
        // Times after the process's stamp origin, before it (negative
        // stamps), and either side of it (the origin is set within the
        // test run, well under 50 s ago).
        let now = Instant::now();
        for start in [
            now,
            now - Duration::from_secs(3600),
            now - Duration::from_secs(50),
        ] {
            let t0 = Stamp::of(start);
            let times: VecDeque<Stamp> = (0..100).map(|s| t0 + Duration::from_secs(s)).collect();
            let now = t0 + Duration::from_secs(99);
            // As `now - at < length` has it: 90 s to 99 s, not 89 s (exactly
            // 10 s old).
            let since = Since::new(now, Duration::from_secs(10));
            assert!(since.holds(t0 + Duration::from_secs(90)));
            assert!(!since.holds(t0 + Duration::from_secs(89)));
            assert!(since.holds(now + Duration::from_secs(1)), "a later time");
            assert_eq!(count_since(&times, since), 10);
            assert_eq!(count_since(&times, Since::new(now, Duration::ZERO)), 0);
            let all = Since::new(now, Duration::MAX); // past a stamp's range
            assert!(all.holds(t0));
            assert_eq!(count_since(&times, all), 100);
            assert_eq!(count_since(&VecDeque::new(), since), 0);
        }
    }

    #[test]
    fn content_window_forgets_old_contents() {
        let (mut w, t0) = world(&[]);
        let l = w.lineage("m", None, None, false);
        w.record_approved(Approved {
            id: &Arc::from("m"),
            lineage: &l,
            content_hash: 7,
            now: t0,
            agent: None,
            takes_turn: true,
        });
        let win = Duration::from_secs(10);
        assert!(w.seen_content(7, t0 + Duration::from_secs(9), win));
        assert!(!w.seen_content(7, t0 + Duration::from_secs(10), win));
        assert!(!w.seen_content(8, t0, win));
    }

    #[test]
    fn the_newest_of_a_repeated_content_decides_whether_it_was_seen() {
        let (mut w, t0) = world(&[]); // default duplicate window: 300 s
        let win = Duration::from_secs(300);
        let l = w.lineage("m", None, None, false);
        for (i, (secs, hash)) in [(100, 5), (150, 9), (350, 5)].into_iter().enumerate() {
            w.record_approved(Approved {
                id: &Arc::from(format!("m{i}")),
                lineage: &l,
                content_hash: hash,
                now: t0 + Duration::from_secs(secs),
                agent: None,
                takes_turn: true,
            });
        }
        let at = |secs| t0 + Duration::from_secs(secs);
        // Both 5s are held; the one of 100 s is out of the window at 401 s.
        assert_eq!(w.contents.len(), 3);
        assert!(w.seen_content(5, at(401), win), "again at 350 s");
        assert!(!w.seen_content(5, at(650), win), "350 s is 300 s old");
        assert!(w.seen_content(9, at(449), win));
        assert!(!w.seen_content(9, at(450), win), "held, but aged out");
    }
}
