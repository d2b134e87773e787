//! llama.cpp's n-gram lookup-cache file (`-lcs` static / `-lcd` dynamic cache of `--spec-type ngram-cache`),
//! written by us so that llama.cpp's ngram-cache drafter gets the same material the recipe pack was compiled
//! from: the training prompts and the teacher's outputs.
//!
//! The format, as `common_ngram_cache_save`/`common_ngram_cache_load` in `common/ngram-cache.cpp` of the
//! pinned tree define it: no header, a sequence of records in host byte order (little-endian on every
//! machine we build for), each
//!
//! ```text
//! common_ngram  ngram;     // LLAMA_NGRAM_MAX = 4 × int32 token ids, unused slots = LLAMA_TOKEN_NULL (-1)
//! int32         ntokens;   // > 0
//! ntokens × { int32 token; int32 count; }   // count > 0
//! ```
//!
//! The loader asserts `ntokens > 0`, `count > 0` and that the file ends exactly after a record. An n-gram of
//! size n holds the n tokens *before* the predicted one. llama-lookup-create builds static caches from
//! 2-grams only (`LLAMA_NGRAM_STATIC`), and the drafter only ever looks a static cache up by a 2-gram; a
//! dynamic cache holds 1- to 4-grams (`LLAMA_NGRAM_MIN..=LLAMA_NGRAM_MAX`).

use std::collections::BTreeMap;
use std::path::Path;

/// `LLAMA_NGRAM_MIN`.
pub const NGRAM_MIN: usize = 1;
/// `LLAMA_NGRAM_MAX`: the fixed width of a stored n-gram.
pub const NGRAM_MAX: usize = 4;
/// `LLAMA_NGRAM_STATIC`: the n-gram size of static caches.
pub const NGRAM_STATIC: usize = 2;
/// `LLAMA_TOKEN_NULL`: fills the unused slots of an n-gram.
pub const TOKEN_NULL: i32 = -1;

/// An n-gram as llama.cpp stores it: up to 4 tokens, padded with [`TOKEN_NULL`].
pub type Ngram = [i32; NGRAM_MAX];

/// Next-token counts per n-gram (ordered maps, so files are byte-for-byte reproducible).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LookupCache {
    map: BTreeMap<Ngram, BTreeMap<i32, i32>>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LookupCacheError {
    #[error("{path}: truncated record at byte {offset}")]
    Truncated { path: String, offset: usize },
    #[error("{path}: record at byte {offset} has {ntokens} tokens (must be > 0)")]
    BadTokenCount { path: String, offset: usize, ntokens: i32 },
    #[error("{path}: record at byte {offset} has count {count} for token {token} (must be > 0)")]
    BadCount { path: String, offset: usize, token: i32, count: i32 },
    #[error("{path}: {reason}")]
    Io { path: String, reason: String },
}

/// The n-gram of the `n` tokens `window` (n ≤ 4), padded as llama.cpp pads it.
pub fn ngram(window: &[i32]) -> Ngram {
    assert!(window.len() <= NGRAM_MAX, "an n-gram holds at most {NGRAM_MAX} tokens");
    let mut g = [TOKEN_NULL; NGRAM_MAX];
    g[..window.len()].copy_from_slice(window);
    g
}

impl LookupCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts every (n-gram → next token) pair of one token sequence for n in `n_min..=n_max`, as
    /// `common_ngram_cache_update(cache, n_min, n_max, tokens, tokens.size(), ...)` does. Call it once per
    /// sequence: n-grams never span two sequences.
    pub fn update(&mut self, tokens: &[i32], n_min: usize, n_max: usize) {
        assert!(n_min >= 1 && n_min <= n_max && n_max <= NGRAM_MAX, "bad n-gram sizes {n_min}..={n_max}");
        for n in n_min..=n_max {
            for i in n..tokens.len() {
                let c = self.map.entry(ngram(&tokens[i - n..i])).or_default().entry(tokens[i]).or_insert(0);
                *c = c.saturating_add(1);
            }
        }
    }

    /// A static cache (2-grams, as llama-lookup-create writes) over these sequences.
    pub fn static_from<'a>(seqs: impl IntoIterator<Item = &'a [i32]>) -> Self {
        let mut c = Self::new();
        for s in seqs {
            c.update(s, NGRAM_STATIC, NGRAM_STATIC);
        }
        c
    }

    /// A dynamic cache (1- to 4-grams, as llama.cpp updates its context and dynamic caches) over these sequences.
    pub fn dynamic_from<'a>(seqs: impl IntoIterator<Item = &'a [i32]>) -> Self {
        let mut c = Self::new();
        for s in seqs {
            c.update(s, NGRAM_MIN, NGRAM_MAX);
        }
        c
    }

    /// Number of n-grams (records).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Number of (n-gram, token) pairs.
    pub fn n_pairs(&self) -> usize {
        self.map.values().map(BTreeMap::len).sum()
    }

    /// The next-token counts of an n-gram.
    pub fn get(&self, g: &Ngram) -> Option<&BTreeMap<i32, i32>> {
        self.map.get(g)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Ngram, &BTreeMap<i32, i32>)> {
        self.map.iter()
    }

    /// The file's bytes (records in ascending n-gram order, tokens ascending within a record).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.map.len() * 28 + self.n_pairs() * 8);
        for (g, counts) in &self.map {
            for t in g {
                out.extend_from_slice(&t.to_le_bytes());
            }
            out.extend_from_slice(&(counts.len() as i32).to_le_bytes());
            for (tok, n) in counts {
                out.extend_from_slice(&tok.to_le_bytes());
                out.extend_from_slice(&n.to_le_bytes());
            }
        }
        out
    }

    /// Writes the file (to a temporary name first, then renamed: no half-written cache).
    pub fn write(&self, path: &Path) -> Result<(), LookupCacheError> {
        let io = |e: std::io::Error| LookupCacheError::Io { path: path.display().to_string(), reason: e.to_string() };
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, self.to_bytes()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Reads the format back with the checks llama.cpp's loader asserts (a file llama.cpp would abort on is
    /// an error here). `origin` names the input in errors.
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<Self, LookupCacheError> {
        let mut map: BTreeMap<Ngram, BTreeMap<i32, i32>> = BTreeMap::new();
        let mut off = 0usize;
        let rd = |off: &mut usize, start: usize| -> Result<i32, LookupCacheError> {
            let b = bytes
                .get(*off..*off + 4)
                .ok_or(LookupCacheError::Truncated { path: origin.to_string(), offset: start })?;
            *off += 4;
            Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        while off < bytes.len() {
            let start = off;
            let mut g = [TOKEN_NULL; NGRAM_MAX];
            for t in g.iter_mut() {
                *t = rd(&mut off, start)?;
            }
            let ntokens = rd(&mut off, start)?;
            if ntokens <= 0 {
                return Err(LookupCacheError::BadTokenCount { path: origin.to_string(), offset: start, ntokens });
            }
            let mut counts = BTreeMap::new();
            for _ in 0..ntokens {
                let token = rd(&mut off, start)?;
                let count = rd(&mut off, start)?;
                if count <= 0 {
                    return Err(LookupCacheError::BadCount { path: origin.to_string(), offset: start, token, count });
                }
                // std::unordered_map::emplace keeps the first value of a duplicate key, as we do.
                counts.entry(token).or_insert(count);
            }
            map.entry(g).or_insert(counts);
        }
        Ok(LookupCache { map })
    }

    pub fn read(path: &Path) -> Result<Self, LookupCacheError> {
        let bytes = std::fs::read(path)
            .map_err(|e| LookupCacheError::Io { path: path.display().to_string(), reason: e.to_string() })?;
        Self::from_bytes(&bytes, &path.display().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le(words: &[i32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn update_counts_the_tokens_after_each_ngram() {
        let mut c = LookupCache::new();
        c.update(&[1, 2, 1, 2, 3], 2, 2);
        assert_eq!(c.len(), 2);
        let after12 = c.get(&[1, 2, -1, -1]).unwrap();
        assert_eq!(after12.iter().map(|(&t, &n)| (t, n)).collect::<Vec<_>>(), vec![(1, 1), (3, 1)]);
        assert_eq!(c.get(&[2, 1, -1, -1]).unwrap().get(&2), Some(&1));
        // 1..4-grams: 4 + 3 + 2 + 1 windows of a 5-token sequence, each followed by one token.
        let d = LookupCache::dynamic_from([&[5, 6, 7, 8, 9][..]]);
        assert_eq!(d.n_pairs(), 4 + 3 + 2 + 1);
        assert_eq!(d.get(&[5, 6, 7, 8]).unwrap().get(&9), Some(&1));
        assert_eq!(d.get(&[5, -1, -1, -1]).unwrap().get(&6), Some(&1));
        // sequences do not run into each other
        let s = LookupCache::static_from([&[1, 2][..], &[3, 4][..]]);
        assert!(s.is_empty(), "{s:?}");
    }

    #[test]
    fn bytes_are_llama_cpp_records() {
        let mut c = LookupCache::new();
        c.update(&[7, 8, 9, 7, 8, 10, 7, 8, 9], 2, 2);
        // records sorted by n-gram: [7,8] → {9:2, 10:1}; [8,9] → {7:1}; [8,10] → {7:1}; [9,7] → {8:1}; [10,7] → {8:1}
        let want = [
            le(&[7, 8, -1, -1, 2, 9, 2, 10, 1]),
            le(&[8, 9, -1, -1, 1, 7, 1]),
            le(&[8, 10, -1, -1, 1, 7, 1]),
            le(&[9, 7, -1, -1, 1, 8, 1]),
            le(&[10, 7, -1, -1, 1, 8, 1]),
        ]
        .concat();
        assert_eq!(c.to_bytes(), want);
    }

    #[test]
    fn round_trip_through_a_file() {
        let mut rng = fastrand::Rng::with_seed(5);
        let seqs: Vec<Vec<i32>> = (0..20).map(|_| (0..200).map(|_| rng.i32(0..40)).collect()).collect();
        let c = LookupCache::dynamic_from(seqs.iter().map(Vec::as_slice));
        assert!(c.len() > 100);
        let dir = std::env::temp_dir().join(format!("kolm-lcs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x.lcs");
        c.write(&p).unwrap();
        assert_eq!(LookupCache::read(&p).unwrap(), c);
        assert_eq!(std::fs::metadata(&p).unwrap().len() as usize, c.len() * 20 + c.n_pairs() * 8);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(LookupCache::from_bytes(&[], "e").unwrap(), LookupCache::new());
    }

    #[test]
    fn reader_refuses_what_llama_cpp_would_abort_on() {
        let good = le(&[1, 2, -1, -1, 1, 3, 4]);
        assert!(LookupCache::from_bytes(&good, "g").is_ok());
        let e = LookupCache::from_bytes(&good[..good.len() - 2], "t").unwrap_err();
        assert_eq!(e, LookupCacheError::Truncated { path: "t".into(), offset: 0 });
        let e = LookupCache::from_bytes(&le(&[1, 2, -1, -1, 0]), "z").unwrap_err();
        assert!(matches!(e, LookupCacheError::BadTokenCount { ntokens: 0, .. }), "{e}");
        let e = LookupCache::from_bytes(&[good.clone(), le(&[1, 2, -1, -1, 1, 5, -3])].concat(), "c").unwrap_err();
        assert_eq!(e.to_string(), "c: record at byte 28 has count -3 for token 5 (must be > 0)");
    }
}
