//! Content normalisation for the `duplicate` rule (contract §5.4).
//!
//! Every paragraph-start `@name` is removed (roster or not), the text is
//! lowercased, whitespace runs become one space, and the ends are trimmed.
//! So `@bob Sounds  GOOD` and `@alice sounds good` are the same message.
//! A token of the run that is no name (`@bob:approve`, `@alice's`, `@@x`)
//! is text, as routing reads it, and ends the run here: it and everything
//! after it stay, so `@bob:approve the plan` and `@bob:reject the plan` are
//! not the same message. (Routing's run goes on past such a token; here a
//! name after one stays, which keeps normalising twice the same as once:
//! a run that went on would, the second time, swallow the commas of a
//! paragraph joined after it.)
//!
//! Invisible marks (a byte-order mark, bidirectional marks, zero-width
//! spaces and joiners: [`crate::names::is_invisible_mark`]) count as
//! spaces, as routing reads them: they show nothing, so they neither make
//! a message new nor hide a paragraph's mentions.
//!
//! Paragraph starts here skip any Unicode whitespace, not only spaces and
//! tabs as routing does: otherwise a run hidden behind a no-break space would
//! surface after the first pass, and normalising twice would differ from
//! normalising once. The result is idempotent: `normalize(normalize(x)) ==
//! normalize(x)`.

use std::sync::LazyLock;

use crate::names::is_invisible_mark;

/// The normalised form of `content`.
pub fn normalize(content: &str) -> String {
    let mut out = String::with_capacity(content.len());
    normalize_into(content, &mut out);
    out
}

/// Appends the normalised form of `content` to `out` (the hot path reuses
/// one buffer). ASCII paragraphs, the common case, are copied whole when
/// already tidy (single spaces between words), else a word at a time, and
/// lowercased in place; every path produces the same text.
pub fn normalize_into(content: &str, out: &mut String) {
    // Invisible marks show nothing: each counts as a space, as routing
    // reads them in a paragraph's run, so `sounds\u{200b} good` is `sounds
    // good` and a byte-order mark before a paragraph's `@name` does not
    // keep it.
    if !content.is_ascii() && content.chars().any(is_invisible_mark) {
        let visible: String = content
            .chars()
            .map(|c| if is_invisible_mark(c) { ' ' } else { c })
            .collect();
        return normalize_into(&visible, out);
    }
    let start = out.len();
    // Built as bytes and checked as UTF-8 once at the end: only whole
    // characters of valid UTF-8 are appended.
    let mut bytes = std::mem::take(out).into_bytes();
    let word_break = |bytes: &mut Vec<u8>| {
        if bytes.len() > start {
            bytes.push(b' ');
        }
    };
    for paragraph in content.split('\n') {
        let rest = strip_leading_mentions(paragraph);
        if rest.is_ascii() {
            let rest = rest.as_bytes();
            if is_tidy(rest) {
                // Already one space between words: copied whole.
                word_break(&mut bytes);
                let at = bytes.len();
                bytes.extend_from_slice(rest);
                bytes[at..].make_ascii_lowercase();
                continue;
            }
            let words = rest.split(|&b| b == b' ' || is_control_space(b));
            for word in words.filter(|w| !w.is_empty()) {
                word_break(&mut bytes);
                let at = bytes.len();
                bytes.extend_from_slice(word);
                bytes[at..].make_ascii_lowercase();
            }
            continue;
        }
        for word in rest.split_whitespace() {
            word_break(&mut bytes);
            push_lowercase(&mut bytes, word);
        }
    }
    // Only whole characters were appended to valid UTF-8: this cannot fail.
    *out = String::from_utf8(bytes).unwrap_or_default();
}

/// Appends `word` lowercased, a byte at a time when it is ASCII.
fn push_lowercase(bytes: &mut Vec<u8>, word: &str) {
    if word.is_ascii() {
        let at = bytes.len();
        bytes.extend_from_slice(word.as_bytes());
        bytes[at..].make_ascii_lowercase();
        return;
    }
    let mut buf = [0; 4];
    for c in word.chars().flat_map(char::to_lowercase) {
        bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
    }
}

/// `char::is_whitespace` on ASCII is space and these: \t, \n, \x0B, \x0C, \r.
fn is_control_space(b: u8) -> bool {
    (b'\t'..=b'\r').contains(&b)
}

/// True when ASCII `text` (no leading whitespace) is non-empty and its
/// words are separated by single spaces, with none at the end: what
/// normalising would keep as it is, but for the case. Written as one pass
/// without early exits and a search for two spaces, so both run over many
/// bytes at a time.
fn is_tidy(text: &[u8]) -> bool {
    let controls = text
        .iter()
        .fold(false, |found, &b| found | is_control_space(b));
    !controls && !text.is_empty() && !text.ends_with(b" ") && DOUBLE_SPACE.find(text).is_none()
}

/// The search for two spaces, built once: `memmem::find` builds its
/// searcher on every call, which cost more than the search of a message.
static DOUBLE_SPACE: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(b"  "));

/// The substance of `content`: its normalised form with everything but
/// letters and digits removed and spaces collapsed, "@bob Sounds good!! 👍"
/// → "sounds good". What the `low_content`, `similar` and `concluded` rules
/// read.
pub fn substance(content: &str) -> String {
    let mut out = String::with_capacity(content.len());
    substance_into(&normalize(content), &mut out);
    out
}

/// Appends the substance of `normalized` (text [`normalize`] gave) to `out`:
/// each run of characters other than letters and digits becomes one space,
/// none at either end.
pub fn substance_into(normalized: &str, out: &mut String) {
    let start = out.len();
    let mut push = |run: &str| {
        if !run.is_empty() {
            if out.len() > start {
                out.push(' ');
            }
            out.push_str(run);
        }
    };
    // Whole runs are copied, not a character at a time.
    if normalized.is_ascii() {
        // A byte at a time, where a character is one byte: the same runs,
        // without decoding characters. The runs end at ASCII bytes, so each
        // is a `str` slice.
        let mut run_start = 0;
        for (i, b) in normalized.bytes().enumerate() {
            if !b.is_ascii_alphanumeric() {
                push(&normalized[run_start..i]);
                run_start = i + 1;
            }
        }
        push(&normalized[run_start..]);
    } else {
        normalized
            .split(|c: char| !c.is_alphanumeric())
            .for_each(push);
    }
}

/// `p` without its leading whitespace and paragraph-start `@name` run, up
/// to the first `@token` that is no name.
fn strip_leading_mentions(p: &str) -> &str {
    let mut s = p.trim_start();
    // Tokens end, and runs are parted, as routing reads them.
    let parts =
        |c: char| c.is_whitespace() || c == ',' || crate::mentions::WIDE_PUNCTUATION.contains(&c);
    while let Some(rest) = s.strip_prefix('@') {
        let end = rest.find(parts).unwrap_or(rest.len());
        if !is_mention(&rest[..end]) {
            break;
        }
        s = rest[end..].trim_start_matches(parts);
    }
    s
}

/// Whether the token after an `@` is a name (with the punctuation that
/// closes it, `:`, `.`, `!`, `?`, `;`), as routing reads mentions. Judged on its lowercase form, which is what
/// normalising keeps: a token that lowercases to a name (the Kelvin sign's
/// `K` becomes `k`) is removed the first time, not only when normalised
/// again.
fn is_mention(token: &str) -> bool {
    let token = crate::mentions::without_closing(token);
    let mut len = 0;
    for c in token.chars().flat_map(char::to_lowercase) {
        if !c.is_ascii() || !crate::names::is_name_byte(c as u8) {
            return false;
        }
        len += 1;
    }
    (1..=crate::names::MAX_NAME_LEN).contains(&len)
}

#[cfg(test)]
mod tests {
    use super::{normalize, strip_leading_mentions, substance};
    use proptest::strategy::Strategy;

    /// Normalisation as the contract words it, a character at a time: what
    /// the fast paths are checked against.
    fn reference(content: &str) -> String {
        let visible: String = content
            .chars()
            .map(|c| {
                if crate::names::is_invisible_mark(c) {
                    ' '
                } else {
                    c
                }
            })
            .collect();
        let words: Vec<String> = visible
            .split('\n')
            .flat_map(|p| strip_leading_mentions(p).split_whitespace())
            .map(|w| w.chars().flat_map(char::to_lowercase).collect())
            .collect();
        words.join(" ")
    }

    /// Contents made of words, mentions and every kind of gap: all ASCII
    /// (the fast paths) or with non-ASCII pieces too.
    fn contents(ascii: bool) -> impl proptest::strategy::Strategy<Value = String> {
        let mut pieces = vec![
            "Hello", "wOrld", "x.Y", " ", " ", " ", "  ", "\t", "\x0b", "\x0c", "\r\n", "\n",
            "@bob", "@a,", ",", ": ", "42", "@b:", "@x.y", "@@", "'s",
        ];
        if !ascii {
            pieces.extend([
                "É",
                "ΣΑΣ",
                "İ",
                "ß",
                "🙂",
                "\u{a0}",
                "\u{2003}",
                "²",
                "٣",
                "日本",
                "@\u{212a}",
            ]);
        }
        proptest::collection::vec(proptest::sample::select(pieces), 0..16).prop_map(|p| p.concat())
    }

    /// The substance a character at a time.
    fn substance_reference(normalized: &str) -> String {
        let mut out = String::new();
        let mut gap = false;
        for c in normalized.chars() {
            if !c.is_alphanumeric() {
                gap = true;
                continue;
            }
            if gap && !out.is_empty() {
                out.push(' ');
            }
            gap = false;
            out.push(c);
        }
        out
    }

    proptest::proptest! {
        #[test]
        fn substance_agrees_with_the_character_at_a_time_reference(content in contents(false)) {
            let mut out = String::from("kept");
            super::substance_into(&content, &mut out);
            let expected = substance_reference(&content);
            let joined = if expected.is_empty() { "kept".to_string() } else { format!("kept{expected}") };
            proptest::prop_assert_eq!(out, joined);
        }

        #[test]
        fn ascii_substance_agrees_with_the_character_at_a_time_reference(content in contents(true)) {
            let mut out = String::new();
            super::substance_into(&content, &mut out);
            proptest::prop_assert_eq!(out, substance_reference(&content));
        }

        #[test]
        fn ascii_agrees_with_the_character_at_a_time_reference(content in contents(true)) {
            proptest::prop_assert_eq!(normalize(&content), reference(&content));
        }

        #[test]
        fn unicode_agrees_with_the_character_at_a_time_reference(content in contents(false)) {
            proptest::prop_assert_eq!(normalize(&content), reference(&content));
        }
    }

    #[test]
    fn substance_keeps_only_letters_and_digits_between_single_spaces() {
        assert_eq!(substance("@bob  Sounds GOOD!! 👍"), "sounds good");
        assert_eq!(substance("🙂🙂"), "");
        assert_eq!(substance("  ...v2.0 -- ready?  "), "v2 0 ready");
        assert_eq!(substance("Ünïcödé\u{a0}words, ok"), "ünïcödé words ok");
        assert_eq!(
            substance("A-b, c3!  d") + " é",
            substance("A-b, c3!  d é"),
            "the ASCII path agrees with the Unicode path"
        );
    }

    #[test]
    fn removes_leading_mentions_lowercases_and_collapses_whitespace() {
        assert_eq!(normalize("@bob Sounds  GOOD\t!"), "sounds good !");
        assert_eq!(normalize("  @Alice, @carol sounds good"), "sounds good");
        assert_eq!(normalize("first\n@bob second"), "first second");
        assert_eq!(normalize("@bob: ok"), "ok");
        // Closed with any punctuation that ends a phrase, as routing reads
        // it: the same words to another agent are the same message.
        assert_eq!(normalize("@bob. can you check?"), "can you check?");
        assert_eq!(
            normalize("@bob?! same words"),
            normalize("@carol... same words")
        );
    }

    #[test]
    fn keeps_run_tokens_that_are_no_names() {
        assert_eq!(normalize("@@x @nobody.here ok"), "@@x @nobody.here ok");
        assert_eq!(
            normalize("@Bob:approve the migration"),
            "@bob:approve the migration"
        );
        assert_ne!(
            normalize("@bob:approve the migration"),
            normalize("@bob:reject the migration")
        );
        assert_ne!(
            normalize("@alice's draft looks right"),
            normalize("@bob's draft looks right")
        );
        // The run ends at the first that is not: a name after it stays.
        assert_eq!(normalize("@alice @x.y, @bob hi"), "@x.y, @bob hi");
        // A token that lowercases to a name is one (normalising twice agrees).
        assert_eq!(normalize("@\u{212a} hi"), "hi");
    }

    #[test]
    fn keeps_inline_mentions_and_commas_that_are_text() {
        assert_eq!(normalize("ask @bob now"), "ask @bob now");
        assert_eq!(normalize(", then"), ", then");
    }

    #[test]
    fn empty_and_mention_only_content_normalise_to_empty() {
        assert_eq!(normalize(""), "");
        assert_eq!(normalize("@bob"), "");
        assert_eq!(normalize(" \n @a \n"), "");
    }

    #[test]
    fn the_ascii_fast_path_agrees_with_the_unicode_path() {
        // Same words, once pure ASCII and once with a non-ASCII word that
        // forces the Unicode path on its paragraph.
        for (ascii, unicode) in [
            ("A\x0bB\x0cC\rD  E\tF", "A\x0bB\x0cC\rD  E\tF \u{e9}"),
            ("@bob Hello   WORLD", "@bob Hello   WORLD \u{e9}"),
        ] {
            assert_eq!(normalize(ascii) + " \u{e9}", normalize(unicode));
        }
        assert_eq!(normalize("A\x0bB"), "a b", "vertical tab is whitespace");
    }

    /// Invisible marks make no message different, nor hide a paragraph's
    /// mentions (before, each of these was a new message).
    #[test]
    fn invisible_marks_are_not_part_of_a_message() {
        assert_eq!(normalize("sounds\u{200b} good"), normalize("sounds good"));
        assert_eq!(normalize("\u{feff}@bob same"), normalize("@carol same"));
        assert_eq!(normalize("ok\n\u{200f}@bob yes"), "ok yes");
        assert_eq!(normalize("go\u{200d}od"), "go od");
        // As routing's run reads them.
        assert_eq!(normalize("\u{200f}@alice \u{200f}@bob hi"), "hi");
        assert_eq!(normalize("@alice\u{200f} @bob hi"), "hi");
        assert_eq!(normalize("@al\u{200b}ice hi"), "ice hi");
        // Separators part words still.
        assert_eq!(normalize("a\u{2028}b"), "a b");
    }

    /// A run parted by Chinese and Japanese punctuation is removed as
    /// routing reads it.
    #[test]
    fn a_run_parted_by_full_width_commas_is_removed() {
        assert_eq!(normalize("@alice，@bob、请看"), "请看");
        assert_eq!(normalize("@bob：好的"), "好的");
    }

    #[test]
    fn is_idempotent_on_awkward_inputs() {
        for s in [
            "\u{a0}@a hi",
            "x\n\u{2003}@b, @c y",
            "İSTANBUL",
            "@a\r\n@b\r\nz",
            "ǅ ß ΣΑΣ",
            "@a ,@b ,, c",
            "@x.y\u{a0}@a z",
            "@\u{212a}: k",
            "@@ @b:c, @d",
            "@\n, ",
            "@x.y\n,@alice hi",
            "@b\u{200b}ob hi",
            "\u{feff}@a\u{2028}@b z",
        ] {
            let once = normalize(s);
            assert_eq!(normalize(&once), once, "{s:?}");
        }
    }
}
