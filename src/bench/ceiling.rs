//! The ceiling of speculative decoding on this machine (Leviathan et al. 2023): with per-token acceptance
//! α and γ drafted tokens per step, a verify step yields E(α, γ) = (1 − α^(γ+1)) / (1 − α) tokens and costs
//! β(γ+1) + γ·d plain steps, where β(n) is the cost of one forward pass over n tokens of one sequence (logits
//! at every position, as verification needs) relative to a one-token pass, and d the drafter's cost per
//! drafted token relative to a target step (0 for model-free drafters). The ceiling speedup is
//! S = E / (β(γ+1) + γ·d). β is measured here with the bindings; α and γ come from the run.

use crate::draft::model::{ModelDraftConfig, ModelDrafter};
use crate::draft::TokenSource;
use super::timing::{filler_tokens, Steps};
use crate::quantile::median;
use crate::llama::{LlamaError, Model};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Tokens per verify step: E(α, γ) = (1 − α^(γ+1)) / (1 − α) (γ may be fractional: a mean draft length).
pub fn expected_tokens(alpha: f64, gamma: f64) -> f64 {
    let a = alpha.clamp(0.0, 1.0);
    if (1.0 - a).abs() < 1e-12 {
        return gamma + 1.0;
    }
    (1.0 - a.powf(gamma + 1.0)) / (1.0 - a)
}

/// S = E(α, γ) / (β(γ+1) + γ·d).
pub fn speedup_ceiling(alpha: f64, gamma: f64, beta_gamma_plus_1: f64, d: f64) -> f64 {
    expected_tokens(alpha, gamma) / (beta_gamma_plus_1 + gamma * d)
}

/// Measured cost of one forward pass over n tokens relative to one token, for one model and thread count.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BetaTable {
    pub model: String,
    pub threads: i32,
    /// Tokens already in the KV cache when the timed passes run.
    pub n_past: usize,
    pub reps: usize,
    /// Median time of a one-token pass, ms.
    pub t1_ms: f64,
    /// (n, median ms, β(n)) at the measured n (ascending, starting at 1).
    pub points: Vec<(usize, f64, f64)>,
}

impl BetaTable {
    /// β(n), linearly interpolated between measured n; None beyond the measured range.
    pub fn beta(&self, n: f64) -> Option<f64> {
        if n <= 1.0 {
            return Some(1.0);
        }
        let lo = self.points.iter().rev().find(|p| p.0 as f64 <= n)?;
        if lo.0 as f64 == n {
            return Some(lo.2);
        }
        let hi = self.points.iter().find(|p| p.0 as f64 > n)?;
        let f = (n - lo.0 as f64) / (hi.0 - lo.0) as f64;
        Some(lo.2 + f * (hi.2 - lo.2))
    }

    pub fn max_n(&self) -> usize {
        self.points.last().map_or(1, |p| p.0)
    }
}

/// The ceiling of one configuration's run beside what it measured.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Ceiling {
    /// accepted / drafted.
    pub alpha: f64,
    /// Mean draft length: drafted / verify steps that carried a draft.
    pub gamma: f64,
    /// β(γ+1), interpolated from the measured table.
    pub beta: f64,
    /// Drafter cost per drafted token relative to a target step (0 for model-free drafters).
    pub d: f64,
    /// E(α, γ).
    pub e: f64,
    /// S = E / (β(γ+1) + γ·d).
    pub s: f64,
    /// The run's measured speedup over no speculation.
    pub measured: f64,
    /// measured / max(S, 1): a drafter can always decline to draft, so below 1 the reachable ceiling is 1.
    pub share: f64,
}

/// The ceiling for a run with `drafted`, `accepted` tokens over `drafts` verify steps, or None when it did
/// not draft or γ+1 is outside the measured β table.
pub fn ceiling(drafted: u64, accepted: u64, drafts: u64, betas: &BetaTable, d: f64, measured: f64) -> Option<Ceiling> {
    if drafted == 0 || drafts == 0 {
        return None;
    }
    let alpha = accepted as f64 / drafted as f64;
    let gamma = drafted as f64 / drafts as f64;
    let beta = betas.beta(gamma + 1.0)?;
    let e = expected_tokens(alpha, gamma);
    let s = e / (beta + gamma * d);
    Some(Ceiling { alpha, gamma, beta, d, e, s, measured, share: measured / s.max(1.0) })
}

/// The n at which β is measured up to `max_n`: every n to 16, then sparser (β is interpolated between).
pub fn beta_points(max_n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (1..=max_n.min(16)).chain([20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128]).filter(|&n| n <= max_n).collect();
    if v.last() != Some(&max_n) {
        v.push(max_n);
    }
    v
}

/// Measures β(n) at [`beta_points`]`(max_n)` on `model` with `threads` threads: `n_past` tokens of context are decoded
/// first, then each timed pass decodes n tokens after them with logits at every position, reads the last
/// logits (which waits for the backend) and removes them again. Every n is visited once per repetition, so
/// drift hits all n alike; each visit first runs one untimed pass of the same shape, so the timed pass reuses
/// its compute graph as a run of same-length drafts does. One warm-up repetition is discarded; medians of
/// `reps`.
pub fn measure_beta(model: &Model, name: &str, max_n: usize, threads: i32, n_past: usize, reps: usize) -> Result<BetaTable, LlamaError> {
    let max_n = max_n.max(1);
    let ns = beta_points(max_n);
    let shapes: Vec<Vec<usize>> = ns.iter().map(|&n| vec![n]).collect();
    let meds = Steps::new(model, 1, threads, n_past, max_n, 0)?.time(&shapes, reps)?;
    let t1 = meds[0];
    Ok(BetaTable {
        model: name.to_string(),
        threads,
        n_past,
        reps,
        t1_ms: t1,
        points: ns.iter().zip(&meds).map(|(&n, &m)| (n, m, m / t1)).collect(),
    })
}

/// Median time of a one-token pass of `model`, ms (for a draft model's cost d = t1(draft) / t1(target)).
pub fn one_token_ms(model: &Model, name: &str, threads: i32, n_past: usize, reps: usize) -> Result<f64, LlamaError> {
    Ok(measure_beta(model, name, 1, threads, n_past, reps)?.t1_ms)
}

/// Median time of one draft-model step of the plugin's drafter (one token decoded with llama.cpp's LM
/// head skipped, then its subset head, or full head, scored), ms, after `n_past` tokens of context.
pub fn model_draft_step_ms(cfg: &ModelDraftConfig, n_past: usize, reps: usize) -> Result<f64, String> {
    let mut md = ModelDrafter::load(cfg).map_err(|e| e.to_string())?;
    let mut hist = filler_tokens(md.model(), n_past.max(1)).map_err(|e| e.to_string())?;
    let mut times = Vec::with_capacity(reps);
    const WARMUP: usize = 6;
    for rep in 0..reps + WARMUP {
        let t0 = Instant::now();
        let t = md.next(0, &hist).ok_or("the draft model predicted nothing")?;
        if rep >= WARMUP {
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        hist.push(t);
    }
    Ok(median(&times))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_tokens_matches_the_closed_form() {
        assert!((expected_tokens(0.0, 3.0) - 1.0).abs() < 1e-12);
        assert!((expected_tokens(1.0, 3.0) - 4.0).abs() < 1e-12);
        // α = 0.5, γ = 2: 1 + 0.5 + 0.25
        assert!((expected_tokens(0.5, 2.0) - 1.75).abs() < 1e-12);
        // fractional γ is continuous around the integer
        assert!((expected_tokens(0.8, 2.0 + 1e-9) - expected_tokens(0.8, 2.0)).abs() < 1e-6);
    }

    #[test]
    fn ceiling_uses_interpolated_beta_and_draft_cost() {
        let t = BetaTable {
            model: "m".into(),
            threads: 2,
            n_past: 128,
            reps: 5,
            t1_ms: 10.0,
            points: vec![(1, 10.0, 1.0), (2, 15.0, 1.5), (3, 22.0, 2.2), (4, 29.0, 2.9)],
        };
        assert_eq!(t.beta(1.0), Some(1.0));
        assert!((t.beta(2.5).unwrap() - 1.85).abs() < 1e-12);
        assert_eq!(t.beta(4.0), Some(2.9));
        assert_eq!(t.beta(4.5), None);
        // 300 drafted over 100 steps (γ = 3), 240 accepted (α = 0.8): E = (1 − 0.8⁴)/0.2 = 2.952, β(4) = 2.9
        let c = ceiling(300, 240, 100, &t, 0.0, 0.9).unwrap();
        assert!((c.gamma - 3.0).abs() < 1e-12 && (c.alpha - 0.8).abs() < 1e-12);
        assert!((c.e - 2.952).abs() < 1e-9);
        assert!((c.s - 2.952 / 2.9).abs() < 1e-9);
        assert!((c.share - 0.9 / c.s).abs() < 1e-12);
        // below 1 the share is against 1 (not drafting), not against S
        let low = ceiling(300, 30, 100, &t, 0.0, 0.95).unwrap();
        assert!(low.s < 1.0 && (low.share - 0.95).abs() < 1e-12);
        let with_d = ceiling(300, 240, 100, &t, 0.1, 0.9).unwrap();
        assert!((with_d.s - 2.952 / 3.2).abs() < 1e-9);
        assert!(ceiling(0, 0, 0, &t, 0.0, 1.0).is_none());
        assert_eq!(beta_points(9), (1..=9).collect::<Vec<_>>());
        assert_eq!(beta_points(41), [(1..=16).collect::<Vec<_>>(), vec![20, 24, 28, 32, 40, 41]].concat());
        let sparse = BetaTable { points: vec![(1, 1.0, 1.0), (16, 8.0, 8.0), (20, 10.0, 10.0)], ..t.clone() };
        assert!((sparse.beta(18.0).unwrap() - 9.0).abs() < 1e-12);
        assert!(ceiling(800, 10, 100, &t, 0.0, 1.0).is_none(), "γ+1 = 9 is outside the table");
    }
}
