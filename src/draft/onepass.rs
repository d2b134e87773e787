//! The cost of a step that is one forward pass of every row's tokens, as vLLM runs it: no call limit and no
//! passes per slot (those are llama-server's, [`super::step`]). What a step costs there depends on two counts
//! that a table of "tokens verified" mixes up: each row (request) brings its own sampling, bookkeeping and
//! attention, each drafted token only its share of the forward pass. Measured with Qwen2.5-Coder-0.5B on this
//! CPU: a step of six rows took 147 ms against 71 for one, while four drafted tokens added 8–17% to a one-row
//! step (docs/vllm.md). Judged by llama-server's table, a token drafted beside five other rows cost 10% of the
//! step and a seventeenth token a second call, and kolm-rsd drafted a quarter of what suffix decoding did at 8
//! clients. So a step of several rows is fitted as `level(rows) + slope · drafted`: a level per row count, one
//! slope for all. (A row alone keeps [`super::beta::BetaModel`]'s table, which follows the bumps of one
//! row's cost by length.)

/// A drafted token's cost before any measurement, as a share of a one-row step (vLLM measured 0.02–0.04).
const PRIOR_SHARE: f64 = 0.04;
/// Pseudo-observations (in drafted tokens squared) the prior slope is worth at first. They fade as the
/// measurements do (by [`DECAY`] a step), down to [`PRIOR_FLOOR`]: steps that draft nothing say nothing of the
/// price, and a prior kept whole while the measured steps faded pulled a price ten times its own back towards
/// it (half of it in 200 steps), until drafting looked cheap again: a replayed run that lost 9% so loses 4%
/// (session 67).
const PRIOR_WEIGHT: f64 = 16.0;
const PRIOR_FLOOR: f64 = 1.0;
/// Each row count's sums decay by this factor per step of that count, so the fit follows a change of load.
const DECAY: f64 = 1.0 - 1.0 / 64.0;
/// Intervals longer than this many times the expected step are idle time, not cost.
const OUTLIER: f64 = 20.0;
/// Once the row count the expected step comes from (this one or the nearest measured) has this much weight, an
/// interval over [`DROP`] times the expected step is dropped (a prompt's prefill chunk, an idle gap: no step
/// of decoding costs that), and one over [`CLIP`] times counts as that much: noise only ever adds time. A row
/// count's first steps are clipped by its neighbour's: in a served run (vLLM, JSON at eight clients, session 33)
/// one prefill step of 1.3 s taken as the first step of four rows, beside four-row steps that drafted 32
/// tokens in 0.27 s, drove the pooled slope to zero, and drafting looked free for the rest of the run.
const CLIP_AFTER: f64 = 4.0;
const DROP: f64 = 4.0;
const CLIP: f64 = 1.5;
/// Row counts kept (vLLM's `max_num_seqs` is 256 by default; more rows share the last bucket).
const MAX_ROWS: usize = 1024;

/// Decayed sums of one row count's steps: weight, drafted tokens, duration (ns), their squares and product, and
/// the plain step each duration implies under the prior's share per drafted token.
#[derive(Clone, Copy, Debug, Default)]
struct Sums {
    n: f64,
    d: f64,
    y: f64,
    dd: f64,
    dy: f64,
    u: f64,
}

impl Sums {
    fn add(&mut self, d: f64, y: f64) {
        for s in [&mut self.n, &mut self.d, &mut self.y, &mut self.dd, &mut self.dy, &mut self.u] {
            *s *= DECAY;
        }
        self.n += 1.0;
        self.d += d;
        self.y += y;
        self.dd += d * d;
        self.dy += d * y;
        self.u += y / (1.0 + PRIOR_SHARE * d);
    }

    /// Spread of the drafted counts and their covariance with the duration (the within-row-count terms).
    fn centred(&self) -> (f64, f64) {
        if self.n <= 0.0 {
            return (0.0, 0.0);
        }
        (self.dd - self.d * self.d / self.n, self.dy - self.d * self.y / self.n)
    }

    /// A plain step of this row count as the prior sees it: what the steps measured imply at
    /// [`PRIOR_SHARE`] per drafted token. Unlike the fitted level it never reaches zero, however few the steps
    /// and however alike their drafted counts.
    fn plain_prior(&self) -> f64 {
        if self.n > 0.0 { self.u / self.n } else { 0.0 }
    }
}

/// Step duration as `level(rows) + slope · drafted`, learned from timed steps.
#[derive(Clone, Debug, Default)]
pub struct OnePassCost {
    /// Index r: steps of r rows (index 0 unused).
    rows: Vec<Sums>,
    /// The pooled slope as of the last step observed (None before any): refitted once per observation rather
    /// than at every price asked for, which the control does for each draft length of each sequence.
    slope: Option<f64>,
    /// Steps observed, which the prior's weight fades with.
    steps: i32,
}

impl OnePassCost {
    /// Records that a step of `rows` rows with `drafted` drafted tokens among them took `dt_ns`.
    pub fn observe(&mut self, rows: usize, drafted: usize, dt_ns: u64) {
        let r = rows.min(MAX_ROWS);
        if r == 0 || dt_ns == 0 {
            return;
        }
        let mut y = dt_ns as f64;
        // Judged against the fit, or the prior where that expects more: a fit from a few steps can expect a
        // plain step to take almost nothing, and would then drop every real one as idle time.
        let prior = self.nearest(r).map(|(m, _)| self.rows[m].plain_prior() * (1.0 + PRIOR_SHARE * drafted as f64));
        if let Some(expected) = self.ns(r, drafted).zip(prior).map(|(e, p)| e.max(p)) {
            if y > OUTLIER * expected {
                return;
            }
            if self.nearest(r).is_some_and(|(_, n)| n >= CLIP_AFTER) {
                if y > DROP * expected {
                    return;
                }
                y = y.min(CLIP * expected);
            }
        }
        if self.rows.len() <= r {
            self.rows.resize(r + 1, Sums::default());
        }
        self.rows[r].add(drafted as f64, y);
        self.steps = self.steps.saturating_add(1);
        self.slope = self.fit_slope();
    }

    /// Nanoseconds a drafted token adds to a step: the slope pooled over row counts, shrunk towards
    /// [`PRIOR_SHARE`] of the fewest rows' plain step, and never above that whole step (no token costs more to
    /// verify than a pass of its own). In a served run (vLLM, JSON at eight clients, session 35) the first two
    /// steps of eight rows drafted 27 and 24 tokens; a prior taken from their mean duration, drafts included,
    /// fitted a drafted token at 2.9 plain steps and a plain step at nearly nothing, and nothing was drafted
    /// again.
    fn fit_slope(&self) -> Option<f64> {
        let (base, _) = self.measured().next()?;
        let plain = self.rows[base].plain_prior();
        let (sxx, sxy) = self.rows.iter().map(Sums::centred).fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
        let w = (PRIOR_WEIGHT * DECAY.powi(self.steps)).max(PRIOR_FLOOR);
        Some(((sxy + w * PRIOR_SHARE * plain) / (sxx + w)).clamp(0.0, plain))
    }

    /// Row counts measured, fewest first, with their weight.
    fn measured(&self) -> impl Iterator<Item = (usize, f64)> + '_ {
        self.rows.iter().enumerate().filter(|(_, s)| s.n > 0.0).map(|(r, s)| (r, s.n))
    }

    /// The measured row count nearest `rows` (itself when measured), with its weight.
    fn nearest(&self, rows: usize) -> Option<(usize, f64)> {
        let r = rows.clamp(1, MAX_ROWS);
        self.measured().min_by_key(|&(m, _)| m.abs_diff(r))
    }

    /// Expected duration of a step of `rows` rows and `drafted` drafted tokens (None before any step). A row
    /// count never seen takes the level of the nearest one seen.
    pub fn ns(&self, rows: usize, drafted: usize) -> Option<f64> {
        let slope = self.slope?;
        let (near, _) = self.nearest(rows)?;
        let s = &self.rows[near];
        let level = (s.y - slope * s.d) / s.n;
        Some(level.max(0.0) + slope * drafted as f64)
    }

    /// Cost of a step of `rows` rows and `drafted` drafted tokens relative to one row with none (the prior's
    /// shape before any measurement).
    pub fn beta(&self, rows: usize, drafted: usize) -> f64 {
        match (self.ns(rows, drafted), self.unit_ns()) {
            (Some(c), Some(u)) if u > 0.0 => c / u,
            _ => 1.0 + PRIOR_SHARE * drafted as f64,
        }
    }

    /// Duration of a plain step of the fewest rows measured: one row's when lone requests were seen, else the
    /// nearest count's (only ratios of step costs steer drafting, so the unit only has to be one of them).
    fn unit_ns(&self) -> Option<f64> {
        let (fewest, _) = self.measured().next()?;
        self.ns(fewest, 0).filter(|&u| u > 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vLLM-like steps: 70 ms plus 15 ms per row beyond the first, 3 ms per drafted token.
    fn step_ns(rows: usize, drafted: usize) -> u64 {
        (70_000_000 + 15_000_000 * (rows - 1) + 3_000_000 * drafted) as u64
    }

    #[test]
    fn rows_and_drafted_tokens_are_told_apart() {
        let mut c = OnePassCost::default();
        assert_eq!(c.beta(1, 4), 1.0 + 4.0 * PRIOR_SHARE, "the prior before any step");
        let mut x = 7u64;
        for _ in 0..400 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let rows = [1, 6, 6, 3][(x >> 33) as usize % 4];
            let drafted = (x >> 40) as usize % (8 * rows + 1);
            c.observe(rows, drafted, step_ns(rows, drafted));
        }
        let per_token = c.beta(6, 13) - c.beta(6, 12);
        assert!((per_token - 3.0 / 70.0).abs() < 1e-3, "a drafted token adds 3 ms of a 70 ms unit: {per_token}");
        assert!((c.beta(6, 0) - 145.0 / 70.0).abs() < 0.01, "six rows: {}", c.beta(6, 0));
        assert!((c.beta(1, 0) - 1.0).abs() < 1e-9);
        // No call limit: the 17th and the 40th token cost what the others do.
        assert!((c.beta(6, 40) - c.beta(6, 16) - 24.0 * per_token).abs() < 1e-6);
        assert!((c.unit_ns().unwrap() - 70e6).abs() < 1e5);
        // A row count never seen takes the nearest one's level.
        assert_eq!(c.beta(5, 2), c.beta(6, 2));
    }

    #[test]
    fn idle_gaps_and_stalls_barely_move_the_fit() {
        let mut c = OnePassCost::default();
        for i in 0..200 {
            let drafted = i % 9;
            c.observe(6, drafted, step_ns(6, drafted));
            c.observe(1, drafted, step_ns(1, drafted));
        }
        let before = c.beta(6, 8);
        c.observe(6, 8, 1_000_000_000_000);
        assert_eq!(c.beta(6, 8), before, "an idle gap is not cost");
        for _ in 0..8 {
            c.observe(6, 0, 3 * step_ns(6, 0));
        }
        assert!(c.beta(6, 0) < 1.2 * before, "stalls count at most 1.5 times: {} {}", c.beta(6, 0), before);
        c.observe(0, 3, 5);
        c.observe(3, 3, 0);
        assert_eq!(c.measured().count(), 2, "empty steps are not steps");
    }

    #[test]
    fn a_prefill_taken_as_a_new_row_counts_first_step_leaves_the_slope_alone() {
        let mut c = OnePassCost::default();
        for i in 0..100 {
            let drafted = (i * 7) % 12;
            for _ in 0..5 {
                c.observe(5, drafted, step_ns(5, drafted));
            }
        }
        // A request left; the next step of four rows also prefilled a new prompt (1.3 s), each row timing it.
        for _ in 0..4 {
            c.observe(4, 4, 1_300_000_000);
        }
        for i in 0..12 {
            let drafted = 28 + i % 5;
            for _ in 0..4 {
                c.observe(4, drafted, step_ns(4, drafted));
            }
        }
        // Thirty drafted tokens cost what they do (90 ms on a 115 ms step), not nothing.
        let (got, want) = (c.beta(4, 30) / c.beta(4, 0), step_ns(4, 30) as f64 / step_ns(4, 0) as f64);
        assert!((got - want).abs() < 0.05, "{got} against {want}");
    }

    #[test]
    fn the_slope_is_never_negative() {
        let mut c = OnePassCost::default();
        for d in 0..40 {
            c.observe(2, d, 100_000_000 - 1_000_000 * d as u64);
        }
        assert!(c.beta(2, 20) >= c.beta(2, 0));
    }

    #[test]
    fn two_steps_that_drafted_alike_do_not_make_drafting_look_dear() {
        // Session 35's log (vLLM, Qwen2.5-Coder-0.5B, eight clients): the first steps of eight rows drafted 27 and
        // 24 tokens (236 and 211 ms, each timed by the eight rows); plain steps then took 88 ms and a drafted
        // token 5.5 ms.
        let mut c = OnePassCost::default();
        for (d, ms) in [(27, 236), (24, 211)] {
            for _ in 0..8 {
                c.observe(8, d, ms * 1_000_000);
            }
        }
        let share = |c: &OnePassCost| (c.beta(8, 8) / c.beta(8, 0) - 1.0) / 8.0;
        assert!(share(&c) < 0.2, "two steps alone: a drafted token at {} of a plain step", share(&c));
        for i in 0..60 {
            let d = [0, 0, 0, 5, 0, 12][i % 6];
            for _ in 0..8 {
                c.observe(8, d, 88_000_000 + 5_500_000 * d as u64);
            }
        }
        assert!((share(&c) - 5.5 / 88.0).abs() < 0.015, "{}", share(&c));
        assert!((c.ns(8, 0).unwrap() / 88e6 - 1.0).abs() < 0.1, "plain steps are measured, not dropped: {:?}", c.ns(8, 0));
    }

    #[test]
    fn a_plain_step_the_fit_did_not_expect_is_still_measured() {
        // Two rows: drafted tokens measured at 8 ms. Eight rows: every step so far drafted 30 tokens, so their
        // level is the pooled slope's extrapolation (13 ms), where a plain step takes 88 ms. Judged by the fit
        // alone, each plain step would be dropped as idle time, and the level never corrected.
        let mut c = OnePassCost::default();
        for i in 0..40 {
            let d = if i % 2 == 0 { 0 } else { 20 };
            c.observe(2, d, 80_000_000 + 8_000_000 * d as u64);
        }
        for _ in 0..40 {
            c.observe(8, 30, 88_000_000 + 5_500_000 * 30);
        }
        assert!(c.ns(8, 0).unwrap() < 30e6, "the fit's level: {:?}", c.ns(8, 0));
        for _ in 0..20 {
            c.observe(8, 0, 88_000_000);
        }
        assert!(c.ns(8, 0).unwrap() > 60e6, "{:?}", c.ns(8, 0));
    }
}
