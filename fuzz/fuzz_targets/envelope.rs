//! The payload parser: any bytes, any header id, any size limit.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopguard::envelope::{parse, FallbackId};

fuzz_target!(|data: &[u8]| {
    // The first byte is the size limit (in fours), the next eight (when
    // UTF-8) the `Nats-Msg-Id` header, the rest the payload.
    let (limit, rest) = data
        .split_first()
        .map_or((0, data), |(l, r)| (*l as usize * 4, r));
    let (head, payload) = rest.split_at(rest.len().min(8));
    let header = std::str::from_utf8(head).ok();
    let fallback = header.map(FallbackId::header).unwrap_or_default();
    if let Ok(env) = parse(payload, fallback, limit) {
        assert!(payload.len() <= limit);
        assert!(env
            .fields
            .keys()
            .all(|k| !["content", "id", "thread_id", "parent_id"].contains(&k.as_str())));
        // A header that became the id counts toward the limit.
        if env.id.as_deref() == header
            && parse(payload, FallbackId::default(), limit).is_ok_and(|e| e.id.is_none())
        {
            assert!(
                payload.len() + loopguard::json::escaped_len(header.unwrap_or_default()) <= limit
            );
        }
    }
});
