//! Break-even control: choose the draft length from measured verify cost β and acceptance.
//!
//! A verify step over γ drafted tokens costs β(γ+1) plain steps and yields
//! E(γ) = 1 + p₁ + p₁p₂ + … + p₁…p_γ tokens, where pᵢ is the chance that drafted token i is
//! accepted given the ones before it were. The drafter picks γ maximising E(γ) / (β(γ+1) + d);
//! γ = 0 (score 1) means drafting does not pay. d is the drafter's own cost: zero for pack and n-gram
//! lookups, one draft-model step (measured) for each token a draft model proposes.

/// Longest draft the drafter will ever propose.
pub const MAX_DRAFT: usize = 16;

/// β(m) for m tokens verified, measured with llama-batched-bench on the 2-core target machine
/// (Qwen2.5-Coder-1.5B Q4_K_M; docs/method.md). Linear in between, extrapolated past the end.
pub const DEFAULT_BETA_PRIOR: &[(u32, f32)] = &[
    (1, 1.0),
    (2, 1.55),
    (3, 2.2),
    (4, 2.9),
    (5, 3.9),
    (8, 6.3),
    (16, 8.0),
];

/// Pseudo-samples the prior is worth against measurements in each bucket.
const PRIOR_WEIGHT: f64 = 4.0;
/// After this many samples a bucket's mean becomes an exponential moving average.
const EMA_SAMPLES: u32 = 16;
/// Once a bucket is past its warm-up, β is refitted every this many observations (it moves
/// slowly, and refitting every step was a fifth of the drafter's time).
const REFIT_EVERY: u32 = 8;
/// Intervals longer than this many times the expected step are idle time, not cost.
const OUTLIER: f64 = 20.0;

const BUCKETS: usize = MAX_DRAFT + 2;

/// Verify cost β(m) relative to a plain one-token step, learned from step durations.
#[derive(Clone, Debug)]
pub struct BetaModel {
    prior: [f64; BUCKETS],
    mean_ns: [f64; BUCKETS],
    samples: [u32; BUCKETS],
    observations: u32,
    /// Current estimate, index m = tokens verified (index 0 unused).
    beta: [f64; BUCKETS],
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
        }
    }

    /// β for `verified` tokens (1 = plain step).
    #[inline]
    pub fn beta(&self, verified: usize) -> f64 {
        self.beta[verified.clamp(1, BUCKETS - 1)]
    }

    /// Current table: element g is β(g + 1), the cost of a step verifying g drafted tokens.
    pub fn table(&self) -> [f32; MAX_DRAFT + 1] {
        std::array::from_fn(|g| self.beta[g + 1] as f32)
    }

    /// Records that a step verifying `verified` tokens took `dt_ns`.
    pub fn observe(&mut self, verified: usize, dt_ns: u64) {
        let m = verified.clamp(1, BUCKETS - 1);
        let dt = dt_ns as f64;
        if let Some(unit) = self.unit_ns() {
            if dt > OUTLIER * self.beta[m] * unit {
                return;
            }
        }
        if dt <= 0.0 {
            return;
        }
        self.samples[m] = self.samples[m].saturating_add(1);
        let w = 1.0 / f64::from(self.samples[m].min(EMA_SAMPLES));
        self.mean_ns[m] += w * (dt - self.mean_ns[m]);
        self.observations = self.observations.wrapping_add(1);
        if self.samples[m] <= EMA_SAMPLES || self.observations.is_multiple_of(REFIT_EVERY) {
            self.refit();
        }
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

/// Per-position acceptance as exponentially decayed counts: position i's estimate is
/// P(token i accepted | tokens before it accepted).
#[derive(Clone, Debug, Default)]
pub struct Acceptance {
    num: [f32; MAX_DRAFT],
    den: [f32; MAX_DRAFT],
}

impl Acceptance {
    /// A step drafted `drafted` tokens and the target accepted the first `accepted`.
    pub fn observe(&mut self, drafted: usize, accepted: usize, decay: f32) {
        let seen = drafted.min(accepted + 1).min(MAX_DRAFT);
        for i in 0..seen {
            self.num[i] = self.num[i] * decay + if i < accepted { 1.0 } else { 0.0 };
            self.den[i] = self.den[i] * decay + 1.0;
        }
    }

    /// Estimate for position `i` (0-based), shrunk towards `prior` by `weight` pseudo-samples.
    #[inline]
    pub fn estimate(&self, i: usize, prior: f32, weight: f32) -> f32 {
        let i = i.min(MAX_DRAFT - 1);
        (self.num[i] + weight * prior) / (self.den[i] + weight)
    }
}

/// Draft length in `0..=p.len()` maximising expected tokens per unit of cost; `cost[i]` is what drafting
/// token i costs relative to a plain step (0 for pack and n-gram tokens, d for a draft model's).
pub fn best_length(p: &[f32], beta: &BetaModel, cost: &[f64]) -> usize {
    let (mut best, mut best_score) = (0, 1.0);
    let (mut expected, mut run, mut spent) = (1.0, 1.0, 0.0);
    for (i, &pi) in p.iter().enumerate() {
        run *= f64::from(pi);
        expected += run;
        spent += cost.get(i).copied().unwrap_or(0.0);
        let score = expected / (beta.beta(i + 2) + spent);
        if score > best_score + 1e-9 {
            (best, best_score) = (i + 1, score);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prior_interpolates() {
        let b = BetaModel::new(DEFAULT_BETA_PRIOR);
        assert_eq!(b.beta(1), 1.0);
        assert!((b.beta(2) - 1.55).abs() < 1e-6);
        assert!((b.beta(6) - 4.7).abs() < 1e-6);
        assert!((b.beta(12) - 7.15).abs() < 1e-6);
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
    fn best_length_trades_acceptance_against_cost() {
        let b = BetaModel::new(DEFAULT_BETA_PRIOR);
        assert_eq!(
            best_length(&[0.3; 4], &b, &[]),
            0,
            "low acceptance: don't draft"
        );
        assert_eq!(best_length(&[0.7; 4], &b, &[]), 1);
        assert_eq!(best_length(&[0.7; 4], &b, &[0.35; 4]), 0, "a draft model's cost makes it not pay");
        assert!(best_length(&[1.0; 4], &b, &[]) >= 1);
        let flat = BetaModel::new(&[(1, 1.0), (16, 1.0)]);
        assert_eq!(
            best_length(&[0.5; 4], &flat, &[]),
            4,
            "free verification: draft all"
        );
    }

    #[test]
    fn acceptance_is_conditional_per_position() {
        let mut a = Acceptance::default();
        a.observe(3, 1, 1.0);
        assert_eq!(a.estimate(0, 0.5, 1.0), 0.75);
        assert_eq!(a.estimate(1, 0.5, 1.0), 0.25);
        assert_eq!(
            a.estimate(2, 0.5, 1.0),
            0.5,
            "position 3 was never reached: prior"
        );
    }
}
