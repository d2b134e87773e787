//! N-gram lookup over the current request (prompt + generated tokens), kept incrementally.
//!
//! A mirror of the sequence plus a map from the key of every k-gram (k ≤ `max_n`) to the position
//! right after its most recent occurrence and how often it occurred. Syncing with the caller's tokens costs O(new tokens)
//! in the usual case (the sequence only grew or lost its tail); predictions verify the matched
//! window against the mirror, so stale map entries left by a rollback are harmless.

use ahash::AHashMap;
use std::sync::Arc;

use crate::hash::SuffixHasher;

/// Tokens compared at the tail of the mirror to accept it as a prefix without a full scan.
const TAIL_CHECK: usize = 16;

#[derive(Clone, Debug, Default)]
pub struct ContextIndex {
    tokens: Vec<i32>,
    /// k-gram key → (position after its latest occurrence, occurrences).
    next: AHashMap<u64, (u32, u32)>,
    max_n: usize,
    /// Token id → the id it is matched as (see [`TokenTexts::canonical`](super::syntax::TokenTexts::canonical));
    /// empty: every token as itself.
    canon: Arc<[i32]>,
}

impl ContextIndex {
    pub fn new(max_n: usize) -> ContextIndex {
        ContextIndex {
            tokens: Vec::new(),
            next: AHashMap::new(),
            max_n: max_n.clamp(1, 8),
            canon: Arc::new([]),
        }
    }

    /// Matches tokens by `canon` from the next [`reset`](Self::reset) on; copies still propose the tokens
    /// themselves.
    pub fn set_canon(&mut self, canon: Arc<[i32]>) {
        self.canon = canon;
    }

    /// What `t` is matched as.
    #[inline]
    fn key(&self, t: i32) -> i32 {
        usize::try_from(t).ok().and_then(|i| self.canon.get(i)).copied().unwrap_or(t)
    }

    /// Starts over with `prompt`.
    pub fn reset(&mut self, prompt: &[i32]) {
        self.tokens.clear();
        self.next.clear();
        // Room for the prompt and 4,096 generated tokens: no rehash (allocation) on the hot path.
        self.next.reserve((prompt.len() + 4096) * self.max_n);
        self.tokens.reserve(prompt.len() + 4096);
        for &t in prompt {
            self.push(t);
        }
    }

    /// An index of `tokens` that matches the way this one does (same n-gram lengths and canonical ids).
    pub fn sibling(&self, tokens: &[i32]) -> ContextIndex {
        let mut c = ContextIndex { canon: self.canon.clone(), ..ContextIndex::new(self.max_n) };
        c.next.reserve(tokens.len() * c.max_n);
        c.tokens.reserve(tokens.len());
        for &t in tokens {
            c.push(t);
        }
        c
    }

    /// The mirrored sequence.
    pub fn tokens(&self) -> &[i32] {
        &self.tokens
    }

    /// Makes the mirror equal `tokens` followed by `last`; returns how many of its tokens were kept.
    pub fn sync(&mut self, tokens: &[i32], last: i32) -> usize {
        self.sync_each(tokens, last, |_, _| {})
    }

    /// [`sync`](Self::sync), showing `each` every token the mirror takes, before it takes it.
    pub fn sync_each(&mut self, tokens: &[i32], last: i32, mut each: impl FnMut(&ContextIndex, i32)) -> usize {
        let len = tokens.len() + 1;
        let at = |i: usize| if i < tokens.len() { tokens[i] } else { last };
        let m = self.tokens.len();
        let tail_ok =
            m <= len && (m.saturating_sub(TAIL_CHECK)..m).all(|i| self.tokens[i] == at(i));
        let common = if tail_ok {
            m
        } else {
            (0..m.min(len))
                .find(|&i| self.tokens[i] != at(i))
                .unwrap_or(m.min(len))
        };
        self.tokens.truncate(common);
        for i in common..len {
            each(self, at(i));
            self.push(at(i));
        }
        common
    }

    fn push(&mut self, t: i32) {
        let i = self.tokens.len();
        let mut h = SuffixHasher::new();
        for k in 1..=self.max_n.min(i) {
            h.push(self.key(self.tokens[i - k]) as u32);
            let e = self.next.entry(h.key()).or_insert((0, 0));
            *e = (i as u32, e.1 + 1);
        }
        self.tokens.push(t);
    }

    /// Where the history (the mirror followed by `drafted`) last occurred before: the latest earlier
    /// occurrence of its longest suffix of `max_n` down to `min_n` tokens, found by hash and checked
    /// against the mirror, then extended back token by token (up to [`MAX_MATCH`]) to measure how long
    /// the match really is, which is what says how far a copy from there can be trusted; and whether the
    /// matched suffix occurred more than once before (then the copy picked one continuation of several:
    /// in JSON answers a 2–3-token copy was right 62–67% of the time when its suffix was unique, 26–39%
    /// when not). Occurrences rolled back by `sync` still count, which only errs towards ambiguous.
    pub fn find(&self, drafted: &[i32], min_n: usize) -> Option<Copy> {
        self.find_after(&self.tokens, drafted, min_n)
    }

    /// [`find`](Self::find) among the copies whose text starts at mirror position `floor` or later.
    pub fn find_from(&self, drafted: &[i32], min_n: usize, floor: usize) -> Option<Copy> {
        self.find_between(&self.tokens, drafted, min_n, self.max_n, floor)
    }

    /// [`find`](Self::find) for a history kept elsewhere (`hist` followed by `drafted`): where in this index
    /// its end occurred, so another text (a request's predicted output) can be copied from.
    pub fn find_after(&self, hist: &[i32], drafted: &[i32], min_n: usize) -> Option<Copy> {
        self.find_between(hist, drafted, min_n, self.max_n, 0)
    }

    /// Where in this index the last `n` tokens of `hist` occurred last (one lookup, not the longest suffix
    /// first): whether the end of `hist` copies text here, asked for every token an answer takes.
    pub fn find_last(&self, hist: &[i32], n: usize) -> Option<Copy> {
        self.find_between(hist, &[], n, n, 0)
    }

    /// [`find_after`](Self::find_after) over suffixes of `min_n` to `max_n` tokens whose last occurrence
    /// starts at `floor` or later.
    fn find_between(&self, hist: &[i32], drafted: &[i32], min_n: usize, max_n: usize, floor: usize) -> Option<Copy> {
        let (m, past) = (self.tokens.len(), hist.len());
        let len = past + drafted.len();
        let at = |i: usize| self.key(if i < past { hist[i] } else { drafted[i - past] });
        let mut keys = [0u64; 8];
        let mut h = SuffixHasher::new();
        let top = max_n.min(self.max_n).min(len);
        for k in 1..=top {
            h.push(at(len - k) as u32);
            keys[k - 1] = h.key();
        }
        (min_n.max(1)..=top).rev().find_map(|k| {
            let (p, seen) = *self.next.get(&keys[k - 1])?;
            let p = p as usize;
            if p >= m || p < k + floor || (1..=k).any(|j| self.key(self.tokens[p - j]) != at(len - j)) {
                return None;
            }
            Some(Copy { pos: p, len: self.matched_back(p, len, at, k), ambiguous: seen > 1 })
        })
    }

    /// The copy at position `q` of this text, which the answer (`hist`, ending in the token before `q`) was copying
    /// there, continued through `drafted`; its match measured back as [`find`](Self::find) measures, at least
    /// `min_n` tokens. A text that repeats (a function's doctests, a list of calls) keeps only its latest occurrence
    /// of each n-gram in the map, so the copy the answer follows is found here, not there.
    pub fn follow(&self, q: usize, hist: &[i32], drafted: &[i32], min_n: usize) -> Option<Copy> {
        let t = &self.tokens;
        let pos = q + drafted.len();
        if pos >= t.len() || !t[q..pos].iter().zip(drafted).all(|(&a, &b)| self.key(a) == self.key(b)) {
            return None;
        }
        let (past, len) = (hist.len(), hist.len() + drafted.len());
        let at = |i: usize| self.key(if i < past { hist[i] } else { drafted[i - past] });
        let n = self.matched_back(pos, len, at, 0);
        (n >= min_n.max(1)).then_some(Copy { pos, len: n, ambiguous: false })
    }

    /// How many tokens before `pos` equal the last ones of a history of `len` tokens (`at(i)` the i-th, as
    /// matched), the first `n` known to, counted up to [`MAX_MATCH`]: how far a copy from `pos` can be trusted.
    fn matched_back(&self, pos: usize, len: usize, at: impl Fn(usize) -> i32, mut n: usize) -> usize {
        while n < MAX_MATCH && n < pos && n < len && self.key(self.tokens[pos - n - 1]) == at(len - n - 1) {
            n += 1;
        }
        n
    }

    /// The token a copy proposes.
    #[inline]
    pub fn token(&self, c: Copy) -> i32 {
        self.tokens[c.pos]
    }

    /// The copy one token further on, once its token was taken; None where the mirror ends.
    #[inline]
    pub fn advance(&self, c: Copy) -> Option<Copy> {
        (c.pos + 1 < self.tokens.len()).then_some(Copy { pos: c.pos + 1, len: (c.len + 1).min(MAX_MATCH), ..c })
    }
}

/// Longest match length measured; longer matches are no more informative.
pub const MAX_MATCH: usize = 32;

/// A copy of the request's own text: the token at mirror position `pos` follows a match of `len` tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copy {
    pub pos: usize,
    pub len: usize,
    /// The hashed suffix the match was found by occurred more than once before.
    pub ambiguous: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The naive oracle: scan every earlier position for the longest match of the history's end.
    fn naive(mirror: &[i32], drafted: &[i32], max_n: usize, min_n: usize) -> Option<Copy> {
        let hist: Vec<i32> = mirror.iter().chain(drafted).copied().collect();
        let h = hist.len();
        let matched = |p: usize, n: usize| n <= p && n <= h && (1..=n).all(|j| mirror[p - j] == hist[h - j]);
        // Longest hashed suffix first; for it, the latest position; then the true length.
        (min_n.max(1)..=max_n.min(h)).rev().find_map(|k| {
            let p = (k..mirror.len()).rev().find(|&p| matched(p, k))?;
            let len = (k..=MAX_MATCH.min(p)).rev().find(|&n| matched(p, n)).unwrap();
            let seen = (k..mirror.len()).filter(|&q| matched(q, k)).count();
            Some(Copy { pos: p, len, ambiguous: seen > 1 })
        })
    }

    fn ctx(tokens: &[i32], max_n: usize) -> ContextIndex {
        let mut c = ContextIndex::new(max_n);
        c.reset(tokens);
        c
    }

    #[test]
    fn finds_latest_occurrence_longest_first_and_measures_the_match() {
        let c = ctx(&[1, 2, 3, 9, 2, 3, 4, 7, 2, 3], 3);
        let f = |d: &[i32], min| c.find(d, min).map(|x| (c.token(x), x.len));
        assert_eq!(f(&[], 1), Some((4, 2)), "latest earlier occurrence of 2 3");
        assert_eq!(f(&[8], 1), None);
        assert_eq!(f(&[5, 9], 2), None, "5 9 never occurred and 1 token is too short");
        assert_eq!(f(&[5, 9], 1), Some((2, 1)));
    }

    #[test]
    fn a_suffix_seen_several_times_is_ambiguous() {
        let c = ctx(&[1, 2, 3, 1, 2, 4, 9, 1, 2], 2);
        let x = c.find(&[], 2).unwrap();
        assert_eq!((c.token(x), x.len, x.ambiguous), (4, 2, true), "1 2 → 3 and 1 2 → 4");
        let c = ctx(&[1, 2, 3, 9, 1, 2], 2);
        assert!(!c.find(&[], 2).unwrap().ambiguous);
        assert!(c.advance(c.find(&[], 2).unwrap()).is_some_and(|y| !y.ambiguous));
    }

    #[test]
    fn match_length_runs_past_the_hashed_suffix() {
        let c = ctx(&[5, 1, 2, 3, 4, 8, 1, 2, 3], 2);
        let x = c.find(&[], 1).unwrap();
        assert_eq!((c.token(x), x.len), (4, 3), "hashed on 2 3, matched 1 2 3");
    }

    #[test]
    fn a_canonical_match_runs_across_a_different_newline_run() {
        // 7 and 8 are both runs of newlines (matched as 7): the answer's `1 2 3 8 4` copies the prompt's
        // `1 2 3 7 4 5` and proposes 5 after a 5-token match.
        let tokens = [9, 1, 2, 3, 7, 4, 5, 6, 1, 2, 3, 8, 4];
        let exact = ctx(&tokens, 4);
        let x = exact.find(&[], 1).unwrap();
        assert_eq!((exact.token(x), x.len), (5, 1), "exactly, only `4` matches");
        let mut c = ContextIndex::new(4);
        c.set_canon(std::sync::Arc::from(vec![0, 1, 2, 3, 4, 5, 6, 7, 7, 9]));
        c.reset(&tokens);
        let x = c.find(&[], 2).unwrap();
        assert_eq!((c.token(x), x.len), (5, 5));
    }

    #[test]
    fn copies_advance_to_the_end_of_the_mirror() {
        let c = ctx(&[5, 6, 7, 8, 5, 6], 2);
        let x = c.find(&[], 2).unwrap();
        assert_eq!((c.token(x), x.len), (7, 2));
        let y = c.advance(x).unwrap();
        assert_eq!((c.token(y), y.len), (8, 3));
        let z = c.advance(c.advance(y).unwrap()).unwrap();
        assert_eq!(c.token(z), 6);
        assert_eq!(c.advance(z), None, "the copy reached the last mirrored token");
    }

    #[test]
    fn agrees_with_the_naive_scan() {
        let mut rng = fastrand::Rng::with_seed(7);
        for case in 0..400 {
            let alphabet = 2 + case % 5;
            let mirror: Vec<i32> = (0..rng.usize(1..80)).map(|_| rng.i32(0..alphabet)).collect();
            let drafted: Vec<i32> = (0..rng.usize(0..4)).map(|_| rng.i32(0..alphabet)).collect();
            let max_n = rng.usize(1..=8);
            let min_n = rng.usize(1..=max_n);
            let c = ctx(&mirror, max_n);
            assert_eq!(c.find(&drafted, min_n), naive(&mirror, &drafted, max_n, min_n), "{mirror:?} + {drafted:?}, n {min_n}..={max_n}");
            assert_eq!(c.find_last(&mirror, min_n), naive(&mirror, &[], min_n, min_n), "{mirror:?}, n {min_n}");
        }
    }

    #[test]
    fn the_copy_the_answer_follows_goes_on_where_the_map_holds_a_later_occurrence() {
        // Two doctests `7 1 2 3` and `8 1 2 4`: the map keeps the later `1 2 → 4`; an answer copying the first
        // (its next token at position 3, after `7 1`) goes on with 2 3, its match measured back as `find` measures it.
        let p = ctx(&[9, 7, 1, 2, 3, 8, 1, 2, 4], 2);
        assert_eq!(p.token(p.find_after(&[5, 7, 1, 2], &[], 2).unwrap()), 4);
        let x = p.follow(3, &[5, 7, 1], &[2], 2).unwrap();
        assert_eq!((p.token(x), x.len, x.ambiguous), (3, 3, false));
        assert_eq!(p.follow(3, &[5, 7, 1], &[6], 1), None, "the draft left the copy");
        assert_eq!(p.follow(4, &[5, 0, 0], &[], 1), None, "the history does not end in the copied text");
        assert_eq!(p.follow(8, &[1, 2], &[4], 1), None, "past the text's end");
    }

    #[test]
    fn another_text_is_found_after_this_history() {
        // The predicted text `5 6 7 8` follows the prompt's tail `1 2`: after `1 2 5 6` it proposes 7, after a
        // 4-token match; a history that left it matches nothing.
        let mut c = ContextIndex::new(3);
        c.set_canon(std::sync::Arc::from(vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 5]));
        let p = c.sibling(&[1, 2, 5, 6, 7, 8]);
        let x = p.find_after(&[9, 1, 2, 5], &[6], 2).unwrap();
        assert_eq!((p.token(x), x.len), (7, 4));
        assert_eq!(p.advance(x).map(|y| p.token(y)), Some(8));
        assert_eq!(p.find_after(&[1, 2, 5, 6, 7, 8], &[], 1), None, "the text's end proposes nothing");
        assert_eq!(p.find_after(&[3, 4], &[], 1), None);
        let x = p.find_after(&[2, 9], &[], 2).unwrap();
        assert_eq!(p.token(x), 6, "matched by canonical ids, like the index it came from");
    }

    #[test]
    fn sync_each_shows_every_new_token_before_the_mirror_takes_it() {
        let mut c = ContextIndex::new(3);
        c.reset(&[1, 2, 3]);
        let mut seen = Vec::new();
        c.sync_each(&[1, 2, 3, 4], 5, |c, x| seen.push((c.tokens().len(), x)));
        assert_eq!(seen, [(3, 4), (4, 5)]);
        seen.clear();
        c.sync_each(&[1, 2], 9, |c, x| seen.push((c.tokens().len(), x)));
        assert_eq!(seen, [(2, 9)], "after a rollback, from where the mirror was cut");
    }

    #[test]
    fn sync_follows_rollbacks() {
        let mut c = ContextIndex::new(3);
        c.reset(&[1, 2, 3]);
        c.sync(&[1, 2, 3, 4, 5], 6);
        assert_eq!(c.tokens(), &[1, 2, 3, 4, 5, 6]);
        c.sync(&[1, 2, 3], 7);
        assert_eq!(c.tokens(), &[1, 2, 3, 7]);
        assert_eq!(c.find(&[4], 1).map(|x| c.token(x)), None, "4 → 5 was rolled back: the stale entry is ignored");
        assert_eq!(c.find(&[3], 1).map(|x| c.token(x)), Some(7), "3 → 7 replaced 3 → 4");
        c.sync(&[8, 8], 8);
        assert_eq!(c.tokens(), &[8, 8, 8]);
    }
}
