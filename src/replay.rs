//! Replay: recorded greedy continuations served to the drafter with a verify-cost table as the clock.
//!
//! Served for real, a drafting policy is measured through machine noise (±5% here), and only on this
//! machine's β. Replayed, the same drafter (break-even control included, learning β from the clock it is
//! given) is measured exactly, and under any β: this CPU's, or free verification (β = 1, what a GPU comes
//! close to), which is how tokens per verify step and acceptance carry over to other hardware. Greedy
//! verification keeps a drafted token exactly when it equals the recorded one, so the replay is exact.

use crate::draft::context::ContextIndex;
use crate::draft::enumeration::Enumerations;
use crate::draft::rewrite::Rewrites;
use crate::draft::syntax::{Answer, TokenTexts};
use crate::draft::{copied_token, next_key, Context, Drafter, DrafterConfig, Proposed};
use crate::index::Index;

mod batched;
mod ngram_simple;
mod recordings;
pub use batched::{replay_batched, replay_batched_traced, Batched, Oracle, Served, Serving};
pub use ngram_simple::NgramSimple;
pub use recordings::{model_key, Recordings};

/// One recorded request: the prompt's tokens, the output the request predicted (OpenAI's `prediction`;
/// empty for none) and the target's greedy continuation.
#[derive(Clone, Debug, Default)]
pub struct Recorded {
    pub prompt: Vec<i32>,
    pub prediction: Vec<i32>,
    pub output: Vec<i32>,
}

/// What a replay measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Replayed {
    /// Tokens generated after the first (the first comes from the prompt pass, as in llama-server's timings).
    pub tokens: usize,
    /// Target forward passes (verify steps).
    pub passes: usize,
    /// Their cost in plain steps.
    pub cost: f64,
    pub drafted: usize,
    pub accepted: usize,
}

impl Replayed {
    /// Decode speed relative to plain decoding (one plain step per token).
    pub fn speedup(&self) -> f64 {
        if self.cost > 0.0 { self.tokens as f64 / self.cost } else { 1.0 }
    }

    pub fn tokens_per_pass(&self) -> f64 {
        if self.passes > 0 { self.tokens as f64 / self.passes as f64 } else { 0.0 }
    }

    pub fn acceptance(&self) -> f64 {
        if self.drafted > 0 { self.accepted as f64 / self.drafted as f64 } else { 0.0 }
    }

    fn add(&mut self, o: &Replayed) {
        self.tokens += o.tokens;
        self.passes += o.passes;
        self.cost += o.cost;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
    }
}

/// A drafter under replay: the plugin's [`Drafter`] (on sequence 0) or a baseline such as llama.cpp's
/// ngram-simple ([`NgramSimple`]), so both are measured on the same recordings and the same clock.
pub trait Proposer {
    /// A new request with this prompt and predicted output (empty for none).
    fn begin(&mut self, prompt: &[i32], prediction: &[i32]);
    /// Drafts at most `n_max` tokens after `hist` + `last` into `out`, at `now_ns` on the clock.
    fn propose(&mut self, hist: &[i32], last: i32, n_max: usize, now_ns: u64, out: &mut Vec<i32>) -> usize;
    /// The target kept the first `n` drafted tokens.
    fn accept(&mut self, n: usize);
    /// The tokens the last `propose` looked at, drafted or not, with their evidence (none for a baseline).
    fn last_chain(&self) -> Vec<Proposed> {
        Vec::new()
    }
}

impl Proposer for Drafter {
    fn begin(&mut self, prompt: &[i32], prediction: &[i32]) {
        Drafter::begin(self, 0, prompt);
        if !prediction.is_empty() {
            Drafter::predict(self, 0, prediction);
        }
    }
    fn propose(&mut self, hist: &[i32], last: i32, n_max: usize, now_ns: u64, out: &mut Vec<i32>) -> usize {
        Drafter::propose(self, 0, hist, last, n_max, now_ns, out)
    }
    fn accept(&mut self, n: usize) {
        Drafter::accept(self, 0, n);
    }
    fn last_chain(&self) -> Vec<Proposed> {
        Drafter::last_chain(self, 0)
    }
}

/// One verify step of a replay, for a trace of the drafter's decisions.
#[derive(Clone, Debug)]
pub struct Step {
    /// Index of the recording, and the tokens before the step (prompt and answer, with the one just sampled).
    pub run: usize,
    pub position: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// The chain the drafter built (longer than the draft where the control cut it), and how many of its first
    /// tokens the recording has next: where `right` exceeds `drafted` a longer draft would have been kept.
    pub chain: Vec<Proposed>,
    pub right: usize,
}

impl Step {
    /// A step of recording `run` that drafted `drafted` tokens from `chain` where the recording has `next`.
    fn new(run: usize, position: usize, drafted: usize, accepted: usize, chain: Vec<Proposed>, next: &[i32]) -> Step {
        let right = chain.iter().zip(next).take_while(|(c, &t)| c.token == t).count();
        Step { run, position, drafted, accepted, chain, right }
    }
}

/// Serves `runs` in order to `d`, drafting at most `n_max` tokens a step; a pass verifying m tokens costs
/// `beta(m)` plain steps of `unit_ns` each on the drafter's clock. Returns each run's measurement and
/// their sum.
pub fn replay(d: &mut impl Proposer, runs: &[Recorded], n_max: usize, beta: impl Fn(usize) -> f64, unit_ns: f64) -> (Vec<Replayed>, Replayed) {
    replay_with(d, runs, n_max, beta, unit_ns, None)
}

/// [`replay`], showing `trace` every step.
pub fn replay_traced(
    d: &mut impl Proposer,
    runs: &[Recorded],
    n_max: usize,
    beta: impl Fn(usize) -> f64,
    unit_ns: f64,
    mut trace: impl FnMut(Step),
) -> (Vec<Replayed>, Replayed) {
    replay_with(d, runs, n_max, beta, unit_ns, Some(&mut trace))
}

/// The replay loop; the chain behind each draft is read only when traced.
fn replay_with(
    d: &mut impl Proposer,
    runs: &[Recorded],
    n_max: usize,
    beta: impl Fn(usize) -> f64,
    unit_ns: f64,
    mut trace: Option<&mut dyn FnMut(Step)>,
) -> (Vec<Replayed>, Replayed) {
    let mut now = 0u64;
    let mut total = Replayed::default();
    let mut each = Vec::with_capacity(runs.len());
    let mut draft = Vec::new();
    for (run, r) in runs.iter().enumerate() {
        let mut m = Replayed::default();
        let Some((&first, rest)) = r.output.split_first() else {
            each.push(m);
            continue;
        };
        d.begin(&r.prompt, &r.prediction);
        let mut hist = r.prompt.clone();
        let mut last = first;
        let mut i = 0; // rest[i] is what the target samples next
        while i < rest.len() {
            // llama-server never verifies past the request's remaining tokens.
            let g = d.propose(&hist, last, n_max.min(rest.len() - i), now, &mut draft);
            let position = hist.len() + 1;
            let (acc, took) = verify(&draft, &rest[i..], &mut hist, &mut last);
            if let Some(trace) = trace.as_mut() {
                trace(Step::new(run, position, g, acc, d.last_chain(), &rest[i..]));
            }
            d.accept(acc);
            let cost = beta(g + 1);
            now += (cost * unit_ns) as u64;
            i += took;
            m.passes += 1;
            m.cost += cost;
            m.drafted += g;
            m.accepted += acc;
        }
        m.tokens = rest.len();
        total.add(&m);
        each.push(m);
    }
    (each, total)
}

/// Greedy verification of `draft` against `rest`, the recording's next tokens (not empty): returns the drafted
/// tokens the target keeps and the tokens the step yields (those and the target's own, never past the recording),
/// and moves the history (`hist`, with `last` the token just sampled) past them.
fn verify(draft: &[i32], rest: &[i32], hist: &mut Vec<i32>, last: &mut i32) -> (usize, usize) {
    let acc = draft.iter().zip(rest).take_while(|(a, b)| a == b).count();
    let took = (acc + 1).min(rest.len());
    hist.push(*last);
    hist.extend_from_slice(&rest[..took - 1]);
    *last = rest[took - 1];
    (acc, took)
}

/// The ceiling of the evidence itself: at every position the pack's recipe (as confident as the drafter
/// asks), the request's copy (as long a match as it asks, with the rewrites the answer made so far) and, with
/// token texts, the key the prompt's lists name are looked up on the true history, and an
/// oracle drafts exactly the runs where one of them is right, up to `n_max`, and nothing else. No control
/// can tell right proposals from wrong ones better than this, so it is the ceiling of the drafter with the
/// same evidence (up to a copy that runs on where a fresh lookup would jump elsewhere); the distance to it
/// is what not knowing which proposals are right costs.
pub fn oracle(
    index: Option<&Index>,
    texts: Option<&TokenTexts>,
    cfg: &DrafterConfig,
    runs: &[Recorded],
    n_max: usize,
    beta: impl Fn(usize) -> f64,
) -> Replayed {
    let mut total = Replayed::default();
    for right in right_proposals(index, texts, cfg, runs) {
        let mut m = Replayed { tokens: right.len(), ..Replayed::default() };
        let mut i = 0;
        while i < right.len() {
            // One pass: the run of right proposals, then the target's own token.
            let run = right_run(&right, i, n_max);
            let cost = beta(run + 1);
            m.passes += 1;
            m.cost += cost;
            m.drafted += run;
            m.accepted += run;
            i += run + 1;
        }
        total.add(&m);
    }
    total
}

/// The oracle's draft at `done` tokens into a recording whose proposals are `right`: the run of right ones, at most
/// `n_max`, never the last token (the target's own either way: drafting it would only make the step dearer).
pub fn right_run(right: &[bool], done: usize, n_max: usize) -> usize {
    right[done..right.len() - 1].iter().take(n_max).take_while(|&&ok| ok).count()
}

/// Per recording, per token after the first (`output[1..]`): whether some source the drafter reads proposes it
/// after the true history before it ([`oracle`] says which sources).
pub fn right_proposals(index: Option<&Index>, texts: Option<&TokenTexts>, cfg: &DrafterConfig, runs: &[Recorded]) -> Vec<Vec<bool>> {
    let mut ctx = ContextIndex::new(cfg.ctx_max_n);
    if let Some(tx) = texts {
        ctx.set_canon(tx.canonical());
    }
    let (mut answer, mut key, mut rewrites) = (Answer::default(), Vec::new(), Rewrites::default());
    let mut all = Vec::with_capacity(runs.len());
    for r in runs {
        let Some((&first, rest)) = r.output.split_first() else {
            all.push(Vec::new());
            continue;
        };
        ctx.reset(&r.prompt);
        rewrites.reset(r.prompt.len());
        answer.reset(r.prompt.len());
        let enums = texts.map(|tx| Enumerations::from_prompt(tx, &r.prompt)).unwrap_or_default();
        let mut listed: Option<&[i32]> = None;
        let mut hist = r.prompt.clone();
        // right[i]: some source proposes rest[i] after prompt + output[..=i].
        let mut right = Vec::with_capacity(rest.len());
        let mut last = first;
        for &t in rest {
            let kept = ctx.sync_each(&hist, last, |c, x| rewrites.observe(c, None, true, x));
            hist.push(last);
            if let Some(tx) = texts {
                answer.sync(tx, &hist, kept);
                if let Some(opener) = answer.now().key_start() {
                    listed = next_key(&enums, answer.rev(tx, &hist), answer.now().depth(), opener, &mut key);
                }
            }
            let pack = index.and_then(|ix| cfg.recipe(ix, &hist)).is_some_and(|h| h.token == t);
            let copy = cfg.context == Context::All
                && copied_token(&ctx, &rewrites, cfg.ctx_min_n) == Some(t)
                && !texts.is_some_and(|tx| tx.is_control(t));
            // A listed key is proposed token by token while the answer spells it.
            let list = listed.is_some_and(|k| k.first() == Some(&t));
            listed = listed.filter(|_| list).map(|k| &k[1..]).filter(|k| !k.is_empty());
            right.push(pack || copy || list);
            last = t;
        }
        all.push(right);
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draft::DrafterConfig;

    /// A continuation that copies a passage of the prompt.
    fn copying() -> Recorded {
        copying_from(100)
    }

    /// A continuation that copies a passage of 60 tokens from `start` on out of its prompt, then writes 3 more.
    pub(super) fn copying_from(start: i32) -> Recorded {
        let passage: Vec<i32> = (start..start + 60).collect();
        let mut prompt = vec![1, 2, 3];
        prompt.extend(&passage);
        prompt.extend([4, 5]);
        let mut output = passage.clone();
        output.extend([7, 8, 9]);
        Recorded { prompt, output, ..Recorded::default() }
    }

    #[test]
    fn free_verification_pays_for_copies_and_accounting_adds_up() {
        let mut d = Drafter::new(None, DrafterConfig::default());
        let runs = [copying(), copying()];
        let (each, total) = replay(&mut d, &runs, 15, |_| 1.0, 1e6);
        assert_eq!(total.tokens, 2 * 62);
        assert_eq!(each.len(), 2);
        // Every pass yields its accepted tokens plus the target's own, but the last pass of a run may end
        // on an accepted token.
        assert!(total.tokens <= total.accepted + total.passes && total.accepted + total.passes <= total.tokens + runs.len(), "{total:?}");
        assert!(total.speedup() > 3.0, "{total:?}");
        assert!(total.acceptance() > 0.8, "{total:?}");
    }

    #[test]
    fn the_oracle_drafts_every_right_run_and_bounds_the_drafter() {
        let runs = [copying(), copying()];
        let cfg = DrafterConfig::default();
        let free = oracle(None, None, &cfg, &runs, 15, |_| 1.0);
        assert_eq!(free.tokens, 2 * 62);
        assert_eq!(free.drafted, free.accepted);
        // The copied passage is right from its third token on (a copy needs a 2-token match); the tail is not.
        let mut d = Drafter::new(None, DrafterConfig::default());
        let (_, real) = replay(&mut d, &runs, 15, |_| 1.0, 1e6);
        assert!(free.speedup() >= real.speedup(), "oracle {free:?} below the drafter {real:?}");
        let cpu = |m: usize| if m == 1 { 1.0 } else { 1.6 + 0.5 * (m - 2) as f64 };
        let mut d = Drafter::new(None, DrafterConfig::default());
        let (_, real) = replay(&mut d, &runs, 15, cpu, 1e6);
        assert!(oracle(None, None, &cfg, &runs, 15, cpu).speedup() >= real.speedup());
        // Nothing to copy, nothing right: one pass per token.
        let flat = [Recorded { prompt: vec![1, 2, 3], output: (10..30).collect(), ..Recorded::default() }];
        let o = oracle(None, None, &cfg, &flat, 15, |_| 1.0);
        assert_eq!((o.passes, o.drafted, o.tokens), (19, 0, 19));
    }

    #[test]
    fn a_trace_shows_every_step_and_the_chain_behind_its_draft() {
        let mut d = Drafter::new(None, DrafterConfig::default());
        let runs = [copying(), copying()];
        let mut steps = Vec::new();
        let (_, total) = replay_traced(&mut d, &runs, 15, |m| 1.0 + 0.3 * (m - 1) as f64, 1e6, |s| steps.push(s));
        assert_eq!(steps.len(), total.passes);
        assert_eq!(steps.iter().map(|s| s.accepted).sum::<usize>(), total.accepted);
        assert_eq!(steps.iter().map(|s| s.drafted).sum::<usize>(), total.drafted);
        assert!(steps.iter().all(|s| s.chain.len() >= s.drafted && s.right >= s.accepted && s.right.min(s.drafted) == s.accepted), "{steps:?}");
        assert!(steps.iter().all(|s| s.chain.iter().all(|c| (0.0..=1.0).contains(&c.p))));
        // The second recording starts where the first ended, each at the prompt's end (the first token sampled).
        let starts: Vec<usize> = steps.iter().filter(|s| s.position == runs[0].prompt.len() + 1).map(|s| s.run).collect();
        assert_eq!(starts, [0, 1]);
        // The passage is copied: most steps draft, and their chains rest on copies.
        assert!(steps.iter().filter(|s| s.drafted > 0).count() * 2 > steps.len(), "{steps:?}");
        assert!(steps.iter().flat_map(|s| &s.chain).all(|c| c.class.source() == crate::draft::class::Source::Context), "{steps:?}");
        // A baseline shows its steps with no chain.
        let mut n = NgramSimple::DEFAULT;
        let mut count = 0;
        replay_traced(&mut n, &runs, 15, |_| 1.0, 1e6, |s| {
            assert!(s.chain.is_empty() && s.right == 0);
            count += 1;
        });
        assert!(count > 0);
    }

    #[test]
    fn a_costly_verify_is_declined_and_nothing_is_lost() {
        // Verifying 2 tokens costs 3 steps: no draft can pay, and the control must find that out. It does so by
        // drafting: the first few drafts, priced by the β prior, are a fixed cost of learning (13 plain steps
        // here), so the runs are long enough for it not to be the whole measure.
        let mut d = Drafter::new(None, DrafterConfig::default());
        let runs = vec![copying(); 8];
        let (_, total) = replay(&mut d, &runs, 15, |m| if m == 1 { 1.0 } else { 1.5 * m as f64 }, 1e6);
        assert!(total.speedup() > 0.95, "never much slower than plain decoding: {total:?}");
        let mut plain = Drafter::new(None, DrafterConfig { max_draft: 0, ..DrafterConfig::default() });
        let (_, none) = replay(&mut plain, &runs, 15, |_| 1.0, 1e6);
        assert_eq!((none.passes, none.drafted, none.speedup()), (none.tokens, 0, 1.0));
    }
}
