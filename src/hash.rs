//! Stable 48-bit keys for windows of token ids or shape classes.
//!
//! These keys are stored in `recipes.json` files, so the function below is part of the file format
//! (version 1) and must never change: no `RandomState`, no `ahash`, nothing seeded per process.
//!
//! Definition (format v1): for a window `w[0..n]` (oldest first), run 64-bit FNV-1a over the
//! little-endian bytes of `w[n-1], w[n-2], …, w[0]` — newest item first — then apply the
//! MurmurHash3 `fmix64` finalizer and keep the top 48 bits.
//!
//! Feeding the newest item first lets one pass over a history produce the keys of every suffix
//! length (1, 2, 3, …) at the cost of one FNV step per item, which is what the run-time lookup
//! needs. 48 bits keep collisions negligible (about 4·10⁻⁵ chance of any collision in a
//! 150,000-entry table, 5·10⁻¹⁰ chance per lookup of a false hit, and a false hit only costs a
//! rejected draft) while keeping entries compact on disk.

/// Number of significant bits in a window key.
pub const KEY_BITS: u32 = 48;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Incremental key of a window grown towards the past: push the newest item first.
#[derive(Clone, Copy, Debug)]
pub struct SuffixHasher {
    state: u64,
}

impl Default for SuffixHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl SuffixHasher {
    pub const fn new() -> Self {
        SuffixHasher { state: FNV_OFFSET }
    }

    /// Extends the window by one item on its old side.
    #[inline]
    pub fn push(&mut self, item: u32) {
        for b in item.to_le_bytes() {
            self.state ^= u64::from(b);
            self.state = self.state.wrapping_mul(FNV_PRIME);
        }
    }

    /// Key of the window pushed so far.
    #[inline]
    pub fn key(&self) -> u64 {
        fmix64(self.state) >> (64 - KEY_BITS)
    }
}

#[inline]
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// Key of a whole window given oldest first (the reference definition).
pub fn window_key(window: &[u32]) -> u64 {
    let mut h = SuffixHasher::new();
    for &x in window.iter().rev() {
        h.push(x);
    }
    h.key()
}

/// Keys of the last 1, 2, …, `max_n` tokens of `tokens` (token ids as `u32` bit patterns):
/// `out[n - 1]` is the key of the last `n` tokens. Returns how many keys were written.
#[inline]
pub fn literal_suffix_keys(tokens: &[i32], max_n: usize, out: &mut [u64]) -> usize {
    let n = max_n.min(tokens.len()).min(out.len());
    let mut h = SuffixHasher::new();
    for (i, &t) in tokens.iter().rev().take(n).enumerate() {
        h.push(t as u32);
        out[i] = h.key();
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn golden_values_never_change() {
        // Pinned (and cross-checked with an independent Python implementation): these keys are
        // stored in files. Changing them breaks every pack ever written.
        assert_eq!(window_key(&[]), 0xefd0_1f60_ba99);
        assert_eq!(window_key(&[1]), 0xdc07_7c17_952d);
        assert_eq!(window_key(&[1, 2, 3]), 0x596d_c00d_cf12);
        assert_eq!(window_key(&[262_143, 0, 42]), 0xad12_60d7_0096);
    }

    #[test]
    fn order_matters_and_keys_fit() {
        assert_ne!(window_key(&[1, 2]), window_key(&[2, 1]));
        assert!(window_key(&[7, 8, 9]) < 1 << KEY_BITS);
    }

    proptest! {
        #[test]
        fn suffix_keys_match_reference(tokens in proptest::collection::vec(0i32..1000, 0..40), max_n in 0usize..40) {
            let mut out = [0u64; 40];
            let n = literal_suffix_keys(&tokens, max_n, &mut out);
            prop_assert_eq!(n, max_n.min(tokens.len()));
            for k in 1..=n {
                let w: Vec<u32> = tokens[tokens.len() - k..].iter().map(|&t| t as u32).collect();
                prop_assert_eq!(out[k - 1], window_key(&w));
            }
        }
    }
}
