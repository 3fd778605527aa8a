//! Rule 4, `duplicate`: an agent may not repeat the normalised content of any
//! approved message of the world (from any sender) within
//! `rules.duplicate.window_seconds`.

use std::time::Duration;

use super::{Context, Rule, RuleName};

pub struct Duplicate;

impl Rule for Duplicate {
    fn name(&self) -> RuleName {
        RuleName::Duplicate
    }

    fn check(&self, cx: &Context<'_>) -> Result<(), String> {
        let secs = cx.limits.duplicate.window_seconds;
        if secs > 0
            && cx
                .world
                .seen_content(cx.msg.content_hash, cx.msg.now, Duration::from_secs(secs))
        {
            return Err(format!(
                "the same content was already approved in this world within the last {secs}s"
            ));
        }
        Ok(())
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
        assert!(f.check(&Duplicate, 299, 1, 7).is_err());
        assert!(f.check(&Duplicate, 300, 1, 7).is_ok());
        assert!(f.check(&Duplicate, 10, 1, 8).is_ok());
    }

    #[test]
    fn zero_disables() {
        let mut f = fixture(0);
        f.approve(0, 7);
        assert!(f.check(&Duplicate, 0, 1, 7).is_ok());
    }
}
