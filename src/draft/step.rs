//! The server step: which sequences share llama-server's decode call, and with how many tokens.

use super::control::Shared;

/// Which sequences share llama-server's decode calls. Each server step drafts for every generating slot
/// (one call each, in a row), then verifies all their tokens in one batch; a sequence calling again marks
/// the next step. Sequences of the current or the last step count as sharing this one.
pub(super) struct Rounds {
    now: Vec<bool>,
    prev: Vec<bool>,
    /// Per sequence: tokens (1 + drafted) of its latest proposal, and what it is expected to yield.
    tokens: Vec<usize>,
    expected: Vec<f64>,
    /// Tokens the last complete step verified.
    pub(super) last_total: usize,
}

impl Rounds {
    pub(super) fn new(n_seq: usize) -> Rounds {
        Rounds { now: vec![false; n_seq], prev: vec![false; n_seq], tokens: vec![1; n_seq], expected: vec![1.0; n_seq], last_total: 1 }
    }

    /// `seq` drafts: returns what the other sequences put into the same call (those not yet called in
    /// this step as they did in the last).
    pub(super) fn enter(&mut self, seq: usize) -> Shared {
        if self.now[seq] {
            self.last_total = (0..self.now.len()).filter(|&j| self.now[j]).map(|j| self.tokens[j]).sum();
            std::mem::swap(&mut self.now, &mut self.prev);
            self.now.fill(false);
        }
        self.now[seq] = true;
        let mut shared = Shared::default();
        for j in (0..self.now.len()).filter(|&j| j != seq && (self.now[j] || self.prev[j])) {
            shared.tokens += self.tokens[j];
            shared.expected += self.expected[j];
        }
        shared
    }

    pub(super) fn record(&mut self, seq: usize, tokens: usize, expected: f64) {
        self.tokens[seq] = tokens;
        self.expected[seq] = expected;
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_see_what_other_slots_put_into_the_call() {
        let mut r = Rounds::new(3);
        assert_eq!(r.enter(0), Shared::default(), "alone so far");
        r.record(0, 4, 2.5);
        assert_eq!(r.enter(1), Shared { tokens: 4, expected: 2.5 });
        r.record(1, 1, 1.0);
        // Sequence 0 again: the step with 4 + 1 tokens was decoded; 1 has not drafted in this one yet but
        // did in the last, so it counts with what it put in then.
        assert_eq!(r.enter(0), Shared { tokens: 1, expected: 1.0 });
        assert_eq!(r.last_total, 5);
        r.record(0, 1, 1.0);
        assert_eq!(r.enter(1), Shared { tokens: 1, expected: 1.0 }, "0 is in this step already, with its new proposal");
        r.record(1, 3, 2.0);
        assert_eq!(r.enter(0), Shared { tokens: 3, expected: 2.0 });
        assert_eq!(r.last_total, 4);
        r.record(0, 1, 1.0);
        assert_eq!(r.enter(0), Shared::default(), "1 did not draft in the last step: its request is over");
        assert_eq!(r.last_total, 1);
    }
}
