//! Rule 1, `pass`: an agent hands control back to a human by writing
//! `<world>pass</world>` (any case). The message is edited, never blocked.

use crate::names::Name;

const MARKER: &[u8] = b"<world>pass</world>";

/// True when `content` holds the pass marker, in any case. Jumps from `<`
/// to `<` (with `memchr`) instead of comparing at every position.
pub fn is_pass(content: &str) -> bool {
    let b = content.as_bytes();
    let mut i = 0;
    while let Some(off) = memchr::memchr(b'<', &b[i..]) {
        let at = i + off;
        match b.get(at..at + MARKER.len()) {
            Some(candidate) if candidate.eq_ignore_ascii_case(MARKER) => return true,
            Some(_) => i = at + 1,
            None => return false,
        }
    }
    false
}

/// The content a pass is rewritten to.
pub fn handback_content(agent: &Name) -> String {
    format!("@human {agent} is passing control to you")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_marker_in_any_case_anywhere() {
        assert!(is_pass("<world>pass</world>"));
        assert!(is_pass("ok, <WORLD>Pass</World> now"));
        assert!(!is_pass("<world>pas</world>"));
        assert!(!is_pass("pass"));
        assert!(!is_pass(""));
        assert!(is_pass("<<world>pass</world>"));
        assert!(!is_pass("<world>pass</world"));
    }

    #[test]
    fn handback_addresses_the_human() {
        let a = Name::parse("bob").unwrap();
        assert_eq!(handback_content(&a), "@human bob is passing control to you");
    }
}
