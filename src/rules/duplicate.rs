//! Rule 4, `duplicate`: an agent may not repeat the normalised content of any
//! approved message of the world (from any sender) within
//! `rules.duplicate.window_seconds`.

use std::time::Duration;

use super::{Context, Rule, RuleName, Verdict};

pub struct Duplicate;

impl Rule for Duplicate {
    fn name(&self) -> RuleName {
        RuleName::Duplicate
    }

    fn check(&self, cx: &Context<'_>) -> Verdict {
        let secs = cx.limits.duplicate.window_seconds;
        if secs > 0
            && cx
                .world
                .seen_content(cx.msg.content_hash, cx.msg.now, Duration::from_secs(secs))
        {
            return Verdict::reject(
                self.name(),
                format!(
                    "the same content was already approved in this world within the last {secs}s"
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

    fn fixture(window: u64) -> Fixture {
        let mut l = RulesConfig::default();
        l.duplicate.window_seconds = window;
        Fixture::new(l)
    }

    #[test]
    fn rejects_a_repeat_inside_the_window_only() {
        let mut f = fixture(300);
        f.approve(0, 7);
        assert!(f.check(&Duplicate, 299, 1, 7).rejects());
        assert!(f.check(&Duplicate, 300, 1, 7).allows());
        assert!(f.check(&Duplicate, 10, 1, 8).allows());
    }

    #[test]
    fn zero_disables() {
        let mut f = fixture(0);
        f.approve(0, 7);
        assert!(f.check(&Duplicate, 0, 1, 7).allows());
    }
}
