//! The whole decision: a hostile subject and payload in, never a panic, and
//! only subjects made of `[a-z0-9_-]` tokens out, each carrying a JSON
//! object.
#![no_main]
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use loopguard::{
    clock::SystemClock, config::Config, envelope::FallbackId, judge::Judge, metrics::Metrics,
};
use serde_json::value::RawValue;

fn judge() -> &'static Judge {
    static JUDGE: OnceLock<Judge> = OnceLock::new();
    JUDGE.get_or_init(|| {
        let settings = Config::default().validate().expect("defaults are valid");
        Judge::new(Arc::new(settings), Arc::new(SystemClock), Metrics::new())
    })
}

fuzz_target!(|data: &[u8]| {
    // The first line is the subject after "chat.", then after a tab (if
    // any) a `Nats-Msg-Id` header; the rest is the payload.
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let Ok(line) = std::str::from_utf8(&data[..split]) else {
        return;
    };
    let (tail, header) = line
        .split_once('\t')
        .map_or((line, None), |(t, h)| (t, Some(h)));
    let payload = data.get(split + 1..).unwrap_or(&[]);
    let judge = judge();
    let origin = judge.subjects().parse(&format!("chat.{tail}"));
    let fallback = header.map(FallbackId::header).unwrap_or_default();
    if let Some(decision) = judge.decide(origin, payload, fallback) {
        for out in &decision.outbound {
            let rest = out.subject.strip_prefix("chat.").expect("prefix");
            assert!(
                rest.split('.').all(|t| !t.is_empty()
                    && t.bytes().all(|b| b.is_ascii_lowercase()
                        || b.is_ascii_digit()
                        || b == b'_'
                        || b == b'-')),
                "unsafe subject {}",
                out.subject
            );
            // Read field by field as written: serde_json's `Value` would read
            // its own markers, which a payload may hold as keys.
            let object: Result<BTreeMap<String, Box<RawValue>>, _> =
                serde_json::from_slice(&out.payload);
            assert!(
                object.is_ok(),
                "not a JSON object on {}: {:?}",
                out.subject,
                out.payload
            );
        }
    }
});
