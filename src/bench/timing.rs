//! Decode steps timed with the bindings: the one timing loop behind β (one sequence), the load ceiling
//! (every slot drafting alike) and the cost of uneven steps (slots drafting differently).

use crate::draft::step::calls;
use crate::llama::{Batch, Context, ContextOptions, LlamaError, Model};
use crate::quantile::median;
use std::time::Instant;

/// A context of `slots` sequences (a KV stream each, as llama-server with `-np`), each holding the same
/// `n_past` filler tokens, on which whole server steps are timed.
pub struct Steps<'m> {
    ctx: Context<'m>,
    batch: Batch,
    toks: Vec<i32>,
    slots: usize,
    n_past: usize,
}

impl<'m> Steps<'m> {
    /// Room for steps of up to `max_step` tokens a slot and prompts of up to `max_prompt` tokens in slot 0.
    pub fn new(model: &'m Model, slots: usize, threads: i32, n_past: usize, max_step: usize, max_prompt: usize) -> Result<Steps<'m>, LlamaError> {
        let slots = slots.max(1);
        let per_seq = (n_past + max_step + 32).max(max_prompt + 32).next_multiple_of(256);
        let opts = ContextOptions {
            n_ctx: (per_seq * slots) as u32,
            n_batch: n_past.max(max_step).max(max_prompt).max(32) as u32,
            n_seq: slots as u32,
            n_threads: threads,
            flash_attn: None,
            kv_unified: false,
        };
        let mut ctx = Context::new(model, &opts)?;
        let toks = filler_tokens(model, max_prompt.max(n_past + max_step))?;
        let mut batch = Batch::new(opts.n_batch as usize, slots);
        for s in 0..slots {
            batch.clear();
            for (i, &t) in toks[..n_past].iter().enumerate() {
                batch.add(t, i as i32, &[s as i32], i + 1 == n_past);
            }
            if n_past > 0 {
                ctx.decode(&batch)?;
            }
        }
        Ok(Steps { ctx, batch, toks, slots, n_past })
    }

    /// Median ms of each step of `shapes` (`shape[j]`: tokens slot j verifies after its `n_past`, logits at every
    /// position, in the calls strict batching makes). Every shape is visited once per repetition, so drift hits all
    /// alike; each visit first runs one untimed pass of the same shape, so the timed pass reuses its compute graph
    /// as a run of like steps does. One warm-up repetition is discarded; medians of `reps`.
    pub fn time(&mut self, shapes: &[Vec<usize>], reps: usize) -> Result<Vec<f64>, LlamaError> {
        let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(reps); shapes.len()];
        for rep in 0..=reps {
            for (shape, v) in shapes.iter().zip(&mut times) {
                let mut ms = 0.0;
                for _timed in [false, true] {
                    let t0 = Instant::now();
                    self.step(shape)?;
                    ms = t0.elapsed().as_secs_f64() * 1e3;
                    for s in 0..self.slots {
                        self.ctx.seq_rm(s as i32, self.n_past as i32, -1);
                    }
                }
                if rep >= 1 {
                    v.push(ms);
                }
            }
        }
        Ok(times.iter().map(|v| median(v)).collect())
    }

    /// One step of `shape`: each decode call, then its last logits (which waits for the backend).
    fn step(&mut self, shape: &[usize]) -> Result<(), LlamaError> {
        let mut result = Ok(());
        let (ctx, batch, toks, n_past) = (&mut self.ctx, &mut self.batch, &self.toks, self.n_past);
        calls(shape.len().min(self.slots), |j| shape[j], |slots| {
            if result.is_err() {
                return;
            }
            batch.clear();
            for s in slots {
                for j in 0..shape[s] {
                    batch.add(toks[n_past + j], (n_past + j) as i32, &[s as i32], true);
                }
            }
            result = ctx.decode(batch).map(|_| {
                let _ = ctx.logits(batch.len() as i32 - 1)[0];
            });
        });
        result
    }

    /// Median ms of a prompt of `n` tokens decoded alone in slot 0, after clearing it (the other slots' caches do
    /// not enter a prompt's own call). One warm-up repetition is discarded; median of `reps`.
    pub fn prefill(&mut self, n: usize, reps: usize) -> Result<f64, LlamaError> {
        let mut v = Vec::with_capacity(reps);
        for rep in 0..=reps {
            self.ctx.seq_rm(0, 0, -1);
            self.batch.clear();
            for (i, &t) in self.toks[..n].iter().enumerate() {
                self.batch.add(t, i as i32, &[0], i + 1 == n);
            }
            let t0 = Instant::now();
            self.ctx.decode(&self.batch)?;
            let _ = self.ctx.logits(-1)[0];
            if rep >= 1 {
                v.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        Ok(median(&v))
    }
}

/// At least `n` tokens of mixed prose, JSON and code (the text repeated), exactly `n` long.
pub(super) fn filler_tokens(model: &Model, n: usize) -> Result<Vec<i32>, LlamaError> {
    let text = "The quick brown fox jumps over the lazy dog. {\"name\": \"Ann Lee\", \"age\": 42, \"tags\": [\"x\", \"y\"]}\n\
                def add(a, b):\n    return a + b\n";
    let seed = model.tokenize(text, true, false)?;
    Ok(seed.iter().copied().cycle().take(n).collect())
}

