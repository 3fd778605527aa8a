//! Rule 10, `budget`: at most `rules.budget.max` approved agent messages per
//! world within `rules.budget.window_seconds` (e.g. 200 an hour), so a slow
//! loop that stays under every short limit still ends.

use std::time::Duration;

use super::{Context, Rule, RuleName, Verdict};

pub struct Budget;

impl Rule for Budget {
    fn name(&self) -> RuleName {
        RuleName::Budget
    }

    fn check(&self, cx: &Context<'_>) -> Verdict {
        let (max, secs) = (cx.limits.budget.max, cx.limits.budget.window_seconds);
        if max == 0 || secs == 0 {
            return Verdict::Allow;
        }
        let used = cx
            .world
            .agent_approvals_within(cx.msg.now, Duration::from_secs(secs));
        if used >= max as usize {
            return Verdict::reject(
                self.name(),
                format!("agents in this world already sent {used} messages in the last {secs}s, the budget is {max}"),
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

    fn fixture(max: u32) -> Fixture {
        let mut l = RulesConfig::default();
        l.budget.max = max;
        l.budget.window_seconds = 3600;
        Fixture::new(l)
    }

    #[test]
    fn a_slow_loop_ends_when_the_budget_is_spent_and_resumes_as_it_ages() {
        let mut f = fixture(3);
        for (i, who) in ["a", "b", "a"].iter().enumerate() {
            assert!(f.check_as_at(&Budget, who, i as u64 * 600).allows());
            f.approve_as(who, i as u64 * 600, i as u64);
        }
        let reason = f.check_as_at(&Budget, "b", 1800).expect_reject();
        assert!(reason.contains("budget is 3"), "{reason}");
        assert!(
            f.check_as_at(&Budget, "b", 3600).allows(),
            "the first approval left the window"
        );
    }

    #[test]
    fn zero_disables() {
        let mut f = fixture(0);
        for i in 0..50 {
            f.approve_as("a", i, i);
        }
        assert!(f.check_as_at(&Budget, "a", 60).allows());
    }
}
