//! The normaliser: never panics, and normalising twice changes nothing.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let once = loopguard::normalize::normalize(text);
    assert_eq!(loopguard::normalize::normalize(&once), once);
});
