//! Rule 6, `rate`: an agent may have at most `rules.rate.max` approved
//! messages in one world within `rules.rate.window_seconds`.

use std::time::Duration;

use super::{Context, Rule, RuleName, Verdict};

pub struct Rate;

impl Rule for Rate {
    fn name(&self) -> RuleName {
        RuleName::Rate
    }

    fn check(&self, cx: &Context<'_>) -> Verdict {
        let (max, secs) = (cx.limits.rate.max, cx.limits.rate.window_seconds);
        if max == 0 || secs == 0 {
            return Verdict::Allow;
        }
        let window = Duration::from_secs(secs);
        let recent = cx
            .world
            .agent(cx.msg.sender)
            .map_or(0, |a| a.approvals_within(cx.msg.now, window));
        if recent >= max as usize {
            return Verdict::reject(
                self.name(),
                format!(
                    "{} already sent {recent} messages in the last {secs}s, the limit is {max}",
                    cx.msg.sender
                ),
            );
        }
        Verdict::Allow
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RulesConfig;
    use crate::rules::testing::Fixture;

    fn fixture(max: u32, secs: u64) -> Fixture {
        let mut l = RulesConfig::default();
        l.rate.max = max;
        l.rate.window_seconds = secs;
        Fixture::new(l)
    }

    #[test]
    fn rejects_the_message_over_the_limit_and_frees_the_slot_later() {
        let mut f = fixture(3, 60);
        for t in [0, 10, 20] {
            assert!(f.check(&Rate, t, 1, t).allows());
            f.approve(t, t);
        }
        let reason = f.check(&Rate, 30, 1, 99).expect_reject();
        assert!(reason.contains("limit is 3"), "{reason}");
        // the first approval (t=0) leaves the window at t=60
        assert!(f.check(&Rate, 60, 1, 99).allows());
    }

    #[test]
    fn a_window_longer_than_a_stamp_reaches_counts_every_approval() {
        // `window_seconds` is bounded from below only.
        let mut f = fixture(2, u64::MAX);
        for t in [0, 1_000_000] {
            assert!(f.check(&Rate, t, 1, t).allows());
            f.approve(t, t);
        }
        let reason = f.check(&Rate, 2_000_000_000, 1, 99).expect_reject();
        assert!(reason.contains("limit is 2"), "{reason}");
    }

    #[test]
    fn zero_disables() {
        let mut f = fixture(0, 60);
        for t in 0..20 {
            f.approve(t, t);
        }
        assert!(f.check(&Rate, 20, 1, 99).allows());
    }
}
