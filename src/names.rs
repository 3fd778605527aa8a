//! Canonical names: the only text that may ever become a subject token.
//!
//! World, agent, human and system names arrive as subject tokens or in
//! configuration. They are lowercased and must then match `[a-z0-9_-]{1,64}`
//! (contract §1). A [`Name`] can only be built through [`Name::parse`], so any
//! subject loopguard builds from names is safe by construction.

use std::fmt;

use smol_str::{SmolStr, StrExt};

/// Longest name accepted, in bytes (all accepted characters are ASCII).
pub const MAX_NAME_LEN: usize = 64;

/// A validated, lowercase name. Cheap to clone: names are shared between the
/// roster, per-agent state and every message that mentions them.
///
/// Names of up to 23 bytes (nearly all) are held inline, the rest in a
/// shared `Arc<str>`. A world's name is its key in the world cache, and an
/// agent's is compared on every message it sends: inline, neither comparison
/// nor copy follows a pointer to memory that is likely out of the CPU's
/// caches, and a copy touches no reference count.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(SmolStr);

/// Why a piece of text is not a name; rendered into rejection reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("is empty")]
    Empty,
    #[error("is longer than {MAX_NAME_LEN} characters")]
    TooLong,
    #[error("may only contain a-z, 0-9, '_' and '-'")]
    BadChar,
}

impl Name {
    /// Canonicalises `raw` (ASCII lowercase) and validates it.
    pub fn parse(raw: &str) -> Result<Name, NameError> {
        if raw.is_empty() {
            return Err(NameError::Empty);
        }
        if raw.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong);
        }
        if !raw.bytes().all(is_name_byte) {
            return Err(NameError::BadChar);
        }
        if raw.bytes().any(|b| b.is_ascii_uppercase()) {
            Ok(Name(raw.to_ascii_lowercase_smolstr()))
        } else {
            Ok(Name(SmolStr::new(raw)))
        }
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

/// True for the bytes a name may hold before lowercasing.
pub fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Shortens untrusted text for logs and events: at most [`MAX_NAME_LEN`]
/// characters, control characters and invisible formatting replaced, so a
/// hostile subject token cannot flood or forge log lines, nor show a name
/// other than its own on a dashboard (a right-to-left override reverses
/// what follows it; a zero-width space hides).
pub fn display_untrusted(raw: &str) -> String {
    raw.chars()
        .take(MAX_NAME_LEN)
        .map(|c| match c.is_control() || is_invisible_format(c) {
            true => '\u{fffd}',
            false => c,
        })
        .collect()
}

/// Unicode's bidirectional controls, zero-width and other invisible
/// formatting characters, and line and paragraph separators: they change
/// how the text around them shows, and show nothing themselves.
pub(crate) fn is_invisible_format(c: char) -> bool {
    matches!(
        c,
        '\u{00ad}'
            | '\u{061c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{e0000}'..='\u{e007f}'
    )
}

/// An invisible formatting character that is no whitespace (a byte-order
/// mark, a bidirectional mark, a zero-width space or joiner): what an
/// editor may put before or inside a word without showing it, so mentions
/// and normalisation read past it (the line and paragraph separators,
/// whitespace, still part words).
pub(crate) fn is_invisible_mark(c: char) -> bool {
    is_invisible_format(c) && !c.is_whitespace()
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::borrow::Borrow<str> for Name {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

/// The string itself, without a copy of a long one.
impl From<Name> for SmolStr {
    fn from(name: Name) -> SmolStr {
        name.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl serde::Serialize for Name {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Name {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Name::parse(&raw).map_err(|e| serde::de::Error::custom(format!("name {raw:?} {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowercases_and_accepts_the_allowed_alphabet() {
        assert_eq!(Name::parse("Alice_01-x").unwrap().as_str(), "alice_01-x");
        assert_eq!(Name::parse(&"a".repeat(64)).unwrap().as_str().len(), 64);
    }

    #[test]
    fn rejects_subject_metacharacters_whitespace_and_non_ascii() {
        for bad in ["a.b", "a*", ">", "a b", "a\tb", "bøb", "a\n", "", "@a"] {
            assert!(Name::parse(bad).is_err(), "{bad:?} must be rejected");
        }
        assert_eq!(Name::parse(&"a".repeat(65)), Err(NameError::TooLong));
        assert_eq!(Name::parse(""), Err(NameError::Empty));
        assert_eq!(Name::parse("a.b"), Err(NameError::BadChar));
    }

    #[test]
    fn display_untrusted_bounds_and_defuses_text() {
        let shown = display_untrusted(&format!("x\n{}", "y".repeat(200)));
        assert_eq!(shown.chars().count(), MAX_NAME_LEN);
        assert!(!shown.contains('\n'));
        // Bidirectional overrides and zero-width characters are shown as
        // replacements, so `\u{202e}nimda` cannot show as "admin".
        assert_eq!(
            display_untrusted("\u{202e}nimda\u{200b}\u{2066}é"),
            "\u{fffd}nimda\u{fffd}\u{fffd}é"
        );
    }
}
