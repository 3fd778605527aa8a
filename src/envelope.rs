//! Ingress payloads (contract §4): bytes in, an [`Envelope`] or a reason out.
//!
//! A JSON object with a string `content` (or, failing that, `text`) is read
//! as a structured message; any other payload — plain text, malformed JSON,
//! JSON that is not an object — is the content itself, byte for byte.

use serde_json::{Map, Value};

/// One parsed ingress message.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    pub content: String,
    /// From the JSON, else the `Nats-Msg-Id` header, else none (the judge
    /// generates one).
    pub id: Option<String>,
    pub thread_id: Option<String>,
    pub parent_id: Option<String>,
    /// Every other ingress field, kept verbatim for egress. `content`, `id`,
    /// `thread_id` and `parent_id` are taken out: loopguard sets them.
    pub fields: Map<String, Value>,
}

/// Why a payload is refused; each maps to a rule name and a reason sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("payload is {size} bytes, over the limit of {max}")]
    TooLarge { size: usize, max: usize },
    #[error("payload is not valid UTF-8")]
    NotUtf8,
    #[error("JSON object has no string `content` or `text`")]
    NoContent,
    #[error("JSON field `{0}` must be a string")]
    NotAString(&'static str),
}

/// Parses `payload`, taking `header_id` as the id when the JSON has none.
pub fn parse(
    payload: &[u8],
    header_id: Option<&str>,
    max_bytes: usize,
) -> Result<Envelope, EnvelopeError> {
    if payload.len() > max_bytes {
        return Err(EnvelopeError::TooLarge {
            size: payload.len(),
            max: max_bytes,
        });
    }
    let text = std::str::from_utf8(payload).map_err(|_| EnvelopeError::NotUtf8)?;
    let header_id = header_id.map(str::to_owned);

    // Only text that opens like an object is worth handing to the JSON parser.
    let object = if text.trim_start().starts_with('{') {
        serde_json::from_str::<Map<String, Value>>(text).ok()
    } else {
        None
    };
    let Some(mut fields) = object else {
        return Ok(Envelope {
            content: text.to_owned(),
            id: header_id,
            thread_id: None,
            parent_id: None,
            fields: Map::new(),
        });
    };

    let content = match take_string(&mut fields, "content") {
        Ok(Some(c)) => c,
        // `content` absent, null or not a string: fall back to `text`, kept
        // in the fields as written.
        _ => match fields.get("text") {
            Some(Value::String(t)) => t.clone(),
            _ => return Err(EnvelopeError::NoContent),
        },
    };
    let id = take_string(&mut fields, "id")?.or(header_id);
    let thread_id = take_string(&mut fields, "thread_id")?;
    let parent_id = take_string(&mut fields, "parent_id")?;
    Ok(Envelope {
        content,
        id,
        thread_id,
        parent_id,
        fields,
    })
}

/// Removes `key` from `fields`: a string, absent/null, or an error.
fn take_string(
    fields: &mut Map<String, Value>,
    key: &'static str,
) -> Result<Option<String>, EnvelopeError> {
    match fields.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(EnvelopeError::NotAString(key)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(payload: &str) -> Envelope {
        parse(payload.as_bytes(), None, 1024).unwrap()
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
                parse(raw.as_bytes(), None, 1024),
                Err(EnvelopeError::NoContent),
                "{raw}"
            );
        }
    }

    #[test]
    fn rejects_non_string_ids() {
        for (raw, key) in [
            (r#"{"content":"x","id":1}"#, "id"),
            (r#"{"content":"x","thread_id":{}}"#, "thread_id"),
            (r#"{"content":"x","parent_id":true}"#, "parent_id"),
        ] {
            assert_eq!(
                parse(raw.as_bytes(), None, 1024),
                Err(EnvelopeError::NotAString(key))
            );
        }
    }

    #[test]
    fn header_id_applies_only_when_the_json_has_none() {
        let e = parse(br#"{"content":"x"}"#, Some("h1"), 1024).unwrap();
        assert_eq!(e.id.as_deref(), Some("h1"));
        let e = parse(br#"{"content":"x","id":"j1"}"#, Some("h1"), 1024).unwrap();
        assert_eq!(e.id.as_deref(), Some("j1"));
        let e = parse(b"plain", Some("h2"), 1024).unwrap();
        assert_eq!(e.id.as_deref(), Some("h2"));
    }

    #[test]
    fn rejects_oversize_before_anything_else_and_invalid_utf8() {
        assert_eq!(
            parse(&[0xff; 11], None, 10),
            Err(EnvelopeError::TooLarge { size: 11, max: 10 })
        );
        assert_eq!(
            parse(&[b'h', 0xff, b'i'], None, 10),
            Err(EnvelopeError::NotUtf8)
        );
        assert!(parse(&[b'x'; 10], None, 10).is_ok());
    }
}
