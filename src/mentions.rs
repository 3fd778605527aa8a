//! Mention parsing (contract §3), pure and allocation-light.
//!
//! A *paragraph-start* mention is `@name` at the start of the content or right
//! after a newline, after optional spaces or tabs. Several in a row count,
//! separated by spaces, tabs or commas; the run goes on past tokens that
//! are not names. Invisible marks (a byte-order mark, a bidirectional mark,
//! a zero-width space or joiner) count as spaces throughout the run, as
//! normalisation reads them. A token ends at a space, tab, comma, CR or LF, and may close
//! with punctuation that ends a phrase: `:`, `.`, `!`, `?`, `;`, as many as
//! written (`@alice: …`, `@bob. can you…`, `@carol?!`). Chinese and
//! Japanese punctuation (`，`, `、`, `：`, `；`, `！`, `？`, `。`, `．`) ends a
//! token and parts a run's tokens, as such text has no spaces. A token holding
//! anything else — `'s`, `.x`, `*`, `>`, non-ASCII, a second `@` — is not a
//! name: it is plain text, and so may hold an inline mention as any text may
//! (`@bob's` is one, as `ask @bob's` is).
//!
//! An *inline* (mid-paragraph) mention is `@name` anywhere else, where the `@`
//! does not sit inside a word (`a@b.com` is no mention) or after a `/` (a
//! path or address: `medium.com/@bob/post`), and the name is the
//! whole word (`@josé` does not mention `jos`, `@bob@host` not `bob`;
//! `@bob—` and `@bob’s` do mention `bob`).
//!
//! This module only finds name-shaped tokens; routing decides which of them
//! are roster agents.

use crate::names::{is_name_byte, MAX_NAME_LEN};

/// Name-shaped mention tokens of one content, as written (not lowercased).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan<'a> {
    /// Paragraph-start mentions, in order of appearance.
    pub leading: Vec<&'a str>,
    /// Mid-paragraph mentions, in order of appearance.
    pub inline: Vec<&'a str>,
}

/// Finds every name-shaped mention token in `content`.
pub fn scan(content: &str) -> Scan<'_> {
    let mut out = Scan::default();
    for paragraph in content.split('\n') {
        let run_end = leading_run(paragraph, |token| match token {
            RunToken::Name(name) => out.leading.push(name),
            RunToken::Plain(span) => inline_mentions(paragraph, span, &mut out.inline),
        });
        inline_mentions(paragraph, run_end..paragraph.len(), &mut out.inline);
    }
    out
}

/// Punctuation that may close a paragraph-start mention token.
const CLOSING: [char; 5] = [':', '.', '!', '?', ';'];

/// Chinese and Japanese punctuation: it ends a paragraph-start token and
/// parts a run's tokens (such text has no spaces: `@bob：看一下`,
/// `@alice、@bob 请看`).
pub const WIDE_PUNCTUATION: [char; 8] = ['，', '、', '：', '；', '！', '？', '。', '．'];

/// A paragraph-start token without the punctuation that closes it
/// (`bob?!` is `bob`): what must be a name for the token to be a mention.
/// Normalisation (the duplicate rule) reads tokens the same way.
pub fn without_closing(token: &str) -> &str {
    token.trim_end_matches(CLOSING)
}

/// The paragraph-start mentions of `content` alone, in a list.
pub fn leading(content: &str) -> Vec<&str> {
    let mut out = Vec::new();
    each_leading(content, |name| out.push(name));
    out
}

/// Hands each paragraph-start mention of `content` to `found`, in order,
/// with no list: what routing reads first, and all it reads for an agent
/// or system sender.
pub fn each_leading<'a>(content: &'a str, mut found: impl FnMut(&'a str)) {
    for paragraph in content.split('\n') {
        leading_run(paragraph, |token| {
            if let RunToken::Name(name) = token {
                found(name);
            }
        });
    }
}

/// The mid-paragraph mentions of `content` alone.
pub fn inline(content: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for paragraph in content.split('\n') {
        let run_end = leading_run(paragraph, |token| {
            if let RunToken::Plain(span) = token {
                inline_mentions(paragraph, span, &mut out);
            }
        });
        inline_mentions(paragraph, run_end..paragraph.len(), &mut out);
    }
    out
}

/// A token of a paragraph-start run.
enum RunToken<'a> {
    /// A name: a paragraph-start mention.
    Name(&'a str),
    /// Not a name (`@bob.x`, `@alice's`), so plain text at those bytes of
    /// the paragraph, `@` included: read as any text is for inline
    /// mentions, so `@alice's` is one here as it is mid-paragraph.
    Plain(std::ops::Range<usize>),
}

/// Scans the paragraph-start run of one paragraph, handing each token to
/// `found`; returns the byte offset where the run ends.
fn leading_run<'a>(p: &'a str, mut found: impl FnMut(RunToken<'a>)) -> usize {
    let b = p.as_bytes();
    let mut i = skip_indent(p);
    while i < b.len() && b[i] == b'@' {
        let tok_start = i + 1;
        let mut j = tok_start;
        while j < b.len() {
            match b[j] {
                b' ' | b'\t' | b',' | b'\r' => break,
                c if c < 0x80 => j += 1,
                // A character at a time past ASCII (`j` stays on a
                // character boundary).
                _ => match parts_run(p, j) {
                    Some(_) => break,
                    None => j += p[j..].chars().next().map_or(1, char::len_utf8),
                },
            }
        }
        let tok = without_closing(&p[tok_start..j]);
        found(if is_name(tok) {
            RunToken::Name(tok)
        } else {
            RunToken::Plain(i..j)
        });
        i = skip_separators(p, j);
    }
    i
}

/// The length of the non-ASCII character at `p[i..]` when it ends a run's
/// token and parts its tokens: [`WIDE_PUNCTUATION`], or an invisible mark
/// (which counts as a space, as normalisation reads it).
fn parts_run(p: &str, i: usize) -> Option<usize> {
    let c = p.get(i..)?.chars().next()?;
    (WIDE_PUNCTUATION.contains(&c) || crate::names::is_invisible_mark(c)).then(|| c.len_utf8())
}

/// Past the spaces, tabs, commas, [`WIDE_PUNCTUATION`] and invisible marks
/// between a run's tokens.
fn skip_separators(p: &str, mut i: usize) -> usize {
    let b = p.as_bytes();
    while i < b.len() {
        match b[i] {
            b' ' | b'\t' | b',' => i += 1,
            c if c < 0x80 => break,
            _ => match parts_run(p, i) {
                Some(n) => i += n,
                None => break,
            },
        }
    }
    i
}

/// Pushes inline mentions found in `p[span]`.
fn inline_mentions<'a>(p: &'a str, span: std::ops::Range<usize>, out: &mut Vec<&'a str>) {
    let b = &p.as_bytes()[..span.end];
    let mut i = span.start;
    while let Some(off) = memchr::memchr(b'@', &b[i..]) {
        let at = i + off;
        // `a@b`, `ü@x`: the `@` is inside a word; `…com/@bob/post`: inside
        // a path or address.
        let inside_word = p[..at]
            .chars()
            .next_back()
            .is_some_and(|c| joins_word(c) || c == '/');
        let end = skip(b, at + 1, is_name_byte);
        // `@josé`, `@bob@host`: the word goes on past the name, so it is
        // not the name. (`@bob—`, `@bob’s`: punctuation ends it.)
        let word_goes_on = p[end..].chars().next().is_some_and(joins_word);
        if !inside_word && !word_goes_on && is_name(&p[at + 1..end]) {
            out.push(&p[at + 1..end]);
        }
        i = end.max(at + 1);
    }
}

/// Whether `c`, next to an inline `@name`, makes it part of a longer word:
/// a name's own characters, an `@`, a letter or digit of any script, or a
/// combining mark (`bob` + U+0301 is `bób`; the blocks of diacritics,
/// Hebrew accents and variation selectors: marks the standard library's
/// `is_alphanumeric` leaves out). Punctuation and spaces of any script are
/// not.
fn joins_word(c: char) -> bool {
    if c.is_ascii() {
        return is_name_byte(c as u8) || c == '@';
    }
    c.is_alphanumeric()
        || matches!(
            u32::from(c),
            0x300..=0x36F
                | 0x591..=0x5AF
                | 0x1AB0..=0x1AFF
                | 0x1DC0..=0x1DFF
                | 0x20D0..=0x20FF
                | 0xFE00..=0xFE0F
                | 0xFE20..=0xFE2F
                | 0xE0100..=0xE01EF
        )
}

/// Where a paragraph's text begins: past spaces and tabs, and past the
/// invisible marks an editor may put there (a byte-order mark, a
/// right-to-left mark before an `@name` in a right-to-left paragraph),
/// which count as spaces: they hide nothing a reader sees.
fn skip_indent(p: &str) -> usize {
    let b = p.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b' ' || b[i] == b'\t' {
            i += 1;
        } else if b[i] >= 0x80 {
            match p[i..].chars().next() {
                Some(c) if crate::names::is_invisible_mark(c) => i += c.len_utf8(),
                _ => break,
            }
        } else {
            break;
        }
    }
    i
}

fn skip(b: &[u8], mut i: usize, pred: impl Fn(u8) -> bool) -> usize {
    while i < b.len() && pred(b[i]) {
        i += 1;
    }
    i
}

fn is_name(tok: &str) -> bool {
    !tok.is_empty() && tok.len() <= MAX_NAME_LEN && tok.bytes().all(is_name_byte)
}

/// Lowercases a name-shaped token into `buf` without allocating.
pub fn lowercase<'b>(token: &str, buf: &'b mut [u8; MAX_NAME_LEN]) -> &'b str {
    let n = token.len().min(MAX_NAME_LEN);
    for (dst, src) in buf.iter_mut().zip(token.bytes()).take(n) {
        *dst = src.to_ascii_lowercase();
    }
    // Tokens are ASCII (checked by `is_name`), so this cannot fail; an empty
    // name matches no roster entry if it ever did.
    std::str::from_utf8(&buf[..n]).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each through `scan`, checked against the function of its own.
    fn leading_of(s: &str) -> Vec<&str> {
        let scan = scan(s);
        assert_eq!(scan.leading, leading(s), "{s:?}");
        assert_eq!(scan.inline, inline(s), "{s:?}");
        scan.leading
    }
    fn inline_of(s: &str) -> Vec<&str> {
        leading_of(s);
        scan(s).inline
    }

    /// Chinese and Japanese punctuation ends and parts a run's tokens
    /// (before, `@bob，请检查` was plain text: an agent's message went
    /// public, a human's to no inbox).
    #[test]
    fn full_width_punctuation_parts_and_closes_a_run_s_tokens() {
        assert_eq!(leading_of("@bob，请检查迁移"), ["bob"]);
        assert_eq!(leading_of("@bob：看一下"), ["bob"]);
        assert_eq!(leading_of("@bob。"), ["bob"]);
        assert_eq!(leading_of("@alice、@bob 请看"), ["alice", "bob"]);
        assert_eq!(leading_of("@alice，@bob？ 好"), ["alice", "bob"]);
        assert_eq!(leading_of("@alice：@bob 好"), ["alice", "bob"]);
        for c in WIDE_PUNCTUATION {
            assert_eq!(leading_of(&format!("@bob{c}x")), ["bob"], "{c}");
        }
        // Other full-width characters are no punctuation here.
        assert!(leading_of("@bob（x").is_empty());
    }

    /// Invisible marks count as spaces in the run: before each name (a
    /// right-to-left editor's marks), after one, and as its end.
    #[test]
    fn invisible_marks_in_a_run_count_as_spaces() {
        assert_eq!(
            leading_of("\u{200f}@alice \u{200f}@bob hi"),
            ["alice", "bob"]
        );
        assert_eq!(leading_of("@alice\u{200f} @bob"), ["alice", "bob"]);
        assert_eq!(leading_of("@al\u{200b}ice hi"), ["al"]);
        assert!(leading_of("@\u{200f}alice").is_empty());
        // Other non-ASCII characters still make a token plain text.
        assert!(leading_of("@bob\u{e9} hi").is_empty());
    }

    /// An `@` after a `/` is inside a path or address, not a mention (a
    /// human's link would otherwise reach no inbox).
    #[test]
    fn an_at_after_a_slash_is_no_inline_mention() {
        assert!(inline_of("see https://medium.com/@bob/post").is_empty());
        assert_eq!(inline_of("ask /me @bob"), ["bob"]);
    }

    /// Combining marks the standard library does not call alphanumeric
    /// still continue a word (a variation selector, a Hebrew accent).
    #[test]
    fn variation_selectors_and_hebrew_accents_continue_a_name() {
        assert!(inline_of("ask @bob\u{fe0f} now").is_empty());
        assert!(inline_of("ask @bob\u{0591} now").is_empty());
        assert!(inline_of("x\u{fe0f}@bob now").is_empty());
    }

    #[test]
    fn finds_a_run_of_leading_mentions() {
        assert_eq!(leading_of("@alice @bob, please review"), ["alice", "bob"]);
        assert_eq!(leading_of("  \t@Alice,@bob hi"), ["Alice", "bob"]);
        assert_eq!(leading_of("@alice: can you?"), ["alice"]);
        assert_eq!(leading_of("hello\n  @carol go"), ["carol"]);
        assert_eq!(leading_of("@alice\r\nnext"), ["alice"]);
    }

    #[test]
    fn the_run_goes_on_past_ignored_tokens() {
        assert_eq!(leading_of("@ @@x @bob.> @alice hi"), ["alice"]);
    }

    #[test]
    fn the_run_stops_at_the_first_word() {
        let s = scan("@alice hi @bob");
        assert_eq!(s.leading, ["alice"]);
        assert_eq!(s.inline, ["bob"]);
    }

    #[test]
    fn malformed_tokens_are_plain_text() {
        for s in [
            "@",
            "@@x",
            "@bob.x",
            "@bob*",
            "@bob>",
            "@bøb",
            "@a\u{a0}b",
            "x@alice",
            "@é",
        ] {
            assert!(leading_of(s).is_empty(), "{s:?}");
        }
        assert!(leading_of(&format!("@{}", "a".repeat(65))).is_empty());
        assert_eq!(leading_of(&format!("@{}", "a".repeat(64))).len(), 1);
    }

    #[test]
    fn inline_mentions_skip_at_signs_inside_words() {
        assert_eq!(inline_of("mail a@b.com or ask @bob."), ["bob"]);
        assert_eq!(inline_of("thanks (@carol) and @@dave"), ["carol"]);
        assert_eq!(inline_of("ü@x"), Vec::<&str>::new());
        assert_eq!(inline_of("say @ nothing"), Vec::<&str>::new());
    }

    #[test]
    fn an_inline_mention_is_the_whole_word() {
        let none = Vec::<&str>::new();
        assert_eq!(inline_of("ask @josé or @bob\u{301} now"), none);
        assert_eq!(inline_of("write to @bob@example.com"), none);
        assert_eq!(inline_of("ask éf@bob or 名@bob"), none);
        // At a paragraph's start too, where the token is plain text.
        assert_eq!(scan("@josé hi").inline, none);
        // Punctuation and spaces end the word, ASCII or not: still a mention.
        assert_eq!(
            inline_of("ask @bob's friend, @carol! or (@dave)"),
            ["bob", "carol", "dave"]
        );
        assert_eq!(
            inline_of("ask @bob—now, @carol’s draft, —@dave… or\u{a0}@erin\u{a0}"),
            ["bob", "carol", "dave", "erin"]
        );
    }

    #[test]
    fn a_token_of_the_run_that_is_no_name_is_read_as_text() {
        let s = scan("@alice's draft, can you check?");
        assert!(s.leading.is_empty());
        assert_eq!(s.inline, ["alice"]);
        assert_eq!(
            inline_of("@ @@x @bob.> @alice's @carol hi"),
            ["bob", "alice"]
        );
        assert_eq!(leading_of("@ @@x @bob.> @alice's @carol hi"), ["carol"]);
    }

    /// `@bob.` is `@name` at the paragraph's start (contract §3): the
    /// punctuation that ends a phrase closes the mention, however much of
    /// it there is. Before 2026-11-23 only one `:` did, and `@bob.` was a
    /// mid-paragraph mention.
    #[test]
    fn punctuation_that_ends_a_phrase_closes_a_paragraph_start_mention() {
        for content in [
            "@alice. can you check?",
            "@alice? are you there",
            "@alice! look",
            "@alice; then",
            "@alice:: hi",
            "@alice?! now",
            "@alice...",
        ] {
            let s = scan(content);
            assert_eq!((s.leading, s.inline), (vec!["alice"], vec![]), "{content}");
        }
        assert_eq!(leading_of("@alice. @bob? both"), ["alice", "bob"]);
        // Only at the token's end: inside it, the token is no name.
        for content in ["@alice.x hi", "@alice?x hi", "@alice.> hi", "@.", "@:?"] {
            assert!(leading_of(content).is_empty(), "{content}");
        }
    }

    #[test]
    fn leading_mentions_are_not_inline() {
        assert!(inline_of("@alice @bob hi").is_empty());
    }

    #[test]
    fn lowercase_uses_a_stack_buffer() {
        let mut buf = [0u8; MAX_NAME_LEN];
        assert_eq!(lowercase("AliCe", &mut buf), "alice");
    }
}
