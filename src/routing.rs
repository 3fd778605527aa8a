//! Routing (contract §3): where an approved message goes.
//!
//! | message                                      | public | inboxes                    |
//! |----------------------------------------------|--------|----------------------------|
//! | any sender, paragraph-start roster mentions  | no     | each mentioned agent       |
//! | human, no mention anywhere                   | yes    | every roster agent but them|
//! | human, mid-paragraph mentions only           | yes    | none                       |
//! | agent, no paragraph-start mention            | yes    | none                       |
//! | system                                       | yes    | none                       |

use std::collections::HashSet;

use crate::clock::Stamp;
use crate::mentions;
use crate::names::{Name, MAX_NAME_LEN};
use crate::state::WorldState;
use crate::subject::SenderKind;

/// `visibility` of an egress copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    Public,
    Private,
}

impl Visibility {
    pub const fn as_str(self) -> &'static str {
        match self {
            Visibility::Public => "public",
            Visibility::Private => "private",
        }
    }
}

/// Where one message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub visibility: Visibility,
    /// A copy goes to the public transcript.
    pub public: bool,
    /// Agents that get a copy in their inbox, in mention or roster order.
    pub inboxes: Vec<Name>,
    /// The inboxes are the agents mentioned, not a human's broadcast.
    pub by_mention: bool,
}

impl Route {
    /// The public transcript only.
    pub fn public() -> Route {
        Route {
            visibility: Visibility::Public,
            public: true,
            inboxes: Vec::new(),
            by_mention: false,
        }
    }

    /// The `mentions` field: canonical names the message was routed to by
    /// mention (none for a broadcast).
    pub fn mentions(&self) -> &[Name] {
        if self.by_mention {
            &self.inboxes
        } else {
            &[]
        }
    }
}

/// Mentioned agents searched one by one; past this many, in a set.
const SHORT_LIST: usize = 16;

/// Routes a message of `kind` from `sender` with `content` in `world`.
pub fn route(
    kind: SenderKind,
    sender: &Name,
    content: &str,
    world: &WorldState,
    now: Stamp,
) -> Route {
    let mut buf = [0u8; MAX_NAME_LEN];
    let mut mentioned: Vec<Name> = Vec::new();
    // Past a few names, a set: a content may name the whole roster (1,024
    // agents) and repeat it, and a search of the list per token was
    // quadratic (9 ms for 64 KiB of mentions, measured).
    let mut taken: Option<HashSet<Name, foldhash::fast::RandomState>> = None;
    mentions::each_leading(content, |token| {
        let lower = mentions::lowercase(token, &mut buf);
        if lower == sender.as_str() {
            return;
        }
        if let Some((name, _)) = world.roster_get(lower, now) {
            let new = if mentioned.len() < SHORT_LIST {
                !mentioned.contains(name)
            } else {
                taken
                    .get_or_insert_with(|| mentioned.iter().cloned().collect())
                    .insert(name.clone())
            };
            if new {
                mentioned.push(name.clone());
            }
        }
    });
    if !mentioned.is_empty() {
        return Route {
            visibility: Visibility::Private,
            public: false,
            inboxes: mentioned,
            by_mention: true,
        };
    }
    if kind != SenderKind::Human {
        return Route::public();
    }
    // Inline mentions matter only to a human's message, so only a human's
    // content is scanned for them.
    let mentions_inline = mentions::inline(content).into_iter().any(|token| {
        let lower = mentions::lowercase(token, &mut buf);
        lower != sender.as_str() && world.roster_get(lower, now).is_some()
    });
    if mentions_inline {
        return Route::public();
    }
    let inboxes = world
        .roster(now)
        .into_iter()
        .filter(|a| a != sender)
        .collect();
    Route {
        visibility: Visibility::Public,
        public: true,
        inboxes,
        by_mention: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RulesConfig, WorldSettings};
    use std::sync::Arc;
    use std::time::Duration;

    fn n(x: &str) -> Name {
        Name::parse(x).unwrap()
    }

    fn world() -> (WorldState, Stamp) {
        let now = Stamp::of(std::time::Instant::now());
        let settings = Arc::new(WorldSettings {
            agents: vec![n("alice"), n("bob"), n("carol")],
            rules: RulesConfig::default(),
        });
        (WorldState::new(settings, Duration::from_secs(60), now), now)
    }

    #[test]
    fn paragraph_start_mentions_go_private_to_each_mentioned_agent() {
        let (w, now) = world();
        for kind in [SenderKind::Agent, SenderKind::Human, SenderKind::System] {
            let r = route(kind, &n("dave"), "@Bob, @carol please look", &w, now);
            assert_eq!(r.visibility, Visibility::Private);
            assert!(!r.public);
            assert_eq!(r.inboxes, [n("bob"), n("carol")]);
            assert_eq!(r.mentions(), r.inboxes);
        }
    }

    /// An invisible mark before a paragraph's `@name` (a byte-order mark,
    /// the right-to-left mark of a right-to-left editor) does not hide the
    /// mention: before, an agent's message went public and a human's to
    /// no inbox at all.
    #[test]
    fn an_invisible_mark_before_a_paragraph_start_mention_is_read_past() {
        let (w, now) = world();
        for c in [
            "\u{feff}@bob look",
            "\u{200f}@bob look",
            "hi\n \u{200e}@bob look",
        ] {
            for (kind, sender) in [(SenderKind::Human, "hank"), (SenderKind::Agent, "alice")] {
                let r = route(kind, &n(sender), c, &w, now);
                assert_eq!((r.public, r.inboxes), (false, vec![n("bob")]), "{c:?}");
            }
        }
    }

    #[test]
    fn human_without_mentions_broadcasts_to_every_other_agent() {
        let (w, now) = world();
        let r = route(SenderKind::Human, &n("alice"), "hello all", &w, now);
        assert_eq!((r.visibility, r.public), (Visibility::Public, true));
        assert_eq!(r.inboxes, [n("bob"), n("carol")], "the sender is left out");
        assert!(r.mentions().is_empty());
    }

    #[test]
    fn human_with_only_inline_mentions_goes_public_only() {
        let (w, now) = world();
        let r = route(
            SenderKind::Human,
            &n("hank"),
            "I think @bob is right",
            &w,
            now,
        );
        assert_eq!(r, Route::public());
    }

    /// `@bob's` opens the paragraph but is no name: plain text, where it
    /// is an inline mention as in `ask @bob's`, not a broadcast to
    /// everyone.
    #[test]
    fn a_human_s_paragraph_opening_with_a_mention_that_is_no_name_goes_public_only() {
        let (w, now) = world();
        for content in ["@bob's draft looks right", "@bob.x can you check?"] {
            let r = route(SenderKind::Human, &n("hank"), content, &w, now);
            assert_eq!(r, Route::public(), "{content}");
        }
    }

    /// `@bob.`, `@bob?`: a paragraph-start mention closed by punctuation,
    /// private to bob from any sender (public, or public only, before
    /// 2026-11-23).
    #[test]
    fn a_paragraph_start_mention_closed_by_punctuation_goes_to_its_inbox() {
        let (w, now) = world();
        for content in ["@bob. can you check?", "@bob? are you there", "@bob! look"] {
            for (kind, sender) in [
                (SenderKind::Human, "hank"),
                (SenderKind::Agent, "alice"),
                (SenderKind::System, "ops"),
            ] {
                let r = route(kind, &n(sender), content, &w, now);
                assert!(!r.public, "{content} from {sender}");
                assert_eq!(r.inboxes, [n("bob")], "{content} from {sender}");
            }
        }
    }

    #[test]
    fn agent_and_system_without_leading_mentions_go_public_only() {
        let (w, now) = world();
        assert_eq!(
            route(SenderKind::Agent, &n("alice"), "hi @bob", &w, now),
            Route::public()
        );
        assert_eq!(
            route(SenderKind::System, &n("ops"), "restarting", &w, now),
            Route::public()
        );
    }

    #[test]
    fn self_unknown_and_malformed_mentions_count_as_none() {
        let (w, now) = world();
        for content in [
            "@alice hi",
            "@zed hi",
            "@ hi",
            "@@bob hi",
            "@bob.x hi",
            "a@bob.com",
        ] {
            assert_eq!(
                route(SenderKind::Agent, &n("alice"), content, &w, now),
                Route::public(),
                "{content}"
            );
        }
        // for a human, an unknown name is no mention at all: broadcast
        let r = route(SenderKind::Human, &n("hank"), "@zed hi", &w, now);
        assert_eq!(r.inboxes.len(), 3);
    }

    #[test]
    fn repeated_mentions_give_one_copy() {
        let (w, now) = world();
        let r = route(
            SenderKind::Agent,
            &n("alice"),
            "@bob @BOB hi\n@bob again",
            &w,
            now,
        );
        assert_eq!(r.inboxes, [n("bob")]);
    }

    #[test]
    fn a_long_run_of_repeated_mentions_gives_one_copy_each_in_order() {
        let now = Stamp::of(std::time::Instant::now());
        let agents: Vec<Name> = (0..3 * SHORT_LIST).map(|i| n(&format!("a{i}"))).collect();
        let settings = Arc::new(WorldSettings {
            agents: agents.clone(),
            rules: RulesConfig::default(),
        });
        let w = WorldState::new(settings, Duration::from_secs(60), now);
        // Every agent, newest first, twice over, then the first ones again
        // in capitals: past the short list, the set must still see repeats.
        let mut content = String::new();
        for round in 0..2 {
            for a in agents.iter().rev() {
                content.push_str(&format!("@{a} "));
            }
            if round == 1 {
                for a in &agents[..SHORT_LIST + 2] {
                    content.push_str(&format!("@{} ", a.as_str().to_uppercase()));
                }
            }
        }
        let r = route(SenderKind::Human, &n("hank"), &content, &w, now);
        let expected: Vec<Name> = agents.iter().rev().cloned().collect();
        assert_eq!(r.inboxes, expected);
        assert_eq!(r.mentions(), expected);
    }
}
