//! The gate's unit on [`super::gate::Clock::PlainSteps`]: what a plain step (every generating slot one token,
//! nothing drafted) takes now, per number of slots and at the step's context. A step reads attention over every
//! cell its slots hold, so its time grows with their context: served alone, SmolLM2-135M's plain steps took 9.6 ms
//! at the start of an answer and 12.1 ms 300 tokens into it. A unit that only followed recent plain steps lagged
//! behind both moves: when a request began the unit was still the last answer's end, and windows of not drafting
//! in which a request began read 1.048 tokens a slot per plain step against 0.988 in the others (`-np 1`, MT-Bench,
//! 51 windows), three times the gate's margin; while an answer grew, the arm whose steps were rarely plain (drafting)
//! was timed against an older unit than the other. So each number of slots keeps a running mean of its plain steps'
//! time and context, and one slope over all of them says what a context token adds (the cells a step reads, however
//! many slots hold them); a step is priced at its own context.

use super::mean::{CLIP, CLIP_AFTER, EMA_SAMPLES};

/// A slope's evidence decays by this share a plain step: it changes with the machine far more slowly than the
/// steps' level does (the running means follow that, over [`EMA_SAMPLES`] steps).
const SLOPE_DECAY: f64 = 1.0 / 256.0;
/// Until this much spread of context (squared tokens, over the decayed steps) is seen, the slope is pulled toward
/// none: 4 steps 32 tokens from their mean. Steps of one context say nothing of what another costs.
const SLOPE_PRIOR: f64 = 4.0 * 32.0 * 32.0;

/// Plain steps of one number of slots: mean wall time (ns) and context (cells), and how many were measured.
#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    ns: f64,
    ctx: f64,
    n: u32,
}

impl Bucket {
    /// The time of a plain step of this many slots at `ctx` cells, at `slope` ns a cell.
    fn at(&self, ctx: f64, slope: f64) -> f64 {
        // Never below half the mean: a slope learned on other contexts must not price a step at nothing.
        (self.ns + slope * (ctx - self.ctx)).max(0.5 * self.ns)
    }
}

/// Measured plain steps, and the β model's prices corrected by them for numbers of slots not yet measured.
#[derive(Clone, Debug, Default)]
pub(super) struct PlainSteps {
    buckets: Vec<Bucket>,
    /// Decayed sums of context's and time's deviations from their bucket's means: products, and squares of the first.
    sxy: f64,
    sxx: f64,
    /// Whether the slope is learned at all (off: a step is priced at its bucket's mean, whatever its context).
    by_context: bool,
    /// Plain steps' wall time over the β model's price, and how many were measured.
    priced: (f64, u32),
}

impl PlainSteps {
    pub(super) fn new(by_context: bool) -> PlainSteps {
        PlainSteps { by_context, ..PlainSteps::default() }
    }

    /// Nanoseconds a cell of context adds to a step (never negative: more cells are never read faster).
    pub(super) fn slope(&self) -> f64 {
        if self.by_context && self.sxx > 0.0 {
            (self.sxy / (self.sxx + SLOPE_PRIOR)).max(0.0)
        } else {
            0.0
        }
    }

    /// A plain step of `slots` slots holding `ctx` cells: measured, else the β model's `price` (ns) corrected by what
    /// plain steps measured against it.
    pub(super) fn unit_ns(&self, slots: usize, ctx: usize, price: Option<f64>) -> Option<f64> {
        let measured = self.buckets.get(slots).filter(|b| b.n > 0).map(|b| b.at(ctx as f64, self.slope()));
        measured.or_else(|| price.map(|p| if self.priced.1 > 0 { p * self.priced.0 } else { p }))
    }

    /// A plain step of `slots` slots holding `ctx` cells took `wall_ns`; the β model priced it at `price`.
    pub(super) fn learn(&mut self, slots: usize, ctx: usize, wall_ns: f64, price: Option<f64>) {
        if self.buckets.len() <= slots {
            self.buckets.resize(slots + 1, Bucket::default());
        }
        let slope = self.slope();
        let b = &mut self.buckets[slots];
        let ctx = ctx as f64;
        // Noise only ever adds time: once warm, a step counts at most CLIP times its unit (as `mean::clipped_average`).
        let y = if b.n >= CLIP_AFTER { wall_ns.min(CLIP * b.at(ctx, slope)) } else { wall_ns };
        if b.n > 0 && self.by_context {
            let (dx, dy) = (ctx - b.ctx, y - b.ns);
            self.sxy = self.sxy * (1.0 - SLOPE_DECAY) + dx * dy;
            self.sxx = self.sxx * (1.0 - SLOPE_DECAY) + dx * dx;
        }
        b.n = b.n.saturating_add(1);
        let w = 1.0 / f64::from(b.n.min(EMA_SAMPLES));
        b.ns += w * (y - b.ns);
        b.ctx += w * (ctx - b.ctx);
        if let Some(p) = price {
            super::mean::clipped_average(&mut self.priced.0, &mut self.priced.1, wall_ns / p, 0.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain steps of one slot through answers of `len` tokens from a context of `start` cells: 9.6 ms plus 12.5 µs a
    /// cell (SmolLM2-135M alone, as measured), each step up to `jitter` of it slower.
    fn answers(p: &mut PlainSteps, n: usize, start: usize, len: usize, jitter: f64) {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..n {
            for t in 0..len {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let ctx = start + t;
                let ns = (9.6e6 + 12.5e3 * ctx as f64) * (1.0 + jitter * (seed % 1000) as f64 / 1000.0);
                p.learn(1, ctx, ns, None);
            }
        }
    }

    #[test]
    fn a_step_is_priced_at_its_own_context() {
        let mut p = PlainSteps::new(true);
        answers(&mut p, 4, 50, 400, 0.0);
        assert!((p.slope() - 12.5e3).abs() < 0.5e3, "learned {} ns a cell", p.slope());
        // The answer just ended at 449 cells; the next begins at 50.
        let begun = p.unit_ns(1, 50, None).unwrap();
        assert!((begun / (9.6e6 + 12.5e3 * 50.0) - 1.0).abs() < 0.02, "{begun}");
        // The running mean alone prices it at the last answer's end: 30% dear.
        let mut mean = PlainSteps::new(false);
        answers(&mut mean, 4, 50, 400, 0.0);
        let stale = mean.unit_ns(1, 50, None).unwrap();
        assert!(stale / (9.6e6 + 12.5e3 * 50.0) > 1.25, "{stale}");
        assert_eq!(mean.slope(), 0.0);
    }

    #[test]
    fn jitter_neither_makes_a_slope_nor_unlearns_one() {
        // One context, noisy steps: no spread of context, no slope.
        let mut flat = PlainSteps::new(true);
        for _ in 0..400 {
            flat.learn(1, 200, 11e6, None);
            flat.learn(1, 200, 13e6, None);
        }
        assert_eq!(flat.slope(), 0.0, "no context spread");
        // Noisy answers (up to 20% slower a step) still give about the slope the cells cost, and stalls do not lift it.
        let mut p = PlainSteps::new(true);
        answers(&mut p, 6, 50, 400, 0.2);
        for _ in 0..3 {
            p.learn(1, 449, 80e6, None);
        }
        let s = p.slope();
        assert!(s > 10e3 && s < 16e3, "{s} ns a cell");
    }

    #[test]
    fn slots_not_yet_measured_take_the_corrected_price() {
        let mut p = PlainSteps::new(true);
        assert_eq!(p.unit_ns(2, 100, Some(20e6)), Some(20e6), "nothing measured: the price");
        p.learn(1, 100, 12e6, Some(10e6));
        assert_eq!(p.unit_ns(2, 100, Some(20e6)), Some(24e6), "plain steps measured 1.2 times their price");
        assert_eq!(p.unit_ns(1, 100, Some(20e6)), Some(12e6), "measured");
        assert_eq!(p.unit_ns(3, 100, None), None);
    }
}
