//! Ingress payloads (contract §4): bytes in, an [`Envelope`] or a reason out.
//!
//! A JSON object with a string `content` (or, failing that, `text`) is read
//! as a structured message; any other payload — plain text, malformed JSON,
//! JSON that is not an object — is the content itself, byte for byte.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// One parsed ingress message. Its content is borrowed from the payload
/// when the payload holds it as written (plain text, or a JSON string
/// without escapes): a copy of each message's content was one of the
/// larger allocations of a decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope<'a> {
    pub content: Cow<'a, str>,
    /// From the JSON, else the `Nats-Msg-Id` header, else none (the judge
    /// generates one).
    pub id: Option<String>,
    pub thread_id: Option<String>,
    pub parent_id: Option<String>,
    /// Every other ingress field, kept verbatim for egress. `content`, `id`,
    /// `thread_id` and `parent_id` are taken out: loopguard sets them.
    pub fields: Map<String, Value>,
}

/// Where a message's id comes from when its payload names none: the
/// header, else loopguard's stable id, else (left to the judge) a new one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FallbackId<'a> {
    /// The message's `Nats-Msg-Id` header: the sender's bytes, so when it
    /// becomes the id it counts toward `limits.max_payload_bytes` at its
    /// length in JSON (every copy carries it, twice when it is also the
    /// thread).
    pub header: Option<&'a str>,
    /// Made by loopguard (JetStream: `<stream>-<sequence>`), so that a
    /// redelivered message gets the same id.
    pub stable: Option<&'a str>,
}

impl<'a> FallbackId<'a> {
    pub fn header(id: &'a str) -> FallbackId<'a> {
        FallbackId {
            header: Some(id),
            stable: None,
        }
    }
}

/// Why a payload is refused; each maps to a rule name and a reason sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("payload is {size} bytes, over the limit of {max}")]
    TooLarge { size: usize, max: usize },
    /// The id a header gave, `id` bytes in JSON, and the payload.
    #[error("payload is {payload} bytes and the id of its Nats-Msg-Id header {id} (as JSON), over the limit of {max} together")]
    IdTooLarge {
        payload: usize,
        id: usize,
        max: usize,
    },
    #[error("payload is not valid UTF-8")]
    NotUtf8,
    #[error("JSON object has no string `content` or `text`")]
    NoContent,
    #[error("JSON field `{0}` must be a string")]
    NotAString(&'static str),
}

/// A payload refused: why, and the id its JSON gave (a string, not empty),
/// if it was a JSON object read that far, so that the event of its
/// rejection names the message as its sender does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct Unreadable {
    pub why: EnvelopeError,
    pub id: Option<String>,
}

impl From<EnvelopeError> for Unreadable {
    fn from(why: EnvelopeError) -> Unreadable {
        Unreadable { why, id: None }
    }
}

/// Parses `payload`, taking `fallback` as the id when the JSON has none.
/// Over `max_bytes`: the payload, or the payload and a header id that
/// becomes the id (checked last: a payload that is also invalid is that).
pub fn parse<'a>(
    payload: &'a [u8],
    fallback: FallbackId<'_>,
    max_bytes: usize,
) -> Result<Envelope<'a>, Unreadable> {
    if payload.len() > max_bytes {
        return Err(EnvelopeError::TooLarge {
            size: payload.len(),
            max: max_bytes,
        }
        .into());
    }
    let text = std::str::from_utf8(payload).map_err(|_| EnvelopeError::NotUtf8)?;
    let fallback_id = || -> Result<Option<String>, EnvelopeError> {
        if let Some(id) = fallback.header {
            let written = crate::json::escaped_len(id);
            if payload.len() + written > max_bytes {
                return Err(EnvelopeError::IdTooLarge {
                    payload: payload.len(),
                    id: written,
                    max: max_bytes,
                });
            }
        }
        Ok(fallback.header.or(fallback.stable).map(str::to_owned))
    };

    // Only text that opens like an object is worth handing to the JSON
    // parser; a byte-order mark before it (as some Windows tools write) is
    // not part of the JSON text (RFC 8259 §8.1 lets a parser ignore it).
    let json = text.strip_prefix('\u{feff}').unwrap_or(text);
    let object = if json.trim_start().starts_with('{') {
        serde_json::from_str::<Object>(json).ok()
    } else {
        None
    };
    let Some(Object {
        content,
        id,
        thread_id,
        parent_id,
        fields,
    }) = object
    else {
        return Ok(Envelope {
            id: fallback_id()?,
            content: Cow::Borrowed(text),
            thread_id: None,
            parent_id: None,
            fields: Map::new(),
        });
    };

    let id = id_field(id, "id");
    let content = match content.flatten() {
        Some(c) => c,
        // `content` absent, null or not a string: fall back to `text`, kept
        // in the fields as written.
        None => match fields.get("text") {
            Some(Value::String(t)) => Cow::Owned(t.clone()),
            _ => {
                return Err(Unreadable {
                    why: EnvelopeError::NoContent,
                    id: id.ok().flatten(),
                })
            }
        },
    };
    let id = id?;
    let refused = |why| Unreadable {
        why,
        id: id.clone(),
    };
    let thread_id = id_field(thread_id, "thread_id").map_err(refused)?;
    let parent_id = id_field(parent_id, "parent_id").map_err(refused)?;
    let id = match id {
        Some(id) => Some(id),
        None => fallback_id()?,
    };
    Ok(Envelope {
        content,
        id,
        thread_id,
        parent_id,
        fields,
    })
}

/// The string a `content` value holds, borrowed from the payload when it
/// has no escapes; none when the value is no string. The value is read in
/// full here, as serde_json reads any other value: skipping it over (as a
/// `RawValue` is read) lets through what makes the payload no JSON, a lone
/// surrogate escape (`"\ud83d"`, an emoji cut in half) or nesting past
/// serde_json's depth limit, and such a payload is taken whole as text.
fn content_in(raw: &RawValue) -> Result<Option<Cow<'_, str>>, serde_json::Error> {
    let text = raw.get();
    match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        // Without escapes, the bytes are the string (the skip refused
        // control characters, and the payload is UTF-8).
        Some(inner) if !inner.contains('\\') => Ok(Some(Cow::Borrowed(inner))),
        Some(_) => serde_json::from_str::<String>(text).map(|s| Some(Cow::Owned(s))),
        // Read one level down, as it lies in the payload: alone it would
        // start a depth count of its own, and 127 levels inside the payload's
        // object would pass where serde_json refuses the payload.
        None => serde_json::from_str::<[Plain; 1]>(&format!("[{text}]")).map(|_| None),
    }
}

/// One of the ids (`id`, `thread_id`, `parent_id`): a string, absent (null
/// or empty), or an error. An empty id names no message: kept, every
/// message of a sender that sends "" would share one id, and so their
/// copies one `Nats-Msg-Id` (an egress stream would keep only the first).
fn id_field(value: Option<Value>, key: &'static str) -> Result<Option<String>, EnvelopeError> {
    Ok(string(value, key)?.filter(|id| !id.is_empty()))
}

/// One of loopguard's own ingress fields: a string, absent/null, or an error.
fn string(value: Option<Value>, key: &'static str) -> Result<Option<String>, EnvelopeError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(EnvelopeError::NotAString(key)),
    }
}

/// An ingress JSON object read in one pass: the fields loopguard sets taken
/// apart as they come (a repeated key: the last one counts, as in a map),
/// every other field kept in `fields`. Keys are borrowed from the payload
/// unless escaped, so the common message allocates no key and no map; so
/// is the content, read as written and taken apart later.
#[derive(Default)]
struct Object<'de> {
    /// `Some(None)`: there, but not a string.
    content: Option<Option<Cow<'de, str>>>,
    id: Option<Value>,
    thread_id: Option<Value>,
    parent_id: Option<Value>,
    fields: Map<String, Value>,
}

impl<'de> Deserialize<'de> for Object<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Object<'de>, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = Object<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Object<'de>, A::Error> {
                let mut o = Object::default();
                while let Some(Key(key)) = map.next_key()? {
                    if key == "content" {
                        let raw: &'de RawValue = map.next_value()?;
                        o.content = Some(content_in(raw).map_err(serde::de::Error::custom)?);
                        continue;
                    }
                    let Plain(value) = map.next_value()?;
                    let slot = match &*key {
                        "id" => &mut o.id,
                        "thread_id" => &mut o.thread_id,
                        "parent_id" => &mut o.parent_id,
                        _ => {
                            o.fields.insert(key.into_owned(), value);
                            continue;
                        }
                    };
                    *slot = Some(value);
                }
                Ok(o)
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// A JSON value read as written. serde_json's own `Value` reads an object
/// whose first key is `$serde_json::private::RawValue` as the JSON its
/// string holds, parsed anew: so `{"$serde_json::private::RawValue":
/// "\"m1\""}` was a string id, an object's fields came out rewritten, and
/// each such object began a new parser with its own depth limit (128),
/// so a 64 KiB payload could nest about 1,600 deep. Here that key is a key
/// like any other. The number marker, `$serde_json::private::Number`, is
/// still read as a number: it is how serde_json hands over a number's
/// exact digits, and a payload that writes it is read the same (§9).
struct Plain(Value);

/// serde_json's marker for a number's exact digits (`arbitrary_precision`).
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

impl<'de> Deserialize<'de> for Plain {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Plain, D::Error> {
        struct Any;
        impl<'de> Visitor<'de> for Any {
            type Value = Plain;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, b: bool) -> Result<Plain, E> {
                Ok(Plain(Value::Bool(b)))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Plain, E> {
                Ok(Plain(Value::from(n)))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Plain, E> {
                Ok(Plain(Value::from(n)))
            }
            fn visit_f64<E>(self, n: f64) -> Result<Plain, E> {
                Ok(Plain(Value::from(n)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Plain, E> {
                Ok(Plain(Value::String(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Plain, E> {
                Ok(Plain(Value::String(s)))
            }
            fn visit_unit<E>(self) -> Result<Plain, E> {
                Ok(Plain(Value::Null))
            }
            fn visit_none<E>(self) -> Result<Plain, E> {
                Ok(Plain(Value::Null))
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Plain, D::Error> {
                Plain::deserialize(d)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Plain, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(Plain(item)) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Plain(Value::Array(items)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Plain, A::Error> {
                let mut object = Map::new();
                let mut first = true;
                while let Some(Key(key)) = map.next_key()? {
                    if std::mem::take(&mut first) && key == NUMBER_TOKEN {
                        let digits: String = map.next_value()?;
                        let number = digits.parse().map_err(serde::de::Error::custom)?;
                        return Ok(Plain(Value::Number(number)));
                    }
                    let Plain(value) = map.next_value()?;
                    object.insert(key.into_owned(), value);
                }
                Ok(Plain(Value::Object(object)))
            }
        }
        deserializer.deserialize_any(Any)
    }
}

/// An object key, borrowed from the payload when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Key<'de>, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s)))
            }
        }
        deserializer.deserialize_str(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(payload: &str) -> Envelope<'_> {
        parse(payload.as_bytes(), FallbackId::default(), 1024).unwrap()
    }

    /// [`parse`], with why a payload is refused.
    fn read<'a>(
        payload: &'a [u8],
        fallback: FallbackId<'_>,
        max: usize,
    ) -> Result<Envelope<'a>, EnvelopeError> {
        parse(payload, fallback, max).map_err(|e| e.why)
    }

    #[test]
    fn reads_a_structured_message_and_keeps_other_fields() {
        let e = ok(r#"{"content":"hi","id":"m1","thread_id":"t","parent_id":null,"lang":"en"}"#);
        assert_eq!(e.content, "hi");
        assert_eq!(e.id.as_deref(), Some("m1"));
        assert_eq!(e.thread_id.as_deref(), Some("t"));
        assert_eq!(e.parent_id, None);
        assert_eq!(e.fields.get("lang"), Some(&Value::from("en")));
        assert!(!e.fields.contains_key("content"));
    }

    /// A byte-order mark before the JSON object does not make it plain
    /// text (before, the whole object was the content, its id lost).
    #[test]
    fn a_byte_order_mark_before_an_object_is_ignored() {
        let e = ok("\u{feff}{\"content\":\"@bob hi\",\"id\":\"m1\"}");
        assert_eq!((&*e.content, e.id.as_deref()), ("@bob hi", Some("m1")));
        // Only before the object: plain text keeps it.
        assert_eq!(ok("\u{feff}hello").content, "\u{feff}hello");
    }

    /// The content is the payload's own bytes unless escapes must be
    /// undone: no copy of it for the common message.
    #[test]
    fn content_written_plainly_is_borrowed_from_the_payload() {
        assert!(matches!(
            ok(r#"{"content":"hi @bob"}"#).content,
            Cow::Borrowed("hi @bob")
        ));
        assert!(matches!(
            ok("plain text").content,
            Cow::Borrowed("plain text")
        ));
        let escaped = ok(r#"{"content":"line\nnext \u00e9"}"#);
        assert!(matches!(escaped.content, Cow::Owned(_)));
        assert_eq!(escaped.content, "line\nnext é");
    }

    /// What serde_json would not read as JSON is taken whole as text, even
    /// where the content is read apart: a lone surrogate escape, nesting
    /// past the depth limit.
    #[test]
    fn content_that_is_no_json_makes_the_payload_text() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        // In the payload's object, 127 levels make 128, one past the limit
        // (found by review: read alone, the content passed).
        let deepest = |n: usize| {
            format!(
                r#"{{"content":{}{},"text":"t"}}"#,
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        assert!(serde_json::from_str::<Value>(&deepest(127)).is_err());
        assert!(serde_json::from_str::<Value>(&deepest(126)).is_ok());
        assert_eq!(ok(&deepest(126)).content, "t");
        for raw in [
            deepest(127),
            r#"{"content":"\ud83d"}"#.to_string(),
            r#"{"content":"\ud800","content":"ok"}"#.to_string(),
            r#"{"content":"x\ud800y","text":"t"}"#.to_string(),
            format!(r#"{{"content":{deep},"text":"t"}}"#),
        ] {
            assert_eq!(ok(&raw).content, raw);
        }
        // A whole pair, and content that is no string, are read as before.
        assert_eq!(ok(r#"{"content":"\ud83d\ude00"}"#).content, "\u{1f600}");
        assert_eq!(ok(r#"{"content":[["x"]],"text":"t"}"#).content, "t");
    }

    /// serde_json's `Value` read an object whose first key is its raw-value
    /// marker as the JSON inside it: a string id, a string text, fields
    /// rewritten, and a new depth limit at each such object. Read as written
    /// now; the number marker still reads as a number (§9).
    #[test]
    fn serde_json_s_raw_value_marker_is_a_key_like_any_other() {
        let marker = "$serde_json::private::RawValue";
        let id = format!(r#"{{"content":"x","id":{{"{marker}":"\"m1\""}}}}"#);
        assert_eq!(
            read(id.as_bytes(), FallbackId::default(), 1024),
            Err(EnvelopeError::NotAString("id"))
        );
        let text = format!(r#"{{"text":{{"{marker}":"\"hi\""}}}}"#);
        assert_eq!(
            read(text.as_bytes(), FallbackId::default(), 1024),
            Err(EnvelopeError::NoContent)
        );
        let kept = format!(r#"{{"content":"x","meta":{{"{marker}":"{{\"a\":1}}"}}}}"#);
        let e = ok(&kept);
        assert_eq!(
            e.fields.get("meta"),
            Some(&serde_json::json!({ marker: "{\"a\":1}" }))
        );
        // Markers nested in markers' strings are strings: no depth past
        // the parser's 128, however they are chained.
        let mut chained = String::from("1");
        for _ in 0..12 {
            chained = serde_json::to_string(&serde_json::json!({ marker: chained })).unwrap();
        }
        let deep = format!(r#"{{"content":"x","deep":{chained}}}"#);
        let e = parse(deep.as_bytes(), FallbackId::default(), 1 << 20).unwrap();
        assert!(e.fields["deep"][marker].is_string());
        // Exact digits, as before.
        let n = ok(r#"{"content":"x","n":123456789012345678901234567890}"#);
        assert_eq!(n.fields["n"].to_string(), "123456789012345678901234567890");
        let as_number = ok(r#"{"content":"x","n":{"$serde_json::private::Number":"1.50"}}"#);
        assert_eq!(as_number.fields["n"].to_string(), "1.50");
    }

    #[test]
    fn falls_back_to_text_when_content_is_missing_or_null() {
        assert_eq!(ok(r#"{"text":"hey"}"#).content, "hey");
        assert_eq!(ok(r#"{"content":null,"text":"hey"}"#).content, "hey");
        assert_eq!(
            ok(r#"{"text":"hey"}"#).fields.get("text"),
            Some(&Value::from("hey"))
        );
    }

    #[test]
    fn takes_anything_that_is_not_an_object_whole() {
        for raw in [
            "plain words",
            "\"hi\"",
            "[1]",
            "{not json",
            "  {\"content\": ",
            "42",
            "",
        ] {
            let e = ok(raw);
            assert_eq!(e.content, raw);
            assert!(e.fields.is_empty());
        }
    }

    #[test]
    fn rejects_objects_without_string_content() {
        for raw in [
            r#"{}"#,
            r#"{"content":5}"#,
            r#"{"text":["x"]}"#,
            r#"{"content":null}"#,
        ] {
            assert_eq!(
                read(raw.as_bytes(), FallbackId::default(), 1024),
                Err(EnvelopeError::NoContent),
                "{raw}"
            );
        }
    }

    #[test]
    fn a_refused_object_still_names_its_id() {
        let id = |raw: &str| {
            parse(raw.as_bytes(), FallbackId::header("h"), 1024)
                .unwrap_err()
                .id
        };
        assert_eq!(id(r#"{"id":"m1","content":5}"#), Some("m1".into()));
        assert_eq!(
            id(r#"{"id":"m1","content":"x","thread_id":7}"#),
            Some("m1".into())
        );
        assert_eq!(
            id(r#"{"content":"x","parent_id":[],"id":"m2"}"#),
            Some("m2".into())
        );
        // None to name: not a string, empty, absent, or not read as JSON.
        assert_eq!(id(r#"{"id":1,"content":"x"}"#), None);
        assert_eq!(id(r#"{"id":"","content":5}"#), None);
        assert_eq!(id(r#"{"content":5}"#), None);
        assert_eq!(
            parse(b"{\"id\":\"m\",\xff}", FallbackId::default(), 1024)
                .unwrap_err()
                .id,
            None
        );
        assert_eq!(
            parse(br#"{"id":"m1","content":5}"#, FallbackId::default(), 10)
                .unwrap_err()
                .id,
            None
        );
    }

    #[test]
    fn rejects_non_string_ids() {
        for (raw, key) in [
            (r#"{"content":"x","id":1}"#, "id"),
            (r#"{"content":"x","thread_id":{}}"#, "thread_id"),
            (r#"{"content":"x","parent_id":true}"#, "parent_id"),
        ] {
            assert_eq!(
                read(raw.as_bytes(), FallbackId::default(), 1024),
                Err(EnvelopeError::NotAString(key))
            );
        }
    }

    /// The envelope as parsed before `Object`: through a whole map.
    fn parse_via_map(payload: &str) -> Result<Envelope<'_>, EnvelopeError> {
        fn take(
            fields: &mut Map<String, Value>,
            key: &'static str,
        ) -> Result<Option<String>, EnvelopeError> {
            string(fields.remove(key), key)
        }
        let Ok(mut fields) = serde_json::from_str::<Map<String, Value>>(payload) else {
            return read(payload.as_bytes(), FallbackId::default(), usize::MAX);
        };
        let content = match take(&mut fields, "content") {
            Ok(Some(c)) => Cow::Owned(c),
            _ => match fields.get("text") {
                Some(Value::String(t)) => Cow::Owned(t.clone()),
                _ => return Err(EnvelopeError::NoContent),
            },
        };
        Ok(Envelope {
            content,
            id: id_field(fields.remove("id"), "id")?,
            thread_id: id_field(fields.remove("thread_id"), "thread_id")?,
            parent_id: id_field(fields.remove("parent_id"), "parent_id")?,
            fields,
        })
    }

    #[test]
    fn repeated_and_escaped_keys_read_as_a_map_would() {
        for raw in [
            r#"{"content":"a","content":"b"}"#,
            r#"{"con\u0074ent":"escaped key","id":"i"}"#,
            r#"{"content":5,"text":"t","x":1,"x":2}"#,
            r#"{"content":"c","id":null,"id":"second"}"#,
            r#"{"content":"c","parent_id":"p","parent_id":7}"#,
            r#"{"content":"c","a\"b":{"n":1.50}}"#,
        ] {
            assert_eq!(
                read(raw.as_bytes(), FallbackId::default(), 1024),
                parse_via_map(raw),
                "{raw}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn objects_read_as_a_map_would(
            members in proptest::collection::vec(
                (
                    proptest::sample::select(vec![
                        "content", "text", "id", "thread_id", "parent_id", "lang",
                        "con\\u0074ent", "i\\u0064",
                    ]),
                    proptest::sample::select(vec![
                        "\"s\"", "\"\"", "null", "1.50", "[true]", "{\"k\":\"v\"}", "\"\\n\"",
                        "\"\\ud83d\"", "\"\\ud83d\\ude00\"", "[\"\\ud800\"]",
                    ]),
                ),
                0..6,
            )
        ) {
            let body: Vec<String> = members.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            let raw = format!("{{{}}}", body.join(","));
            proptest::prop_assert_eq!(read(raw.as_bytes(), FallbackId::default(), 4096), parse_via_map(&raw), "{}", raw);
        }
    }

    #[test]
    fn an_empty_id_is_no_id() {
        let e = parse(
            br#"{"content":"x","id":"","thread_id":"","parent_id":""}"#,
            FallbackId::header("h1"),
            1024,
        )
        .unwrap();
        assert_eq!(
            (e.id.as_deref(), e.thread_id, e.parent_id),
            (Some("h1"), None, None)
        );
        // Content may be empty.
        let e = parse(br#"{"content":""}"#, FallbackId::default(), 1024).unwrap();
        assert_eq!(e.content, "");
    }

    #[test]
    fn header_id_applies_only_when_the_json_has_none() {
        let h = FallbackId::header;
        let e = parse(br#"{"content":"x"}"#, h("h1"), 1024).unwrap();
        assert_eq!(e.id.as_deref(), Some("h1"));
        let e = parse(br#"{"content":"x","id":"j1"}"#, h("h1"), 1024).unwrap();
        assert_eq!(e.id.as_deref(), Some("j1"));
        let e = parse(b"plain", h("h2"), 1024).unwrap();
        assert_eq!(e.id.as_deref(), Some("h2"));
        let both = FallbackId {
            header: Some("h3"),
            stable: Some("s-1"),
        };
        assert_eq!(
            parse(b"plain", both, 1024).unwrap().id.as_deref(),
            Some("h3")
        );
        let stable = FallbackId {
            header: None,
            stable: Some("s-1"),
        };
        assert_eq!(
            parse(b"plain", stable, 1024).unwrap().id.as_deref(),
            Some("s-1")
        );
    }

    #[test]
    fn a_header_id_that_becomes_the_id_counts_toward_the_limit_as_json() {
        let h = FallbackId::header;
        let too_large = |payload, id, max| Err(EnvelopeError::IdTooLarge { payload, id, max });
        assert_eq!(read(b"plain", h("header"), 10), too_large(5, 6, 10));
        assert_eq!(
            read(br#"{"text":"x"}"#, h("header"), 15),
            too_large(12, 6, 15)
        );
        // A control character is six bytes in a copy.
        assert_eq!(read(b"plain", h("\u{1}"), 10), too_large(5, 6, 10));
        assert!(parse(b"plain", h("\u{1}"), 11).is_ok());
        assert_eq!(
            parse(b"plain", h("header"), 10).unwrap_err().to_string(),
            "payload is 5 bytes and the id of its Nats-Msg-Id header 6 (as JSON), over the limit of 10 together"
        );
        // Exactly at the limit, it fits.
        assert!(parse(b"plain", h("head"), 9).is_ok());
        // Not the id (the JSON has one): not copied, not counted.
        let long = "h".repeat(100);
        assert!(parse(br#"{"text":"x","id":"j"}"#, h(&long), 30).is_ok());
        // Invalid wins: the payload is refused for what it is.
        assert_eq!(
            read(br#"{"text":"x","thread_id":1}"#, h(&long), 30),
            Err(EnvelopeError::NotAString("thread_id"))
        );
        assert_eq!(read(&[0xff], h(&long), 30), Err(EnvelopeError::NotUtf8));
        // loopguard's own stable id is not the sender's bytes.
        let stable = FallbackId {
            header: None,
            stable: Some("stream-12345"),
        };
        assert!(parse(b"plain", stable, 10).is_ok());
    }

    #[test]
    fn rejects_oversize_before_anything_else_and_invalid_utf8() {
        assert_eq!(
            read(&[0xff; 11], FallbackId::default(), 10),
            Err(EnvelopeError::TooLarge { size: 11, max: 10 })
        );
        assert_eq!(
            parse(&[0xff; 11], FallbackId::default(), 10)
                .unwrap_err()
                .to_string(),
            "payload is 11 bytes, over the limit of 10"
        );
        assert_eq!(
            read(&[b'h', 0xff, b'i'], FallbackId::default(), 10),
            Err(EnvelopeError::NotUtf8)
        );
        assert!(parse(&[b'x'; 10], FallbackId::default(), 10).is_ok());
    }
}
