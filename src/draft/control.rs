//! Break-even control: choose the draft length from measured verify cost β and acceptance.
//!
//! A verify step over γ drafted tokens costs β(γ+1) plain steps and yields
//! E(γ) = 1 + p₁ + p₁p₂ + … + p₁…p_γ tokens, where pᵢ is the chance that drafted token i is
//! accepted given the ones before it were. The drafter picks γ maximising E(γ) / (β(γ+1) + d);
//! γ = 0 (score 1) means drafting does not pay. d is the drafter's own cost: zero for pack and n-gram
//! lookups, one draft-model step (measured) for each token a draft model proposes. β is [`super::beta`]'s,
//! the acceptance `rates`'.

use super::beta::BetaModel;
use super::step::{Shared, MAX_DRAFT};

/// The verify cost a sequence sees: β of the step it joins for each length of its own draft, and what the other
/// sequences in it are expected to yield. A draft slows the whole step, so it must pay for the others' waiting
/// too: beside others it costs the passes it adds (a pass of its own when it is the only one drafting, under a
/// KV stream per slot), and where it matches their length, about what its tokens add to their pass.
#[derive(Clone, Copy)]
pub struct Verify {
    /// `cost[t]`: β of the step when this sequence verifies t tokens (1 + drafted).
    cost: [f64; MAX_DRAFT + 2],
    others: f64,
    /// Tokens per unit of cost of the step a draft is weighed against (score 1), and that step's cost: by default the
    /// step with no draft from this sequence, [`Verify::joint`] the step with no draft from any.
    plain: f64,
    base: f64,
    /// Other slots in the step, each of whose requests waits for what a draft adds to it.
    waiting: usize,
    /// The least gain in the step's throughput a draft must buy per unit of time it adds to the step: the rate per
    /// waiting request ([`super::DrafterConfig::shared_fair`]) times their number (0 alone).
    fair: f64,
    /// What the step may grow (plain steps) before a request in it falls too far behind plain decoding
    /// ([`super::DrafterConfig::shared_lag`]; infinite: no limit).
    slack: f64,
}

impl Verify {
    pub fn new(beta: &BetaModel, shared: &Shared) -> Verify {
        let mut cost = [1.0; MAX_DRAFT + 2];
        let waiting = shared.waiting();
        for (t, c) in cost.iter_mut().enumerate().skip(1) {
            *c = if waiting > 0 { beta.step(shared.n(), shared.with(t)) } else { beta.beta(t) };
        }
        Verify { cost, others: shared.expected, plain: (shared.expected + 1.0) / cost[1], base: cost[1], waiting, fair: 0.0, slack: f64::INFINITY }
    }

    /// Weighs the step as a whole against the step in which no slot drafts, with the others' drafts as they are or
    /// as offered ([`super::step::Rounds::joint`]): a draft is made when the step it joins, its own draft in, beats
    /// plain decoding by the margin, and its own tokens add to the step's throughput (the least score a draft must
    /// reach is then [`Verify::floor`]). The fairness and lag rules weigh what the whole step adds.
    pub fn joint(mut self, beta: &BetaModel, shared: &Shared) -> Verify {
        if self.waiting > 0 {
            self.base = beta.step(shared.n(), |j| shared.with(1)(j).min(1));
            self.plain = (self.waiting + 1) as f64 / self.base;
        }
        self
    }

    /// The least score a draft must reach: `need`, and what the step scores without one from this sequence (1 unless
    /// [`Verify::joint`]), so that a draft never lowers the step's throughput.
    pub fn floor(&self, need: f64) -> f64 {
        need.max((self.others + 1.0) / self.cost[1] / self.plain)
    }

    /// A draft that would lengthen the step by more than `slack` plain steps is not made: that much more and a
    /// request in the step is further behind plain decoding than it may be ([`super::lag::Ledger`]).
    pub fn owed(mut self, slack: f64) -> Verify {
        self.slack = slack;
        self
    }

    /// With other slots in the step, a draft whose throughput gain is below `per_waiting` times the share of the
    /// step it adds, times the requests that wait for it, is not made. At eight slots here a sure copy of seven
    /// tokens gains the step 6% and adds 77% to it, time that each of seven requests waits.
    pub fn fair(mut self, per_waiting: f64) -> Verify {
        self.fair = per_waiting * self.waiting as f64;
        self
    }

    /// A sequence alone in its verify calls (`-np 1`).
    pub fn alone(beta: &BetaModel) -> Verify {
        Verify::new(beta, &Shared::ALONE)
    }

    /// Tokens per unit of cost of a step in which this sequence verifies `drafted` tokens expected to yield
    /// `expected` (1 + accepted) and spends `spent` plain steps drafting them, relative to not drafting
    /// (score 1). Alone, this is E / (β(γ + 1) + spent).
    #[inline]
    pub fn score(&self, expected: f64, drafted: usize, spent: f64) -> f64 {
        let c = self.cost[(drafted + 1).min(MAX_DRAFT + 1)];
        let score = (self.others + expected) / (c + spent) / self.plain;
        if self.fair > 0.0 || self.slack < f64::INFINITY {
            let added = (c + spent) / self.base - 1.0;
            if added > 0.0 && (score - 1.0 < self.fair * added || added > self.slack) {
                return 0.0;
            }
        }
        score
    }
}

/// True while drafting further could still beat `best`, the best score among the draft's prefixes so far:
/// the draft has `drafted` tokens, expects `expected` tokens from its verify step and reaches its last
/// token with chance `run`. Even if every later token were sure, a draft of L tokens would expect at most
/// `expected + run·(L − drafted)`; if no L up to `max_len` beats `best` that way, nothing can.
/// (All lengths are looked at, not just the next: a measured β table has steps and flat stretches.)
pub fn may_pay_more(expected: f64, run: f64, best: f64, v: &Verify, drafted: usize, max_len: usize) -> bool {
    (drafted + 1..=max_len).any(|l| v.score(expected + run * (l - drafted) as f64, l, 0.0) > best + 1e-9)
}

/// E(γ) for γ = 1, 2, …: the tokens a verify step of the first γ tokens of a draft with estimates `p` is expected to
/// yield (1 + p₁ + p₁p₂ + …).
fn expected_tokens(p: &[f32]) -> impl Iterator<Item = f64> + '_ {
    p.iter().scan((1.0, 1.0), |(expected, run), &pi| {
        *run *= f64::from(pi);
        *expected += *run;
        Some(*expected)
    })
}

/// What a sequence whose chain's estimates are `p` offers a step decided together ([`super::step::Rounds::offer`]): the
/// draft length that scores best, above `need`, when every slot generating in the step (`shared`'s and its own) drafts
/// that many tokens at these estimates, against the step in which none drafts; with the tokens it is expected to
/// yield. (0, 1.0): none.
pub fn offer(p: &[f32], beta: &BetaModel, shared: &Shared, need: f64) -> (usize, f64) {
    let n = shared.n();
    let in_step = |j: usize| j == shared.seq || shared.tokens.get(j).is_some_and(|&t| t > 0);
    let slots = (0..n).filter(|&j| in_step(j)).count() as f64;
    let plain = slots / beta.step(n, |j| usize::from(in_step(j)));
    let (mut best, mut best_score, mut best_expected) = (0, need, 1.0);
    for (i, expected) in expected_tokens(p).enumerate() {
        let score = slots * expected / beta.step(n, |j| if in_step(j) { i + 2 } else { 0 }) / plain;
        if score > best_score + 1e-9 {
            (best, best_score, best_expected) = (i + 1, score, expected);
        }
    }
    (best, best_expected)
}

/// Draft length in `0..=p.len()` maximising expected tokens per unit of cost; `cost[i]` is what drafting
/// token i costs relative to a plain step (0 for pack and n-gram tokens, d for a draft model's). A draft
/// must score above `floor` (1 = a plain step) to be chosen over none.
pub fn best_length(p: &[f32], v: &Verify, cost: &[f64], floor: f64) -> usize {
    let (mut best, mut best_score, mut spent) = (0, floor, 0.0);
    for (i, expected) in expected_tokens(p).enumerate() {
        spent += cost.get(i).copied().unwrap_or(0.0);
        let score = v.score(expected, i + 1, spent);
        if score > best_score + 1e-9 {
            (best, best_score) = (i + 1, score);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draft::beta::DEFAULT_BETA_PRIOR;
    use crate::draft::step::Layout;

    #[test]
    fn best_length_trades_acceptance_against_cost() {
        let b = BetaModel::new(DEFAULT_BETA_PRIOR);
        assert_eq!(
            best_length(&[0.3; 4], &Verify::alone(&b), &[], 1.0),
            0,
            "low acceptance: don't draft"
        );
        assert_eq!(best_length(&[0.4; 4], &Verify::alone(&b), &[], 1.0), 0, "40% does not pay for β(2) = 1.45");
        assert_eq!(best_length(&[0.85; 2], &Verify::alone(&b), &[], 1.0), 2);
        assert_eq!(best_length(&[0.85; 2], &Verify::alone(&b), &[0.45; 2], 1.0), 0, "a draft model's cost makes it not pay");
        assert!(best_length(&[1.0; 4], &Verify::alone(&b), &[], 1.0) >= 1);
        assert_eq!(best_length(&[0.85; 2], &Verify::alone(&b), &[], 1.6), 0, "a draft must beat the floor");
        let flat = BetaModel::new(&[(1, 1.0), (16, 1.0)]);
        assert_eq!(
            best_length(&[0.5; 4], &Verify::alone(&flat), &[], 1.0),
            4,
            "free verification: draft all"
        );
    }

    #[test]
    fn a_shared_step_is_judged_by_everyone_s_throughput() {
        let split = BetaModel::new(DEFAULT_BETA_PRIOR).with_layout(Some(Layout::Split));
        let unified = BetaModel::new(DEFAULT_BETA_PRIOR).with_layout(Some(Layout::Unified));
        let four = Shared { tokens: &[0, 1, 1, 1], seq: 0, expected: 3.0 };
        let v = Verify::new(&unified, &four);
        assert!((v.score(1.0, 0, 0.0) - 1.0).abs() < 1e-12, "not drafting scores 1");
        // In one pass, a token added to a step of four costs 0.275 steps, and the step already yields 4 / β(4) = 2.0
        // tokens per step: a drafted token must be likelier than 0.275 · 2.0 = 0.55, against 0.45 alone.
        assert_eq!(best_length(&[0.5], &Verify::alone(&unified), &[], 1.0), 1);
        assert_eq!(best_length(&[0.5], &v, &[], 1.0), 0, "the others' tokens wait for this draft too");
        assert_eq!(best_length(&[0.9], &v, &[], 1.0), 1);
        // With a KV stream per slot the same token is a pass of its own: even a sure one does not pay.
        assert_eq!(best_length(&[1.0, 1.0], &Verify::new(&split, &four), &[], 1.0), 0);
        // Beside three slots that drafted two tokens each, matching their length adds no pass (one pass of 12
        // against 4 + 6), and one token fewer adds one: the draft is padded to the others' length.
        let drafting = Shared { tokens: &[0, 3, 3, 3], seq: 0, expected: 6.0 };
        let v = Verify::new(&split, &drafting);
        assert!(v.score(1.0 + 0.3 + 0.09, 2, 0.0) > 1.0 && v.score(1.3, 1, 0.0) < 1.0);
        assert_eq!(best_length(&[0.3, 0.3], &v, &[], 1.0), 2);
        // Where the kernels make the fifth token nearly free, the same rule drafts what alone would not.
        let stepped = BetaModel::new(&[(1, 1.0), (4, 2.5), (5, 2.6), (16, 8.6)]).with_layout(Some(Layout::Unified));
        assert_eq!(best_length(&[0.5], &Verify::alone(&stepped), &[], 1.0), 0);
        assert_eq!(best_length(&[0.5], &Verify::new(&stepped, &four), &[], 1.0), 1);
        // Past 16 tokens a call is split in two (patch 0004), and the second costs a whole call again.
        assert!(split.beta(17) - split.beta(16) >= 0.99, "{} {}", split.beta(17), split.beta(16));
        assert!((split.beta(40) - (2.0 * split.beta(16) + split.beta(8))).abs() < 1e-9);
    }

    #[test]
    fn a_fair_shared_draft_buys_throughput_for_the_time_it_adds_to_each_waiting_request() {
        // This CPU at eight slots, one call a step (session 49's measured calls): 108 ms with every slot at one
        // token, 121 with one slot at two, 191 with one at eight; at four slots one slot at two costs 1.18 steps.
        let eight = BetaModel::new(&[(1, 1.0), (8, 3.4), (9, 3.81), (15, 6.02), (16, 6.4)]).with_layout(Some(Layout::Unified));
        let at8 = Shared { tokens: &[0, 1, 1, 1, 1, 1, 1, 1], seq: 0, expected: 7.0 };
        assert_eq!(at8.waiting(), 7);
        let added = |b: &BetaModel, at: &Shared, t: usize| b.step(at.n(), at.with(t)) / b.step(at.n(), at.with(1)) - 1.0;
        assert!((added(&eight, &at8, 2) - 0.12).abs() < 0.01 && (added(&eight, &at8, 8) - 0.77).abs() < 0.01);
        let v8 = Verify::new(&eight, &at8);
        assert_eq!(best_length(&[1.0; 7], &v8, &[], 1.05), 7, "without the rule a sure copy of seven beats the margin");
        assert_eq!(best_length(&[1.0; 7], &v8.fair(0.1), &[], 1.05), 0, "it adds 77% to the step for seven requests and gains it 6%");
        assert_eq!(best_length(&[1.0; 7], &v8.fair(0.01), &[], 1.05), 7, "a rule of 1% a request keeps it");
        let four = BetaModel::new(&[(1, 1.0), (4, 2.2), (5, 2.6)]).with_layout(Some(Layout::Unified));
        let at4 = Shared { tokens: &[0, 1, 1, 1], seq: 0, expected: 3.0 };
        let v4 = Verify::new(&four, &at4);
        let gain = v4.score(2.0, 1, 0.0) - 1.0;
        assert!(gain > 0.05 && gain / added(&four, &at4, 2) > 0.3, "{gain}");
        assert_eq!(best_length(&[1.0], &v4.fair(0.1), &[], 1.05), 1, "at four slots a sure token gains a third of what it adds");
        assert_eq!(best_length(&[1.0], &v4.fair(0.2), &[], 1.05), 0, "the same rate a request as at eight would not");
        assert_eq!(best_length(&[1.0; 7], &Verify::alone(&eight).fair(10.0), &[], 1.05), 7, "alone, no other request waits");
    }

    #[test]
    fn a_step_decided_together_drafts_what_no_slot_would_alone() {
        // A KV stream per slot: a slot's second token beside three at one is a pass of its own (3.0 against 2.0), all
        // four at two are one pass of eight (2.8).
        let b = BetaModel::new(&[(1, 1.0), (4, 2.0), (8, 2.8), (16, 5.2)]).with_layout(Some(Layout::Split));
        let plain = Shared { tokens: &[0, 1, 1, 1], seq: 0, expected: 3.0 };
        assert_eq!(best_length(&[0.9; 3], &Verify::new(&b, &plain), &[], 1.05), 0, "alone it costs a pass");
        assert_eq!(best_length(&[0.9; 3], &Verify::new(&b, &plain).joint(&b, &plain), &[], 1.05), 0, "nobody else offers");
        // What each slot offers: one token each (8 tokens, 2.8) scores 4 · 1.9 / 2.8 against 4 / 2.0, best of the lengths.
        let (len, expected) = offer(&[0.9; 3], &b, &plain, 1.05);
        assert!((len, (expected * 1e3).round()) == (1, 1900.0), "{len} {expected}");
        assert_eq!(offer(&[0.3; 3], &b, &plain, 1.05), (0, 1.0), "unlikely tokens offer nothing");
        // The others offered one token each last step: the step with this slot's token is the one of eight.
        let offered = Shared { tokens: &[0, 2, 2, 2], seq: 0, expected: 5.7 };
        let v = Verify::new(&b, &offered).joint(&b, &offered);
        let need = v.floor(1.05);
        assert!((need - 1.05).abs() < 1e-9, "without this slot's token the step is two passes: {need}");
        assert_eq!(best_length(&[0.9; 3], &v, &[], need), 1);
        assert_eq!(best_length(&[0.9; 3], &Verify::new(&b, &offered), &[], 1.05), 1, "the slot's marginal agrees here");
        // Fairness weighs the whole step: 4 · 1.9 / 2.8 against 4 / 2.0 gains 36% for 40% more time; three waiting
        // requests at 0.1 each ask 0.3 · 40% of it, at 0.4 each 1.2 · 40%.
        assert_eq!(best_length(&[0.9; 3], &v.fair(0.1), &[], v.floor(1.05)), 1);
        assert_eq!(best_length(&[0.9; 3], &v.fair(0.4), &[], v.floor(1.05)), 0);
        // Beside drafts that already pay, a draft of its own must add to the step, not only keep it above the margin.
        let rich = Shared { tokens: &[0, 4, 4, 4], seq: 0, expected: 3.0 * 3.7 };
        let v = Verify::new(&b, &rich).joint(&b, &rich);
        assert!(v.floor(1.05) > 1.15, "{}", v.floor(1.05));
        assert_eq!(best_length(&[0.2], &v, &[], v.floor(1.05)), 0, "{}", v.score(1.2, 1, 0.0));
        assert_eq!(best_length(&[0.9; 3], &v, &[], v.floor(1.05)), 3, "matching the others' length is one pass");
    }

    #[test]
    fn an_owed_step_takes_only_drafts_that_lengthen_it_by_no_more_than_its_slack() {
        // Four slots, one pass: a sure token adds 0.4 / 2.2 = 18% to the step, two add 36%.
        let four = BetaModel::new(&[(1, 1.0), (4, 2.2), (5, 2.6), (6, 3.0)]).with_layout(Some(Layout::Unified));
        let at4 = Shared { tokens: &[0, 1, 1, 1], seq: 0, expected: 3.0 };
        let v = Verify::new(&four, &at4);
        assert_eq!(best_length(&[1.0; 2], &v, &[], 1.0), 2);
        assert_eq!(best_length(&[1.0; 2], &v.owed(0.3), &[], 1.0), 1);
        assert_eq!(best_length(&[1.0; 2], &v.owed(0.1), &[], 1.0), 0);
        assert_eq!(best_length(&[1.0; 2], &v.owed(f64::INFINITY), &[], 1.0), 2);
    }

    #[test]
    fn a_one_pass_step_prices_drafted_tokens_apart_from_rows() {
        // vLLM-like: 70 ms a step, 15 ms per further row, 3 ms per drafted token; steps of six rows.
        let mut b = BetaModel::new(DEFAULT_BETA_PRIOR).with_layout(Some(Layout::OnePass));
        assert_eq!(b.layout(), Layout::OnePass);
        for i in 0..300usize {
            let tokens: Vec<usize> = (0..6).map(|j| 1 + (i * 7 + j * 3) % 9).collect();
            let drafted: usize = tokens.iter().map(|t| t - 1).sum();
            b.observe_step(&tokens, (145_000_000 + 3_000_000 * drafted) as u64);
        }
        let six = Shared { tokens: &[0, 1, 1, 1, 1, 1], seq: 0, expected: 5.0 };
        let v = Verify::new(&b, &six);
        // A token drafted beside five rows adds 3 ms to a 145 ms step yielding 6 tokens: a 20% one pays, a 10%
        // one does not, and likely ones are drafted as long as the proposer may.
        assert_eq!(best_length(&[0.2; 8], &v, &[], 1.0), 1);
        assert_eq!(best_length(&[0.1; 8], &v, &[], 1.0), 0);
        assert_eq!(best_length(&[0.9; 8], &v, &[], 1.0), 8);
        // Priced as llama-server's one call of 6 + γ tokens, each drafted token cost 10% of the step.
        let llama = BetaModel::new(DEFAULT_BETA_PRIOR).with_layout(Some(Layout::Unified));
        assert_eq!(best_length(&[0.2; 8], &Verify::new(&llama, &six), &[], 1.0), 0);
        assert!(best_length(&[0.9; 8], &Verify::new(&llama, &six), &[], 1.0) < 8);
        let wide = Shared { tokens: &[0, 3, 3, 3, 3, 3], seq: 0, expected: 12.0 };
        assert!(b.step(6, wide.with(9)) - b.step(6, wide.with(8)) < 0.05, "no call limit at 24 tokens");
        // A row alone is priced by the table, learned from one-row steps only: here drafts cost nothing.
        let before = b.step(6, six.with(4));
        for _ in 0..100 {
            b.observe_step(&[1], 70_000_000);
            b.observe_step(&[0, 5, 0], 70_000_000);
        }
        assert!((b.beta(5) - 1.0).abs() < 0.05 && (b.step(3, |j| [0, 5, 0][j]) - b.beta(5)).abs() < 1e-12, "{}", b.beta(5));
        assert_eq!(b.step(6, six.with(4)), before, "one-row steps leave the rows' fit alone");
        // A step's duration comes from the clock that priced it: six rows from their fit, one from the table.
        let ms = |t: &[usize]| b.step_ns(t.len(), |j| t[j]).unwrap() / 1e6;
        assert!((ms(&[1; 6]) - 145.0).abs() < 1.0 && (ms(&[5, 1, 1, 1, 1, 1]) - 157.0).abs() < 1.0, "{}", ms(&[1; 6]));
        assert!((ms(&[0, 5, 0]) - 70.0).abs() < 3.0, "{}", ms(&[0, 5, 0]));
    }

    #[test]
    fn extending_stops_when_no_token_could_pay() {
        let cpu = BetaModel::new(DEFAULT_BETA_PRIOR);
        assert!(may_pay_more(1.0, 1.0, 1.0, &Verify::alone(&cpu), 0, 15), "a sure first token always may");
        assert!(!may_pay_more(1.3, 0.25, 1.0, &Verify::alone(&cpu), 1, 15), "reached 25% of the time: no longer draft can pay");
        let flat = BetaModel::new(&[(1, 1.0), (17, 1.1)]);
        assert!(may_pay_more(1.3, 0.3, 1.0, &Verify::alone(&flat), 1, 15), "nearly free verification: keep going");
        // A step in β (8 → 9 tokens verified) does not end a draft that pays again further on.
        let stepped = BetaModel::new(&[(1, 1.0), (8, 4.47), (9, 5.57), (16, 8.3)]);
        let e7 = 8.0; // seven sure tokens
        assert!(may_pay_more(e7, 1.0, e7 / 4.47, &Verify::alone(&stepped), 7, 15));
        // Against the exhaustive rule: whenever extending is refused, no longer draft scores better.
        for &q in &[0.2f32, 0.5, 0.8, 0.95, 1.0] {
            let p = [q; 15];
            let (mut e, mut run, mut best) = (1.0, 1.0, 1.0f64);
            for (i, &pi) in p.iter().enumerate() {
                if !may_pay_more(e, run, best, &Verify::alone(&cpu), i, p.len()) {
                    assert!(best_length(&p, &Verify::alone(&cpu), &[], 1.0) <= i, "q {q}: stopped at {i}, best is {}", best_length(&p, &Verify::alone(&cpu), &[], 1.0));
                    break;
                }
                run *= f64::from(pi);
                e += run;
                best = best.max(e / cpu.beta(i + 2));
            }
        }
    }

    #[test]
    fn one_slow_step_at_a_round_s_start_does_not_price_every_draft_out() {
        let mut b = BetaModel::new(DEFAULT_BETA_PRIOR);
        for (tokens, us) in crate::draft::beta::ROUND_START_S74 {
            b.observe_step(tokens, us * 1000);
        }
        let three = Shared { tokens: &[0, 1, 1, 1], seq: 0, expected: 3.0 };
        let v = Verify::new(&b, &three).fair(0.1);
        assert!(may_pay_more(1.0, 1.0, 1.05, &v, 0, 15), "a sure draft beside three slots may pay");
        assert!(best_length(&[1.0; 4], &v, &[], 1.05) > 0);
        // Priced as the split sum of its passes, none would: session 74's round drafted 78 tokens in 1,386 steps.
        let split = b.clone().with_layout(Some(Layout::Split));
        assert!(!may_pay_more(1.0, 1.0, 1.05, &Verify::new(&split, &three).fair(0.1), 0, 15));
    }
}
