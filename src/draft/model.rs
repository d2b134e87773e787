//! The draft-model source (issue 4): a small model with the target's tokenizer, run in the plugin's own
//! llama context with its LM head skipped (patch 0003), its final hidden state scored by the subset head
//! on a shortlist of the vocabulary plus the request's own tokens, greedily, with a margin fallback to the
//! full head.

use super::TokenSource;
use crate::head::{needs_full_head, top2, HeadDevice, HeadError, HeadInfo, HeadOptions, SubsetHead};
use crate::llama::{Batch, Context, ContextOptions, LlamaError, Model, ModelOptions};
use crate::shortlist::Shortlist;
use std::path::PathBuf;
use std::time::Instant;

/// How the draft model is set up.
#[derive(Clone, Debug)]
pub struct ModelDraftConfig {
    pub model: PathBuf,
    /// The shortlist the subset head scores (checked against the draft model's tokenizer); None = every
    /// id (the full head).
    pub shortlist: Option<PathBuf>,
    /// Score the full head when the subset's top-1 − top-2 logit margin is below this (0 = never).
    pub margin: f32,
    /// Also score the ids of the request's own text that the shortlist lacks (see `RequestRows`).
    pub request_rows: bool,
    pub n_seq: usize,
    /// KV cells shared by all sequences (the target's context size is enough).
    pub n_ctx: u32,
    pub n_threads: i32,
    /// Where the heads (subset, full fallback, request rows) run; the model's layers go to every GPU.
    pub head_device: HeadDevice,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelDraftError {
    #[error(transparent)]
    Llama(#[from] LlamaError),
    #[error("draft model {0}: {1}")]
    Head(String, HeadError),
    #[error("{0}")]
    Shortlist(String),
}

/// What the draft model did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ModelDraftStats {
    /// Tokens predicted.
    pub tokens: u64,
    /// … of which the margin sent to the full head.
    pub fallbacks: u64,
    /// … of which the request's own rows (outside the shortlist) gave the token.
    pub request_hits: u64,
    /// Times a sequence's request rows were rebuilt (new ids outside the shortlist in its text).
    pub request_rebuilds: u64,
    /// Tokens decoded to catch up with the target (history the draft model had not seen).
    pub caught_up: u64,
    /// Wall time in `next`, ns.
    pub ns: u64,
    /// Whether the LM head of the draft model is skipped in llama.cpp (false: it runs and is wasted).
    pub head_skipped: bool,
}

/// A draft model drafting greedily through a subset head. Fields drop in order: the context before the
/// model it borrows.
pub struct ModelDrafter {
    ctx: Context<'static>,
    batch: Batch,
    n_batch: usize,
    head: SubsetHead,
    /// Every row, for the margin fallback (None when `head` already is the full head).
    full: Option<SubsetHead>,
    margin: f32,
    /// Rows outside the shortlist found in each sequence's text (None: full head, or turned off).
    request: Option<RequestRows>,
    /// Tokens in the draft KV cache, per sequence.
    seqs: Vec<Vec<i32>>,
    logits: Vec<f32>,
    full_logits: Vec<f32>,
    /// Exponential moving average of ns per predicted token (catch-up included).
    ema_ns: Option<f64>,
    stats: ModelDraftStats,
    model: Box<Model>,
}

impl ModelDrafter {
    /// Loads the draft GGUF, its context and its head(s).
    pub fn load(cfg: &ModelDraftConfig) -> Result<ModelDrafter, ModelDraftError> {
        let model = Box::new(Model::load(&cfg.model, &ModelOptions::default())?);
        // SAFETY: the model is boxed (its address is stable) and owned by the returned value, whose
        // field order drops `ctx` before `model`; the 'static borrow never escapes this struct.
        let model_ref: &'static Model = unsafe { &*(model.as_ref() as *const Model) };
        let n_batch = 512;
        let mut ctx = Context::new(
            model_ref,
            &ContextOptions {
                n_ctx: cfg.n_ctx.max(512),
                n_batch: n_batch as u32,
                n_seq: cfg.n_seq.max(1) as u32,
                n_threads: cfg.n_threads,
                flash_attn: None,
                // The target verifies every token: cell order need not match anything here.
                kv_unified: true,
            },
        )?;
        ctx.set_embeddings(true);
        let head_skipped = ctx.set_skip_output_head(true);
        let n_vocab = model.n_vocab() as u32;
        let all: Vec<u32> = (0..n_vocab).collect();
        let opts = HeadOptions { n_threads: cfg.n_threads.max(1), device: cfg.head_device };
        let path = cfg.model.display().to_string();
        let head_err = |e| ModelDraftError::Head(path.clone(), e);
        // The GGUF is parsed once for every head made from it.
        let info = HeadInfo::open(&cfg.model).map_err(head_err)?;
        let load = |ids: &[u32]| {
            let raw = info.read_rows(ids).map_err(head_err)?;
            SubsetHead::from_rows(&info, ids, &raw, &opts).map_err(head_err)
        };
        let ids = match &cfg.shortlist {
            Some(p) => Some(Shortlist::load(p, &model).map_err(|e| ModelDraftError::Shortlist(e.to_string()))?.ids),
            None => None,
        };
        let (head, full) = match &ids {
            Some(ids) if (ids.len() as u32) < n_vocab => {
                let full = if cfg.margin > 0.0 { Some(load(&all)?) } else { None };
                (load(ids)?, full)
            }
            _ => (load(&all)?, None),
        };
        let request = match &ids {
            Some(ids) if cfg.request_rows && (ids.len() as u32) < n_vocab => {
                Some(RequestRows::new(info.clone(), ids, cfg.n_seq.max(1), opts.clone()))
            }
            _ => None,
        };
        Ok(ModelDrafter {
            ctx,
            batch: Batch::new(n_batch, 1),
            n_batch,
            logits: vec![0.0; head.len()],
            full_logits: vec![0.0; full.as_ref().map_or(0, SubsetHead::len)],
            head,
            full,
            margin: cfg.margin,
            request,
            seqs: vec![Vec::new(); cfg.n_seq.max(1)],
            ema_ns: None,
            stats: ModelDraftStats { head_skipped, ..ModelDraftStats::default() },
            model,
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Rows the head scores.
    pub fn head_rows(&self) -> usize {
        self.head.len()
    }

    /// The ggml backend the head runs on (e.g. "CPU", "Vulkan0").
    pub fn head_backend(&self) -> String {
        self.head.backend_name()
    }

    pub fn stats(&self) -> ModelDraftStats {
        self.stats
    }

    /// Brings `seq`'s KV cache to `history` (trimmed to the common prefix, so a new request sharing the
    /// system prompt reuses it) and returns the hidden state's next token.
    fn predict(&mut self, seq: usize, history: &[i32]) -> Result<Option<i32>, LlamaError> {
        let Some(kv) = self.seqs.get_mut(seq) else { return Ok(None) };
        if history.is_empty() {
            return Ok(None);
        }
        let common = kv.iter().zip(history).take_while(|(a, b)| a == b).count();
        // The last token is always decoded again: its hidden state is the one scored.
        let keep = common.min(history.len() - 1);
        if keep < kv.len() && !self.ctx.seq_rm(seq as i32, keep as i32, -1) {
            // A partial removal can fail on some caches; start the sequence over.
            self.ctx.seq_rm(seq as i32, 0, -1);
            kv.clear();
            return self.predict_from(seq, history, 0);
        }
        kv.truncate(keep);
        if let Some(r) = self.request.as_mut() {
            if r.update(seq, history, keep).map_err(|e| LlamaError::Context(e.to_string()))? {
                self.stats.request_rebuilds += 1;
            }
        }
        self.predict_from(seq, history, keep)
    }

    fn predict_from(&mut self, seq: usize, history: &[i32], from: usize) -> Result<Option<i32>, LlamaError> {
        let mut i = from;
        while i < history.len() {
            let end = (i + self.n_batch).min(history.len());
            self.batch.clear();
            for (p, &t) in history.iter().enumerate().take(end).skip(i) {
                self.batch.add(t, p as i32, &[seq as i32], p + 1 == history.len());
            }
            if let Err(e) = self.ctx.decode(&self.batch) {
                // Whatever was written is unknown: forget the sequence.
                self.ctx.seq_rm(seq as i32, 0, -1);
                self.seqs[seq].clear();
                return Err(e);
            }
            self.seqs[seq].extend_from_slice(&history[i..end]);
            i = end;
        }
        self.stats.caught_up += (history.len() - from).saturating_sub(1) as u64;
        let h = self.ctx.embeddings(-1);
        let err = |e: HeadError| LlamaError::Context(e.to_string());
        self.head.logits_into(h, 1, &mut self.logits).map_err(err)?;
        let (i1, mut v1, mut v2) = top2(&self.logits);
        let mut best = self.head.ids()[i1];
        if let Some((id, b1, b2)) = self.request.as_mut().map(|r| r.top2(seq, h)).transpose().map_err(err)?.flatten() {
            if b1 > v1 {
                (best, v2, v1) = (id, v1.max(b2), b1);
                self.stats.request_hits += 1;
            } else {
                v2 = v2.max(b1);
            }
        }
        if let Some(full) = self.full.as_mut().filter(|_| needs_full_head(v1, v2, self.margin)) {
            full.logits_into(h, 1, &mut self.full_logits).map_err(err)?;
            self.stats.fallbacks += 1;
            return Ok(Some(top2(&self.full_logits).0 as i32));
        }
        Ok(Some(best as i32))
    }
}

impl TokenSource for ModelDrafter {
    fn next(&mut self, seq: usize, history: &[i32]) -> Option<i32> {
        let t0 = Instant::now();
        let r = self.predict(seq, history);
        let ns = t0.elapsed().as_nanos() as u64;
        self.stats.ns += ns;
        let t = r.ok().flatten()?;
        self.stats.tokens += 1;
        self.ema_ns = Some(match self.ema_ns {
            None => ns as f64,
            Some(m) => m + 0.1 * (ns as f64 - m),
        });
        Some(t)
    }

    fn cost_ns(&self) -> Option<f64> {
        self.ema_ns
    }

    fn summary(&self) -> String {
        let s = &self.stats;
        format!(
            "draft model {} rows on {}{}: {} tokens, {:.2} ms/token, head fallbacks {} ({:.1}%), request rows gave {} ({} rebuilds), caught up {}",
            self.head.len(),
            self.head.backend_name(),
            if s.head_skipped { "" } else { " (llama.cpp head not skipped)" },
            s.tokens,
            s.ns as f64 / 1e6 / s.tokens.max(1) as f64,
            s.fallbacks,
            100.0 * s.fallbacks as f64 / s.tokens.max(1) as f64,
            s.request_hits,
            s.request_rebuilds,
            s.caught_up
        )
    }
}

/// Most rows a sequence's request head holds; past it the set starts over from the current text.
const MAX_REQUEST_ROWS: usize = 8192;

/// The ids of each sequence's own text (prompt and output) that the static shortlist lacks, scored by a
/// small second head. What a request copies from its prompt (names, e-mail addresses, identifiers) is
/// often made of rare tokens no frequency-ranked list holds, and those copies are where a draft model
/// agrees with its target most; the rows are read once per new id, so the cost is one tiny GEMM a step.
struct RequestRows {
    info: HeadInfo,
    opts: HeadOptions,
    /// Bit i set: id i is in the shortlist.
    listed: Vec<u64>,
    seqs: Vec<SeqRows>,
    logits: Vec<f32>,
}

#[derive(Default)]
struct SeqRows {
    /// Ids of the sequence's text outside the shortlist, in order of appearance.
    ids: Vec<u32>,
    seen: ahash::AHashSet<u32>,
    /// The text before this index has been looked at.
    scanned: usize,
    head: Option<SubsetHead>,
}

impl RequestRows {
    fn new(info: HeadInfo, shortlist: &[u32], n_seq: usize, opts: HeadOptions) -> RequestRows {
        let mut listed = vec![0u64; info.n_vocab.div_ceil(64)];
        for &id in shortlist.iter().filter(|&&id| (id as usize) < info.n_vocab) {
            listed[id as usize / 64] |= 1 << (id % 64);
        }
        RequestRows { info, opts, listed, seqs: (0..n_seq).map(|_| SeqRows::default()).collect(), logits: Vec::new() }
    }

    /// Takes in `history` (of which the first `keep` tokens were seen before) and rebuilds the sequence's
    /// head when it brought new ids. Ids only accumulate within a sequence (a rejected draft or an earlier
    /// request leaves a few extra rows, which cost a little time and nothing in correctness), until the
    /// cap starts the set over from the current text. Returns whether the head was rebuilt.
    fn update(&mut self, seq: usize, history: &[i32], keep: usize) -> Result<bool, HeadError> {
        let (listed, s) = (&self.listed, &mut self.seqs[seq]);
        let n_vocab = self.info.n_vocab;
        let outside = |id: u32| (id as usize) < n_vocab && listed[id as usize / 64] >> (id % 64) & 1 == 0;
        let from = s.scanned.min(keep);
        s.scanned = history.len();
        let fresh: Vec<u32> = history[from..].iter().map(|&t| t as u32).filter(|&id| outside(id) && s.seen.insert(id)).collect();
        if fresh.is_empty() {
            return Ok(false);
        }
        if s.ids.len() + fresh.len() > MAX_REQUEST_ROWS {
            // Start over from the current text; `take` stops the filter, so `seen` holds the kept ids only.
            s.seen.clear();
            s.ids = history.iter().map(|&t| t as u32).filter(|&id| outside(id) && s.seen.insert(id)).take(MAX_REQUEST_ROWS).collect();
        } else {
            s.ids.extend(fresh);
        }
        let raw = self.info.read_rows(&s.ids)?;
        s.head = Some(SubsetHead::from_rows(&self.info, &s.ids, &raw, &self.opts)?);
        Ok(true)
    }

    /// The best and second-best logits of the sequence's request rows for hidden state `h`, with the best
    /// id (None: no rows yet).
    fn top2(&mut self, seq: usize, h: &[f32]) -> Result<Option<(u32, f32, f32)>, HeadError> {
        let Some(head) = self.seqs.get_mut(seq).and_then(|s| s.head.as_mut()) else { return Ok(None) };
        self.logits.resize(head.len(), 0.0);
        head.logits_into(h, 1, &mut self.logits)?;
        let (i, a, b) = top2(&self.logits);
        Ok(Some((head.ids()[i], a, b)))
    }
}
