//! N-gram lookup over the current request (prompt + generated tokens), kept incrementally.
//!
//! A mirror of the sequence plus a map from the key of every k-gram (k ≤ `max_n`) to the position
//! right after its most recent occurrence. Syncing with the caller's tokens costs O(new tokens)
//! in the usual case (the sequence only grew or lost its tail); predictions verify the matched
//! window against the mirror, so stale map entries left by a rollback are harmless.

use ahash::AHashMap;

use crate::hash::SuffixHasher;

/// Tokens compared at the tail of the mirror to accept it as a prefix without a full scan.
const TAIL_CHECK: usize = 16;

#[derive(Clone, Debug, Default)]
pub struct ContextIndex {
    tokens: Vec<i32>,
    next: AHashMap<u64, u32>,
    max_n: usize,
}

impl ContextIndex {
    pub fn new(max_n: usize) -> ContextIndex {
        ContextIndex {
            tokens: Vec::new(),
            next: AHashMap::new(),
            max_n: max_n.clamp(1, 8),
        }
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

    /// The mirrored sequence.
    pub fn tokens(&self) -> &[i32] {
        &self.tokens
    }

    /// Makes the mirror equal `tokens` followed by `last`.
    pub fn sync(&mut self, tokens: &[i32], last: i32) {
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
            self.push(at(i));
        }
    }

    fn push(&mut self, t: i32) {
        let i = self.tokens.len();
        let mut h = SuffixHasher::new();
        for k in 1..=self.max_n.min(i) {
            h.push(self.tokens[i - k] as u32);
            self.next.insert(h.key(), i as u32);
        }
        self.tokens.push(t);
    }

    /// Token that followed the latest earlier occurrence of the longest suffix of `history`
    /// (length `max_n` down to `min_n`), with the matched length.
    pub fn predict(&self, history: &[i32], min_n: usize) -> Option<(i32, usize)> {
        let mut keys = [0u64; 8];
        let mut h = SuffixHasher::new();
        let top = self.max_n.min(history.len());
        for k in 1..=top {
            h.push(history[history.len() - k] as u32);
            keys[k - 1] = h.key();
        }
        (min_n.max(1)..=top).rev().find_map(|k| {
            let p = *self.next.get(&keys[k - 1])? as usize;
            let ok = p < self.tokens.len()
                && p >= k
                && self.tokens[p - k..p] == history[history.len() - k..];
            ok.then(|| (self.tokens[p], k))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predicts_from_latest_occurrence_longest_first() {
        let mut c = ContextIndex::new(3);
        c.reset(&[1, 2, 3, 9, 2, 3, 4]);
        c.sync(&[1, 2, 3, 9, 2, 3, 4], 1);
        assert_eq!(
            c.predict(&[7, 2, 3], 1),
            Some((4, 2)),
            "latest occurrence of 2 3"
        );
        assert_eq!(
            c.predict(&[9, 2, 3], 1),
            Some((4, 3)),
            "9 2 3 occurred once, followed by 4"
        );
        assert_eq!(c.predict(&[4, 1], 1), Some((2, 1)));
        assert_eq!(c.predict(&[4, 1], 2), None, "too short a match");
        assert_eq!(c.predict(&[5], 1), None);
    }

    #[test]
    fn sync_follows_rollbacks() {
        let mut c = ContextIndex::new(3);
        c.reset(&[1, 2, 3]);
        c.sync(&[1, 2, 3, 4, 5], 6);
        assert_eq!(c.tokens(), &[1, 2, 3, 4, 5, 6]);
        c.sync(&[1, 2, 3], 7);
        assert_eq!(c.tokens(), &[1, 2, 3, 7]);
        assert_eq!(
            c.predict(&[4], 1),
            None,
            "4 → 5 was rolled back: the stale entry is ignored"
        );
        assert_eq!(c.predict(&[3], 1), Some((7, 1)), "3 → 7 replaced 3 → 4");
        c.sync(&[8, 8], 8);
        assert_eq!(c.tokens(), &[8, 8, 8]);
    }
}
