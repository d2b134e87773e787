//! The request's predicted output (OpenAI's `prediction`, handed over after `begin`): text the caller expects
//! the answer to repeat, a second text to copy from beside the request's own. Verification is unchanged, so a
//! wrong prediction costs rejected drafts, never a different output.
//!
//! It is indexed as the continuation of the prompt's last tokens, so the answer's first tokens already match
//! it (the chat template's assistant header is the shared context), and the match lengths of copies from it
//! grade their evidence exactly as the request's own copies do: a long sure copy drafts long.

use super::context::{ContextIndex, MAX_MATCH};

/// Prompt tokens the prediction is indexed after: as many as a match length measures.
const PROMPT_TAIL: usize = MAX_MATCH;

/// One sequence's prediction and what became of the tokens drafted from it during this request.
#[derive(Clone, Debug, Default)]
pub struct Prediction {
    /// The prompt's tail followed by the predicted tokens; None: this request has no prediction.
    index: Option<ContextIndex>,
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

    /// The request's prediction is `tokens`, the answer to `prompt`; matched like `ctx` matches.
    pub fn set(&mut self, ctx: &ContextIndex, prompt: &[i32], tokens: &[i32]) {
        if tokens.is_empty() {
            self.index = None;
            return;
        }
        let tail = &prompt[prompt.len().saturating_sub(PROMPT_TAIL)..];
        let text: Vec<i32> = tail.iter().chain(tokens).copied().collect();
        self.index = Some(ctx.sibling(&text));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prediction_continues_the_prompt() {
        let ctx = ContextIndex::new(4);
        let mut p = Prediction::default();
        let prompt = [1, 2, 3, 4];
        p.set(&ctx, &prompt, &[20, 21, 22]);
        // The answer's first token is the prediction's: the next one is proposed after a 5-token match.
        let ix = p.index().unwrap();
        let c = ix.find_after(&prompt, &[20], 2).unwrap();
        assert_eq!((ix.token(c), c.len), (21, 5));
        assert_eq!(ix.advance(c).map(|d| ix.token(d)), Some(22));
        assert_eq!(ix.advance(ix.advance(c).unwrap()), None, "the prediction ends");
        assert_eq!(ix.find_after(&[7, 8], &[], 1), None);
        p.set(&ctx, &prompt, &[]);
        assert!(p.index().is_none(), "an empty prediction is none");
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
