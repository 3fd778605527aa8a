//! Subjects (contract §2): parsing what comes in, building what goes out.
//!
//! This is the only module that turns text into subjects, and it builds them
//! solely from the validated prefix and [`Name`]s, so no byte of a payload or
//! of an unchecked token can ever reach a subject loopguard publishes on.

use std::fmt;

use crate::names::{display_untrusted, Name};

/// Who sent an ingress message, by the subject it arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SenderKind {
    Agent,
    Human,
    System,
}

impl SenderKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            SenderKind::Agent => "agent",
            SenderKind::Human => "human",
            SenderKind::System => "system",
        }
    }

    fn parse(token: &str) -> Option<SenderKind> {
        match token {
            "agent" => Some(SenderKind::Agent),
            "human" => Some(SenderKind::Human),
            "system" => Some(SenderKind::System),
            _ => None,
        }
    }
}

impl fmt::Display for SenderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for SenderKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// What an ingress subject says about its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `P.raw.W.KIND.NAME`: a message to judge.
    Raw {
        world: Name,
        kind: SenderKind,
        sender: Name,
    },
    /// `P.join.W.A`: agent A joins W's roster.
    Join { world: Name, agent: Name },
    /// A subject loopguard cannot accept. Gets an event only when `world` is
    /// valid; always counted and logged.
    Invalid {
        world: Option<Name>,
        /// The kind, when the kind token was valid (for the message counter).
        kind: Option<SenderKind>,
        /// The sender token as written, shortened and defused for display.
        sender: String,
        reason: String,
    },
}

impl Origin {
    /// The world this message belongs to, when its name is valid.
    pub fn world(&self) -> Option<&Name> {
        match self {
            Origin::Raw { world, .. } | Origin::Join { world, .. } => Some(world),
            Origin::Invalid { world, .. } => world.as_ref(),
        }
    }
}

/// Subject names for one prefix.
#[derive(Debug, Clone)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    /// `prefix` must already be validated (see `config`).
    pub fn new(prefix: &str) -> Subjects {
        Subjects {
            prefix: prefix.to_string(),
        }
    }

    /// Wildcard subscriptions of the ingress subjects.
    pub fn raw_wildcard(&self) -> String {
        format!("{}.raw.>", self.prefix)
    }

    pub fn join_wildcard(&self) -> String {
        format!("{}.join.>", self.prefix)
    }

    /// The families of subjects loopguard publishes, as wildcards of
    /// exactly their shape: the transcript (`P.public.W`), the inboxes
    /// (`P.private.W.A`) and the events (`P.events.W`).
    pub fn egress_wildcards(&self) -> [String; 3] {
        ["public.*", "private.*.*", "events.*"].map(|family| format!("{}.{family}", self.prefix))
    }

    /// Whether `subject` is of one of the families [`egress_wildcards`]
    /// names (any tokens; a policy subject beside them under the prefix,
    /// `P.policy.check`, is not).
    ///
    /// [`egress_wildcards`]: Subjects::egress_wildcards
    pub fn is_egress(&self, subject: &str) -> bool {
        let Some(rest) = subject
            .strip_prefix(self.prefix.as_str())
            .and_then(|r| r.strip_prefix('.'))
        else {
            return false;
        };
        let tokens: Vec<&str> = rest.split('.').collect();
        if tokens.iter().any(|t| t.is_empty()) {
            return false;
        }
        matches!(
            tokens[..],
            ["public", _] | ["private", _, _] | ["events", _]
        )
    }

    pub fn public(&self, world: &Name) -> String {
        self.build(".public.", world, None)
    }

    pub fn private(&self, world: &Name, agent: &Name) -> String {
        self.build(".private.", world, Some(agent))
    }

    pub fn events(&self, world: &Name) -> String {
        self.build(".events.", world, None)
    }

    /// `P<verb>W[.A]`, in one allocation (this runs for every copy).
    fn build(&self, verb: &str, world: &Name, agent: Option<&Name>) -> String {
        let agent = agent.map_or("", Name::as_str);
        let mut s = String::with_capacity(
            self.prefix.len() + verb.len() + world.as_str().len() + 1 + agent.len(),
        );
        s.push_str(&self.prefix);
        s.push_str(verb);
        s.push_str(world.as_str());
        if !agent.is_empty() {
            s.push('.');
            s.push_str(agent);
        }
        s
    }

    /// Reads an ingress subject. Only subjects under the two wildcards reach
    /// here; anything else is `Invalid` as well.
    pub fn parse(&self, subject: &str) -> Origin {
        let rest = subject
            .strip_prefix(self.prefix.as_str())
            .and_then(|r| r.strip_prefix('.'));
        let Some(rest) = rest else {
            return invalid(None, None, "", "subject is outside the configured prefix");
        };
        let mut tokens = Tokens(Some(rest));
        let verb = tokens.next().unwrap_or("");
        let world_token = tokens.next().unwrap_or("");
        let world = Name::parse(world_token);
        // Up to three more tokens, without collecting them (this runs for
        // every message): `raw` needs exactly two, `join` exactly one.
        let tail = [tokens.next(), tokens.next(), tokens.next()];
        match (verb, tail) {
            ("raw", [Some(kind), Some(sender), None]) => {
                let kind_parsed = SenderKind::parse(kind);
                match (world, kind_parsed, Name::parse(sender)) {
                    (Ok(world), Some(kind), Ok(sender)) => Origin::Raw {
                        world,
                        kind,
                        sender,
                    },
                    (world, kind_parsed, sender_result) => {
                        let reason = match (&world, kind_parsed, &sender_result) {
                            (Err(e), _, _) => format!("world name {e}"),
                            (_, None, _) => format!(
                                "unknown sender kind {:?}; expected agent, human or system",
                                display_untrusted(kind)
                            ),
                            (_, _, Err(e)) => format!("sender name {e}"),
                            _ => String::new(),
                        };
                        invalid(world.ok(), kind_parsed, sender, &reason)
                    }
                }
            }
            ("join", [Some(agent), None, None]) => match (world, Name::parse(agent)) {
                (Ok(world), Ok(agent)) => Origin::Join { world, agent },
                (world, agent_result) => {
                    let reason = match (&world, agent_result) {
                        (Err(e), _) => format!("world name {e}"),
                        (_, Err(e)) => format!("agent name {e}"),
                        _ => String::new(),
                    };
                    invalid(world.ok(), None, agent, &reason)
                }
            },
            ("raw", _) => invalid(
                world.ok(),
                tail[0].and_then(SenderKind::parse),
                tail[1].unwrap_or(""),
                "subject must have the form P.raw.WORLD.KIND.NAME",
            ),
            ("join", _) => invalid(
                world.ok(),
                None,
                tail[0].unwrap_or(""),
                "subject must have the form P.join.WORLD.AGENT",
            ),
            _ => invalid(None, None, "", "subject is not a raw or join subject"),
        }
    }
}

fn invalid(world: Option<Name>, kind: Option<SenderKind>, sender: &str, reason: &str) -> Origin {
    Origin::Invalid {
        world,
        kind,
        sender: display_untrusted(sender),
        reason: reason.to_string(),
    }
}

/// A subject's tokens, as `str::split('.')` gives them, found a byte at a
/// time: `split` searches with `memchr`, whose set-up costs more than the
/// search of a token a few bytes long, on every message.
struct Tokens<'a>(Option<&'a str>);

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let rest = self.0?;
        match rest.bytes().position(|b| b == b'.') {
            Some(dot) => {
                self.0 = Some(&rest[dot + 1..]);
                Some(&rest[..dot])
            }
            None => self.0.take(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s() -> Subjects {
        Subjects::new("chat")
    }

    #[test]
    fn tokens_are_what_split_gives() {
        for text in [
            "",
            ".",
            "..",
            "a",
            "a.",
            ".a",
            "a..b",
            "raw.w.agent.alice",
            "é.ü.",
            "a.b.c.d.e.f",
        ] {
            let ours: Vec<&str> = Tokens(Some(text)).collect();
            assert_eq!(ours, text.split('.').collect::<Vec<_>>(), "{text:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn tokens_are_what_split_gives_for_any_text(text in "[a.é\\x00]{0,12}") {
            let ours: Vec<&str> = Tokens(Some(&text)).collect();
            proptest::prop_assert_eq!(ours, text.split('.').collect::<Vec<_>>());
        }
    }

    fn n(x: &str) -> Name {
        Name::parse(x).unwrap()
    }

    #[test]
    fn parses_raw_and_join_subjects_canonically() {
        assert_eq!(
            s().parse("chat.raw.Lobby.agent.Alice"),
            Origin::Raw {
                world: n("lobby"),
                kind: SenderKind::Agent,
                sender: n("alice")
            }
        );
        assert_eq!(
            s().parse("chat.join.lobby.bob"),
            Origin::Join {
                world: n("lobby"),
                agent: n("bob")
            }
        );
    }

    #[test]
    fn unknown_kinds_and_bad_token_counts_keep_a_valid_world() {
        for subject in [
            "chat.raw.lobby.robot.x",
            // A kind is exact: a permission denying `system` names it so.
            "chat.raw.lobby.System.x",
            "chat.raw.lobby.AGENT.x",
            "chat.raw.lobby.agent",
            "chat.raw.lobby.agent.a.b",
            "chat.raw.lobby.agent.bøb",
            "chat.join.lobby",
            "chat.join.lobby.a.b",
        ] {
            match s().parse(subject) {
                Origin::Invalid { world, reason, .. } => {
                    assert_eq!(world, Some(n("lobby")), "{subject}");
                    assert!(!reason.is_empty(), "{subject}");
                }
                other => panic!("{subject}: {other:?}"),
            }
        }
    }

    #[test]
    fn egress_is_exactly_the_three_families_under_the_prefix() {
        for subject in ["chat.public.w", "chat.private.w.a", "chat.events.w"] {
            assert!(s().is_egress(subject), "{subject}");
        }
        for subject in [
            // A policy subject may sit beside them (contract §9).
            "chat.policy.check",
            "chat.publicity.w",
            "chat.public",
            "chat.public.w.x",
            "chat.private.w",
            "chat.events..w",
            "chat.raw.w.agent.a",
            "chatter.public.w",
            "other.public.w",
            "$JS.ACK.s.c.1.1.1.1.0",
        ] {
            assert!(!s().is_egress(subject), "{subject}");
        }
    }

    #[test]
    fn an_invalid_world_gives_no_world() {
        match s().parse("chat.raw.wörld.agent.a") {
            Origin::Invalid {
                world: None,
                reason,
                ..
            } => assert!(reason.contains("world")),
            other => panic!("{other:?}"),
        }
    }

    /// Whatever else is wrong with the subject (a bad name, too few or too
    /// many tokens), a valid kind is kept, so the event says it and the
    /// message is counted under it.
    #[test]
    fn a_valid_kind_is_kept_for_counting() {
        for (subject, want) in [
            ("chat.raw.lobby.human.x*", Some(SenderKind::Human)),
            ("chat.raw.lobby.agent.a.b", Some(SenderKind::Agent)),
            ("chat.raw.lobby.system", Some(SenderKind::System)),
            ("chat.raw.lobby.robot.a.b", None),
            ("chat.raw.lobby", None),
        ] {
            match s().parse(subject) {
                Origin::Invalid { kind, .. } => assert_eq!(kind, want, "{subject}"),
                other => panic!("{subject}: {other:?}"),
            }
        }
    }

    #[test]
    fn builds_subjects_only_from_names() {
        let s = Subjects::new("acme.chat");
        assert_eq!(s.public(&n("w")), "acme.chat.public.w");
        assert_eq!(s.private(&n("w"), &n("a")), "acme.chat.private.w.a");
        assert_eq!(s.events(&n("w")), "acme.chat.events.w");
        assert_eq!(
            s.parse("acme.chat.join.w.a"),
            Origin::Join {
                world: n("w"),
                agent: n("a")
            }
        );
    }
}
