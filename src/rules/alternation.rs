//! Rule 7, `alternation`: agents taking turns in a fixed cycle (A,B,A,B… or
//! A,B,C,A,B,C…) since the last human or system message. Once a cycle of
//! period 2 to `rules.alternation.max_period` has repeated
//! `rules.alternation.max_cycles` times, the next message continuing it is
//! rejected. Counters stop a runaway loop eventually; this stops the
//! ping-pong as soon as it is one.

use super::{Context, Rule, RuleName, Verdict};

pub struct Alternation;

impl Rule for Alternation {
    fn name(&self) -> RuleName {
        RuleName::Alternation
    }

    fn check(&self, cx: &Context<'_>) -> Verdict {
        let limits = &cx.limits.alternation;
        let cycles = limits.max_cycles as usize;
        if cycles == 0 {
            return Verdict::Allow;
        }
        let seq = cx.world.speakers();
        for period in 2..=limits.max_period as usize {
            let need = period * cycles;
            if seq.len() < need {
                continue;
            }
            let tail = seq.range(seq.len() - need..);
            let block: Vec<_> = seq
                .range(seq.len() - need..seq.len() - need + period)
                .collect();
            // A cycle of one speaker repeated is not an alternation.
            if block.iter().all(|s| *s == block[0]) {
                continue;
            }
            let repeats = tail.enumerate().all(|(i, s)| s == block[i % period]);
            if repeats && block[0] == cx.msg.sender {
                let cycle: Vec<&str> = block.iter().map(|n| n.as_str()).collect();
                return Verdict::reject(
                    self.name(),
                    format!(
                        "agents have gone round the cycle {} {cycles} times since the last human or system message",
                        cycle.join(" → ")
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

    fn fixture(max_cycles: u32) -> Fixture {
        let mut l = RulesConfig::default();
        l.alternation.max_cycles = max_cycles;
        l.alternation.max_period = 3;
        Fixture::new(l)
    }

    fn said(f: &mut Fixture, who: &[&str]) {
        for w in who {
            f.approve_as(w, 0, 0);
        }
    }

    fn check(f: &Fixture, who: &str) -> Verdict {
        f.check_as(&Alternation, who)
    }

    #[test]
    fn a_two_agent_ping_pong_is_cut_after_max_cycles() {
        let mut f = fixture(2);
        said(&mut f, &["a", "b", "a"]);
        assert!(check(&f, "b").allows(), "only one and a half cycles so far");
        said(&mut f, &["b"]);
        let reason = check(&f, "a").expect_reject();
        assert!(
            reason.contains("a → b") && reason.contains("2 times"),
            "{reason}"
        );
        assert!(check(&f, "c").allows(), "a third agent breaks the cycle");
    }

    #[test]
    fn a_three_agent_rotation_is_cut_too() {
        let mut f = fixture(2);
        said(&mut f, &["a", "b", "c", "a", "b", "c"]);
        assert!(check(&f, "a").rejects());
        assert!(check(&f, "b").allows());
    }

    #[test]
    fn irregular_exchanges_and_a_single_speaker_are_left_alone() {
        let mut f = fixture(2);
        said(&mut f, &["a", "b", "b", "a", "c", "a", "b"]);
        assert!(check(&f, "a").allows());
        let mut f = fixture(2);
        said(&mut f, &["a", "a", "a", "a"]);
        assert!(
            check(&f, "a").allows(),
            "repetition by one agent is for rate and cooldown"
        );
    }

    #[test]
    fn a_human_message_starts_a_new_exchange_and_zero_disables() {
        let mut f = fixture(2);
        said(&mut f, &["a", "b", "a", "b"]);
        f.world.reset_turns();
        assert!(check(&f, "a").allows());
        let mut f = fixture(0);
        said(&mut f, &["a", "b", "a", "b", "a", "b"]);
        assert!(check(&f, "a").allows());
    }
}
