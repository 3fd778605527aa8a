//! Content normalisation for the `duplicate` rule (contract §5.4).
//!
//! Every paragraph-start `@token` is removed (roster or not), the text is
//! lowercased, whitespace runs become one space, and the ends are trimmed.
//! So `@bob Sounds  GOOD` and `@alice sounds good` are the same message.
//!
//! Paragraph starts here skip any Unicode whitespace, not only spaces and
//! tabs as routing does: otherwise a run hidden behind a no-break space would
//! surface after the first pass, and normalising twice would differ from
//! normalising once. The result is idempotent: `normalize(normalize(x)) ==
//! normalize(x)`.

/// The normalised form of `content`.
pub fn normalize(content: &str) -> String {
    let mut out = String::with_capacity(content.len());
    normalize_into(content, &mut out);
    out
}

/// Appends the normalised form of `content` to `out` (the hot path reuses
/// one buffer). ASCII content, the common case, skips char decoding; both
/// paths produce the same text.
pub fn normalize_into(content: &str, out: &mut String) {
    let start = out.len();
    for paragraph in content.split('\n') {
        let rest = strip_leading_mentions(paragraph);
        if rest.is_ascii() {
            // One pass over the bytes. `char::is_whitespace` on ASCII is
            // space and \t, \n, \x0B, \x0C, \r.
            let mut space = out.len() > start;
            let mut bytes = std::mem::take(out).into_bytes();
            for &b in rest.as_bytes() {
                if b == b' ' || (b'\t'..=b'\r').contains(&b) {
                    space = bytes.len() > start;
                } else {
                    if space {
                        bytes.push(b' ');
                        space = false;
                    }
                    bytes.push(b.to_ascii_lowercase());
                }
            }
            // Only ASCII was appended to valid UTF-8, so this cannot fail.
            *out = String::from_utf8(bytes).unwrap_or_default();
            continue;
        }
        for word in rest.split_whitespace() {
            if out.len() > start {
                out.push(' ');
            }
            for c in word.chars() {
                if c.is_ascii() {
                    out.push(c.to_ascii_lowercase());
                } else {
                    out.extend(c.to_lowercase());
                }
            }
        }
    }
}

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
    let mut gap = false;
    for c in normalized.chars() {
        if c.is_alphanumeric() {
            if gap && out.len() > start {
                out.push(' ');
            }
            gap = false;
            out.push(c);
        } else {
            gap = true;
        }
    }
}

/// `p` without its leading whitespace and paragraph-start `@token` run.
fn strip_leading_mentions(p: &str) -> &str {
    let mut s = p.trim_start();
    while let Some(rest) = s.strip_prefix('@') {
        let end = rest
            .find(|c: char| c.is_whitespace() || c == ',')
            .unwrap_or(rest.len());
        s = rest[end..].trim_start_matches(|c: char| c.is_whitespace() || c == ',');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::{normalize, substance};

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
        assert_eq!(normalize("@@x @nobody.here ok"), "ok");
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

    #[test]
    fn is_idempotent_on_awkward_inputs() {
        for s in [
            "\u{a0}@a hi",
            "x\n\u{2003}@b, @c y",
            "İSTANBUL",
            "@a\r\n@b\r\nz",
            "ǅ ß ΣΑΣ",
            "@a ,@b ,, c",
        ] {
            let once = normalize(s);
            assert_eq!(normalize(&once), once, "{s:?}");
        }
    }
}
