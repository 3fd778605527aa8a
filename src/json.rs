//! Writes loopguard's own JSON objects — egress copies and events — straight
//! into a buffer.
//!
//! serde's derive wrote each of them through its generic map machinery (the
//! egress copy flattens the ingress fields into itself), escaping every key
//! and value byte by byte: together a quarter of the instructions of a
//! decision. Here loopguard's own keys are written as they are (each is a
//! literal the code chose), and a string is copied whole when no byte of it
//! needs escaping, which a chat message almost never has; one that does is
//! written by serde_json itself. The output is what serde_json writes, byte
//! for byte (see the tests).

use bytes::Bytes;
use serde_json::Value;

/// One JSON object being written, keys in the order they are added.
pub struct Object {
    buf: Vec<u8>,
    empty: bool,
}

impl Object {
    /// An object with room for about `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Object {
        let mut buf = Vec::with_capacity(capacity);
        buf.push(b'{');
        Object { buf, empty: true }
    }

    /// Starts a member named by the code: the comma, the quoted key and the
    /// colon. Such keys are plain words, so they are not escaped.
    fn key(&mut self, key: &'static str) {
        debug_assert!(!needs_escape(key.as_bytes()), "key {key:?}");
        self.comma();
        self.buf.push(b'"');
        self.buf.extend_from_slice(key.as_bytes());
        self.buf.extend_from_slice(b"\":");
    }

    fn comma(&mut self) {
        if !self.empty {
            self.buf.push(b',');
        }
        self.empty = false;
    }

    pub fn str(&mut self, key: &'static str, value: &str) -> &mut Object {
        self.key(key);
        string(&mut self.buf, value);
        self
    }

    /// A string, or `null`.
    pub fn opt_str(&mut self, key: &'static str, value: Option<&str>) -> &mut Object {
        match value {
            Some(v) => self.str(key, v),
            None => {
                self.key(key);
                self.buf.extend_from_slice(b"null");
                self
            }
        }
    }

    pub fn u32(&mut self, key: &'static str, value: u32) -> &mut Object {
        self.key(key);
        let mut digits = [0u8; 10];
        let mut at = digits.len();
        let mut rest = value;
        loop {
            at -= 1;
            digits[at] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        self.buf.extend_from_slice(&digits[at..]);
        self
    }

    /// An array of strings.
    pub fn strs<S: AsRef<str>>(&mut self, key: &'static str, values: &[S]) -> &mut Object {
        self.joined_strs(key, values.iter().map(|v| [v.as_ref(), ""]))
    }

    /// An array of strings, each written from two parts joined (`private.`
    /// and a name), without joining them first.
    pub fn joined_strs<'a>(
        &mut self,
        key: &'static str,
        values: impl IntoIterator<Item = [&'a str; 2]>,
    ) -> &mut Object {
        self.key(key);
        self.buf.push(b'[');
        for (i, [head, tail]) in values.into_iter().enumerate() {
            if i > 0 {
                self.buf.push(b',');
            }
            if needs_escape(head.as_bytes()) || needs_escape(tail.as_bytes()) {
                string(&mut self.buf, &[head, tail].concat());
            } else {
                self.buf.push(b'"');
                self.buf.extend_from_slice(head.as_bytes());
                self.buf.extend_from_slice(tail.as_bytes());
                self.buf.push(b'"');
            }
        }
        self.buf.push(b']');
        self
    }

    /// Any JSON value, written by serde_json, under any key (escaped).
    pub fn value(&mut self, key: &str, value: &Value) -> &mut Object {
        self.comma();
        string(&mut self.buf, key);
        self.buf.push(b':');
        // Writing a `Value` into a Vec cannot fail: its keys are strings.
        let _ = serde_json::to_writer(&mut self.buf, value);
        self
    }

    pub fn finish(mut self) -> Bytes {
        self.buf.push(b'}');
        Bytes::from(self.buf)
    }
}

/// Writes `s` as a JSON string.
fn string(buf: &mut Vec<u8>, s: &str) {
    if needs_escape(s.as_bytes()) {
        // Writing a str into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *buf, s);
    } else {
        buf.reserve(s.len() + 2);
        buf.push(b'"');
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
    }
}

/// The length of `s` written as a JSON string, quotes left out: what a
/// client's bytes cost in a copy (a control character takes six).
pub fn escaped_len(s: &str) -> usize {
    if !needs_escape(s.as_bytes()) {
        return s.len();
    }
    s.bytes()
        .map(|b| match b {
            b'"' | b'\\' | 0x08 | 0x0c | b'\n' | b'\r' | b'\t' => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum()
}

/// True when a byte of `bytes` must be escaped in a JSON string: a control
/// character, `"` or `\`. Eight bytes at a time, as one `u64`, the last
/// ones too, padded with spaces (most of loopguard's strings are names and
/// ids shorter than eight bytes).
fn needs_escape(bytes: &[u8]) -> bool {
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        if word_needs_escape(u64::from_ne_bytes(w)) {
            return true;
        }
    }
    let rest = words.remainder();
    let mut last = [b' '; 8];
    last[..rest.len()].copy_from_slice(rest);
    word_needs_escape(u64::from_ne_bytes(last))
}

/// [`needs_escape`] for the eight bytes of `x`.
fn word_needs_escape(x: u64) -> bool {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    // Nonzero exactly when some byte of `x` is below `n` (n <= 128): the
    // classic word-at-a-time test (a set bit above the lowest such byte may
    // be a borrow, which only matters to code that asks which byte).
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH;
    let quote = x ^ (ONES * u64::from(b'"'));
    let backslash = x ^ (ONES * u64::from(b'\\'));
    below(x, 0x20) | below(quote, 1) | below(backslash, 1) != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn written(f: impl FnOnce(&mut Object)) -> String {
        let mut o = Object::with_capacity(0);
        f(&mut o);
        String::from_utf8(o.finish().to_vec()).unwrap()
    }

    #[test]
    fn writes_what_serde_json_writes() {
        let text = written(|o| {
            o.str("id", "m1")
                .opt_str("parent_id", None)
                .opt_str("thread_id", Some("t\"1"))
                .u32("depth", 4_000_000_000)
                .u32("zero", 0)
                .strs("mentions", &["bob", "carol"])
                .strs::<&str>("none", &[])
                .joined_strs("to", [["public", ""], ["private.", "bob"], ["a\"", "\n"]])
                .joined_strs("nowhere", [])
                .value(
                    "extra",
                    &serde_json::json!({"n": 1.50, "list": [true, null]}),
                )
                .value("an \"ingress\"\nkey", &Value::from("v"));
        });
        let expected = serde_json::to_string(&serde_json::json!({
            "id": "m1",
            "parent_id": null,
            "thread_id": "t\"1",
            "depth": 4_000_000_000u32,
            "zero": 0,
            "mentions": ["bob", "carol"],
            "none": [],
            "to": ["public", "private.bob", "a\"\n"],
            "nowhere": [],
            "extra": {"n": 1.50, "list": [true, null]},
            "an \"ingress\"\nkey": "v",
        }))
        .unwrap();
        // Same bytes, members in the order written (serde_json's map sorts).
        let ours: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&ours).unwrap(), expected);
        assert!(text.starts_with(r#"{"id":"m1","parent_id":null,"thread_id":"t\"1","depth":4000000000,"zero":0,"mentions":["bob","carol"]"#), "{text}");
        assert_eq!(written(|_| {}), "{}");
    }

    #[test]
    fn a_byte_to_escape_is_found_in_every_place_of_a_short_string() {
        for len in 0..=17 {
            let plain = "x".repeat(len);
            assert!(!needs_escape(plain.as_bytes()), "{plain:?}");
            for at in 0..len {
                for special in [b'"', b'\\', b'\n', 0, 0x1f] {
                    let mut bytes = plain.clone().into_bytes();
                    bytes[at] = special;
                    assert!(needs_escape(&bytes), "{bytes:?}");
                }
            }
        }
        // Near misses need none, in either part of a string: bytes just
        // past the control characters, '"' and '\\', DEL, UTF-8's high bytes.
        for clean in ["!#[]^ \u{7f}", "é", "ü€𝄞!", "!#[]^ \u{7f}é€𝄞 !#[]"] {
            assert!(!needs_escape(clean.as_bytes()), "{clean:?}");
        }
    }

    #[test]
    fn escapes_what_needs_it_at_any_position() {
        for special in ['"', '\\', '\n', '\u{0}', '\u{1f}'] {
            for at in [0, 1, 15, 16, 17, 40] {
                let mut s: String = "é".repeat(3) + &"x".repeat(at);
                s.push(special);
                s.push_str("tail");
                let mut buf = Vec::new();
                string(&mut buf, &s);
                assert_eq!(buf, serde_json::to_vec(&s).unwrap(), "{s:?}");
            }
        }
    }

    proptest! {
        #[test]
        fn strings_are_byte_for_byte_serde_json(s in any::<String>()) {
            let mut buf = Vec::new();
            string(&mut buf, &s);
            prop_assert_eq!(buf, serde_json::to_vec(&s).unwrap());
        }

        #[test]
        fn escaped_len_is_what_serde_json_writes(s in "(\\PC|[\\x00-\\x20\"\\\\\\x7f])*") {
            prop_assert_eq!(escaped_len(&s) + 2, serde_json::to_vec(&s).unwrap().len());
        }
    }

    #[test]
    fn escaped_len_counts_each_escape() {
        assert_eq!(escaped_len("plain"), 5);
        assert_eq!(escaped_len("\u{1}\u{1f}"), 12);
        assert_eq!(escaped_len("\"\\\n\r\t\u{8}\u{c}"), 14);
        assert_eq!(escaped_len("é\u{7f}"), 3);
    }
}
