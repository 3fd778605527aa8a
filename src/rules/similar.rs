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

/// A message's content words: their hashes, sorted and deduplicated, and a
/// 128-bit sketch of them (bit `h % 128` set for each hash `h`).
///
/// The sketch is what makes the rule cheap in a busy world: a bit one
/// sketch has and the other lacks stands for at least one word of the
/// first set that the second lacks, so two sketches bound how many words
/// the sets can share, and most earlier sets of chat-sized messages are
/// ruled out without reading them (each is an allocation of its own, and
/// reading it a cache miss). The longer the messages, the fuller the
/// sketches and the less they rule out: at 64 words about 50 of the 128
/// bits are set. 128 bits, not 64: of the benchmark's answers (23 words,
/// all but one or two shared), 3.2% of pairs got past the sketches at a
/// threshold of 0.99 against 11.2% with 64, and a decision with every
/// optional rule on took about 3% less (criterion, 7.12 against 7.35 µs),
/// for 8 bytes more a remembered set.
#[derive(Debug, Clone, Default)]
pub struct Words {
    hashes: Box<[u64]>,
    sketch: u128,
}

impl Words {
    /// The set of `hashes`, in any order, repeats allowed.
    fn new(mut hashes: Vec<u64>) -> Words {
        hashes.sort_unstable();
        hashes.dedup();
        let sketch = hashes.iter().fold(0, |s, h| s | 1 << (h % 128));
        Words {
            hashes: hashes.into_boxed_slice(),
            sketch,
        }
    }

    fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }
}

/// The content words of `substance` (a message's text as
/// [`substance`](crate::normalize::substance) gives it: the judge works it
/// out once for the rules that read it).
pub fn words(substance: &str) -> Words {
    let mut hashes = Vec::with_capacity(MAX_WORDS);
    // Bytes, not characters: the substance's words are separated by single
    // spaces, and the stop words and suffixes are ASCII.
    for w in substance.as_bytes().split(|&b| b == b' ') {
        if w.is_empty() || is_stop_word(w) {
            continue;
        }
        // Kept sorted and distinct: repeats do not count toward the cap (a
        // run of one word would fill it, and two messages opening with the
        // same run would score as one set), and a message of one word
        // repeated costs a search a word, not a sort.
        let hash = WORD_HASHER.hash_one(stem(w));
        if let Err(at) = hashes.binary_search(&hash) {
            hashes.insert(at, hash);
            if hashes.len() == MAX_WORDS {
                break;
            }
        }
    }
    Words::new(hashes)
}

fn is_stop_word(w: &[u8]) -> bool {
    static SET: LazyLock<HashSet<&[u8], foldhash::fast::FixedState>> =
        LazyLock::new(|| STOP_WORDS.iter().map(|w| w.as_bytes()).collect());
    // Most words are longer than any stop word: no lookup for them.
    w.len() <= LONGEST_STOP_WORD && SET.contains(w)
}

/// A light suffix stemmer, so "agree" and "agreed", "test" and "tests"
/// meet: strips one of -ing, -ed, -es, -s, -ly, or else a final -e, keeping
/// at least three bytes (the first of those that does: "bees" loses its
/// -s, as -es would leave two).
fn stem(w: &[u8]) -> &[u8] {
    let cut = |n: usize| (w.len() >= n + 3).then(|| &w[..w.len() - n]);
    let stemmed = match w {
        [.., b'i', b'n', b'g'] => cut(3),
        [.., b'e', b'd'] | [.., b'l', b'y'] => cut(2),
        [.., b'e', b's'] => cut(2).or_else(|| cut(1)),
        [.., b's'] | [.., b'e'] => cut(1),
        _ => None,
    };
    stemmed.unwrap_or(w)
}

/// Jaccard similarity of two sets of words.
#[cfg(test)]
fn jaccard(a: &Words, b: &Words) -> f64 {
    jaccard_at_least(a, b, 0.0).unwrap_or(0.0)
}

/// The Jaccard similarity of `a` and `b` if it is at least `floor`, else
/// `None`, most often without reading the sets: sets of n and m words with
/// c in common score c / (n + m - c), at least `floor` only when
/// c >= floor (n + m) / (1 + floor). The sketches bound c first; a merge of
/// the sets stops once the words left could no longer bring c that far (at
/// a floor of 0.8, two sets of twenty words need eighteen in common: the
/// merge stops at the third word of either that the other lacks).
fn jaccard_at_least(a: &Words, b: &Words, floor: f64) -> Option<f64> {
    let (n, m) = (a.len(), b.len());
    // Less a margin, so that rounding never rules out a pair that would
    // have reached `floor`: the test at the end decides, exactly.
    let needed = (floor * (n + m) as f64 / (1.0 + floor) - 1e-9).ceil() as usize;
    let only_a = (a.sketch & !b.sketch).count_ones() as usize;
    let only_b = (b.sketch & !a.sketch).count_ones() as usize;
    if (n - only_a).min(m - only_b) < needed {
        return None;
    }
    let (a, b) = (&a.hashes, &b.hashes);
    let hopeless = |common: usize, i: usize, j: usize| common + (n - i).min(m - j) < needed;
    let (mut i, mut j, mut common) = (0, 0, 0usize);
    while i < n && j < m {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                common += 1;
                i += 1;
                j += 1;
                continue;
            }
        }
        if hopeless(common, i, j) {
            return None;
        }
    }
    let score = match common {
        0 => 0.0, // two empty sets too: nothing to echo
        _ => common as f64 / (n + m - common) as f64,
    };
    (score >= floor).then_some(score)
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
        // The highest score at or over the threshold: each earlier set is
        // compared only as far as it could still beat the best so far.
        let mut best = None;
        for earlier in cx.world.recent_words(cx.msg.now, window) {
            let floor = best.unwrap_or(limits.threshold);
            if let Some(score) = jaccard_at_least(cx.msg.words, earlier, floor) {
                best = Some(score);
            }
        }
        if let Some(best) = best {
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

    /// The cap counts distinct words: a long run of one word leaves room
    /// for the words after it (before, they were cut, and two messages
    /// opening with the same run scored 1.0).
    #[test]
    fn repeated_words_do_not_fill_the_cap() {
        let run = "retry ".repeat(70);
        assert_eq!(words(&format!("{run}deploy parser tonight")).len(), 4);
        let a = words(&format!("{run}deploy the parser tonight"));
        let b = words(&format!("{run}rollback database now"));
        assert!(jaccard(&a, &b) < 0.6, "{}", jaccard(&a, &b));
        let many: Vec<String> = (0..100).map(|i| format!("w{i}")).collect();
        assert_eq!(words(&many.join(" ")).len(), MAX_WORDS);
        // Two short of the cap, then a long run of one repeat (counted
        // once): the word after it still counts.
        let near = format!("{} {}last", many[..62].join(" "), "zz ".repeat(5000));
        assert_eq!(words(&near).len(), MAX_WORDS);
    }

    #[test]
    fn reworded_echoes_score_high_and_distinct_answers_low() {
        for (a, b, echo) in CASES {
            let s = jaccard(&words(&substance(a)), &words(&substance(b)));
            assert_eq!(s >= 0.6, *echo, "{s:.2} for {a:?} vs {b:?}");
        }
    }

    /// The stemmer as first written: each suffix in turn.
    fn stem_reference(w: &[u8]) -> &[u8] {
        for suffix in [&b"ing"[..], b"ed", b"es", b"s", b"ly", b"e"] {
            if let Some(stripped) = w.strip_suffix(suffix) {
                if stripped.len() >= 3 {
                    return stripped;
                }
            }
        }
        w
    }

    #[test]
    fn stems_keep_three_bytes() {
        let cases: &[(&str, &str)] = &[
            ("testing", "test"),
            ("sing", "sing"),
            ("agreed", "agre"),
            ("tests", "test"),
            ("bees", "bee"),
            ("yes", "yes"),
            ("quickly", "quick"),
            ("agree", "agre"),
            ("the", "the"),
        ];
        for (word, stemmed) in cases {
            assert_eq!(stem(word.as_bytes()), stemmed.as_bytes(), "{word}");
            assert_eq!(
                stem_reference(word.as_bytes()),
                stemmed.as_bytes(),
                "{word}"
            );
        }
    }

    proptest::proptest! {
        /// Words of letters the suffixes are made of, so that every suffix
        /// and the length limit are met often.
        #[test]
        fn stem_agrees_with_trying_each_suffix_in_turn(w in "[a-z]{0,2}[deginlsy]{0,4}") {
            proptest::prop_assert_eq!(stem(w.as_bytes()), stem_reference(w.as_bytes()));
        }

        #[test]
        fn stop_words_are_exactly_the_list(w in "[a-z]{1,7}") {
            proptest::prop_assert_eq!(is_stop_word(w.as_bytes()), STOP_WORDS.contains(&w.as_str()));
        }
    }

    #[test]
    fn every_stop_word_is_one() {
        for w in STOP_WORDS {
            assert!(is_stop_word(w.as_bytes()), "{w}");
        }
        assert!(!is_stop_word(b"thee") && !is_stop_word(b"t") && !is_stop_word(b"ands"));
    }

    #[test]
    fn stop_words_are_dropped() {
        assert!(words("the a with your really should").is_empty());
        assert_eq!(words("the tests").len(), 1);
    }

    #[test]
    fn jaccard_is_exact_on_small_sets() {
        let set = |hashes: &[u64]| Words::new(hashes.to_vec());
        assert_eq!(jaccard(&set(&[1, 2, 3]), &set(&[4, 3, 2])), 0.5);
        assert_eq!(jaccard(&set(&[1]), &set(&[1, 1])), 1.0);
        assert_eq!(jaccard(&set(&[]), &set(&[])), 0.0);
        let (a, b) = (set(&[1, 2, 3]), set(&[2, 3, 4]));
        assert_eq!(jaccard_at_least(&a, &b, 0.5), Some(0.5));
        assert_eq!(jaccard_at_least(&a, &b, 0.51), None);
        assert_eq!(jaccard_at_least(&set(&[]), &set(&[]), 0.1), None);
        // One in common of six: 0.2 exactly, where the overlap 0.2 needs
        // works out at 1.0000000000000002 in floating point.
        let (a, b) = (set(&[1, 2, 3]), set(&[3, 4, 5]));
        assert_eq!(jaccard_at_least(&a, &b, 0.2), Some(0.2));
    }

    /// Sets of up to 40 of 160 hashes, so that two sets share some, most
    /// or all of their words, and sketch bits stand for several words.
    fn set() -> impl proptest::strategy::Strategy<Value = Vec<u64>> {
        proptest::collection::vec(0u64..160, 0..40)
    }

    proptest::proptest! {
        /// Neither the sketches nor stopping early change the answer: the
        /// score at or over the floor, exactly as a full count gives it.
        #[test]
        fn ruling_out_early_gives_the_full_count_s_answer(
            a in set(),
            b in set(),
            // Floors from 0 to 1 in twentieths: the exact ratios small sets
            // score (0.5, 0.75, 0.8, 0.9, ...) are among them.
            twentieths in 0u32..=20,
        ) {
            let floor = f64::from(twentieths) / 20.0;
            let (a, b) = (Words::new(a), Words::new(b));
            let common = a.hashes.iter().filter(|h| b.hashes.contains(h)).count();
            let union = a.len() + b.len() - common;
            let full = if union == 0 { 0.0 } else { common as f64 / union as f64 };
            proptest::prop_assert_eq!(
                jaccard_at_least(&a, &b, floor),
                (full >= floor).then_some(full)
            );
        }
    }
}
