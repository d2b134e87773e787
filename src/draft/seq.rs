//! What the drafter keeps per sequence (llama-server slot).

use super::class::{Class, N_CLASSES};
use super::context::ContextIndex;
use super::decision::Decision;
use super::rates::{Acceptance, Rates};
use super::enumeration::Enumerations;
use super::miss::Pending;
use super::prediction::Prediction;
use super::rewrite::Rewrites;
use super::stats::Stats;
use super::syntax::{Answer, Lex, TokenTexts};

#[derive(Default)]
pub(super) struct Seq {
    pub(super) ctx: ContextIndex,
    /// The edits the answer made to text it copies, proposed again where that text recurs.
    pub(super) rewrites: Rewrites,
    /// The request's predicted output, when it came with one, and the counts of drafts from it.
    pub(super) pred: Prediction,
    /// Where in the answer's syntax each position falls (read when token texts are attached).
    pub(super) answer: Answer,
    /// The prompt's lists of names (the keys an answer will write, in order).
    pub(super) enums: Enumerations,
    /// Reader state before each chain token, and a buffer for the latest key's text.
    pub(super) chain_lex: Vec<Lex>,
    pub(super) key: Vec<u8>,
    pub(super) scratch: Vec<i32>,
    pub(super) chain: Vec<(i32, Class)>,
    /// Bit i: chain token i was copied from the prediction.
    pub(super) chain_predicted: u32,
    pub(super) draft: Vec<i32>,
    /// Sequence length (with the last sampled token) when `draft` was proposed.
    pub(super) draft_base: usize,
    pub(super) awaiting_accept: bool,
    /// Drafted tokens the last `accept` kept, until a `propose` mirrors them: a request's last ones reach none.
    pub(super) kept: usize,
    /// The chain token right after the draft (token, class), judged by the token the target puts there once
    /// the draft was kept whole. Only the rates all sequences share learn from it:
    /// replayed (Qwen2.5-Coder-1.5B, no pack, this CPU's β), JSON extraction gained 6–8% (the live index's weak
    /// recipes, declined at their priors, were right 67–97% of the time there), while a sequence's own rates
    /// learning from it too cost HumanEval 1.3%.
    pub(super) judge: Option<(i32, Class)>,
    /// Acceptance per class of evidence (what the control drafts by) …
    pub(super) rates: Rates<N_CLASSES>,
    /// … and per drafted position (what the counters report).
    pub(super) acc: Acceptance,
    pub(super) off_steps: u32,
    /// Consecutive steps that drafted.
    pub(super) drafting_run: u32,
    /// When this sequence's last call ended; None: its next interval is not timed (a new request here or
    /// elsewhere: the interval holds a prompt's decode).
    pub(super) last_ns: Option<u64>,
    pub(super) pending: Vec<Pending>,
    /// What the control did in this sequence's latest step (read by a step log).
    pub(super) decision: Decision,
    /// Tokens of the sequence counted into the live index (the answer's, from its start).
    pub(super) fed: usize,
    /// History + chain so far, for the draft model.
    pub(super) model_hist: Vec<i32>,
    pub(super) stats: Stats,
}

impl Seq {
    /// A sequence whose request n-grams run up to `ctx_max_n` tokens.
    pub(super) fn new(ctx_max_n: usize) -> Seq {
        Seq { ctx: ContextIndex::new(ctx_max_n), ..Seq::default() }
    }

    /// A new request on this sequence: its prompt replaces the last one; counters persist, acceptance and
    /// timing start over.
    pub(super) fn restart(&mut self, prompt: &[i32], texts: Option<&TokenTexts>) {
        self.ctx.reset(prompt);
        self.rewrites.reset(prompt.len());
        self.pred.clear();
        self.answer.reset(prompt.len());
        self.enums = texts.map(|t| Enumerations::from_prompt(t, prompt)).unwrap_or_default();
        self.draft.clear();
        self.awaiting_accept = false;
        self.kept = 0;
        self.judge = None;
        self.rates = Rates::default();
        self.acc = Acceptance::default();
        self.off_steps = 0;
        self.drafting_run = 0;
        self.last_ns = None;
        self.pending.clear();
        self.decision = Decision::default();
        self.fed = prompt.len();
    }
}
