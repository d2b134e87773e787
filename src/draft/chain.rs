//! The chain: the tokens one draft proposes, each looked up after the ones before it, with the evidence
//! (its [`Class`]) each rests on.

use super::class::{Class, N_CLASSES};
use super::config::{Context, DrafterConfig};
use super::context::{ContextIndex, Copy, MAX_MATCH};
use super::control::{may_pay_more, Verify};
use super::rates::Rates;
use super::enumeration::Enumerations;
use super::rewrite::{Rewrites, Rule, Text};
use super::seq::Seq;
use super::syntax::{self, Lex, Place, TokenTexts};
use super::TokenSource;
use crate::index::{Hit, Index};
use crate::live::Live;
use crate::windows::Windows;

/// Fills `s.chain` with up to `want` tokens, each looked up after the ones before it: where a key starts, the
/// key the prompt's lists name; else the pack's recipe (the live index's where the pack has none) or a copy of the request's own text or of its
/// prediction (the copy where they disagree; a copy, once started, runs on token by token while its tokens
/// are taken; `s.chain_predicted` marks the tokens the prediction's copy proposed); the draft model
/// (source, sequence, how many of the first positions it may fill) answers where none does. Each token's
/// class is its evidence at its place in the answer's syntax (read over `texts`, when given). Under the
/// break-even control the chain ends where no further token could pay, or, `offering` it to a step decided
/// together, where its tokens stop being that sure. Returns the copy's token for the
/// first position when the pack had no recipe there (a possible miss of the pack). `first`: the first place's
/// windows, when the caller hashed them already ([`Lookups::windows`] of the history).
#[allow(clippy::too_many_arguments)]
pub(super) fn build_chain(
    index: Option<&Index>,
    live: Option<&Live>,
    texts: Option<&TokenTexts>,
    cfg: &DrafterConfig,
    s: &mut Seq,
    want: usize,
    global: &Rates<N_CLASSES>,
    verify: &Verify,
    need: f64,
    offering: Option<f32>,
    mut model: Option<(&mut (dyn TokenSource + 'static), usize, usize)>,
    mut first: Option<Windows>,
) -> Option<i32> {
    let lookups = Lookups::new(index, live);
    s.chain.clear();
    s.chain_predicted = 0;
    s.chain_lex.clear();
    s.scratch.clear();
    let hist = s.ctx.tokens();
    let keep = index.map_or(0, Index::max_n).max(live.map_or(0, Live::max_n)).min(hist.len());
    s.scratch.extend_from_slice(&hist[hist.len() - keep..]);
    let mut copy: Option<Copying> = None;
    let mut uncovered = None;
    let mut lex = s.answer.now();
    let mut line_start = texts.is_some_and(|tx| starts_line(tx, hist));
    // The key being drafted from the prompt's list, and how much of it is in the chain.
    let mut listed: Option<(&[i32], usize)> = None;
    let (mut expected, mut run, mut best) = (1.0f64, 1.0f64, need);
    // While every token so far is as sure as `offering`, the chain is an offer to the step and is looked for on.
    let mut sure = offering.is_some();
    for i in 0..want {
        if cfg.adaptive && !sure && !may_pay_more(expected, run, best, verify, i, want) {
            break;
        }
        let place = lex.place();
        if let (None, true, Some(texts), Some(opener)) = (listed, cfg.context == Context::All, texts, lex.key_start()) {
            let rev = s.chain.iter().zip(&s.chain_lex).rev().map(|(&(t, _), &l)| (l, texts.get(t)));
            let rev = rev.chain(s.answer.rev(texts, s.ctx.tokens()));
            listed = next_key(&s.enums, rev, lex.depth(), opener, &mut s.key).map(|k| (k, 0));
        }
        let mut w = first.take().unwrap_or_else(|| lookups.windows(&s.scratch));
        let pack = index
            .and_then(|ix| ix.find(&mut w).filter(|h| cfg.sure(h)))
            .map(|h| (h.token, Class::pack(h.kind, h.count, h.confidence(), place)));
        let recipe = pack.or_else(|| {
            let h = lookups.live(&mut w, &s.scratch).filter(|h| cfg.sure(h))?;
            Some((h.token, Class::live(h.kind, h.count, h.confidence(), place)))
        });
        if copy.is_none() {
            let pred = s.pred.index().map(|ix| (ix, opening(s, texts)));
            copy = Copying::find(&s.ctx, pred, &s.rewrites, &s.scratch[keep..], cfg.ctx_min_n, cfg.context, s.answer.start());
        }
        // A copy never proposes a control token: in the prompt those are the chat template's markers, which
        // the answer does not repeat (on HumanEval the copy of a docstring ran on into `<|im_end|>`).
        let copied = copy
            .map(|c| (c.token(), c.class(place, line_start)))
            .filter(|&(t, _)| !texts.is_some_and(|tx| tx.is_control(t)))
            // A copy after a one-token match (or none) gives way to a recipe, and its agreeing with one is no evidence.
            .filter(|&(_, c)| recipe.is_none() || !c.is_unmatched());
        if i == 0 && pack.is_none() {
            uncovered = copied.map(|(t, _)| t);
        }
        // A key the prompt's list names comes first: neither a recipe nor a copy knows this request's keys.
        // Agreement is evidence of its own kind; where they disagree the request's own text wins (a recipe
        // it contradicts was right 0–12% of the time on held-out answers).
        let mut next = match (listed, recipe, copied) {
            (Some((k, j)), ..) => Some((k[j], Class::listed(place))),
            (None, Some(a), Some(b)) if a.0 == b.0 => Some((a.0, Class::agreed(place))),
            (None, a, b) => b.or(a),
        };
        listed = listed.filter(|&(k, j)| j + 1 < k.len()).map(|(k, j)| (k, j + 1));
        // A copy runs on while its tokens are taken; once the chain leaves it, the next token looks again.
        let predicted = matches!((copy, next), (Some(c), Some((t, _))) if c.predicted && c.token() == t && s.pred.is_predicted(c.at.pos));
        copy = match (copy, next) {
            (Some(c), Some((t, _))) if c.token() == t => c.advance(),
            _ => None,
        };
        if next.is_none() {
            if let Some((src, seq, n)) = model.as_mut() {
                if i < *n {
                    s.model_hist.clear();
                    s.model_hist.extend_from_slice(s.ctx.tokens());
                    s.model_hist.extend(s.chain.iter().map(|&(t, _)| t));
                    next = src.next(*seq, &s.model_hist).map(|t| (t, Class::model(place)));
                }
            }
        }
        let Some((t, c)) = next else { break };
        // A token that would break a one-line string is judged as that, whatever proposed it.
        let c = match texts {
            Some(tx) if lex.place_of(tx.get(t)) == Place::LineBreak => c.at(Place::LineBreak),
            _ => c,
        };
        let p = estimate(cfg, global, &s.rates, c);
        sure &= offering.is_some_and(|x| p >= x);
        run *= f64::from(p);
        expected += run;
        best = best.max(verify.score(expected, i + 1, 0.0));
        if predicted {
            s.chain_predicted |= 1 << i;
        }
        s.chain.push((t, c));
        s.chain_lex.push(lex);
        s.scratch.push(t);
        if let Some(texts) = texts {
            lex.feed(texts.get(t));
            line_start = line_after(texts.get(t), line_start);
        }
    }
    uncovered
}

/// Whether the next token starts a line: the history's last line holds at most indentation so far (read back
/// at most 64 tokens; a line longer than that is taken as not blank).
fn starts_line(texts: &TokenTexts, hist: &[i32]) -> bool {
    for &t in hist.iter().rev().take(64) {
        let text = texts.get(t);
        match memchr::memrchr(b'\n', text) {
            Some(i) => return is_blank(&text[i + 1..]),
            None if !is_blank(text) => return false,
            None => {}
        }
    }
    false
}

/// [`starts_line`] after one more token of `text`, from what it was before it.
fn line_after(text: &[u8], before: bool) -> bool {
    match memchr::memrchr(b'\n', text) {
        Some(i) => is_blank(&text[i + 1..]),
        None => before && is_blank(text),
    }
}

fn is_blank(text: &[u8]) -> bool {
    text.iter().all(|&b| b == b' ' || b == b'\t')
}

/// How the chain hashes the windows of a place: once for the pack's index and the live index, which read the same
/// windows (and, built by the engine, the same shape table); apart only for a live index with a table of its own.
pub(super) struct Lookups<'a> {
    live: Option<&'a Live>,
    /// Longest literal and shape windows either reads.
    max: (usize, usize),
    shared: bool,
}

impl<'a> Lookups<'a> {
    pub(super) fn new(index: Option<&Index>, live: Option<&'a Live>) -> Lookups<'a> {
        let (a, b) = (index.map_or((0, 0), Index::max_ns), live.map_or((0, 0), Live::max_ns));
        let shared = match (index.and_then(Index::shapes), live.and_then(Live::shapes)) {
            (Some(x), Some(y)) => x.same(y),
            _ => true,
        };
        Lookups { live, max: (a.0.max(b.0), a.1.max(b.1)), shared }
    }

    /// The windows at the end of `history`, for both tables.
    pub(super) fn windows(&self, history: &[i32]) -> Windows {
        Windows::new(history, self.max.0, self.max.1)
    }

    /// Whether windows hashed here serve the live index too (else it hashes its own).
    pub(super) fn shared(&self) -> bool {
        self.shared
    }

    /// The live index's recipe at the end of `history`, whose windows are `w` (None without a live index).
    #[inline]
    fn live(&self, w: &mut Windows, history: &[i32]) -> Option<Hit> {
        let live = self.live?;
        if self.shared {
            live.find_windows(w)
        } else {
            live.lookup(history)
        }
    }
}

/// Where in the prediction's index the answer may start to repeat it at this point of the chain: on a line that
/// starts in the answer's opening, before the answer copied any of it (a model that fences the code a caller
/// predicted bare starts it on the line after the fence), at the prediction's first token past blank lines.
fn opening(s: &Seq, texts: Option<&TokenTexts>) -> Option<usize> {
    let (texts, ix, hist) = (texts?, s.pred.index()?, s.ctx.tokens());
    let written = hist.len() + s.chain.len() - s.answer.start().min(hist.len());
    let last = s.chain.last().map(|c| c.0).or(hist.last().copied())?;
    if written > OPENING_LINES || s.pred.accepted > 0 || s.rewrites.following(Text::Predicted).is_some() || !texts.ends_line(last) {
        return None;
    }
    let t = ix.tokens();
    (s.pred.start()..t.len()).find(|&q| !texts.is_newlines(t[q]))
}

/// Answer tokens within which a line's start may be where the answer starts to repeat its prediction: a code
/// fence's line or a sentence before it, not an answer that went its own way.
const OPENING_LINES: usize = 32;

/// A copy being drafted, from the text it copies: the request's own or its prediction. A copy proposes,
/// where it reaches a span the answer rewrote before, the answer's version ([`Rewrites`]) and runs on after
/// the span.
#[derive(Clone, Copy)]
struct Copying<'a> {
    from: &'a ContextIndex,
    at: Copy,
    predicted: bool,
    /// The prediction's first token, proposed where a line of the answer's opening starts (no match behind it).
    opening: bool,
    /// Mirror position of the answer's first token: a copy of the request's own text from here on copies
    /// what the answer wrote, not the prompt.
    answer_start: usize,
    /// The answer's rewrites and, while a rule's new text is proposed, the rule and how much of that text the
    /// chain has.
    rules: &'a Rewrites,
    rewriting: Option<(&'a Rule, usize)>,
}

impl<'a> Copying<'a> {
    /// The copy after the longer match of the history's end (`own`'s mirror followed by `drafted`): in the
    /// prediction (when there is one) or in the request's own text (as far as `use_own` allows), each read as
    /// it is or, where the history ends in an answer's rewrite, as the text that rewrite replaced; the
    /// prediction on a tie, as it is the caller's word on this very answer. The answer starts at
    /// `answer_start` of the mirror. With the prediction comes where its text starts when the history ends a line
    /// of the answer's opening: there, without a longer match in it, the prediction's first token is proposed.
    fn find(own: &'a ContextIndex, pred: Option<(&'a ContextIndex, Option<usize>)>, rules: &'a Rewrites, drafted: &[i32], min_n: usize, use_own: Context, answer_start: usize) -> Option<Copying<'a>> {
        let hist = own.tokens();
        let (pred, opening) = (pred.map(|p| p.0), pred.and_then(|p| p.1));
        let base = |from, at, predicted| Copying { from, at, predicted, opening: false, answer_start, rules, rewriting: None };
        let copy = |from: &'a ContextIndex, at, predicted| base(from, at, predicted).rewrite();
        // Where the answer is copying a text, that copy goes on unless another match is longer.
        let followed = |ix: &'a ContextIndex, text, predicted| copy(ix, ix.follow(rules.following(text)?, hist, drafted, min_n)?, predicted);
        let p = pred.and_then(|ix| copy(ix, ix.find_after(hist, drafted, min_n)?, true));
        let p = longer(p, pred.and_then(|ix| followed(ix, Text::Predicted, true)));
        let p = longer(p, pred.and_then(|ix| Copying::undone(base(ix, Copy::default(), true), hist, drafted, min_n)));
        let p = match (p, pred.zip(opening)) {
            (p, Some((ix, pos))) if p.is_none_or(|c| c.at.len < 2) && pos < ix.tokens().len() => {
                Some(Copying { opening: true, ..base(ix, Copy { pos, len: 1, ambiguous: false }, true) })
            }
            (p, _) => p,
        };
        // Rewrites of the own text are tracked against the prompt, which an answer-only copy does not read.
        let o = match use_own {
            Context::Off => None,
            Context::Answer => own.find_from(drafted, min_n, answer_start).and_then(|at| copy(own, at, false)),
            Context::All => longer(
                longer(own.find(drafted, min_n).and_then(|at| copy(own, at, false)), followed(own, Text::Own, false)),
                Copying::undone(base(own, Copy::default(), false), hist, drafted, min_n),
            ),
        };
        match (p, o) {
            (Some(p), Some(o)) if o.at.len > p.at.len => Some(o),
            (p, o) => p.or(o),
        }
    }

    /// The copy of the text a rewrite replaced in `c.from`, where the history (`hist` followed by `drafted`)
    /// ends in the start of its new text.
    fn undone(c: Copying<'a>, hist: &[i32], drafted: &[i32], min_n: usize) -> Option<Copying<'a>> {
        let len = hist.len() + drafted.len();
        let at = |i: usize| if i < hist.len() { hist[i] } else { drafted[i - hist.len()] };
        let text = if c.predicted { Text::Predicted } else { Text::Own };
        let (rule, j, p, n) = c.rules.undo(text, c.from.tokens(), len, at, min_n)?;
        let at = Copy { pos: p, len: (n + j).min(MAX_MATCH), ambiguous: false };
        Copying { at, rewriting: Some((rule, j)), ..c }.rewritten()
    }

    /// Where this copy stands at a span a rule rewrites: the rule's new text first.
    fn rewrite(self) -> Option<Copying<'a>> {
        match self.rules.at(self.from.tokens(), self.at.pos) {
            Some(rule) => Copying { rewriting: Some((rule, 0)), ..self }.rewritten(),
            None => Some(self),
        }
    }

    /// Past a rule's new text (or with none of it left), the copy goes on after the span it replaced.
    fn rewritten(self) -> Option<Copying<'a>> {
        match self.rewriting {
            Some((rule, j)) if j >= rule.to.len() => {
                let pos = self.at.pos + rule.from.len();
                (pos < self.from.tokens().len()).then_some(Copying { at: Copy { pos, ..self.at }, rewriting: None, ..self })
            }
            _ => Some(self),
        }
    }

    fn token(self) -> i32 {
        match self.rewriting {
            Some((rule, j)) => rule.to[j],
            None => self.from.token(self.at),
        }
    }

    /// A rewritten token is evidence of its own kind; the others are copies after their match, of the
    /// prompt or the prediction, or of what the answer wrote.
    fn class(self, place: Place, line_start: bool) -> Class {
        match self.rewriting {
            Some(_) => Class::rewrite(place),
            None if self.opening => Class::opening(place),
            None => Class::copy(self.at.len, self.at.ambiguous, !self.predicted && self.at.pos >= self.answer_start, line_start, place),
        }
    }

    /// The same copy one token further on; None where its text ends.
    fn advance(self) -> Option<Copying<'a>> {
        match self.rewriting {
            Some((rule, j)) => {
                let at = Copy { len: (self.at.len + 1).min(MAX_MATCH), ..self.at };
                Copying { at, rewriting: Some((rule, j + 1)), ..self }.rewritten()
            }
            None => Copying { at: self.from.advance(self.at)?, opening: false, ..self }.rewrite(),
        }
    }
}

/// The copy of the two read as the text a rewrite replaced, where it matches no shorter.
fn longer<'a>(plain: Option<Copying<'a>>, undone: Option<Copying<'a>>) -> Option<Copying<'a>> {
    match (plain, undone) {
        (Some(c), Some(u)) if c.at.len > u.at.len => Some(c),
        (c, u) => u.or(c),
    }
}

/// The token a copy of the request's own text (`ctx`, read with the answer's `rewrites`) proposes next, as
/// a chain's first token would: the replay's oracle asks it at every position (for the token only, so where the
/// answer starts, which only a copy's class reads, is not given).
pub fn copied_token(ctx: &ContextIndex, rewrites: &Rewrites, min_n: usize) -> Option<i32> {
    Copying::find(ctx, None, rewrites, &[], min_n, Context::All, 0).map(Copying::token)
}

/// Acceptance expected of `c` on a sequence with `rates`: its own counts shrunk towards those all sequences
/// share (`global`), and those towards the prior. Computed per drafted token, not for every class per call.
#[inline]
pub(super) fn estimate(cfg: &DrafterConfig, global: &Rates<N_CLASSES>, rates: &Rates<N_CLASSES>, c: Class) -> f32 {
    let i = c.index();
    rates.estimate(i, global.estimate(i, cfg.class_prior[i], cfg.global_prior_weight), cfg.seq_prior_weight)
}

/// The key that starts here by the prompt's lists: after the latest key at `depth` (in `rev`, (reader state,
/// text) of the tokens so far, latest first) when it follows a `,`; when it opens an object, the first
/// item of that key's list (the next object of an array), or of the prompt's first list at the top level.
pub fn next_key<'e, 'a>(enums: &'e Enumerations, rev: impl Iterator<Item = (Lex, &'a [u8])>, depth: u32, opener: u8, key: &mut Vec<u8>) -> Option<&'e [i32]> {
    if enums.is_empty() {
        return None;
    }
    match (opener, syntax::last_key(rev, depth, key)) {
        (b',', true) => enums.after(key),
        (b'{', true) => enums.first_with(key),
        (b'{', false) if depth == 1 => enums.first(),
        _ => None,
    }
}
