//! The ceiling of a load run (`bench --load`): how fast the run's stream could have been served at its slot
//! count if every generating slot drafted at every step with the run's own acceptance, from call costs
//! measured on this machine.
//!
//! At `-np S` a plain step verifies S tokens in one call; a step where each slot drafts γ tokens verifies
//! S·(γ+1), which strict batching splits into calls of whole slots of at most [`CALL_MAX`] tokens. With
//! per-token acceptance α a slot yields E(α, γ) tokens a step, so decoding runs
//! S_dec = max over γ of E(α, γ) · t(S, 1) / t(S, γ+1) times plain, where t(S, k) is the measured time of the
//! strict calls for S slots of k tokens. Prompts are not drafted: the share of plain's wall time that went to
//! prefill (each completed request's evaluated prompt tokens at the measured prefill speed) is left as it is,
//! so the ceiling of the whole stream is W / (P + (W − P) / S_dec) for plain's wall time W and prefill time P.

use super::ceiling::expected_tokens;
use super::timing::Steps;
use crate::draft::step::{passes, Layout, CALL_MAX};
use crate::llama::{LlamaError, Model};
use serde::Serialize;

/// The token counts of the decode calls strict batching makes for `slots` generating slots of `k` tokens
/// each (patch 0004's `strict_chunk`): whole slots packed in order while a call stays within [`CALL_MAX`]
/// tokens, at least one slot a call.
pub fn strict_calls(slots: usize, k: usize) -> Vec<usize> {
    let mut calls = Vec::new();
    passes(slots, |_| k, Layout::Unified, |t| calls.push(t));
    calls
}

/// Measured costs at one slot count: the strict calls for every draft length, and prefill.
#[derive(Clone, Debug, Serialize)]
pub struct LoadCosts {
    pub slots: usize,
    /// Tokens already in each slot's cache when the timed calls run.
    pub n_past: usize,
    /// `step_ms[k - 1]`: median time of the strict calls verifying k tokens in every slot, k = 1..=CALL_MAX.
    pub step_ms: Vec<f64>,
    /// `single_ms[n - 1]`: median time of one slot alone verifying n tokens, n = 1..=CALL_MAX: what the uneven
    /// steps are priced from.
    pub single_ms: Vec<f64>,
    /// (prompt tokens, median ms) of one prompt decoded alone, ascending.
    pub prefill_ms: Vec<(usize, f64)>,
    /// Steps in which slots verify different numbers of tokens, against what the drafter's pass model makes of them.
    pub uneven: Vec<UnevenStep>,
}

/// One uneven step, measured, and priced from steps of one pass as the drafter prices it (the sum of its passes,
/// `src/draft/step.rs`) and as one call of its tokens would be (the drafter's model before session 16).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct UnevenStep {
    /// Tokens each slot verifies.
    pub shape: Vec<usize>,
    pub ms: f64,
    /// Σ over its passes of a one-slot step of that many tokens.
    pub passes_ms: f64,
    /// Σ over its calls of a one-slot step of the call's tokens.
    pub calls_ms: f64,
}

/// The uneven steps measured at `slots` slots: one slot drafting 1, 2 or 7 tokens beside one-token slots, two
/// drafting side by side and apart, an idle slot between generating ones, and two tokens everywhere.
pub fn uneven_shapes(slots: usize) -> Vec<Vec<usize>> {
    let heads: [&[usize]; 6] = [&[2], &[3], &[8], &[3, 3], &[3, 1, 3], &[1, 0]];
    let mut v: Vec<Vec<usize>> = heads
        .iter()
        .filter(|h| h.len() < slots)
        .map(|h| h.iter().copied().chain(std::iter::repeat(1)).take(slots).collect())
        .collect();
    v.push(vec![2; slots]);
    v
}

impl LoadCosts {
    /// Time to decode a prompt of `n` tokens alone, interpolated (beyond the table: at its last rate).
    pub fn prefill(&self, n: usize) -> f64 {
        let pts = &self.prefill_ms;
        let Some(&(n_last, t_last)) = pts.last() else { return 0.0 };
        if n >= n_last {
            return t_last * n as f64 / n_last as f64;
        }
        let hi = pts.iter().position(|p| p.0 >= n).unwrap_or(0);
        let (n0, t0) = if hi == 0 { (0, 0.0) } else { pts[hi - 1] };
        let (n1, t1) = pts[hi];
        t0 + (t1 - t0) * (n - n0) as f64 / (n1 - n0) as f64
    }

    /// The best decode speed-up over plain steps with per-token acceptance `alpha`, and the draft length
    /// per slot that gives it (0 and 1.0 when no draft pays).
    pub fn decode_ceiling(&self, alpha: f64) -> (usize, f64) {
        let t1 = self.step_ms[0];
        (1..self.step_ms.len())
            .map(|g| (g, expected_tokens(alpha, g as f64) * t1 / self.step_ms[g]))
            .fold((0, 1.0), |best, c| if c.1 > best.1 { c } else { best })
    }
}

/// A step of `shape` (`shape[j]`: tokens slot j verifies, 0 for none) priced as the sum of its passes under
/// `layout`, each at `single[n - 1]`, the measured time of one slot alone verifying n tokens.
pub fn priced(single: &[f64], shape: &[usize], layout: Layout) -> f64 {
    let mut ms = 0.0;
    passes(shape.len(), |j| shape[j], layout, |n| ms += single[n.min(single.len()) - 1]);
    ms
}

/// What a server's steps cost at some slot count, measured: enough to price any step ([`priced`]) and its prompt.
#[derive(Clone, Debug)]
pub struct CallCosts {
    /// `single_ms[n - 1]`: median time of one slot alone verifying n tokens, n = 1..=[`CALL_MAX`].
    pub single_ms: Vec<f64>,
    /// (tokens, median ms) of one prompt decoded alone.
    pub prompt: (usize, f64),
}

impl CallCosts {
    /// Time to decode a prompt of `n` tokens, at the measured prompt's rate.
    pub fn prompt_ms(&self, n: usize) -> f64 {
        self.prompt.1 * n as f64 / self.prompt.0.max(1) as f64
    }
}

/// Measures [`CallCosts`] in a context of `slots` KV streams as llama-server's, each slot holding `n_past` tokens,
/// with a prompt of `prompt` tokens.
pub fn call_costs(model: &Model, slots: usize, threads: i32, n_past: usize, prompt: usize, reps: usize) -> Result<CallCosts, LlamaError> {
    let shapes: Vec<Vec<usize>> = (1..=CALL_MAX).map(|n| vec![n]).collect();
    let mut steps = Steps::new(model, slots, threads, n_past, CALL_MAX, prompt)?;
    let single_ms = steps.time(&shapes, reps)?;
    let prompt = (prompt, steps.prefill(prompt, reps)?);
    Ok(CallCosts { single_ms, prompt })
}

/// Measures [`LoadCosts`] for `slots` sequences on `model` with `threads` threads (0: one per core). Every
/// slot first holds `n_past` tokens; each timed step decodes k tokens in every slot (logits at every
/// position, as verification asks) in the calls strict batching makes ([`Steps::time`]); so are one slot alone
/// verifying 1..=CALL_MAX tokens and the [`uneven_shapes`], all in turn. Prefill: prompts of 32 to `max_prompt` tokens decoded alone (logits at the last).
pub fn measure(model: &Model, slots: usize, threads: i32, n_past: usize, max_prompt: usize, reps: usize) -> Result<LoadCosts, LlamaError> {
    let mut steps = Steps::new(model, slots, threads, n_past, CALL_MAX, max_prompt)?;
    // Every shape in one interleaved loop: timed in two (the equal steps first), drift between them showed as a
    // step of 2 tokens a slot costing 254 ms in the first and 190 in the second (session 29, `-np 8`).
    let uneven_shapes = uneven_shapes(slots);
    let mut shapes: Vec<Vec<usize>> = (1..=CALL_MAX).map(|k| vec![k; slots]).collect();
    shapes.extend((1..=CALL_MAX).map(|n| vec![n]));
    shapes.extend(uneven_shapes.iter().cloned());
    let t = steps.time(&shapes, reps)?;
    let (step_ms, rest) = t.split_at(CALL_MAX);
    let (single, measured) = rest.split_at(CALL_MAX);
    let step_ms = step_ms.to_vec();
    let uneven = uneven_shapes
        .iter()
        .zip(measured)
        .map(|(shape, &ms)| UnevenStep {
            passes_ms: priced(single, shape, Layout::Split),
            calls_ms: priced(single, shape, Layout::Unified),
            shape: shape.clone(),
            ms,
        })
        .collect();
    let mut prefill_ms = Vec::new();
    let mut n = 32;
    while n <= max_prompt {
        prefill_ms.push((n, steps.prefill(n, reps)?));
        n *= 2;
    }
    Ok(LoadCosts { slots, n_past, step_ms, single_ms: single.to_vec(), prefill_ms, uneven })
}

/// One run's ceiling beside what it measured.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LoadCeiling {
    /// accepted / drafted over the run.
    pub alpha: f64,
    /// Draft length per slot at which the ceiling is reached.
    pub gamma: usize,
    /// Decode steps' speed-up over plain at that length.
    pub decode: f64,
    /// Share of plain's wall time spent on prefill.
    pub prefill_share: f64,
    /// The whole stream's ceiling against plain.
    pub s: f64,
    /// The run's measured speed-up against plain.
    pub measured: f64,
    /// measured / ceiling.
    pub share: f64,
}

/// The ceiling of a run that drafted `drafted` tokens and had `accepted` of them accepted, served in
/// `measured` × plain's throughput, where plain took `plain_wall_ms` of which `prefill_ms` prefill; None if
/// it drafted nothing.
pub fn ceiling(costs: &LoadCosts, drafted: u64, accepted: u64, plain_wall_ms: f64, prefill_ms: f64, measured: f64) -> Option<LoadCeiling> {
    if drafted == 0 || plain_wall_ms <= 0.0 {
        return None;
    }
    let alpha = accepted as f64 / drafted as f64;
    let (gamma, decode) = costs.decode_ceiling(alpha);
    let p = prefill_ms.clamp(0.0, plain_wall_ms);
    let s = plain_wall_ms / (p + (plain_wall_ms - p) / decode);
    Some(LoadCeiling { alpha, gamma, decode, prefill_share: p / plain_wall_ms, s, measured, share: measured / s })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Patch 0004's `strict_chunk` over a batch of `slots` runs of `k` tokens, written as the C++ is.
    fn strict_chunk_oracle(slots: usize, k: usize) -> Vec<usize> {
        let n = slots * k;
        let run_end = |i: usize| (i / k + 1) * k;
        let mut calls = Vec::new();
        let mut off = 0;
        while off < n {
            let mut end = run_end(off);
            while end < n {
                let next = run_end(end);
                if next - off > CALL_MAX {
                    break;
                }
                end = next;
            }
            calls.push(end - off);
            off = end;
        }
        calls
    }

    #[test]
    fn uneven_shapes_have_a_drafting_slot_beside_others() {
        assert_eq!(uneven_shapes(4), [[2, 1, 1, 1], [3, 1, 1, 1], [8, 1, 1, 1], [3, 3, 1, 1], [3, 1, 3, 1], [1, 0, 1, 1], [2, 2, 2, 2]]);
        assert_eq!(uneven_shapes(2), [[2, 1], [3, 1], [8, 1], [2, 2]]);
        assert_eq!(uneven_shapes(1), [[2]]);
    }

    #[test]
    fn strict_calls_follow_the_server_patch() {
        for slots in 1..=8 {
            for k in 1..=CALL_MAX {
                assert_eq!(strict_calls(slots, k), strict_chunk_oracle(slots, k), "{slots} slots × {k}");
            }
        }
        assert_eq!(strict_calls(4, 5), [15, 5]);
        assert_eq!(strict_calls(8, 1), [8]);
        assert_eq!(strict_calls(2, 16), [16, 16]);
    }

    fn costs(step_ms: Vec<f64>) -> LoadCosts {
        LoadCosts { slots: 4, n_past: 256, step_ms, single_ms: vec![], prefill_ms: vec![(32, 100.0), (64, 180.0), (128, 340.0)], uneven: vec![] }
    }

    #[test]
    fn prefill_is_interpolated_and_extended_at_the_last_rate() {
        let c = costs(vec![1.0; CALL_MAX]);
        assert_eq!(c.prefill(32), 100.0);
        assert_eq!(c.prefill(48), 140.0);
        assert_eq!(c.prefill(16), 50.0);
        assert_eq!(c.prefill(256), 680.0);
    }

    #[test]
    fn the_decode_ceiling_picks_the_best_length_and_never_goes_below_plain() {
        // Each further token in the call costs 0.25 of a plain step.
        let c = costs((0..CALL_MAX).map(|k| 1.0 + 0.25 * k as f64).collect());
        // Sure drafts: E = γ + 1 against 1 + 0.25γ grows with γ, so the longest.
        assert_eq!(c.decode_ceiling(1.0).0, CALL_MAX - 1);
        // Useless drafts: no length pays.
        assert_eq!(c.decode_ceiling(0.0), (0, 1.0));
        let (g, s) = c.decode_ceiling(0.75);
        assert!(g >= 1 && s > 1.0);
        let naive = (1..CALL_MAX).map(|g| expected_tokens(0.75, g as f64) / (1.0 + 0.25 * g as f64)).fold(1.0, f64::max);
        assert!((s - naive).abs() < 1e-12);
    }

    #[test]
    fn prefill_bounds_the_stream_s_ceiling() {
        let c = costs((0..CALL_MAX).map(|k| 1.0 + 0.25 * k as f64).collect());
        let (_, dec) = c.decode_ceiling(0.8);
        let none = ceiling(&c, 100, 80, 1000.0, 0.0, 1.0).unwrap();
        assert!((none.s - dec).abs() < 1e-12, "no prefill: the stream gains what decoding gains");
        let half = ceiling(&c, 100, 80, 1000.0, 500.0, 1.0).unwrap();
        assert!((half.s - 1.0 / (0.5 + 0.5 / dec)).abs() < 1e-12);
        assert!((half.share - 1.0 / half.s).abs() < 1e-12);
        assert_eq!(ceiling(&c, 100, 80, 1000.0, 2000.0, 1.0).unwrap().s, 1.0, "all prefill: nothing to gain");
        assert!(ceiling(&c, 0, 0, 1000.0, 0.0, 1.0).is_none());
    }
}
