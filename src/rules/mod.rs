//! The loop rules (contract §5), one per file, each behind [`Rule`].
//!
//! A rule is pure: it reads the candidate message, the world's state and the
//! world's limits, and answers with a reason when the message must not go
//! out. Rules never change state and never read a clock: the judge passes
//! `now` in, and records approvals after every rule has passed.

mod alternation;
mod budget;
pub mod concluded;
mod cooldown;
mod depth;
mod duplicate;
pub mod low_content;
pub mod pass;
mod rate;
pub mod similar;
mod turns;

use std::fmt;

use crate::clock::Stamp;
use crate::config::RulesConfig;
use crate::names::Name;
use crate::state::WorldState;

pub use alternation::Alternation;
pub use budget::Budget;
pub use concluded::Concluded;
pub use cooldown::Cooldown;
pub use depth::Depth;
pub use duplicate::Duplicate;
pub use low_content::LowContent;
pub use rate::Rate;
pub use similar::Similar;
pub use turns::Turns;

/// Every rule name a decision can carry; the values of the `rule` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleName {
    Invalid,
    TooLarge,
    Pass,
    Turns,
    Depth,
    Duplicate,
    Cooldown,
    Rate,
    Alternation,
    Similar,
    LowContent,
    Budget,
    Concluded,
    /// The external policy service (not one of `LOOP_RULES`: asked after them).
    Policy,
}

impl RuleName {
    /// Every rule name, in declaration order (`RuleName as usize` indexes it).
    pub const ALL: [RuleName; 14] = [
        RuleName::Invalid,
        RuleName::TooLarge,
        RuleName::Pass,
        RuleName::Turns,
        RuleName::Depth,
        RuleName::Duplicate,
        RuleName::Cooldown,
        RuleName::Rate,
        RuleName::Alternation,
        RuleName::Similar,
        RuleName::LowContent,
        RuleName::Budget,
        RuleName::Concluded,
        RuleName::Policy,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            RuleName::Invalid => "invalid",
            RuleName::TooLarge => "too_large",
            RuleName::Pass => "pass",
            RuleName::Turns => "turns",
            RuleName::Depth => "depth",
            RuleName::Duplicate => "duplicate",
            RuleName::Cooldown => "cooldown",
            RuleName::Rate => "rate",
            RuleName::Alternation => "alternation",
            RuleName::Similar => "similar",
            RuleName::LowContent => "low_content",
            RuleName::Budget => "budget",
            RuleName::Concluded => "concluded",
            RuleName::Policy => "policy",
        }
    }
}

impl fmt::Display for RuleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for RuleName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// An agent message under judgement, with everything the rules look at
/// computed once.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub sender: &'a Name,
    /// The content's substance (see `normalize::substance`): what
    /// `low_content` and `similar` read; empty unless one of them is on.
    pub substance: &'a str,
    /// Its resolved parent is an agent's message.
    pub parent_is_agent: bool,
    /// Its content words (see `similar::words`); empty unless `similar` is on.
    pub words: &'a similar::Words,
    /// Depth resolved from the message's lineage.
    pub depth: u32,
    /// Hash of the normalised content (see `normalize`).
    pub content_hash: u64,
    pub now: Stamp,
}

/// What a rule may read.
pub struct Context<'a> {
    pub msg: &'a Candidate<'a>,
    pub world: &'a WorldState,
    pub limits: &'a RulesConfig,
}

/// A rule that failed, and why, in words for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub rule: RuleName,
    pub reason: String,
}

/// What a rule says of one message: a value, never an `Err` (errors are for
/// failures of loopguard itself, and a rule cannot fail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Reject(Rejection),
}

impl Verdict {
    pub fn reject(rule: RuleName, reason: String) -> Verdict {
        Verdict::Reject(Rejection { rule, reason })
    }

    #[cfg(test)]
    pub fn allows(&self) -> bool {
        matches!(self, Verdict::Allow)
    }

    #[cfg(test)]
    pub fn rejects(&self) -> bool {
        !self.allows()
    }

    /// The reason of a rejection; panics on `Allow` (tests only).
    #[cfg(test)]
    pub fn expect_reject(self) -> String {
        match self {
            Verdict::Reject(r) => r.reason,
            Verdict::Allow => panic!("expected a rejection"),
        }
    }
}

/// One loop rule.
pub trait Rule: Send + Sync {
    fn name(&self) -> RuleName;
    fn check(&self, cx: &Context<'_>) -> Verdict;
}

/// Rules 2-6 in the order the contract applies them, then the rules this
/// project adds (7-11, off by default).
pub static LOOP_RULES: [&dyn Rule; 10] = [
    &Turns,
    &Depth,
    &Duplicate,
    &Cooldown,
    &Rate,
    &Alternation,
    &Similar,
    &LowContent,
    &Budget,
    &Concluded,
];

/// The first rule that fails, if any.
pub fn first_failure(cx: &Context<'_>) -> Option<Rejection> {
    LOOP_RULES.iter().find_map(|rule| match rule.check(cx) {
        Verdict::Allow => None,
        Verdict::Reject(rejection) => Some(rejection),
    })
}

#[cfg(test)]
pub(crate) mod testing {
    //! A small world builder shared by the rules' unit tests.
    use super::*;
    use crate::config::WorldSettings;
    use crate::state::{Approved, Lineage};
    use std::sync::Arc;
    use std::time::Duration;

    pub struct Fixture {
        pub world: WorldState,
        pub limits: RulesConfig,
        pub t0: Stamp,
        pub agent: Name,
    }

    impl Fixture {
        pub fn new(limits: RulesConfig) -> Fixture {
            let agent = Name::parse("alice").unwrap();
            let settings = Arc::new(WorldSettings {
                agents: vec![agent.clone()],
                rules: limits.clone(),
            });
            let t0 = Stamp::of(std::time::Instant::now());
            Fixture {
                world: WorldState::new(settings, Duration::from_secs(3600), t0),
                limits,
                t0,
                agent,
            }
        }

        pub fn at(&self, secs: u64) -> Stamp {
            self.t0 + Duration::from_secs(secs)
        }

        /// Records an approved message of agent `who` at `secs`.
        pub fn approve_as(&mut self, who: &str, secs: u64, content_hash: u64) {
            let agent = Name::parse(who).unwrap();
            self.world.touch_agent(&agent, self.at(secs));
            let lineage = Lineage {
                parent_id: None,
                thread_id: Arc::from("t"),
                depth: 1,
                parent_is_agent: false,
            };
            let id = format!("m{}-{who}-{secs}-{content_hash}", self.world.turns);
            let keep = self.limits.rate.max as usize;
            let now = self.at(secs);
            self.world.record_approved(Approved {
                id: &Arc::from(id),
                lineage: &lineage,
                content_hash,
                now,
                agent: Some((&agent, keep)),
                takes_turn: true,
            });
            self.world.turns += 1;
        }

        /// Runs `rule` on a message from `who` at `secs`.
        pub fn check_as_at(&self, rule: &dyn Rule, who: &str, secs: u64) -> Verdict {
            let agent = Name::parse(who).unwrap();
            self.run(rule, &agent, "", false, 1, u64::MAX, secs)
        }

        pub fn check_as(&self, rule: &dyn Rule, who: &str) -> Verdict {
            self.check_as_at(rule, who, 0)
        }

        /// Runs `rule` on `content` from the fixture's agent.
        pub fn check_content(
            &self,
            rule: &dyn Rule,
            content: &str,
            parent_is_agent: bool,
        ) -> Verdict {
            self.run(rule, &self.agent, content, parent_is_agent, 1, u64::MAX, 0)
        }

        /// Runs `rule` on one candidate message.
        #[allow(clippy::too_many_arguments)]
        fn run(
            &self,
            rule: &dyn Rule,
            sender: &Name,
            content: &str,
            parent_is_agent: bool,
            depth: u32,
            content_hash: u64,
            secs: u64,
        ) -> Verdict {
            let substance = crate::normalize::substance(content);
            let msg = Candidate {
                sender,
                substance: &substance,
                parent_is_agent,
                words: &similar::Words::default(),
                depth,
                content_hash,
                now: self.at(secs),
            };
            rule.check(&Context {
                msg: &msg,
                world: &self.world,
                limits: &self.limits,
            })
        }

        /// Records an approved message of the fixture's agent at `secs`.
        pub fn approve(&mut self, secs: u64, content_hash: u64) {
            let agent = self.agent.as_str().to_string();
            self.approve_as(&agent, secs, content_hash);
        }

        /// Runs `rule` on a message of the fixture's agent at `secs`.
        pub fn check(&self, rule: &dyn Rule, secs: u64, depth: u32, content_hash: u64) -> Verdict {
            self.run(rule, &self.agent, "", false, depth, content_hash, secs)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::Fixture;
    use super::*;

    #[test]
    fn the_first_failing_rule_in_contract_order_wins() {
        let mut limits = RulesConfig::default();
        limits.turns.max = 1;
        limits.cooldown.seconds = 60;
        let mut f = Fixture::new(limits);
        f.approve(0, 42);
        // turns, duplicate and cooldown all fail: turns comes first.
        let msg = Candidate {
            sender: &f.agent,
            substance: "",
            parent_is_agent: false,
            words: &similar::Words::default(),
            depth: 1,
            content_hash: 42,
            now: f.at(1),
        };
        let cx = Context {
            msg: &msg,
            world: &f.world,
            limits: &f.limits,
        };
        assert_eq!(first_failure(&cx).map(|r| r.rule), Some(RuleName::Turns));
        f.world.reset_turns();
        let cx = Context {
            msg: &msg,
            world: &f.world,
            limits: &f.limits,
        };
        assert_eq!(
            first_failure(&cx).map(|r| r.rule),
            Some(RuleName::Duplicate)
        );
    }

    #[test]
    fn all_lists_every_rule_at_its_own_index() {
        for (i, r) in RuleName::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }

    #[test]
    fn rule_names_are_the_contract_labels() {
        let names: Vec<_> = LOOP_RULES.iter().map(|r| r.name().as_str()).collect();
        assert_eq!(
            names,
            [
                "turns",
                "depth",
                "duplicate",
                "cooldown",
                "rate",
                "alternation",
                "similar",
                "low_content",
                "budget",
                "concluded"
            ]
        );
    }
}
