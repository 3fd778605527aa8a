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
    for paragraph in content.split('\n') {
        for word in strip_leading_mentions(paragraph).split_whitespace() {
            if !out.is_empty() {
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
    out
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
    use super::normalize;

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
