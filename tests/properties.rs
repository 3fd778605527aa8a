//! Property tests over everything hostile input reaches: the subject parser,
//! the envelope parser, the mention extractor, the normaliser, and the whole
//! judge (with the contract's rules, and with loopguard's own on too). Whatever comes in, nothing panics and no subject loopguard builds
//! carries a token outside `[a-z0-9_-]`; every copy and event it publishes
//! is a JSON object with the contract's fields, and a copy keeps the
//! message's other fields as written.

use std::sync::Arc;

use loopguard::clock::SystemClock;
use loopguard::config::Config;
use loopguard::judge::Judge;
use loopguard::metrics::Metrics;
use loopguard::names::Name;
use loopguard::subject::{Origin, Subjects};
use loopguard::{envelope, mentions, normalize};
use proptest::prelude::*;

/// Each token of `subject` after the `chat` prefix is a valid name token.
fn assert_safe_subject(subject: &str) {
    let rest = subject.strip_prefix("chat.").expect("our prefix");
    let mut tokens = rest.split('.');
    let verb = tokens.next().unwrap();
    assert!(["public", "private", "events"].contains(&verb), "{subject}");
    for t in tokens {
        assert!(
            !t.is_empty()
                && t.len() <= 64
                && t.bytes().all(|b| b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || b == b'_'
                    || b == b'-'),
            "unsafe token {t:?} in {subject:?}"
        );
    }
}

/// Subject tokens: mostly plausible names, often hostile.
fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9_-]{1,8}",
        ".{0,70}",
        Just("agent".to_string()),
        Just("human".to_string()),
        Just(">".to_string()),
        Just("*".to_string()),
    ]
}

/// Contents rich in mention syntax.
fn content() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,200}",
        prop::collection::vec(
            prop_oneof![
                Just("@".to_string()),
                Just("@bob".to_string()),
                Just("@Alice".to_string()),
                Just("@carol:".to_string()),
                Just(", ".to_string()),
                Just("\n".to_string()),
                Just("\r\n".to_string()),
                Just(" \t".to_string()),
                Just("\u{a0}".to_string()),
                // Invisible marks and Chinese punctuation, which part a
                // run's tokens.
                Just("\u{200f}".to_string()),
                Just("\u{200b}".to_string()),
                Just("\u{feff}".to_string()),
                Just("，".to_string()),
                Just("：".to_string()),
                Just("<world>pass</world>".to_string()),
                "[a-z .>*]{0,6}",
                ".{0,4}",
            ],
            0..30
        )
        .prop_map(|parts| parts.concat()),
    ]
}

/// Payloads for the envelope parser: arbitrary bytes (mostly not UTF-8),
/// printable text (the plain-text path), and JSON envelopes with and
/// without an id (the JSON path, and the header id's).
fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        "[ -~]{0,200}".prop_map(String::into_bytes),
        (".{0,100}", proptest::option::of(".{0,30}")).prop_map(|(content, id)| {
            let mut v = serde_json::json!({ "content": content });
            if let Some(id) = id {
                v["id"] = id.into();
            }
            serde_json::to_vec(&v).expect("JSON")
        }),
        // Refused, with an id of its own.
        ".{0,30}".prop_map(|id| {
            serde_json::to_vec(&serde_json::json!({ "id": id, "content": 5 })).expect("JSON")
        }),
    ]
}

/// Any JSON, objects' keys now and then serde_json's own markers (a
/// payload may write them: they are keys like any other, but the number's).
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        ".{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        let key = prop_oneof![
            3 => "[a-z]{1,6}",
            1 => Just("$serde_json::private::RawValue".to_string()),
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key, inner), 0..4)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect())),
        ]
    })
}

/// The fields of a copy or event, each as written: serde_json's `Value`
/// would read its markers (above) as they are not meant here.
type Fields = std::collections::BTreeMap<String, Box<serde_json::value::RawValue>>;

/// A judge with the contract's rules, and with `optional`, loopguard's own
/// rules on too, set tight enough to reject often.
fn judge(optional: bool) -> Judge {
    let mut config = Config::default();
    if optional {
        let rules = &mut config.rules;
        rules.alternation.max_cycles = 2;
        rules.similar.threshold = 0.5;
        rules.low_content.enabled = true;
        rules.budget.max = 5;
        rules.concluded.enabled = true;
    }
    config.worlds.insert(
        "w".into(),
        serde_json::from_value(serde_json::json!({"agents": ["alice", "bob", "carol"]})).unwrap(),
    );
    Judge::new(
        Arc::new(config.validate().unwrap()),
        Arc::new(SystemClock),
        Metrics::new(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Half the cases are name-like (the other half would almost never
    /// parse), and each must be accepted exactly when it is a name.
    #[test]
    fn names_are_either_rejected_or_safe(raw in prop_oneof![".{0,80}", "[a-zA-Z0-9_-]{0,70}"]) {
        let is_name = (1..=64).contains(&raw.len())
            && raw.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        prop_assert_eq!(Name::parse(&raw).is_ok(), is_name, "{:?}", raw);
        if let Ok(name) = Name::parse(&raw) {
            prop_assert!(name.as_str().bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'));
            prop_assert_eq!(name.as_str(), raw.to_ascii_lowercase());
        }
    }

    #[test]
    fn the_envelope_parser_never_panics(bytes in payload(), header in proptest::option::of(".{0,20}"), max in 0usize..400) {
        let fallback = header.as_deref().map(envelope::FallbackId::header).unwrap_or_default();
        let parsed = envelope::parse(&bytes, fallback, max);
        // The id a refused payload's JSON gave goes into its event, which
        // holds no more than a payload may.
        if let Err(envelope::Unreadable { id: Some(id), .. }) = &parsed {
            prop_assert!(!id.is_empty() && loopguard::json::escaped_len(id) <= max);
        }
        if let Ok(env) = parsed {
            prop_assert!(bytes.len() <= max);
            // A header that became the id fits with the payload, as JSON
            // (an id the JSON gave is in the payload already).
            if let (Some(h), Some(id)) = (&header, &env.id) {
                if h == id && !h.is_empty() {
                    prop_assert!(bytes.len() + loopguard::json::escaped_len(h) <= max);
                }
            }
        }
    }

    #[test]
    fn the_envelope_parser_takes_json_objects_apart(content in ".{0,50}", id in proptest::option::of(".{0,10}"), extra in ".{0,10}") {
        let payload = serde_json::json!({"content": content, "id": id, "x": extra}).to_string();
        let env = envelope::parse(payload.as_bytes(), envelope::FallbackId::default(), 10_000).unwrap();
        prop_assert_eq!(env.content, content);
        // An empty id counts as none.
        prop_assert_eq!(env.id, id.filter(|id| !id.is_empty()));
        prop_assert_eq!(env.fields.get("x").and_then(|v| v.as_str()), Some(extra.as_str()));
    }

    #[test]
    fn leading_and_inline_mentions_read_apart_are_the_scans(text in content()) {
        // Routing reads the two kinds apart, the inline ones for humans only.
        let scan = mentions::scan(&text);
        prop_assert_eq!(mentions::leading(&text), scan.leading);
        prop_assert_eq!(mentions::inline(&text), scan.inline);
    }

    #[test]
    fn normalisation_is_idempotent(text in content()) {
        let once = normalize::normalize(&text);
        prop_assert_eq!(normalize::normalize(&once), once);
    }
}

/// Run by hand rather than in `proptest!`, to check after the last case that
/// each kind of origin came up: a parser that made every subject invalid
/// would pass the checks of the other two.
#[test]
fn subject_parsing_yields_only_valid_names() {
    let strategy = (
        token(),
        token(),
        token(),
        token(),
        prop_oneof![Just("raw"), Just("join"), Just("x")],
    );
    let config = ProptestConfig {
        source_file: Some(file!()),
        ..ProptestConfig::with_cases(512)
    };
    let subjects = Subjects::new("chat");
    let seen = std::cell::Cell::new([0usize; 3]);
    let count = |i: usize| {
        let mut n = seen.get();
        n[i] += 1;
        seen.set(n);
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let result = runner.run(&strategy, |(a, b, c, d, verb)| {
        let subject = format!("chat.{verb}.{a}.{b}.{c}.{d}");
        for s in [
            subject.as_str(),
            &format!("chat.{verb}.{a}.{b}.{c}"),
            &format!("chat.{verb}.{a}.{b}"),
        ] {
            match subjects.parse(s) {
                Origin::Raw { world, sender, .. } => {
                    count(0);
                    assert_safe_subject(&subjects.public(&world));
                    assert_safe_subject(&subjects.private(&world, &sender));
                }
                Origin::Join { world, agent } => {
                    count(1);
                    assert_safe_subject(&subjects.private(&world, &agent));
                }
                Origin::Invalid { world, sender, .. } => {
                    count(2);
                    prop_assert!(sender.chars().count() <= 64);
                    if let Some(w) = world {
                        assert_safe_subject(&subjects.events(&w));
                    }
                }
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let [raw, join, invalid] = seen.get();
    assert!(
        raw > 0 && join > 0 && invalid > 0,
        "raw {raw}, join {join}, invalid {invalid}"
    );
}

/// By hand, like the one above: the cases found mentions at all.
#[test]
fn mention_tokens_are_always_names() {
    let config = ProptestConfig {
        source_file: Some(file!()),
        ..ProptestConfig::with_cases(512)
    };
    let tokens = std::cell::Cell::new(0usize);
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let result = runner.run(&content(), |text| {
        let scan = mentions::scan(&text);
        for t in scan.leading.iter().chain(scan.inline.iter()) {
            tokens.set(tokens.get() + 1);
            let name = Name::parse(t);
            prop_assert!(name.is_ok(), "token {:?} from {:?}", t, text);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(tokens.get() > 0, "no case had a mention");
}

/// Run by hand rather than in `proptest!`, to check after the last case that
/// the cases published copies at all: a judge that published nothing would
/// pass every subject check.
#[test]
fn the_judge_never_panics_and_only_publishes_on_safe_subjects() {
    let strategy = (
        prop::collection::vec(
            (
                token(),
                token(),
                content(),
                proptest::option::of(".{0,8}"),
                json_value(),
            ),
            1..12,
        ),
        any::<bool>(),
    );
    let config = ProptestConfig {
        source_file: Some(file!()),
        ..ProptestConfig::with_cases(512)
    };
    let subjects = Subjects::new("chat");
    let published = std::cell::Cell::new(0usize);
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let result = runner.run(&strategy, |(msgs, optional)| {
        let judge = judge(optional);
        for (kind, name, text, parent, extra) in msgs {
            for world in ["w", "other"] {
                let origin = subjects.parse(&format!("chat.raw.{world}.{kind}.{name}"));
                let payload =
                    serde_json::json!({"content": text, "parent_id": parent, "extra": extra})
                        .to_string();
                let extra_written = serde_json::to_string(&extra).unwrap();
                for (p, structured) in [(payload.as_bytes(), true), (text.as_bytes(), false)] {
                    let decision = judge.decide(origin.clone(), p, envelope::FallbackId::default());
                    for out in decision.iter().flat_map(|d| &d.outbound) {
                        assert_safe_subject(&out.subject);
                        // JSON, and an object of the contract's fields (§4).
                        let fields: Fields = serde_json::from_slice(&out.payload)
                            .map_err(|e| TestCaseError::fail(format!("{e}: {:?}", out.payload)))?;
                        let wanted: &[&str] = if out.delivery.is_some() {
                            &[
                                "id",
                                "world",
                                "sender",
                                "sender_kind",
                                "content",
                                "thread_id",
                                "parent_id",
                                "depth",
                                "mentions",
                                "visibility",
                                "received_at",
                            ]
                        } else {
                            &[
                                "id",
                                "world",
                                "sender",
                                "sender_kind",
                                "decision",
                                "rule",
                                "reason",
                                "depth",
                                "turn",
                                "delivered_to",
                                "observed_at",
                            ]
                        };
                        for key in wanted {
                            prop_assert!(
                                fields.contains_key(*key),
                                "{key} missing: {:?}",
                                out.payload
                            );
                        }
                        // A message's copy keeps its other fields as written
                        // (the hand-back notice is loopguard's own).
                        let notice = out
                            .msg_id
                            .as_deref()
                            .is_some_and(|id| id.ends_with(":notice"));
                        if structured && out.delivery.is_some() && !notice {
                            prop_assert_eq!(
                                fields.get("extra").map(|v| v.get()),
                                Some(extra_written.as_str())
                            );
                        }
                        published.set(published.get() + 1);
                    }
                }
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(published.get() > 0, "no case published a copy");
}
