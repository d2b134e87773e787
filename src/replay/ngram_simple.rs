//! llama.cpp's `--spec-type ngram-simple` (`common_ngram_simple_draft` in the pinned source), re-implemented
//! for replay so the baseline the issue measures against is measured on the same recordings and clock as
//! kolm-rsd's drafter, free of the served runs' noise.

use super::Proposer;

/// The last `n` tokens (the sampled one included) are looked up, latest match first, in the request's
/// tokens before them; the `m` tokens that followed the match are drafted, if at least `n` follow it.
#[derive(Clone, Copy, Debug)]
pub struct NgramSimple {
    pub n: usize,
    pub m: usize,
}

impl NgramSimple {
    /// llama.cpp's defaults (`size_n` 12, `size_m` 48).
    pub const DEFAULT: NgramSimple = NgramSimple { n: 12, m: 48 };
}

impl Proposer for NgramSimple {
    fn begin(&mut self, _prompt: &[i32], _prediction: &[i32]) {}

    fn propose(&mut self, hist: &[i32], last: i32, n_max: usize, _now_ns: u64, out: &mut Vec<i32>) -> usize {
        out.clear();
        let (n, len) = (self.n.max(1), hist.len());
        if len <= n + self.m + 1 {
            return 0;
        }
        let tail = &hist[len - n + 1..];
        // Position 0 is never a match upstream (it doubles as "none"); the current n-gram itself is skipped.
        let Some(at) = (1..len - n).rev().find(|&j| hist[j..j + n - 1] == *tail && hist[j + n - 1] == last) else {
            return 0;
        };
        let copy = self.m.min(len - (at + n));
        if copy < n {
            return 0;
        }
        out.extend_from_slice(&hist[at + n..at + n + copy.min(n_max)]);
        out.len()
    }

    fn accept(&mut self, _n: usize) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loop of `common_ngram_simple_draft`, kept as literal as Rust allows: the oracle for the above.
    fn upstream(n: usize, m: usize, tokens: &[i32], sampled: i32) -> Vec<i32> {
        let cur_len = tokens.len();
        if cur_len <= n + m + 1 {
            return vec![];
        }
        let mut pattern: Vec<i32> = tokens[cur_len - n + 1..cur_len].to_vec();
        pattern.push(sampled);
        let mut match_pos = 0;
        let mut j = cur_len - n - 1;
        while j > 0 {
            if (0..pattern.len()).all(|k| tokens[j + k] == pattern[k]) {
                match_pos = j;
                break;
            }
            j -= 1;
        }
        if match_pos == 0 {
            return vec![];
        }
        let copy_max = m.min(cur_len - (match_pos + n));
        if copy_max < n {
            return vec![];
        }
        tokens[match_pos + n..match_pos + n + copy_max].to_vec()
    }

    #[test]
    fn drafts_what_upstream_drafts() {
        // Small alphabets make many repeats, matches at the edges and too-short copies.
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as i32
        };
        let mut out = Vec::new();
        for case in 0..2000 {
            let (n, m) = (1 + case % 4, 1 + case % 7);
            let alphabet = 2 + case % 3;
            let len = case % 40;
            let hist: Vec<i32> = (0..len).map(|_| next().rem_euclid(alphabet as i32)).collect();
            let last = next().rem_euclid(alphabet as i32);
            let mut p = NgramSimple { n, m };
            let want = upstream(n, m, &hist, last);
            assert_eq!(p.propose(&hist, last, 64, 0, &mut out), want.len());
            assert_eq!(out, want, "n {n} m {m} hist {hist:?} last {last}");
            p.propose(&hist, last, 2, 0, &mut out);
            assert_eq!(out, want[..want.len().min(2)]);
        }
    }

    #[test]
    fn copies_a_repeated_passage() {
        let passage: Vec<i32> = (100..130).collect();
        let mut hist: Vec<i32> = (0..40).collect();
        hist.extend(&passage);
        hist.extend([3, 4]);
        hist.extend(&passage[..11]);
        let mut out = Vec::new();
        let mut p = NgramSimple::DEFAULT;
        let got = p.propose(&hist, passage[11], 64, 0, &mut out);
        // The rest of the passage, then what followed it, up to the copy's end at the history's end.
        assert_eq!((got, &out[..18], &out[18..20]), (31, &passage[12..], &[3, 4][..]));
    }
}
