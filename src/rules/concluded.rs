//! Rule 11, `concluded`: once a conversation is concluded ("thanks
//! everyone", "that's all"), agents speak only when mentioned — one reply
//! per mention — until a human speaks again. Keeps agents from reviving a
//! finished conversation among themselves.

use aho_corasick::automaton::Automaton;
use aho_corasick::dfa::DFA;
use aho_corasick::{AhoCorasick, Anchored, MatchKind};

use super::{Context, Rule, RuleName, Verdict};
use crate::normalize::substance;

pub struct Concluded;

impl Rule for Concluded {
    fn name(&self) -> RuleName {
        RuleName::Concluded
    }

    fn check(&self, cx: &Context<'_>) -> Verdict {
        if cx.limits.concluded.enabled
            && cx.world.is_concluded()
            && !cx.world.may_reply_after_conclusion(cx.msg.sender)
        {
            return Verdict::reject(
                self.name(),
                "the conversation was concluded; agents speak only when mentioned until a human speaks again"
                    .to_string(),
            );
        }
        Verdict::Allow
    }
}

/// `conversation.conclusion_phrases`, ready to match: each phrase reduced
/// to its substance and padded with a space each side, so only whole words
/// match, all compiled into one Aho-Corasick DFA. Built once per
/// configuration load, not per message.
#[derive(Debug, Clone, Default)]
pub struct Conclusions(Option<Matcher>);

#[derive(Debug, Clone)]
struct Matcher {
    /// The padded phrases, walked a byte at a time.
    phrases: DFA,
    /// The longest word of each phrase. A phrase's words are whole runs of
    /// letters and digits of the normalised text, so a text holding none of
    /// these words holds no phrase: one vectorised search (about 50 ns for
    /// 200 bytes, against about 300 ns for the walk) settles most messages.
    words: AhoCorasick,
}

impl Conclusions {
    /// Compiles the phrases, or says why they could not be (the config
    /// refuses them, so a start or a reload says so, not a lost warning).
    pub fn new(phrases: &[String]) -> Result<Conclusions, String> {
        let patterns: Vec<String> = phrases
            .iter()
            .map(|p| substance(p))
            .filter(|p| !p.is_empty())
            .collect();
        if patterns.is_empty() {
            return Ok(Conclusions(None));
        }
        let words = patterns.iter().map(|p| {
            p.split(' ')
                .fold("", |long, w| if w.len() > long.len() { w } else { long })
        });
        // Leftmost semantics let the search use its SIMD prefilter.
        let words = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostFirst)
            .build(words);
        let phrases = DFA::new(patterns.iter().map(|p| format!(" {p} ")));
        match (phrases, words) {
            (Ok(phrases), Ok(words)) => Ok(Conclusions(Some(Matcher { phrases, words }))),
            (Err(error), _) | (_, Err(error)) => Err(format!("could not be compiled: {error}")),
        }
    }

    /// True when `content` holds one of the phrases.
    #[cfg(test)]
    pub fn found(&self, content: &str) -> bool {
        self.found_in_normalized(&crate::normalize::normalize(content))
    }

    /// True when `normalized` (content as [`crate::normalize::normalize`] gives it) holds one
    /// of the phrases. The hot path passes the text it normalised for the
    /// duplicate hash, so a message is normalised once; its substance (as
    /// [`crate::normalize::substance_into`] makes it) is fed to the
    /// automaton as it is made, padded like the patterns, without a buffer,
    /// once the search for the phrases' longest words found one of them.
    pub fn found_in_normalized(&self, normalized: &str) -> bool {
        let Some(Matcher {
            phrases: dfa,
            words,
        }) = &self.0
        else {
            return false;
        };
        if !words.is_match(normalized) {
            return false;
        }
        let Ok(mut state) = dfa.start_state(Anchored::No) else {
            return false;
        };
        let mut step = |b: u8| {
            state = dfa.next_state(Anchored::No, state, b);
            dfa.is_special(state) && dfa.is_match(state)
        };
        if step(b' ') {
            return true;
        }
        let (mut gap, mut started) = (false, false);
        if normalized.is_ascii() {
            // The common case, byte by byte; the same walk as below.
            for &b in normalized.as_bytes() {
                if !b.is_ascii_alphanumeric() {
                    gap = true;
                    continue;
                }
                if gap && started && step(b' ') {
                    return true;
                }
                (gap, started) = (false, true);
                if step(b) {
                    return true;
                }
            }
            return step(b' ');
        }
        for c in normalized.chars() {
            if !c.is_alphanumeric() {
                gap = true;
                continue;
            }
            if gap && started && step(b' ') {
                return true;
            }
            (gap, started) = (false, true);
            if c.encode_utf8(&mut [0; 4]).bytes().any(&mut step) {
                return true;
            }
        }
        step(b' ')
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Stamp;
    use crate::config::{ConversationConfig, RulesConfig};
    use crate::names::Name;
    use crate::rules::testing::Fixture;
    use crate::subject::SenderKind;

    fn phrases() -> Conclusions {
        Conclusions::new(&ConversationConfig::default().conclusion_phrases).unwrap()
    }

    fn concludes(content: &str, phrases: &Conclusions) -> bool {
        phrases.found(content)
    }

    #[test]
    fn the_streamed_match_agrees_with_a_search_of_the_padded_substance() {
        let phrases = ConversationConfig::default().conclusion_phrases;
        let matcher = Conclusions::new(&phrases).unwrap();
        let patterns: Vec<String> = phrases
            .iter()
            .map(|p| format!(" {} ", substance(p)))
            .collect();
        for text in [
            "OK, thanks everyone!",
            "thanks everyone",
            "thanks  ...everyone",
            "THAT'S ALL",
            "thanks everyonex",
            "xthanks everyone",
            "",
            "🙂 thanks, everyone 🙂",
            "noch etwas: thanks everyone — ünd",
            "we are done here",
        ] {
            let padded = format!(" {} ", substance(text));
            let expected = patterns.iter().any(|p| padded.contains(p.as_str()));
            assert_eq!(matcher.found(text), expected, "{text:?}");
        }
    }

    proptest::proptest! {
        /// Texts made of phrase words, near-misses and separators: the
        /// prefilter and the walk together agree with a plain search of the
        /// padded substance.
        #[test]
        fn the_match_agrees_with_a_search_of_the_padded_substance_on_any_text(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "thanks everyone", "That's all", "we're done", "case closed",
                "thanks", "everyone", "everyonex", "all", "that", "s", "done",
                "ünd", "🙂", " ", "  ", ", ", "'", "!", "\n", "@bob ", "—", "x",
            ]), 0..10),
        ) {
            let phrases = ConversationConfig::default().conclusion_phrases;
            let matcher = Conclusions::new(&phrases).unwrap();
            let text = parts.concat();
            let padded = format!(" {} ", substance(&text));
            let expected = phrases
                .iter()
                .any(|p| padded.contains(&format!(" {} ", substance(p))));
            proptest::prop_assert_eq!(matcher.found(&text), expected, "{:?}", text);
        }
    }

    #[test]
    fn conclusions_are_found_as_whole_words() {
        assert!(concludes("OK, thanks everyone!", &phrases()));
        assert!(concludes("That's all for today.", &phrases()));
        assert!(
            !concludes("Is that all we need?", &phrases()),
            "a question is no conclusion"
        );
        assert!(!concludes("thanks everybody for the logs", &phrases()));
        assert!(!concludes("thanks, will do", &phrases()));
    }

    /// Human hank's message, concluding or not, mentioning `mentioned`.
    fn hank_says(f: &mut Fixture, concludes: bool, mentioned: &[Name], now: Stamp) {
        let hank = Name::parse("hank").unwrap();
        f.world
            .observe_conversation(SenderKind::Human, &hank, concludes, mentioned, now);
    }

    #[test]
    fn after_a_conclusion_only_mentioned_agents_speak_once_until_a_human_does() {
        let mut l = RulesConfig::default();
        l.concluded.enabled = true;
        let mut f = Fixture::new(l);
        let (alice, bob) = (Name::parse("alice").unwrap(), Name::parse("bob").unwrap());
        let now = f.at(0);
        hank_says(&mut f, true, &[], now);
        assert!(f.check_as(&Concluded, "alice").rejects());
        // bob mentions alice: alice may reply once
        f.world.observe_conversation(
            SenderKind::Agent,
            &bob,
            false,
            std::slice::from_ref(&alice),
            now,
        );
        assert!(f.check_as(&Concluded, "alice").allows());
        f.world
            .observe_conversation(SenderKind::Agent, &alice, false, &[], now);
        assert!(
            f.check_as(&Concluded, "alice").rejects(),
            "one reply per mention"
        );
        // a human reopens
        hank_says(&mut f, false, &[], now);
        assert!(f.check_as(&Concluded, "alice").allows());
    }

    #[test]
    fn a_concluding_message_that_mentions_someone_lets_them_answer() {
        let mut l = RulesConfig::default();
        l.concluded.enabled = true;
        let mut f = Fixture::new(l);
        let now = f.at(0);
        let bob = Name::parse("bob").unwrap();
        hank_says(&mut f, true, std::slice::from_ref(&bob), now);
        assert!(
            f.check_as(&Concluded, "bob").allows(),
            "\"@bob thanks everyone\""
        );
        assert!(f.check_as(&Concluded, "alice").rejects());
    }

    #[test]
    fn off_by_default() {
        let mut f = Fixture::new(RulesConfig::default());
        let now = f.at(0);
        hank_says(&mut f, true, &[], now);
        assert!(f.check_as(&Concluded, "alice").allows());
    }
}
