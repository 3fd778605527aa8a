//! A policy service's answer: any bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopguard::judge::PolicyOutcome;
use loopguard::publish::{read_answer, MAX_POLICY_REASON_CHARS};

fuzz_target!(|data: &[u8]| {
    match read_answer(data) {
        // Only a JSON object names a decision.
        PolicyOutcome::Approve => assert!(serde_json::from_slice::<serde_json::Value>(data)
            .is_ok_and(|v| v["decision"] == "approve")),
        PolicyOutcome::Reject(reason) => assert!(reason.chars().count() <= MAX_POLICY_REASON_CHARS),
        PolicyOutcome::Failed { .. } => {}
    }
});
