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
    /// Adds the greedy continuation as one more sequence of the batch: what serving with temperature 0
    /// produces (up to the cell order noted at [`Teacher::run`]), so the recipes it agrees on are the ones that pay.
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
    /// `n_ctx_seq` bounds prompt + continuation of each sequence; `n_threads` 0 = one per core (a busy machine
    /// runs faster with fewer: every ggml step waits at a barrier for its slowest thread).
    pub fn new(model: &'m Model, n_seq: usize, n_ctx_seq: usize, n_threads: i32) -> Result<Self, LlamaError> {
        let opts = ContextOptions { n_ctx: (n_ctx_seq * n_seq) as u32, n_batch: 512, n_seq: n_seq as u32, n_threads, kv_unified: true, ..Default::default() };
        Ok(Teacher { model, ctx: Context::new(model, &opts)?, n_seq, n_ctx_seq })
    }

    /// K sampled continuations of `prompt` (the greedy one first when `with_greedy`), each stopping at
    /// end-of-generation or max_tokens.
    pub fn sample(&mut self, prompt: &[Token], s: &Sampling, rng: &mut fastrand::Rng) -> Result<Vec<Vec<Token>>, LlamaError> {
        let jobs: Vec<Job> = (0..s.n_seq()).map(|j| Job { prompt: 0, greedy: s.with_greedy && j == 0 }).collect();
        let mut outs = vec![Vec::new(); jobs.len()];
        self.run(&[prompt.to_vec()], &jobs, s, rng, |j, out| outs[j] = out)?;
        Ok(outs)
    }

    /// The greedy continuation (what serving with temperature 0 produces).
    pub fn greedy(&mut self, prompt: &[Token], max_tokens: usize) -> Result<Vec<Token>, LlamaError> {
        let s = Sampling { samples: 1, temperature: 0.0, top_k: 1, max_tokens, seed: 0, with_greedy: true };
        let mut out = Vec::new();
        self.run(&[prompt.to_vec()], &[Job { prompt: 0, greedy: true }], &s, &mut fastrand::Rng::with_seed(0), |_, o| out = o)?;
        Ok(out)
    }

    /// Generates every job's continuation with all sequences of the context busy: a sequence that ends takes the
    /// next job at once, so one long answer no longer leaves the others' lanes idle until it ends. Jobs are taken in
    /// order and those of one prompt must be adjacent: they share its decoded prompt (its cache copied from a
    /// sequence that holds it, not decoded again). A new prompt is decoded in calls of its own, so every
    /// generation call holds at most `n_seq` tokens, which the batch-invariant kernels compute as single-token
    /// decoding does. Not bit for bit, though, once jobs follow each other on a sequence: on an AVX-512 machine
    /// (session 14) a later job's greedy answer tipped at a near tie, the same with its prompt decoded whole. The
    /// likely cause, not proven: it reuses cells an earlier job freed, a token can then sit in a cell before its
    /// predecessors', and attention sums the sequence's cells in another order. The compile uses greedy answers to estimate
    /// coverage and as one sample among K, where that does not matter; serving verifies with the target itself.
    /// `done(job, tokens)` is called as each job ends, in the order they end.
    pub fn run(&mut self, prompts: &[Vec<Token>], jobs: &[Job], s: &Sampling, rng: &mut fastrand::Rng, mut done: impl FnMut(usize, Vec<Token>)) -> Result<(), LlamaError> {
        self.ctx.clear();
        let greedy = Sampling { temperature: 0.0, ..s.clone() };
        let mut lanes: Vec<Lane> = (0..self.n_seq).map(|_| Lane::Free).collect();
        // The logits after the prompt of the latest job begun: every job of that prompt draws its first token there.
        let mut first: Option<(usize, Vec<f32>)> = None;
        let mut next_job = 0;
        let mut batch = Batch::new(self.n_seq.max(1), 1);
        let mut rows: Vec<usize> = Vec::with_capacity(self.n_seq);
        loop {
            let mut l = 0;
            while l < lanes.len() && next_job < jobs.len() {
                if matches!(lanes[l], Lane::Busy { .. }) {
                    l += 1;
                    continue;
                }
                let (job, p) = (next_job, jobs[next_job].prompt);
                next_job += 1;
                let prompt = &prompts[p];
                let budget = s.max_tokens.min(self.n_ctx_seq.saturating_sub(prompt.len() + 1));
                if budget == 0 {
                    done(job, Vec::new());
                    continue;
                }
                let holder = if lanes[l].holds(jobs, p) { Some(l) } else { (0..lanes.len()).find(|&h| lanes[h].holds(jobs, p)) };
                match holder.filter(|_| first.as_ref().is_some_and(|(fp, _)| *fp == p)) {
                    Some(h) if h == l => {}
                    Some(h) => {
                        self.ctx.seq_rm(l as i32, -1, -1);
                        self.ctx.seq_cp(h as i32, l as i32, 0, prompt.len() as i32);
                    }
                    None => {
                        // A prompt in the cache that begins the same way (a shared instruction, the chat template's
                        // system turn) lends its decoded beginning, and only the rest is decoded. At least the last
                        // token is decoded: its logits are the first token's distribution.
                        let (from, n) = (0..lanes.len())
                            .filter_map(|h| lanes[h].prompt(jobs).map(|q| (h, common_prefix(&prompts[q], prompt))))
                            .max_by_key(|&(h, n)| (n, h == l))
                            .map_or((l, 0), |(h, n)| (h, n.min(prompt.len().saturating_sub(1))));
                        if from == l || n == 0 {
                            self.ctx.seq_rm(l as i32, n as i32, -1);
                        } else {
                            self.ctx.seq_rm(l as i32, -1, -1);
                            self.ctx.seq_cp(from as i32, l as i32, 0, n as i32);
                        }
                        first = Some((p, self.prefill(&prompt[n..], n, l)?));
                    }
                }
                let logits = first.as_ref().map(|(_, v)| v.as_slice()).unwrap_or_default();
                let t = sample_token(logits, if jobs[job].greedy { &greedy } else { s }, rng);
                lanes[l] = Lane::Busy { job, out: Vec::new(), budget };
                // A job may end at its first token; the lane then takes the next job in this same pass.
                self.take(&mut lanes, l, t, jobs, next_job, prompts, &mut done);
            }
            batch.clear();
            rows.clear();
            for (l, lane) in lanes.iter().enumerate() {
                if let Lane::Busy { job, out, .. } = lane {
                    let pos = prompts[jobs[*job].prompt].len() + out.len() - 1;
                    batch.add(*out.last().expect("a busy lane has its first token"), pos as i32, &[l as i32], true);
                    rows.push(l);
                }
            }
            if rows.is_empty() {
                return Ok(());
            }
            self.ctx.decode(&batch)?;
            for (i, &l) in rows.iter().enumerate() {
                let job = match &lanes[l] {
                    Lane::Busy { job, .. } => *job,
                    _ => continue,
                };
                let t = sample_token(self.ctx.logits(i as i32), if jobs[job].greedy { &greedy } else { s }, rng);
                self.take(&mut lanes, l, t, jobs, next_job, prompts, &mut done);
            }
        }
    }

    /// Lane `l` generated `t`: kept, and when it ends the job, the job is handed over and the lane freed, keeping its
    /// prompt's cache when the next job to begin is of the same prompt.
    #[allow(clippy::too_many_arguments)]
    fn take(&mut self, lanes: &mut [Lane], l: usize, t: Token, jobs: &[Job], next_job: usize, prompts: &[Vec<Token>], done: &mut impl FnMut(usize, Vec<Token>)) {
        let Lane::Busy { job, out, budget } = &mut lanes[l] else { return };
        out.push(t);
        if !self.model.is_eog(t) && out.len() < *budget {
            return;
        }
        let (job, out) = (*job, std::mem::take(out));
        let p = jobs[job].prompt;
        lanes[l] = if jobs.get(next_job).is_some_and(|j| j.prompt == p) {
            self.ctx.seq_rm(l as i32, prompts[p].len() as i32, -1);
            Lane::Holds(p)
        } else {
            self.ctx.seq_rm(l as i32, -1, -1);
            Lane::Free
        };
        done(job, out);
    }

    /// Decodes `tokens`, which begin at position `start` of a prompt, into sequence `seq` (in chunks of the batch
    /// size); the logits of the last one.
    fn prefill(&mut self, tokens: &[Token], start: usize, seq: usize) -> Result<Vec<f32>, LlamaError> {
        let mut batch = Batch::new(512, 1);
        for (c, chunk) in tokens.chunks(512).enumerate() {
            batch.clear();
            for (i, &t) in chunk.iter().enumerate() {
                let at = c * 512 + i;
                batch.add(t, (start + at) as i32, &[seq as i32], at + 1 == tokens.len());
            }
            self.ctx.decode(&batch)?;
        }
        Ok(self.ctx.logits(-1).to_vec())
    }
}

/// One continuation for [`Teacher::run`] to generate: of which prompt, and whether greedy or sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Job {
    pub prompt: usize,
    pub greedy: bool,
}

/// One sequence of the teacher's context.
enum Lane {
    Free,
    /// Free, with the decoded prompt of this prompt index still in its cache.
    Holds(usize),
    Busy { job: usize, out: Vec<Token>, budget: usize },
}

impl Lane {
    /// The prompt whose decoded tokens (positions 0..len) this lane's cache holds, to copy from.
    fn prompt(&self, jobs: &[Job]) -> Option<usize> {
        match self {
            Lane::Free => None,
            Lane::Holds(q) => Some(*q),
            Lane::Busy { job, .. } => Some(jobs[*job].prompt),
        }
    }

    fn holds(&self, jobs: &[Job], p: usize) -> bool {
        self.prompt(jobs) == Some(p)
    }
}

/// How many tokens `a` and `b` begin with alike.
fn common_prefix(a: &[Token], b: &[Token]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The `k` largest logits' token ids, largest first (ties: lower id first), in one pass without sorting or
/// allocating the whole vocabulary (151,936 logits for Qwen, at every sampled token of a compile).
fn top_k(logits: &[f32], k: usize) -> Vec<usize> {
    let k = k.min(logits.len());
    let mut idx: Vec<usize> = Vec::with_capacity(k);
    let smallest = |idx: &[usize]| (0..idx.len()).min_by(|&a, &b| logits[idx[a]].total_cmp(&logits[idx[b]]).then(idx[b].cmp(&idx[a]))).unwrap_or(0);
    let mut low = 0; // place in idx of the smallest kept logit, once idx is full
    for (i, &x) in logits.iter().enumerate() {
        if idx.len() < k {
            idx.push(i);
            if idx.len() == k {
                low = smallest(&idx);
            }
        } else if x > logits[idx[low]] {
            idx[low] = i;
            low = smallest(&idx);
        }
    }
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    idx
}

/// Temperature sampling over the top_k logits; temperature ≤ 0 is greedy.
pub fn sample_token(logits: &[f32], s: &Sampling, rng: &mut fastrand::Rng) -> Token {
    if s.temperature <= 0.0 || s.top_k <= 1 {
        return argmax(logits);
    }
    let idx = top_k(logits, s.top_k);
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
    fn top_k_agrees_with_sorting_everything() {
        let mut rng = fastrand::Rng::with_seed(3);
        for n in [1usize, 5, 40, 41, 1000] {
            // Few distinct values, so ties are common.
            let logits: Vec<f32> = (0..n).map(|_| rng.u8(..20) as f32 * 0.5).collect();
            for k in [1usize, 2, 40, 2000] {
                let mut naive: Vec<usize> = (0..n).collect();
                naive.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
                naive.truncate(k);
                assert_eq!(top_k(&logits, k), naive, "n {n} k {k}");
            }
        }
    }

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
