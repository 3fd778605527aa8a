//! Rule 8, `similar`: reworded echoes. An agent message whose content words
//! overlap an approved message of the world (from any sender, within
//! `rules.similar.window_seconds`) by a Jaccard similarity of at least
//! `rules.similar.threshold` is rejected.
//!
//! Content words: the content normalised (see `normalize`), everything but
//! letters and digits removed, English stop words dropped, a light suffix
//! stemmer applied (-ing, -ed, -es, -s, -ly, final -e), then hashed and
//! deduplicated. "Good point, add unit tests" and "Good point — we should add
//! unit tests" both become {good, point, add, unit, tests}: similarity 1.0.
//! Exact Jaccard over sorted hashes costs about what a MinHash signature
//! would at chat-message sizes, and estimates nothing.

use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::LazyLock;
use std::time::Duration;

use super::{Context, Rule, RuleName, Verdict};

/// Most content words kept per message (the rest are ignored).
pub const MAX_WORDS: usize = 64;

/// Words that carry no meaning of their own in a reply.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "can", "could", "do", "for", "from",
    "has", "have", "i", "if", "in", "is", "it", "its", "just", "let", "lets", "maybe", "me", "my",
    "of", "on", "or", "our", "really", "s", "should", "so", "that", "the", "then", "this", "to",
    "us", "very", "we", "will", "with", "would", "you", "your",
];

/// Length of the longest of `STOP_WORDS`.
const LONGEST_STOP_WORD: usize = {
    let (mut i, mut longest) = (0, 0);
    while i < STOP_WORDS.len() {
        if STOP_WORDS[i].len() > longest {
            longest = STOP_WORDS[i].len();
        }
        i += 1;
    }
    longest
};

/// Hashes words with a fixed seed: the sets are compared within one process
/// only, and go into no hash table a client could crowd. foldhash, not
/// SipHash: a message has dozens of words, and SipHash cost more than the
/// rest of the set's making.
const WORD_HASHER: foldhash::quality::FixedState = foldhash::quality::FixedState::with_seed(0);

/// The sorted, deduplicated hashes of the content words of `substance`
/// (a message's text as [`substance`](crate::normalize::substance) gives
/// it: the judge works it out once for the rules that read it).
pub fn words(substance: &str) -> Vec<u64> {
    let mut hashes: Vec<u64> = substance
        .split(' ')
        .filter(|w| !w.is_empty() && !is_stop_word(w))
        .take(MAX_WORDS)
        .map(|w| WORD_HASHER.hash_one(stem(w)))
        .collect();
    hashes.sort_unstable();
    hashes.dedup();
    hashes
}

fn is_stop_word(w: &str) -> bool {
    static SET: LazyLock<HashSet<&str, foldhash::fast::FixedState>> =
        LazyLock::new(|| STOP_WORDS.iter().copied().collect());
    // Most words are longer than any stop word: no lookup for them.
    w.len() <= LONGEST_STOP_WORD && SET.contains(w)
}

/// A light suffix stemmer, so "agree" and "agreed", "test" and "tests"
/// meet: strips one of -ing, -ed, -es, -s, -ly, or else a final -e, keeping
/// at least three letters.
fn stem(w: &str) -> &str {
    for suffix in ["ing", "ed", "es", "s", "ly"] {
        if let Some(stripped) = w.strip_suffix(suffix) {
            if stripped.len() >= 3 {
                return stripped;
            }
        }
    }
    match w.strip_suffix('e') {
        Some(stripped) if stripped.len() >= 3 => stripped,
        _ => w,
    }
}

/// Jaccard similarity of two sorted, deduplicated sets.
pub fn jaccard(a: &[u64], b: &[u64]) -> f64 {
    if a.is_empty() && b.is_empty() {
        return 0.0; // nothing to echo
    }
    let (mut i, mut j, mut common) = (0, 0, 0usize);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                common += 1;
                i += 1;
                j += 1;
            }
        }
    }
    common as f64 / (a.len() + b.len() - common) as f64
}

pub struct Similar;

impl Rule for Similar {
    fn name(&self) -> RuleName {
        RuleName::Similar
    }

    fn check(&self, cx: &Context<'_>) -> Verdict {
        let limits = &cx.limits.similar;
        if !limits.is_on() || cx.msg.words.is_empty() {
            return Verdict::Allow;
        }
        let window = Duration::from_secs(limits.window_seconds);
        let best = cx
            .world
            .recent_words(cx.msg.now, window)
            .map(|earlier| jaccard(cx.msg.words, earlier))
            .fold(0.0, f64::max);
        if best >= limits.threshold {
            return Verdict::reject(
                self.name(),
                format!(
                    "{:.0}% the same words as a message of the last {}s (threshold {:.0}%)",
                    best * 100.0,
                    limits.window_seconds,
                    limits.threshold * 100.0
                ),
            );
        }
        Verdict::Allow
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize::substance;

    /// (earlier message, new message, should count as an echo at 0.6)
    const CASES: &[(&str, &str, bool)] = &[
        (
            "Good point, add unit tests",
            "Good point — we should add unit tests",
            true,
        ),
        (
            "@bob I agree, let's ship it on Friday",
            "@alice Agreed: ship it on Friday!",
            true,
        ),
        (
            "The migration needs a rollback step",
            "We really need a rollback step for the migration",
            true,
        ),
        (
            "Sounds good, I'll start on the parser",
            "Sounds good! I will start on the parser.",
            true,
        ),
        (
            "The best approach is caching the results",
            "The best approach is batching the writes",
            false,
        ),
        (
            "Paris is the capital of France",
            "I think the answer is Lyon",
            false,
        ),
        (
            "Use a bounded channel between the stages",
            "Profile first; the JSON encoding may dominate",
            false,
        ),
        ("42", "43", false),
    ];

    #[test]
    fn reworded_echoes_score_high_and_distinct_answers_low() {
        for (a, b, echo) in CASES {
            let s = jaccard(&words(&substance(a)), &words(&substance(b)));
            println!("{s:.2}  {a:?} / {b:?}");
            assert_eq!(s >= 0.6, *echo, "{s:.2} for {a:?} vs {b:?}");
        }
    }

    #[test]
    fn stop_words_are_dropped() {
        assert!(words("the a with your really should").is_empty());
        assert_eq!(words("the tests").len(), 1);
    }

    #[test]
    fn jaccard_is_exact_on_small_sets() {
        assert_eq!(jaccard(&[1, 2, 3], &[2, 3, 4]), 0.5);
        assert_eq!(jaccard(&[1], &[1]), 1.0);
        assert_eq!(jaccard(&[], &[]), 0.0);
    }
}
