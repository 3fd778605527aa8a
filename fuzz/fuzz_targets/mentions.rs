//! The mention extractor: every token it returns must be a valid name.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let scan = loopguard::mentions::scan(text);
    for token in scan.leading.iter().chain(scan.inline.iter()) {
        assert!(loopguard::names::Name::parse(token).is_ok(), "{token:?}");
    }
});
