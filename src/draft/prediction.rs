//! The request's predicted output (OpenAI's `prediction`, handed over after `begin`): text the caller expects
//! the answer to repeat, a second text to copy from beside the request's own. Verification is unchanged, so a
//! wrong prediction costs rejected drafts, never a different output.
//!
//! It is indexed as the continuation of the prompt's last tokens, so the answer's first tokens already match
//! it (the chat template's assistant header is the shared context), and the match lengths of copies from it
//! grade their evidence exactly as the request's own copies do: a long sure copy drafts long.

use super::context::{ContextIndex, MAX_MATCH};
use super::syntax::TokenTexts;

/// Prompt tokens the prediction is indexed after: as many as a match length measures.
const PROMPT_TAIL: usize = MAX_MATCH;
/// Most tokens a coda keeps: a fence's close or a closing line, not a paragraph.
const MAX_CODA: usize = 8;
/// Last predicted tokens an answer must repeat to count as having reached its prediction's end.
const REACHED: usize = 4;

/// One sequence's prediction and what became of the tokens drafted from it during this request.
#[derive(Clone, Debug, Default)]
pub struct Prediction {
    /// The prompt's tail, the predicted tokens and the [`Coda`] learned so far; None: this request has no prediction.
    index: Option<ContextIndex>,
    /// Where in `index` the predicted tokens start and end.
    start: usize,
    end: usize,
    /// Predicted tokens drafted and kept by verification …
    pub accepted: u64,
    /// … and drafted and discarded (the first token the target disagreed with and every one after it).
    pub rejected: u64,
}

impl Prediction {
    /// A new request: no prediction, nothing counted.
    pub fn clear(&mut self) {
        *self = Prediction::default();
    }

    /// The request's prediction is `tokens`, the answer to `prompt`, followed by what answers wrote after theirs
    /// (`coda`, read with `texts`); matched like `ctx` matches.
    pub fn set(&mut self, ctx: &ContextIndex, prompt: &[i32], tokens: &[i32], coda: &Coda, texts: Option<&TokenTexts>) {
        if tokens.is_empty() {
            self.index = None;
            return;
        }
        let tail = &prompt[prompt.len().saturating_sub(PROMPT_TAIL)..];
        let text: Vec<i32> = tail.iter().copied().chain(coda.follow(tokens, texts)).collect();
        (self.start, self.end) = (tail.len(), tail.len() + tokens.len());
        self.index = Some(ctx.sibling(&text));
    }

    /// Where the predicted tokens start in the [`index`](Self::index).
    pub fn start(&self) -> usize {
        self.start
    }

    /// The predicted tokens; None without a prediction.
    pub fn tokens(&self) -> Option<&[i32]> {
        Some(&self.index.as_ref()?.tokens()[self.start..self.end])
    }

    /// Whether a copy of position `pos` of the [`index`](Self::index) copies the caller's prediction (not the
    /// prompt's tail or the coda).
    pub fn is_predicted(&self, pos: usize) -> bool {
        (self.start..self.end).contains(&pos)
    }

    /// The prompt's tail and the prediction, to copy from with [`ContextIndex::find_after`]; None without one.
    pub fn index(&self) -> Option<&ContextIndex> {
        self.index.as_ref()
    }

    /// Counts a verified draft of `g` tokens of which the first `n` were kept (bit i of `predicted`: token i
    /// was the prediction's); returns the predicted tokens it kept and discarded.
    pub fn observe(&mut self, predicted: u32, g: usize, n: usize) -> (u64, u64) {
        let bits = |from: usize, to: usize| (from..to).filter(|&i| predicted >> i & 1 == 1).count() as u64;
        let (kept, discarded) = (bits(0, n), bits(n, g));
        self.accepted += kept;
        self.rejected += discarded;
        (kept, discarded)
    }
}

/// What answers wrote right after repeating their prediction to its end, learned from the latest that did and
/// indexed after the next prediction, so a copy that reaches the predicted text's end runs on into it. A model
/// that fences its code closes the fence there where a caller predicts the bare code: on the project's code edits
/// that close took a verify step of its own in every answer. Whether the answer went on to a new line is learned
/// apart from the tokens: a prediction that ends mid-line ends in a token the answer writes merged with the line
/// break (`]` then `]\n`), one that ends a line does not, so the break is written as the next prediction's end
/// spells it. Shared by all sequences.
#[derive(Clone, Debug, Default)]
pub struct Coda {
    /// The answer's text went on to a new line right after the predicted text.
    line_break: bool,
    /// The tokens after that (after the line break, if any).
    rest: Vec<i32>,
}

impl Coda {
    /// Learns from an `answer` (as far as the drafter saw it) to a request whose prediction was `predicted`:
    /// what it wrote after the latest place it repeated the prediction's last tokens, if it wrote anything there.
    pub fn learn(&mut self, predicted: &[i32], answer: &[i32], texts: Option<&TokenTexts>) {
        let Some((&last, body)) = predicted.split_last() else { return };
        let body = &body[body.len().saturating_sub(REACHED - 1)..];
        let k = body.len();
        let merged = texts.and_then(|t| t.newlined(last));
        let Some(j) = (k..answer.len()).rev().find(|&j| answer[j - k..j] == *body && (answer[j] == last || merged == Some(answer[j]))) else {
            return;
        };
        let mut rest = &answer[j + 1..];
        let line_break = if answer[j] != last || texts.is_some_and(|tx| tx.ends_line(last)) {
            true
        } else if let (Some(&t), Some(nl)) = (rest.first(), texts.and_then(TokenTexts::newline)) {
            rest = &rest[usize::from(t == nl)..];
            t == nl
        } else {
            false
        };
        if line_break || !rest.is_empty() {
            *self = Coda { line_break, rest: rest[..rest.len().min(MAX_CODA)].to_vec() };
        }
    }

    /// `tokens` (not empty) as an answer that repeats them to their end writes them, and the rest of the coda.
    fn follow(&self, tokens: &[i32], texts: Option<&TokenTexts>) -> Vec<i32> {
        let mut text = tokens.to_vec();
        let last = tokens[tokens.len() - 1];
        match texts.filter(|tx| self.line_break && !tx.ends_line(last)) {
            None => {}
            Some(tx) => match (tx.newlined(last), tx.newline()) {
                (Some(merged), _) => *text.last_mut().expect("not empty") = merged,
                (None, Some(nl)) => text.push(nl),
                // No token writes a line break: the rest would follow on the wrong line.
                (None, None) => return text,
            },
        }
        text.extend_from_slice(&self.rest);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prediction_continues_the_prompt() {
        let ctx = ContextIndex::new(4);
        let mut p = Prediction::default();
        let prompt = [1, 2, 3, 4];
        p.set(&ctx, &prompt, &[20, 21, 22], &Coda::default(), None);
        // The answer's first token is the prediction's: the next one is proposed after a 5-token match.
        let ix = p.index().unwrap();
        let c = ix.find_after(&prompt, &[20], 2).unwrap();
        assert_eq!((ix.token(c), c.len), (21, 5));
        assert_eq!(ix.advance(c).map(|d| ix.token(d)), Some(22));
        assert_eq!(ix.advance(ix.advance(c).unwrap()), None, "the prediction ends");
        assert_eq!(ix.find_after(&[7, 8], &[], 1), None);
        p.set(&ctx, &prompt, &[], &Coda::default(), None);
        assert!(p.index().is_none(), "an empty prediction is none");
    }

    #[test]
    fn a_copy_that_reaches_the_predicted_end_runs_on_into_the_coda() {
        let ctx = ContextIndex::new(4);
        let mut coda = Coda::default();
        // The answer fenced its predicted `20 21 22 23 24` (9 opens, 8 closes, 2 ends the answer).
        coda.learn(&[20, 21, 22, 23, 24], &[9, 20, 21, 22, 23, 24, 8, 2], None);
        assert_eq!((coda.line_break, &coda.rest[..]), (false, &[8, 2][..]));
        coda.learn(&[20, 21, 22, 23, 24], &[9, 20, 21, 30], None);
        coda.learn(&[20, 21, 22, 23, 24], &[9, 20, 21, 22, 23, 24], None);
        coda.learn(&[], &[1, 2], None);
        assert_eq!(coda.rest, [8, 2], "an answer that left its prediction, or ended with it, teaches nothing");
        coda.learn(&[5, 6, 7, 8], &(5..40).collect::<Vec<i32>>(), None);
        assert_eq!(coda.rest, [9, 10, 11, 12, 13, 14, 15, 16], "a coda is short");
        coda.learn(&[20, 21, 22, 23, 24], &[9, 20, 21, 22, 23, 24, 8, 2], None);

        let mut p = Prediction::default();
        p.set(&ctx, &[1, 2], &[40, 41, 42, 43], &coda, None);
        assert_eq!(p.tokens(), Some(&[40, 41, 42, 43][..]));
        let ix = p.index().unwrap();
        let c = ix.find_after(&[1, 2, 40, 41], &[42, 43], 2).unwrap();
        assert_eq!((ix.token(c), p.is_predicted(c.pos)), (8, false), "the coda follows, not predicted");
        assert!(p.is_predicted(c.pos - 1) && !p.is_predicted(0));
    }

    #[test]
    fn the_coda_breaks_the_line_as_the_predicted_end_spells_it() {
        // Token texts: 0 `x`, 1 `]`, 2 `]\n`, 3 "```", 4 `)`, 5 `)\n`, 6 `y`, 7 `z`, 8 `;`, 9 `\n`, 10 `;\n`.
        let texts = TokenTexts::new(&[b"x", b"]", b"]\n", b"```", b")", b")\n", b"y", b"z", b";", b"\n", b"x\n"]);
        let mut coda = Coda::default();
        // Predicted `y x ]`, answered `y x ]\n` and a fence's close.
        coda.learn(&[6, 0, 1], &[3, 6, 0, 2, 3], Some(&texts));
        assert_eq!((coda.line_break, &coda.rest[..]), (true, &[3][..]));
        let ctx = ContextIndex::new(3);
        let mut p = Prediction::default();
        let mut indexed = |tokens: &[i32], coda: &Coda| {
            p.set(&ctx, &[9], tokens, coda, Some(&texts));
            p.index().unwrap().tokens()[1..].to_vec()
        };
        assert_eq!(indexed(&[7, 6, 4], &coda), [7, 6, 5, 3], "`)` is written `)\n`, then the close");
        assert_eq!(indexed(&[7, 6, 8], &coda), [7, 6, 8, 9, 3], "no token is `;\n`: a newline of its own");
        assert_eq!(indexed(&[7, 6, 10], &coda), [7, 6, 10, 3], "the prediction ended its line");
        // An answer that repeated a prediction ending in `x\n` and closed the fence teaches the same.
        coda.learn(&[6, 10], &[6, 10, 3], Some(&texts));
        assert_eq!((coda.line_break, &coda.rest[..]), (true, &[3][..]));
        // One that wrote the newline as a token of its own, too; one that stayed on the line does not break it.
        coda.learn(&[6, 4], &[6, 4, 9, 3, 0], Some(&texts));
        assert_eq!((coda.line_break, &coda.rest[..]), (true, &[3, 0][..]));
        coda.learn(&[6, 4], &[6, 4, 8], Some(&texts));
        assert_eq!(indexed(&[7, 6, 1], &coda), [7, 6, 1, 8]);
        assert!(p.is_predicted(3) && !p.is_predicted(4));
    }

    #[test]
    fn counts_kept_and_discarded_predicted_tokens() {
        let mut p = Prediction::default();
        // Tokens 0, 1, 3 of 5 were predicted; the target kept 2.
        assert_eq!(p.observe(0b01011, 5, 2), (2, 1));
        assert_eq!((p.accepted, p.rejected), (2, 1));
        p.observe(0b111, 3, 3);
        assert_eq!((p.accepted, p.rejected), (5, 1));
        p.clear();
        assert_eq!((p.accepted, p.rejected), (0, 0));
    }
}
