//! Verify cost β: what a step that verifies m tokens costs against a plain one-token step, learned from the
//! server's step durations, from a prior where nothing is measured yet. [`super::control`] prices drafts by it.

use super::mean::{clipped_average, CLIP, CLIP_AFTER, EMA_SAMPLES};
use super::onepass::OnePassCost;
use super::step::{passes, Layout, CALL_MAX, MAX_DRAFT};

/// β(m) for m tokens verified (logits at every position) on the 2-core target machine, Qwen2.5-Coder-1.5B
/// Q4_K_M with patches 0001–0011: the second token costs 0.45 of a step, the next ones about 0.28 up to 8
/// and 0.3 past it. That is the dear end of what was measured (docs/batch-invariance.md: β(2, 8, 16) = 1.41,
/// 3.09, 5.48 over 9 rounds of the C bench; 1.33, 2.82, 4.90 in the served bench of session 22). A prior
/// copied from one table kept its bumps, and β(5) − β(4) = 0.19 once made a token added to a shared call
/// (`-np 4`) look nearly free, so it is three straight pieces. It is only where learning starts: lengths
/// that are drafted get measured, the others follow the measured ones.
pub const DEFAULT_BETA_PRIOR: &[(u32, f32)] = &[(1, 1.0), (2, 1.45), (8, 3.1), (16, 5.5)];

/// Pseudo-samples the prior is worth against measurements in each bucket.
const PRIOR_WEIGHT: f64 = 4.0;
/// Once a bucket is past its warm-up, β is refitted every this many observations (it moves
/// slowly, and refitting every step was a fifth of the drafter's time).
const REFIT_EVERY: u32 = 8;
/// Intervals longer than this many times the expected step are idle time, not cost.
const OUTLIER: f64 = 20.0;

const BUCKETS: usize = MAX_DRAFT + 2;
/// How far a multi-pass step's measured log cost ratio may sit above its running mean (noise only adds time).
const LOG_CLIP: f64 = 0.405; // ln 1.5
/// Steps of one pass in a row after which a fit of several-pass steps is stale, and what it keeps of its log ratio
/// at each one after that: it wears back toward its prior (a ratio of 1). Only drafts make steps of several passes,
/// so a fit that a few slow steps lifted past where no draft pays is never measured again: at `-np 4` two drafting
/// steps taken while the machine slowed lifted it from 1.004 to 1.097, where beside three slots even a sure draft
/// gains less than the fairness rule asks, and nothing was drafted for the next 2,100 steps of the round (session
/// 73, answers of up to 256 tokens; at 64 the turnover of requests broke it after 130 steps). Stale after 128
/// steps, a 10% excess wears below 7.5% within 30 more, and the drafts then made measure the fit again.
const STALE: u32 = 128;
const WEAR: f64 = 0.99;
/// Steps of several passes a learned layout rests on. One told it once: at `-np 4` the first several-pass step
/// timed in a round (85 ms for 1-1-1-2, against 64 for a plain step) sat closer to the split sum of its passes
/// than to one call. Priced as split, no draft paid beside three slots, so no step of several passes came to
/// say otherwise, and the round drafted 78 tokens in 1,386 steps where its neighbours drafted 2,500 (session 74).
const LAYOUT_AFTER: u32 = 4;

/// Verify cost β(m) relative to a plain one-token step, learned from step durations.
#[derive(Clone, Debug)]
pub struct BetaModel {
    prior: [f64; BUCKETS],
    mean_ns: [f64; BUCKETS],
    samples: [u32; BUCKETS],
    observations: u32,
    /// Current estimate, index m = tokens verified (index 0 unused).
    beta: [f64; BUCKETS],
    /// Steps of several forward passes (`-np > 1`), fitted under each [`Layout`]: how their measured duration
    /// compares with what their passes' buckets add up to. The layout that fits better is llama-server's.
    fits: [PassFit; 2],
    /// The layout given by the user (`kv=`), or None to take the one that fits.
    forced: Option<Layout>,
    /// Under [`Layout::OnePass`] (vLLM) steps of several rows are timed by rows and drafted tokens; a row alone
    /// keeps the table, which follows the bumps of one row's cost (measured at one client: drafts of up to four
    /// tokens cost nothing there, where one line through rows and lengths said 6% a token).
    one_pass: Option<OnePassCost>,
}

/// Steps of several passes under one [`Layout`]: running mean of ln(measured / sum of the passes' β) and of its
/// square. The mean scales the sum (β measured per pass size, not per pass mix); the square says how well the
/// layout explains the steps at all.
#[derive(Clone, Copy, Debug, Default)]
struct PassFit {
    log_ratio: f64,
    log_sq: f64,
    samples: u32,
    /// Steps of one pass since the last of several.
    unmeasured: u32,
}

impl PassFit {
    fn add(&mut self, x: f64) {
        let x = if self.samples >= CLIP_AFTER { x.min(self.log_ratio + LOG_CLIP) } else { x };
        self.samples = self.samples.saturating_add(1);
        self.unmeasured = 0;
        let w = f64::from(self.samples.min(EMA_SAMPLES)) + PRIOR_WEIGHT;
        self.log_ratio += (x - self.log_ratio) / w;
        self.log_sq += (x * x - self.log_sq) / w;
    }

    /// A step of one pass: nothing to fit, and past [`STALE`] of them the ratio wears toward its prior.
    fn idle(&mut self) {
        self.unmeasured = self.unmeasured.saturating_add(1);
        if self.unmeasured > STALE {
            self.log_ratio *= WEAR;
        }
    }
}

/// The fit of a llama-server layout (a one-pass model's steps are timed by [`OnePassCost`], never fitted).
fn index(layout: Layout) -> usize {
    match layout {
        Layout::Split => 0,
        Layout::Unified | Layout::OnePass => 1,
    }
}

impl BetaModel {
    /// `prior` points (tokens verified, β) must include m = 1; missing buckets are interpolated.
    pub fn new(prior: &[(u32, f32)]) -> BetaModel {
        let mut pts: Vec<(f64, f64)> = prior
            .iter()
            .map(|&(m, b)| (f64::from(m), f64::from(b)))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut table = [1.0; BUCKETS];
        for (m, slot) in table.iter_mut().enumerate().skip(1) {
            *slot = interpolate(&pts, m as f64).max(1.0);
        }
        table[1] = 1.0;
        BetaModel {
            prior: table,
            mean_ns: [0.0; BUCKETS],
            samples: [0; BUCKETS],
            observations: 0,
            beta: table,
            fits: [PassFit::default(); 2],
            forced: None,
            one_pass: None,
        }
    }

    /// Takes `layout` as the server's instead of learning it.
    pub fn with_layout(mut self, layout: Option<Layout>) -> BetaModel {
        self.forced = layout;
        self.one_pass = (layout == Some(Layout::OnePass)).then(OnePassCost::default);
        self
    }

    /// How llama-server cuts a step into passes: as given, or the layout whose predictions of the multi-pass
    /// steps seen so far were closer (one pass per call until told otherwise: patch 0014 makes a call of
    /// unequal slots one pass; a llama.cpp without it, or with `LLAMA_KV_RAGGED_MAX=0`, is learned as split).
    /// Told only by [`LAYOUT_AFTER`] such steps, and not by a stale fit: priced as split, no draft pays beside
    /// three slots, so a split layout is never measured again once taken.
    pub fn layout(&self) -> Layout {
        let [split, unified] = &self.fits;
        let told = split.samples.min(unified.samples) >= LAYOUT_AFTER && unified.unmeasured <= STALE;
        self.forced.unwrap_or(if told && split.log_sq < unified.log_sq { Layout::Split } else { Layout::Unified })
    }

    /// β of a step in which slot `j < n` verifies `tokens(j)`: one pass is its bucket; several are the sum of theirs,
    /// scaled by what such steps were measured to take against that sum (never below the dearest pass). So is one
    /// pass of slots with unequal tokens (patch 0014): the buckets are measured on passes of equal slots, and an
    /// unequal pass also pads the attention of every stream to its longest run.
    pub fn step(&self, n: usize, tokens: impl Fn(usize) -> usize) -> f64 {
        if let Some(op) = &self.one_pass {
            let (rows, drafted) = rows_drafted((0..n).map(&tokens));
            return match rows {
                0 => 1.0,
                1 => self.beta((0..n).map(tokens).sum()),
                _ => op.beta(rows, drafted),
            };
        }
        let layout = self.layout();
        let (mut count, mut sum, mut dearest) = (0, 0.0, 0.0f64);
        passes(n, &tokens, layout, |t| {
            let b = self.beta(t);
            count += 1;
            sum += b;
            dearest = dearest.max(b);
        });
        // A bucket measures steps that are one pass under both layouts (`observe_step`); one that the split
        // layout takes as several is measured against its sum, as steps of several passes are.
        let one_pass_either_way = || {
            let mut split = 0;
            passes(n, &tokens, Layout::Split, |_| split += 1);
            split == 1
        };
        match count {
            0 => 1.0,
            1 if layout == Layout::Split || one_pass_either_way() => sum,
            _ => (self.fits[index(layout)].log_ratio.exp() * sum).max(dearest),
        }
    }

    /// Expected duration (ns) of a step in which slot `j < n` verifies `tokens(j)` (None before a unit is known).
    /// A step of several rows in one pass has its own clock ([`OnePassCost::ns`]): its β is relative to the
    /// fewest rows it measured, not to this table's one-row unit.
    pub fn step_ns(&self, n: usize, tokens: impl Fn(usize) -> usize) -> Option<f64> {
        if let Some(op) = &self.one_pass {
            let (rows, drafted) = rows_drafted((0..n).map(&tokens));
            if rows > 1 {
                return op.ns(rows, drafted);
            }
        }
        Some(self.unit_ns()? * self.step(n, tokens))
    }

    /// β for `verified` tokens (1 = plain step). Past [`CALL_MAX`] tokens llama-server splits the batch into
    /// calls of at most that many (patch 0004), each paying its own fixed cost: their sum, scaled by what such steps
    /// were measured to take against it. Under [`Layout::OnePass`] there is no call limit.
    #[inline]
    pub fn beta(&self, verified: usize) -> f64 {
        let v = verified.max(1);
        if self.one_pass.is_some() {
            return self.beta[v.min(BUCKETS - 1)];
        }
        if v <= CALL_MAX {
            return self.beta[v];
        }
        // Never below one whole call: a measured ratio under 1 must not make a 17th token look like a saving.
        (self.fits[index(self.layout())].log_ratio.exp() * self.calls_beta(v)).max(self.beta[CALL_MAX])
    }

    /// β of `v` > [`CALL_MAX`] tokens as the sum of its calls' (patch 0004 splits a step into calls of at most
    /// [`CALL_MAX`]).
    fn calls_beta(&self, v: usize) -> f64 {
        let (calls, rest) = (v / CALL_MAX, v % CALL_MAX);
        calls as f64 * self.beta[CALL_MAX] + if rest > 0 { self.beta[rest] } else { 0.0 }
    }

    /// Current table: element g is β(g + 1), the cost of a step verifying g drafted tokens.
    pub fn table(&self) -> [f32; MAX_DRAFT + 1] {
        std::array::from_fn(|g| self.beta(g + 1) as f32)
    }

    /// Records that a step in which slot j verified `tokens[j]` took `dt_ns`. A step of one pass (under either
    /// layout) measures its bucket; one of several passes measures how each layout's sum of passes fits it. Under
    /// [`Layout::OnePass`] a step of one row measures its bucket, one of several the rows' fit.
    pub fn observe_step(&mut self, tokens: &[usize], dt_ns: u64) {
        if let Some(op) = &mut self.one_pass {
            match rows_drafted(tokens.iter().copied()) {
                (0, _) => {}
                (1, drafted) => self.observe(drafted + 1, dt_ns),
                (rows, drafted) => op.observe(rows, drafted, dt_ns),
            }
            return;
        }
        let mut fit = [(0usize, 0.0f64, 0usize); 2]; // (passes, sum of β, tokens of the last pass)
        for layout in [Layout::Split, Layout::Unified] {
            let f = &mut fit[index(layout)];
            passes(tokens.len(), |j| tokens[j], layout, |t| {
                *f = (f.0 + 1, f.1 + self.beta(t), t);
            });
        }
        match fit {
            [(0, ..), _] => {}
            [(1, _, t), (1, ..)] => {
                self.fits.iter_mut().for_each(PassFit::idle);
                self.observe(t, dt_ns);
            }
            _ => {
                let Some(unit) = self.unit_ns() else { return };
                for (f, (_, sum, _)) in self.fits.iter_mut().zip(fit) {
                    let ratio = dt_ns as f64 / (unit * sum);
                    if ratio > 0.0 && ratio <= OUTLIER {
                        f.add(ratio.ln());
                    }
                }
            }
        }
    }

    /// Records that one pass verifying `verified` tokens (a sequence alone) took `dt_ns`.
    pub fn observe(&mut self, verified: usize, dt_ns: u64) {
        if verified >= BUCKETS || (verified > CALL_MAX && self.one_pass.is_none()) {
            return;
        }
        let m = verified.max(1);
        let dt = dt_ns as f64;
        if let Some(unit) = self.unit_ns() {
            if dt > OUTLIER * self.beta[m] * unit {
                return;
            }
        }
        if dt <= 0.0 {
            return;
        }
        // The plain step is every β's denominator. At `-np 8` a slot alone at one token is rare, and the first
        // such interval set it whole: one of 323 ms (a stall, twice a step of all eight at one token) made
        // every β 1 and every step cost the same, so the drafter drafted as if tokens were free for the rest of
        // the round (session 53, 304 of 441 steps). Its samples are held to what the unit is taken to be so far,
        // as a bucket's later samples are to its mean.
        let dt = match (m, self.unit_ns()) {
            (1, Some(unit)) => dt.min(CLIP * unit),
            _ => dt,
        };
        clipped_average(&mut self.mean_ns[m], &mut self.samples[m], dt, 0.0);
        self.observations = self.observations.wrapping_add(1);
        if self.samples[m] <= EMA_SAMPLES || self.observations.is_multiple_of(REFIT_EVERY) {
            self.refit();
        }
    }

    /// Steps of one pass timed so far.
    #[cfg(test)]
    pub(super) fn observations(&self) -> u32 {
        self.observations
    }

    /// Duration of a plain step: measured, or inferred from other buckets through the prior.
    pub fn unit_ns(&self) -> Option<f64> {
        if self.samples[1] > 0 {
            return Some(self.mean_ns[1]);
        }
        let (mut num, mut den) = (0.0, 0.0);
        for m in 2..BUCKETS {
            let s = f64::from(self.samples[m]);
            num += s * self.mean_ns[m] / self.prior[m];
            den += s;
        }
        (den > 0.0).then(|| num / den)
    }

    /// Measured buckets blend ratio and prior; unmeasured ones follow the prior's shape, scaled
    /// by how far measurements sit from it. The result is kept non-decreasing and ≥ 1.
    fn refit(&mut self) {
        let Some(unit) = self.unit_ns() else { return };
        let (mut num, mut den) = (PRIOR_WEIGHT, PRIOR_WEIGHT);
        for m in 2..BUCKETS {
            if self.samples[m] > 0 && self.prior[m] > 1.0 {
                let s = f64::from(self.samples[m]);
                num += s * (self.mean_ns[m] / unit - 1.0) / (self.prior[m] - 1.0);
                den += s;
            }
        }
        let scale = (num / den).max(0.0);
        self.beta[1] = 1.0;
        for m in 2..BUCKETS {
            let shaped = 1.0 + (self.prior[m] - 1.0) * scale;
            let s = f64::from(self.samples[m]);
            let est = (s * self.mean_ns[m] / unit + PRIOR_WEIGHT * shaped) / (s + PRIOR_WEIGHT);
            self.beta[m] = est.max(self.beta[m - 1]);
        }
    }
}

/// Rows that verify something, and the tokens they draft (all but the one each samples anyway).
fn rows_drafted(tokens: impl Iterator<Item = usize>) -> (usize, usize) {
    tokens.filter(|&t| t > 0).fold((0, 0), |(r, d), t| (r + 1, d + t - 1))
}

fn interpolate(pts: &[(f64, f64)], x: f64) -> f64 {
    match pts {
        [] => 1.0,
        [(_, y)] => *y,
        _ => {
            let i = pts
                .windows(2)
                .position(|w| x <= w[1].0)
                .unwrap_or(pts.len() - 2);
            let ((x0, y0), (x1, y1)) = (pts[i], pts[i + 1]);
            y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        }
    }
}

/// The start of session 74's round that stopped drafting at `-np 4`, as its step log timed it (tokens a slot, µs):
/// drafting steps before a unit was known, the first plain step, then one slow drafting step.
#[cfg(test)]
pub(super) const ROUND_START_S74: [(&[usize], u64); 9] = [
    (&[1, 1, 1, 4], 95_818),
    (&[1, 1, 1, 3], 87_462),
    (&[3, 1, 1, 1], 85_229),
    (&[3, 1, 1, 1], 79_458),
    (&[2, 3, 1, 1], 96_213),
    (&[1, 1, 1, 2], 71_691),
    (&[1, 1, 1, 1], 64_154),
    (&[1, 1, 1, 2], 85_346),
    (&[1, 1, 1, 1], 63_098),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prior_interpolates() {
        let b = BetaModel::new(DEFAULT_BETA_PRIOR);
        assert_eq!(b.beta(1), 1.0);
        assert!((b.beta(2) - 1.45).abs() < 1e-6);
        assert!((b.beta(5) - 2.275).abs() < 1e-6);
        assert!((b.beta(12) - 4.3).abs() < 1e-6);
        assert!(b.beta(17) > b.beta(16));
    }

    #[test]
    fn measurements_move_beta() {
        let mut b = BetaModel::new(DEFAULT_BETA_PRIOR);
        for _ in 0..40 {
            b.observe(1, 50_000_000);
            b.observe(2, 150_000_000);
        }
        assert!(b.beta(2) > 2.7, "measured 3.0, got {}", b.beta(2));
        assert!(
            b.beta(3) > 3.0,
            "unmeasured buckets follow, got {}",
            b.beta(3)
        );
        b.observe(1, 50_000_000_000);
        assert!(b.beta(2) > 2.7, "idle gaps are ignored");
    }

    #[test]
    fn a_stall_as_the_first_plain_step_does_not_set_the_unit() {
        // Eight slots at one token (one pass of 8) for a while, then the first step of a slot alone stalls.
        const MS: u64 = 1_000_000;
        let mut b = BetaModel::new(DEFAULT_BETA_PRIOR);
        for _ in 0..100 {
            b.observe(8, 140 * MS);
        }
        let unit = b.unit_ns().unwrap();
        assert!((unit / 1e6 - 140.0 / 3.1).abs() < 1.0, "inferred through the prior: {unit}");
        b.observe(1, 323 * MS);
        assert!(b.beta(8) > 2.0, "β(8) = {}", b.beta(8));
        assert!(b.beta(9) > b.beta(8), "a ninth token still costs: {:?}", b.table());
        // A lasting change is still followed, one sample at a time.
        for _ in 0..12 {
            b.observe(1, 90 * MS);
        }
        assert!(b.unit_ns().unwrap() > 85.0 * 1e6, "{:?}", b.unit_ns());
    }

    #[test]
    fn stalls_count_little_and_a_lasting_change_is_followed() {
        // A step of 2 tokens costs 1.6 plain steps, but one in eight of them stalls to 4× its time; plain
        // steps happened not to stall. Unclipped, β(2) would be measured near 2.2.
        let run = |b: &mut BetaModel, unit: u64, steps: usize| {
            for i in 0..steps {
                b.observe(1, unit);
                b.observe(2, unit * 16 / 10 * if i % 8 == 3 { 4 } else { 1 });
            }
        };
        let mut b = BetaModel::new(&[(1, 1.0), (2, 1.3), (16, 8.0)]);
        run(&mut b, 10_000_000, 200);
        assert!(b.beta(2) > 1.55 && b.beta(2) < 1.8, "β(2) = {}", b.beta(2));
        // The machine becomes twice as slow for good, plain steps and verifies alike: followed within 40 steps.
        run(&mut b, 20_000_000, 40);
        assert!(b.unit_ns().unwrap() > 19_000_000.0 && b.beta(2) > 1.55 && b.beta(2) < 1.8, "{:?} {}", b.unit_ns(), b.beta(2));
    }

    /// Steps of `shape` that take `cost(passes)` plain steps of 10 ms, with one-pass steps of 4 slots between.
    fn serve(b: &mut BetaModel, shapes: &[&[usize]], cost: impl Fn(&[usize]) -> f64) {
        let unit = 10_000_000.0;
        for _ in 0..40 {
            b.observe_step(&[1], unit as u64);
            b.observe_step(&[1, 1, 1, 1], (unit * b.beta(4)) as u64);
            for s in shapes {
                b.observe_step(s, (unit * cost(s)) as u64);
            }
        }
    }

    #[test]
    fn a_fit_that_stopped_every_draft_wears_off_so_that_drafts_measure_it_again() {
        use crate::draft::control::{best_length, Verify};
        use crate::draft::step::Shared;
        // `-np 4`, one pass per call (patch 0014): plain steps of four slots at 100 ms, and steps in which one slot
        // verifies three tokens beside the others, at the price of their pass.
        let mut b = BetaModel::new(DEFAULT_BETA_PRIOR).with_layout(Some(Layout::Unified));
        let plain_ns = 100_000_000;
        let drafting = [1, 1, 1, 3];
        let price = |b: &BetaModel| b.step_ns(4, |j| drafting[j]).unwrap();
        let at4 = Shared { tokens: &[0, 1, 1, 1], seq: 0, expected: 3.0 };
        // The longest sure draft that pays beside three slots under the fairness rule the drafter serves with.
        let sure = |b: &BetaModel| best_length(&[1.0; 15], &Verify::new(b, &at4).fair(0.1), &[], 1.05);
        for _ in 0..20 {
            b.observe_step(&[1, 1, 1, 1], plain_ns);
            let p = price(&b);
            b.observe_step(&drafting, p as u64);
        }
        assert!(sure(&b) > 0);
        // Six drafting steps while the machine slowed, at 1.5 times their price: no draft pays any more, so no step
        // of several passes comes to measure the fit again.
        for _ in 0..6 {
            let p = price(&b);
            b.observe_step(&drafting, (1.5 * p) as u64);
        }
        assert_eq!(sure(&b), 0);
        let trapped = price(&b);
        for _ in 0..STALE {
            b.observe_step(&[1, 1, 1, 1], plain_ns);
        }
        assert_eq!(price(&b), trapped, "drafts a few steps apart keep the fit as measured: it wears off only when stale");
        for _ in 0..100 {
            b.observe_step(&[1, 1, 1, 1], plain_ns);
        }
        assert!(sure(&b) > 0, "stale, it wears back toward its prior until drafts pay and measure it again");
        let prior = BetaModel::new(DEFAULT_BETA_PRIOR).with_layout(Some(Layout::Unified));
        assert!(b.step(4, |j| drafting[j]) >= prior.step(4, |j| drafting[j]), "toward its prior, not past it");
    }

    /// The sum of β over the passes `layout` cuts step `s` into.
    fn sum(b: &BetaModel, layout: Layout, s: &[usize]) -> f64 {
        let mut c = 0.0;
        passes(s.len(), |j| s[j], layout, |t| c += b.beta(t));
        c
    }

    #[test]
    fn multi_pass_steps_teach_the_layout_and_their_ratio() {
        let shapes: [&[usize]; 4] = [&[2, 1, 1, 1], &[3, 1, 3, 1], &[1, 0, 1, 1], &[4, 4, 2, 2]];
        let prior = BetaModel::new(DEFAULT_BETA_PRIOR);
        // A server with a KV stream per slot whose multi-pass steps take 0.9 of their passes' sum.
        let mut b = BetaModel::new(DEFAULT_BETA_PRIOR);
        assert_eq!(b.layout(), Layout::Unified, "until measured: one pass per call (patch 0014)");
        let before = b.step(4, |j| [2, 1, 1, 1][j]);
        b.observe_step(&[2, 1, 1, 1], 1_000_000_000);
        assert_eq!(b.step(4, |j| [2, 1, 1, 1][j]), before, "no plain step measured yet: nothing to scale by");
        serve(&mut b, &shapes, |s| 0.9 * sum(&prior, Layout::Split, s));
        assert_eq!(b.layout(), Layout::Split);
        let r = b.step(4, |j| [2, 1, 1, 1][j]) / sum(&b, Layout::Split, &[2, 1, 1, 1]);
        assert!((r - 0.9).abs() < 0.02, "ratio {r}");
        let r3 = b.step(4, |j| [3, 1, 3, 1][j]) / sum(&b, Layout::Split, &[3, 1, 3, 1]);
        assert!((r3 - r).abs() < 1e-12, "every multi-pass step is scaled alike");
        let known = b.step(4, |j| [2, 1, 1, 1][j]);
        b.observe_step(&[2, 1, 1, 1], 10_000_000_000_000);
        assert_eq!(b.step(4, |j| [2, 1, 1, 1][j]), known, "idle time is not cost");
        // A unified KV cache (-kvu): the same steps take what one call of their tokens takes.
        let mut u = BetaModel::new(DEFAULT_BETA_PRIOR);
        serve(&mut u, &shapes, |s| sum(&prior, Layout::Unified, s));
        assert_eq!(u.layout(), Layout::Unified);
        let r = u.step(4, |j| [2, 1, 1, 1][j]) / u.beta(5);
        assert!((r - 1.0).abs() < 0.02, "one call of its tokens: {r}");
        // One pass per call whose unequal steps take 1.5 of their bucket (patch 0014 pads every stream to the
        // longest run): those are priced as measured, steps of equal slots by their bucket.
        let mut p = BetaModel::new(DEFAULT_BETA_PRIOR).with_layout(Some(Layout::Unified));
        serve(&mut p, &shapes, |s| {
            let c = sum(&prior, Layout::Unified, s);
            if s.iter().all(|&t| t == s[0]) { c } else { 1.5 * c }
        });
        let r = p.step(4, |j| [2, 1, 1, 1][j]) / p.beta(5);
        assert!((r - 1.5).abs() < 0.05, "an unequal pass as measured: {r}");
        assert_eq!(p.step(4, |j| [2, 2, 2, 2][j]), p.beta(8), "an equal pass is its bucket");
        // Told the layout, the model keeps it whatever the steps say.
        let mut f = BetaModel::new(DEFAULT_BETA_PRIOR).with_layout(Some(Layout::Split));
        serve(&mut f, &shapes, |s| sum(&prior, Layout::Unified, s));
        assert_eq!(f.layout(), Layout::Split);
    }

    #[test]
    fn one_step_does_not_tell_the_layout_and_a_stale_one_is_not_kept() {
        let mut b = BetaModel::new(DEFAULT_BETA_PRIOR);
        for (tokens, us) in ROUND_START_S74 {
            b.observe_step(tokens, us * 1000);
        }
        assert!(b.fits[0].log_sq < b.fits[1].log_sq, "its one several-pass step sat nearer the split sum");
        assert_eq!(b.layout(), Layout::Unified, "one step does not tell");
        // Steps that take their split sum tell it, by LAYOUT_AFTER of them.
        let unit = b.unit_ns().unwrap();
        let split = |b: &BetaModel| (unit * sum(b, Layout::Split, &[2, 1, 1, 1])) as u64;
        for _ in 1..LAYOUT_AFTER - 1 {
            b.observe_step(&[2, 1, 1, 1], split(&b));
        }
        assert_eq!(b.layout(), Layout::Unified);
        b.observe_step(&[2, 1, 1, 1], split(&b));
        assert_eq!(b.layout(), Layout::Split);
        // Taken as split nothing is drafted beside three slots; stale, the layout is one call again until steps of
        // several passes are measured anew.
        for _ in 0..=STALE {
            b.observe_step(&[1, 1, 1, 1], (unit * b.beta(4)) as u64);
        }
        assert_eq!(b.layout(), Layout::Unified);
        b.observe_step(&[2, 1, 1, 1], split(&b));
        assert_eq!(b.layout(), Layout::Split, "measured again, the evidence stands");
    }
}
