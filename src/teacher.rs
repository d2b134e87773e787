//! The teacher runs of `compile`: a model continues one prompt K times with sampling, all K sequences
//! decoded together in one batch per step (not K serial runs), plus greedy runs for held-out prompts.

use crate::llama::{argmax, Batch, Context, ContextOptions, LlamaError, Model, Token};

/// Sampling settings of the teacher.
#[derive(Clone, Debug)]
pub struct Sampling {
    pub samples: usize,
    pub temperature: f32,
    /// Only the top_k most likely tokens are candidates (llama.cpp's default is 40).
    pub top_k: usize,
    pub max_tokens: usize,
    pub seed: u64,
    /// Adds the greedy continuation as one more sequence of the batch: it is exactly what serving
    /// with temperature 0 produces, so the recipes it agrees on are the ones that pay.
    pub with_greedy: bool,
}

impl Sampling {
    /// Sequences decoded per prompt (the samples, plus the greedy one).
    pub fn n_seq(&self) -> usize {
        self.samples.max(1) + self.with_greedy as usize
    }
}

/// A model and a context sized for K sequences, reused across prompts.
pub struct Teacher<'m> {
    model: &'m Model,
    ctx: Context<'m>,
    n_seq: usize,
    n_ctx_seq: usize,
}

impl<'m> Teacher<'m> {
    /// `n_ctx_seq` bounds prompt + continuation of each sequence.
    pub fn new(model: &'m Model, n_seq: usize, n_ctx_seq: usize) -> Result<Self, LlamaError> {
        let opts = ContextOptions { n_ctx: (n_ctx_seq * n_seq) as u32, n_batch: 512, n_seq: n_seq as u32, kv_unified: true, ..Default::default() };
        Ok(Teacher { model, ctx: Context::new(model, &opts)?, n_seq, n_ctx_seq })
    }

    /// Decodes the prompt once into sequence 0 (in chunks of the batch size), then copies its cache into
    /// every other sequence. Returns the logits of the last prompt token.
    fn prefill(&mut self, prompt: &[Token], n: usize) -> Result<Vec<f32>, LlamaError> {
        self.ctx.clear();
        let mut batch = Batch::new(512, 1);
        for (c, chunk) in prompt.chunks(512).enumerate() {
            batch.clear();
            for (i, &t) in chunk.iter().enumerate() {
                let pos = c * 512 + i;
                batch.add(t, pos as i32, &[0], pos + 1 == prompt.len());
            }
            self.ctx.decode(&batch)?;
        }
        for s in 1..n {
            self.ctx.seq_cp(0, s as i32);
        }
        Ok(self.ctx.logits(-1).to_vec())
    }

    /// K sampled continuations of `prompt` (the greedy one first when `with_greedy`), each stopping at
    /// end-of-generation or max_tokens.
    pub fn sample(&mut self, prompt: &[Token], s: &Sampling, rng: &mut fastrand::Rng) -> Result<Vec<Vec<Token>>, LlamaError> {
        let k = s.n_seq().min(self.n_seq);
        let greedy = Sampling { temperature: 0.0, ..s.clone() };
        let pick = |j: usize, logits: &[f32], rng: &mut fastrand::Rng| {
            sample_token(logits, if s.with_greedy && j == 0 { &greedy } else { s }, rng)
        };
        let budget = s.max_tokens.min(self.n_ctx_seq.saturating_sub(prompt.len() + 1));
        let first = self.prefill(prompt, k)?;
        let mut outs: Vec<Vec<Token>> = vec![Vec::new(); k];
        let mut next: Vec<Token> = (0..k).map(|j| pick(j, &first, rng)).collect();
        let mut live: Vec<bool> = vec![true; k];
        let mut batch = Batch::new(k, 1);
        for step in 0..budget {
            batch.clear();
            let mut rows = Vec::with_capacity(k);
            for j in 0..k {
                if !live[j] {
                    continue;
                }
                outs[j].push(next[j]);
                if self.model.is_eog(next[j]) || outs[j].len() >= budget {
                    live[j] = false;
                    continue;
                }
                batch.add(next[j], (prompt.len() + step) as i32, &[j as i32], true);
                rows.push(j);
            }
            if rows.is_empty() {
                break;
            }
            self.ctx.decode(&batch)?;
            for (i, &j) in rows.iter().enumerate() {
                next[j] = pick(j, self.ctx.logits(i as i32), rng);
            }
        }
        Ok(outs)
    }

    /// The greedy continuation (what serving with temperature 0 produces), one token per decode.
    pub fn greedy(&mut self, prompt: &[Token], max_tokens: usize) -> Result<Vec<Token>, LlamaError> {
        let budget = max_tokens.min(self.n_ctx_seq.saturating_sub(prompt.len() + 1));
        let mut tok = argmax(&self.prefill(prompt, 1)?);
        let mut out = Vec::new();
        let mut batch = Batch::new(1, 1);
        while out.len() < budget {
            out.push(tok);
            if self.model.is_eog(tok) {
                break;
            }
            batch.clear();
            batch.add(tok, (prompt.len() + out.len() - 1) as i32, &[0], true);
            self.ctx.decode(&batch)?;
            tok = argmax(self.ctx.logits(0));
        }
        Ok(out)
    }
}

/// Temperature sampling over the top_k logits; temperature ≤ 0 is greedy.
pub fn sample_token(logits: &[f32], s: &Sampling, rng: &mut fastrand::Rng) -> Token {
    if s.temperature <= 0.0 || s.top_k <= 1 {
        return argmax(logits);
    }
    let k = s.top_k.min(logits.len());
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
    idx.truncate(k);
    let max = idx.iter().map(|&i| logits[i]).fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = idx.iter().map(|&i| (((logits[i] - max) / s.temperature) as f64).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut r = rng.f64() * total;
    for (w, &i) in weights.iter().zip(&idx) {
        r -= w;
        if r <= 0.0 {
            return i as Token;
        }
    }
    idx[0] as Token
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_temperature_is_argmax_and_sampling_stays_in_top_k() {
        let logits = [0.1, 3.0, 2.9, -1.0, 0.0];
        let mut s = Sampling { samples: 1, temperature: 0.0, top_k: 40, max_tokens: 1, seed: 0, with_greedy: false };
        let mut rng = fastrand::Rng::with_seed(7);
        assert_eq!(sample_token(&logits, &s, &mut rng), 1);
        s.temperature = 1.0;
        s.top_k = 2;
        let mut seen = [0usize; 5];
        for _ in 0..2000 {
            seen[sample_token(&logits, &s, &mut rng) as usize] += 1;
        }
        assert_eq!(seen[0] + seen[3] + seen[4], 0, "only the top 2 may be drawn: {seen:?}");
        assert!(seen[1] > 800 && seen[2] > 800, "both top tokens drawn about evenly: {seen:?}");
    }
}
