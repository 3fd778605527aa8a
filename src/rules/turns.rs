//! Rule 2, `turns`: at most `rules.turns.max` approved agent messages between
//! two ingress human or system messages. The judge sends the hand-back
//! notice and sets the pause; this rule only says when the limit is hit.

use super::{Context, Rule, RuleName, Verdict};

pub struct Turns;

impl Rule for Turns {
    fn name(&self) -> RuleName {
        RuleName::Turns
    }

    fn check(&self, cx: &Context<'_>) -> Verdict {
        let max = cx.limits.turns.max;
        if max > 0 && cx.world.turns >= max {
            let turns = cx.world.turns;
            let reason = format!(
                "agents have taken {turns} turns since the last human or system message, \
                 the limit is {max}; agents are paused until a human or system message arrives"
            );
            return Verdict::reject(self.name(), reason);
        }
        Verdict::Allow
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RulesConfig;
    use crate::rules::testing::Fixture;

    fn limits(max: u32) -> RulesConfig {
        let mut l = RulesConfig::default();
        l.turns.max = max;
        l.rate.max = 0;
        l.duplicate.window_seconds = 0;
        l
    }

    #[test]
    fn allows_up_to_the_limit_then_rejects() {
        let mut f = Fixture::new(limits(2));
        assert!(f.check(&Turns, 0, 1, 1).allows());
        f.approve(0, 1);
        assert!(f.check(&Turns, 0, 1, 2).allows());
        f.approve(0, 2);
        let reason = f.check(&Turns, 0, 1, 3).expect_reject();
        assert!(reason.contains("limit is 2"), "{reason}");
        f.world.reset_turns();
        assert!(f.check(&Turns, 0, 1, 3).allows());
    }

    #[test]
    fn zero_disables() {
        let mut f = Fixture::new(limits(0));
        for i in 0..50 {
            f.approve(i, i);
        }
        assert!(f.check(&Turns, 60, 1, 99).allows());
    }
}
