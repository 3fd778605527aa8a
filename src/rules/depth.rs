//! Rule 3, `depth`: an agent message may not extend a reply chain beyond
//! `rules.depth.max`. The depth itself is resolved by the world state
//! (`WorldState::lineage`) from `parent_id`, `thread_id` or the latest message.

use super::{Context, Rule, RuleName, Verdict};

pub struct Depth;

impl Rule for Depth {
    fn name(&self) -> RuleName {
        RuleName::Depth
    }

    fn check(&self, cx: &Context<'_>) -> Verdict {
        let max = cx.limits.depth.max;
        if max > 0 && cx.msg.depth > max {
            return Verdict::reject(
                self.name(),
                format!(
                    "reply depth {} is deeper than the limit of {max}",
                    cx.msg.depth
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

    #[test]
    fn rejects_only_beyond_the_limit() {
        let mut l = RulesConfig::default();
        l.depth.max = 3;
        let f = Fixture::new(l);
        assert!(f.check(&Depth, 0, 3, 0).allows());
        let reason = f.check(&Depth, 0, 4, 0).expect_reject();
        assert!(
            reason.contains("depth 4") && reason.contains("limit of 3"),
            "{reason}"
        );
    }

    #[test]
    fn zero_disables() {
        let mut l = RulesConfig::default();
        l.depth.max = 0;
        assert!(Fixture::new(l).check(&Depth, 0, 1000, 0).allows());
    }
}
