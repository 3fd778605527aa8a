//! Rule 9, `low_content`: an agent answering another agent with nothing —
//! only an acknowledgement phrase ("sounds good", "standing by"), only
//! punctuation or emoji, or fewer than `rules.low_content.min_chars` letters
//! and digits. Such replies keep a loop alive without moving it; to a human
//! they stay allowed.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::{Context, Rule, RuleName, Verdict};
use crate::normalize::substance;

/// `rules.low_content.phrases`: the phrases as configured, and their
/// substances, which a message's substance is compared with. Worked out
/// once, when the configuration is read, not for every message: up to 1,000
/// phrases each normalised per message cost more than the whole decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<String>", into = "Vec<String>")]
pub struct Phrases {
    /// As written: what the configuration serialises back to, and what a
    /// world's `rules` section merges over.
    listed: Vec<String>,
    /// What a message's substance is looked up in.
    substances: HashSet<String, foldhash::fast::RandomState>,
    /// Length of the longest substance: a longer text matches none.
    longest: usize,
}

impl Phrases {
    pub fn len(&self) -> usize {
        self.listed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.listed.is_empty()
    }

    /// True when `substance` is one of the phrases' substances.
    pub fn matches(&self, substance: &str) -> bool {
        substance.len() <= self.longest && self.substances.contains(substance)
    }
}

impl From<Vec<String>> for Phrases {
    fn from(listed: Vec<String>) -> Phrases {
        let substances: HashSet<String, _> = listed.iter().map(|p| substance(p)).collect();
        let longest = substances.iter().map(String::len).max().unwrap_or(0);
        Phrases {
            listed,
            substances,
            longest,
        }
    }
}

impl From<Phrases> for Vec<String> {
    fn from(phrases: Phrases) -> Vec<String> {
        phrases.listed
    }
}

pub struct LowContent;

impl Rule for LowContent {
    fn name(&self) -> RuleName {
        RuleName::LowContent
    }

    fn check(&self, cx: &Context<'_>) -> Verdict {
        let limits = &cx.limits.low_content;
        if !limits.enabled || !cx.msg.parent_is_agent {
            return Verdict::Allow;
        }
        let text = cx.msg.substance;
        // Counted up to the minimum only: below it, the count is exact.
        let min_chars = limits.min_chars as usize;
        let letters = text
            .chars()
            .filter(|c| c.is_alphanumeric())
            .take(min_chars)
            .count();
        if letters < min_chars {
            return Verdict::reject(
                self.name(),
                format!("a reply to an agent with {letters} letters or digits says nothing (minimum {})", limits.min_chars),
            );
        }
        if limits.phrases.matches(text) {
            return Verdict::reject(
                self.name(),
                format!("\"{text}\" only acknowledges another agent and adds nothing"),
            );
        }
        Verdict::Allow
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RulesConfig;
    use crate::rules::testing::Fixture;

    fn fixture() -> Fixture {
        let mut l = RulesConfig::default();
        l.low_content.enabled = true;
        Fixture::new(l)
    }

    #[test]
    fn acknowledgements_punctuation_and_emoji_to_an_agent_are_rejected() {
        let f = fixture();
        for text in [
            "@bob Sounds good!",
            "Standing by.",
            "👍",
            "...",
            "ok",
            "Thanks!!",
            "@bob got it 🙏",
            "k",
        ] {
            assert!(
                f.check_content(&LowContent, text, true).rejects(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn substance_and_replies_to_humans_pass() {
        let f = fixture();
        for text in [
            "Sounds good, I will add unit tests for the parser",
            "No: the cache must be bounded",
            "42",
        ] {
            assert!(
                f.check_content(&LowContent, text, true).allows(),
                "{text:?}"
            );
        }
        assert!(
            f.check_content(&LowContent, "thanks", false).allows(),
            "a reply to a human"
        );
    }

    #[test]
    fn phrases_match_by_their_substance_and_read_back_as_written() {
        let listed = vec!["Roger that!".to_string(), "👍 LGTM".to_string()];
        let phrases = Phrases::from(listed.clone());
        assert!(phrases.matches("roger that"));
        assert!(phrases.matches("lgtm"));
        assert!(!phrases.matches("roger"));
        assert!(!phrases.matches("roger that now"));
        // What the configuration shows and what a world's section merges.
        let json = serde_json::to_value(&phrases).unwrap();
        assert_eq!(json, serde_json::json!(listed));
        let back: Phrases = serde_json::from_value(json).unwrap();
        assert_eq!(back, phrases);

        let mut l = RulesConfig::default();
        l.low_content.enabled = true;
        l.low_content.phrases = listed.into();
        let f = Fixture::new(l);
        assert!(f
            .check_content(&LowContent, "@bob ROGER, that.", true)
            .rejects());
        assert!(
            f.check_content(&LowContent, "ok", true).allows(),
            "not listed"
        );
    }

    #[test]
    fn off_by_default() {
        let f = Fixture::new(RulesConfig::default());
        assert!(f.check_content(&LowContent, "ok", true).allows());
    }
}
