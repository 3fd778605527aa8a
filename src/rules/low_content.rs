//! Rule 9, `low_content`: an agent answering another agent with nothing —
//! only an acknowledgement phrase ("sounds good", "standing by"), only
//! punctuation or emoji, or fewer than `rules.low_content.min_chars` letters
//! and digits. Such replies keep a loop alive without moving it; to a human
//! they stay allowed.

use super::{Context, Rule, RuleName, Verdict};
use crate::normalize::substance;

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
        let text = substance(cx.msg.content);
        let letters = text.chars().filter(|c| c.is_alphanumeric()).count();
        if letters < limits.min_chars as usize {
            return Verdict::reject(
                self.name(),
                format!("a reply to an agent with {letters} letters or digits says nothing (minimum {})", limits.min_chars),
            );
        }
        if limits.phrases.iter().any(|p| substance(p) == text) {
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
    fn off_by_default() {
        let f = Fixture::new(RulesConfig::default());
        assert!(f.check_content(&LowContent, "ok", true).allows());
    }
}
