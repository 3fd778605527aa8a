//! Rule 5, `cooldown`: an agent's approved messages in one world must be at
//! least `rules.cooldown.seconds` apart.

use std::time::Duration;

use super::{Context, Rule, RuleName, Verdict};

pub struct Cooldown;

impl Rule for Cooldown {
    fn name(&self) -> RuleName {
        RuleName::Cooldown
    }

    fn check(&self, cx: &Context<'_>) -> Verdict {
        let secs = cx.limits.cooldown.seconds;
        if secs == 0 {
            return Verdict::Allow;
        }
        let last = cx
            .world
            .agent(cx.msg.sender)
            .and_then(|a| a.last_approved());
        if let Some(last) = last {
            let since = cx.msg.now.since(last);
            if since < Duration::from_secs(secs) {
                return Verdict::reject(
                    self.name(),
                    format!(
                        "{}'s previous message was {:.1}s ago; the cooldown is {secs}s",
                        cx.msg.sender,
                        since.as_secs_f64()
                    ),
                );
            }
        }
        Verdict::Allow
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RulesConfig;
    use crate::rules::testing::Fixture;

    fn fixture(secs: u64) -> Fixture {
        let mut l = RulesConfig::default();
        l.cooldown.seconds = secs;
        Fixture::new(l)
    }

    #[test]
    fn rejects_until_the_cooldown_has_passed() {
        let mut f = fixture(30);
        assert!(
            f.check(&Cooldown, 0, 1, 1).allows(),
            "first message is free"
        );
        f.approve(0, 1);
        let reason = f.check(&Cooldown, 29, 1, 2).expect_reject();
        assert!(
            reason.contains("alice") && reason.contains("30s"),
            "{reason}"
        );
        assert!(f.check(&Cooldown, 30, 1, 2).allows());
    }

    #[test]
    fn zero_disables() {
        let mut f = fixture(0);
        f.approve(0, 1);
        assert!(f.check(&Cooldown, 0, 1, 2).allows());
    }
}
