//! What the drafter is tuned by; `Default` is what the plugin uses.

use super::class::{DEFAULT_PRIOR, N_CLASSES};
use super::beta::DEFAULT_BETA_PRIOR;
use super::step::{Layout, INVARIANT_DRAFT};
use super::gate::GateConfig;
use crate::index::{Hit, Index};

/// What of the request's own text the drafter copies (the plugin's `context=1|answer|0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Context {
    /// None: the pack, the live index, a prediction and a draft model only.
    Off,
    /// What the answer wrote, not the prompt: a request whose prompt lacks the text it edits, with the text given
    /// as its prediction, has these.
    Answer,
    /// Copies of the prompt and the answer, and the keys the prompt's lists name.
    All,
}

/// Tuning of the drafter; `Default` is what the plugin uses.
#[derive(Clone, Debug)]
pub struct DrafterConfig {
    /// Number of sequences (slots), ids `0..n_seq`.
    pub n_seq: usize,
    /// Upper bound on draft length, whatever the caller allows (≤ [`super::step::MAX_DRAFT`]).
    pub max_draft: usize,
    /// A pack hit is used only if count/total reaches this.
    pub min_confidence: f32,
    /// … and its count reaches this.
    pub min_count: u32,
    /// Request n-grams: longest suffix tried, and shortest accepted, in tokens.
    pub ctx_max_n: usize,
    pub ctx_min_n: usize,
    /// While off, draft once every this many steps to re-measure acceptance …
    pub probe_every: u32,
    /// … with at most this many tokens.
    pub probe_len: usize,
    /// A sequence that drafted this many steps in a row takes one plain step, so the cost of a
    /// plain step (the unit of β) stays measured even when every step could draft.
    pub calibrate_every: u32,
    /// Acceptance assumed per [`Class`](super::class::Class) of evidence before any measurement.
    pub class_prior: [f32; N_CLASSES],
    /// Decay of a sequence's acceptance counts per observation (0.9 ≈ the last 10 tokens) …
    pub alpha_decay: f32,
    /// … and of the counts all sequences share (0.98 ≈ the last 50).
    pub global_decay: f32,
    /// Pseudo-observations of the global estimate in a sequence's estimate.
    pub seq_prior_weight: f32,
    /// Pseudo-observations of `alpha_prior` in the global estimate.
    pub global_prior_weight: f32,
    /// β prior points (tokens verified, cost relative to one token).
    pub beta_prior: Vec<(u32, f32)>,
    /// Cost of one draft-model token relative to a plain step, assumed until measured (d in
    /// E / (β + d); about 0.35 for a 0.5B draft without its LM head against a 1.5B target).
    pub model_cost_prior: f64,
    /// While the draft model does not pay, it drafts (to re-measure) once per this many steps at
    /// first, doubling after each such probe up to `model_probe_max`: a probe costs a catch-up
    /// pass over the tokens it missed.
    pub model_probe_min: u32,
    pub model_probe_max: u32,
    /// … and only while it would pay at this acceptance (its best case worth testing).
    pub model_probe_alpha: f32,
    /// Misses kept until drained; later ones are dropped and counted.
    pub miss_capacity: usize,
    /// A draft is made only when it is expected to be this much faster than a plain step (0.05 = 5%):
    /// acceptance is an estimate, and a draft that barely pays on average loses as often as it wins.
    pub min_gain: f64,
    /// The same when other sequences share the verify call (`-np > 1`). It was 0.25 while shared steps were priced
    /// as one call of their tokens (session 15: served at `-np 4` the control drafted JSON at 87% and ran at 0.87×).
    /// Priced by their passes ([`super::step`]), steps in place took 0.95–0.99 of their price (session 30's step
    /// logs), and with no margin generation took 10–30% fewer of the round's own one-token steps at `-np 8`
    /// (HumanEval, three rounds) and 11% fewer at `-np 4` (JSON and prose); the single-sequence margin remains.
    pub shared_min_gain: f64,
    /// Beside other slots, a draft holds only the leading tokens whose estimated acceptance reaches this (0: all).
    /// Session 41 set 0.95 on served rounds that moved 4% apart; replayed as llama-server serves 16 clients
    /// (`kolm-rsd replay --slots`, session 66), 0.8 served two to four slots 0.2–3.9% faster on HumanEval (both
    /// splits), code edits and JSON with its pack, prose alike, p99 moving both ways; from six slots on the
    /// fairness rule below decides alone (docs/drafter.md).
    pub shared_sure: f32,
    /// Beside other slots, the least gain in the step's throughput a draft must buy per unit of time it adds to the
    /// step, for each other slot's request, which waits that time (0: none). What a draft gains, only its own request
    /// saves, and at equal throughput the time moves to the requests not drafted for, which make the tail; the more
    /// requests wait, the more a draft must buy. At 0.1 (session 50) a draft beside three others must gain 0.3 of
    /// what it adds, as every sure draft that beats the margin at four slots here does, and beside seven 0.7, where
    /// drafts bought the step 1% for p99 above plain's in every round.
    pub shared_fair: f64,
    /// Beside other slots, a draft is made only while no other request in the step falls behind plain decoding by
    /// more than this share of its steps so far, counting the plain steps its steps cost beyond the tokens they gave
    /// it ([`super::lag`]; infinite: no limit). A request drafted nothing for (prose beside code) pays for the others'
    /// verifies in every step it shares with them, and the slowest of them sets the tail.
    pub shared_lag: f64,
    /// Beside other slots, a step's drafts are decided together: the slots not yet asked count with what they offered
    /// in the last step, and a draft is weighed by the whole step against one with no draft ([`super::step::Rounds::joint`]).
    /// Off: each slot weighs its own draft against the step without it, the others as they were.
    pub joint: bool,
    /// How llama-server cuts a step into forward passes (`kv=split|unified`); None: learned from step times.
    pub layout: Option<Layout>,
    /// Break-even control on; off drafts the whole chain found at every step (tests, benchmarks of
    /// acceptance).
    pub adaptive: bool,
    /// What of the request itself is drafted from where the pack has nothing.
    pub context: Context,
    /// The measured on/off gate over the control (used while `adaptive`; None: the control alone decides).
    pub gate: Option<GateConfig>,
}

impl DrafterConfig {
    /// The pack's recipe for the end of `history`, if it is as sure as this configuration asks.
    pub fn recipe(&self, index: &Index, history: &[i32]) -> Option<Hit> {
        index.lookup(history).filter(|h| self.sure(h))
    }

    /// Whether a recipe (of the pack or the live index) is as sure as this configuration asks.
    pub fn sure(&self, h: &Hit) -> bool {
        h.confidence() >= self.min_confidence && h.count >= self.min_count
    }

    /// This configuration with the shared-step rule of an engine whose step is one forward pass of every request's
    /// tokens, as vLLM's: no margin, no least acceptance and no fairness rule beside other requests. There a drafted
    /// token adds a few percent to a step of several rows, where beside seven of llama-server's slots it lengthens
    /// every slot's step by nearly what it is worth (session 41, which set the plugin's floor on acceptance). Replayed at
    /// eight clients on training prompts (Qwen2.5-Coder-0.5B) no margin beat 0.05 on JSON (1.377× against
    /// 1.307×), HumanEval and code edits, and prose lost 0.7% (session 37); with the plugin's floor the replay
    /// drafted 705 tokens of held-out JSON at α 0.96 (1.160×), without it 1,285 at 0.85 (1.313×), as vLLM served
    /// (session 61). The vLLM proposer and the replay's rows of clients both take it from here, so that they cannot
    /// drift apart again.
    pub fn one_pass_shared(self) -> DrafterConfig {
        DrafterConfig { shared_min_gain: 0.0, shared_sure: 0.0, shared_fair: 0.0, shared_lag: f64::INFINITY, joint: false, ..self }
    }
}

impl Default for DrafterConfig {
    fn default() -> Self {
        DrafterConfig {
            n_seq: 1,
            max_draft: INVARIANT_DRAFT,
            min_confidence: 0.6,
            min_count: 1,
            ctx_max_n: 8,
            ctx_min_n: 1,
            probe_every: 32,
            probe_len: 1,
            calibrate_every: 32,
            class_prior: DEFAULT_PRIOR,
            alpha_decay: 0.9,
            global_decay: 0.98,
            seq_prior_weight: 2.0,
            global_prior_weight: 4.0,
            beta_prior: DEFAULT_BETA_PRIOR.to_vec(),
            model_cost_prior: 0.35,
            model_probe_min: 32,
            model_probe_max: 1024,
            model_probe_alpha: 0.9,
            miss_capacity: 4096,
            min_gain: 0.05,
            shared_min_gain: 0.05,
            shared_sure: 0.8,
            shared_fair: 0.1,
            shared_lag: f64::INFINITY,
            joint: true,
            layout: None,
            adaptive: true,
            context: Context::All,
            gate: Some(GateConfig::default()),
        }
    }
}

