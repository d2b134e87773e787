//! How far each slot's request is behind where plain decoding would have it, in its time in the slot.
//!
//! A step with drafts in it is longer than a plain one, and every request in it waits for the longer step; only the
//! requests whose drafts were kept get tokens for it. A request that drafts nothing (prose beside code) pays the
//! others' verifies in every step it shares with them, and its time in the slot grows, whatever the step's
//! throughput gains: the slowest such request sets the tail. The ledger counts, per request, the plain steps its
//! steps cost beyond the tokens they gave it, so that drafts beside a request already behind can be declined.

/// Per sequence: plain steps spent beyond the tokens got (negative: ahead of plain decoding), and steps taken.
pub(super) struct Ledger {
    lag: Vec<f64>,
    steps: Vec<u32>,
    /// A request began here since the last step ended: that step was the last one's (llama-server begins a request
    /// after the step that decoded its prompt, the replay before it).
    fresh: Vec<bool>,
}

impl Ledger {
    pub(super) fn new(n_seq: usize) -> Ledger {
        Ledger { lag: vec![0.0; n_seq], steps: vec![0; n_seq], fresh: vec![false; n_seq] }
    }

    /// A request began on `seq`: it owes and is owed nothing.
    pub(super) fn begun(&mut self, seq: usize) {
        if let (Some(l), Some(s), Some(f)) = (self.lag.get_mut(seq), self.steps.get_mut(seq), self.fresh.get_mut(seq)) {
            (*l, *s, *f) = (0.0, 0, true);
        }
    }

    /// A step ended in which slot `j` verified `tokens[j]` tokens (0: not in it) and got `got(j)` (1 + kept), and
    /// which cost `cost` plain steps of the same slots (1 when nothing was drafted).
    pub(super) fn step(&mut self, tokens: &[usize], got: impl Fn(usize) -> usize, cost: f64) {
        let slots = self.lag.iter_mut().zip(&mut self.steps).zip(&mut self.fresh);
        for (j, ((l, s), fresh)) in slots.enumerate() {
            if tokens.get(j).is_some_and(|&t| t > 0) && !*fresh {
                *l += cost - got(j) as f64;
                *s += 1;
            }
            *fresh = false;
        }
    }

    /// What more the step may cost `j`'s request (plain steps) before it is behind plain decoding by more than
    /// `rate` of its steps so far.
    pub(super) fn slack(&self, j: usize, rate: f64) -> f64 {
        match (self.lag.get(j), self.steps.get(j)) {
            (Some(&l), Some(&s)) => rate * f64::from(s) - l,
            _ => f64::INFINITY,
        }
    }

    /// The least [`Ledger::slack`] among the slots `tokens[j] > 0` (the others in a step), infinite with none.
    pub(super) fn least_slack(&self, tokens: &[usize], rate: f64) -> f64 {
        if rate == f64::INFINITY {
            return rate; // No limit (and ∞ · 0 steps would be NaN).
        }
        tokens.iter().enumerate().filter(|&(_, &t)| t > 0).map(|(j, _)| self.slack(j, rate)).fold(f64::INFINITY, f64::min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_that_pays_for_others_drafts_falls_behind_and_one_whose_drafts_are_kept_runs_ahead() {
        let mut l = Ledger::new(3);
        // Slot 0 drafts 3 and keeps 2, slot 1 verifies its one token, slot 2 is idle; the step cost 1.4 plain ones.
        l.step(&[4, 1, 0], |j| [3, 1, 0][j], 1.4);
        assert!((l.slack(0, 0.0) - 1.6).abs() < 1e-12, "3 tokens for 1.4 steps: 1.6 ahead");
        assert!((l.slack(1, 0.0) + 0.4).abs() < 1e-12, "1 token for 1.4 steps: 0.4 behind");
        assert_eq!(l.slack(2, 0.0), 0.0, "an idle slot is not charged");
        // Ten plain steps later slot 1 may fall behind by 10% of its 11 steps: 1.1 − 0.4.
        for _ in 0..10 {
            l.step(&[1, 1, 0], |_| 1, 1.0);
        }
        assert!((l.slack(1, 0.1) - 0.7).abs() < 1e-12);
        assert!((l.least_slack(&[0, 1, 0], 0.1) - 0.7).abs() < 1e-12);
        assert!((l.least_slack(&[1, 1, 0], 0.1) - 0.7).abs() < 1e-12, "slot 0, ahead, has more");
        assert_eq!(l.least_slack(&[0, 0, 0], 0.1), f64::INFINITY, "alone, nobody waits");
        assert_eq!(l.least_slack(&[1, 1, 1], f64::INFINITY), f64::INFINITY, "no limit");
        l.begun(1);
        assert_eq!(l.slack(1, 0.1), 0.0, "a new request starts even");
        l.step(&[1, 3, 0], |_| 1, 1.5);
        assert_eq!(l.slack(1, 0.1), 0.0, "the step that ended after it began was the last request's");
        l.step(&[1, 3, 0], |_| 1, 1.5);
        assert!((l.slack(1, 0.1) + 0.4).abs() < 1e-12);
    }
}
