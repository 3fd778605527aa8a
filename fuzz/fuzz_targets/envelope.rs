//! The payload parser: any bytes, any header id, any size limit.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (limit, rest) = data.split_first().map_or((0, data), |(l, r)| (*l as usize * 4, r));
    let header = std::str::from_utf8(&rest[..rest.len().min(8)]).ok();
    if let Ok(env) = loopguard::envelope::parse(rest, header, limit) {
        assert!(rest.len() <= limit);
        assert!(env.fields.keys().all(|k| k != "content" && k != "id"));
    }
});
