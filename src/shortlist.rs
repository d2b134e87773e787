//! Static shortlists: which token ids a restricted LM head scores (FR-Spec, and the "static 60K" note of
//! ../shared/docs/method.md).
//!
//! * [`Histogram`]: over the positions of a corpus, how often each token id is among the teacher's top-k
//!   predictions (`topk`), and how often it occurs in the text (`frequency`, FR-Spec's method). Both are
//!   counted in the same pass and saved together, so other sizes and the other method need no rerun.
//! * [`Shortlist`]: the chosen ids, in rank order (the always-in tokens first), with the tokenizer they
//!   refer to. Untrusted input, read under the same rules as recipe packs.
//! * [`Coverage`]: on held-out positions, the share where the teacher's top-1/2/4/10 are all in the set.
//!
//! # Files
//!
//! ```json
//! { "format": "kolm-rsd/shortlist", "version": 1, "tokenizer": "<fingerprint>", "n_vocab": 151936,
//!   "method": "topk", "top_k": 10, "always": 7, "ids": [151645, 151643, …, 13, 11, …] }
//!
//! { "format": "kolm-rsd/shortlist-histogram", "version": 1, "tokenizer": "<fingerprint>",
//!   "n_vocab": 151936, "top_k": 10, "positions": 23110, "corpus": ["json-extraction", …],
//!   "topk": [[id, count], …], "frequency": [[id, count], …] }
//! ```
//!
//! `ids` are unique, below `n_vocab`, and ranked: the first `always` are the special tokens (end of
//! generation, the chat template's control tokens), then by descending count. A prefix of a shortlist is
//! the shortlist of that size. Unknown fields are refused.

use crate::llama::{Batch, Context, ContextOptions, LlamaError, Model, Token};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;

pub const FORMAT: &str = "kolm-rsd/shortlist";
pub const HISTOGRAM_FORMAT: &str = "kolm-rsd/shortlist-histogram";
pub const VERSION: u32 = 1;
/// Largest accepted shortlist or histogram file.
pub const MAX_FILE_BYTES: usize = 64 << 20;
/// Largest accepted vocabulary.
pub const MAX_VOCAB: u32 = 1 << 22;

/// How ids are ranked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// How often the id is in the teacher's top-k at a position (the static-60K note's method).
    Topk,
    /// How often the id occurs in the corpus text (FR-Spec's method).
    Frequency,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Topk => "topk",
            Method::Frequency => "frequency",
        })
    }
}

/// Why a shortlist or histogram file was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ShortlistErrorKind {
    #[error("file too large ({0} bytes, limit {MAX_FILE_BYTES})")]
    TooLarge(usize),
    #[error("bad JSON at line {line}, column {column}: {message}")]
    Json { line: usize, column: usize, message: String },
    #[error("not a {expected} file (format {found:?})")]
    Format { expected: &'static str, found: String },
    #[error("unsupported version {0} (this build reads version {VERSION})")]
    Version(u32),
    #[error("tokenizer mismatch: file is for {found}, model has {expected}")]
    TokenizerMismatch { expected: String, found: String },
    #[error("vocabulary size mismatch: file says {found}, model has {expected}")]
    VocabMismatch { expected: u32, found: u32 },
    #[error("token id {token} out of range (vocabulary has {n_vocab} tokens)")]
    TokenOutOfRange { token: u32, n_vocab: u32 },
    #[error("duplicate token id {0}")]
    Duplicate(u32),
    #[error("invalid field: {0}")]
    Invalid(String),
}

/// A refused file: where it came from and why.
#[derive(Debug, PartialEq)]
pub struct ShortlistError {
    pub origin: String,
    pub kind: ShortlistErrorKind,
}

impl fmt::Display for ShortlistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shortlist {}: {}", self.origin, self.kind)
    }
}

impl std::error::Error for ShortlistError {}

fn json_err(e: serde_json::Error) -> ShortlistErrorKind {
    ShortlistErrorKind::Json { line: e.line(), column: e.column(), message: e.to_string() }
}

#[derive(Deserialize)]
struct Header {
    format: Option<String>,
    version: Option<u32>,
}

/// Size, JSON, format and version checks shared by both file kinds.
fn check_header(bytes: &[u8], expected: &'static str) -> Result<(), ShortlistErrorKind> {
    if bytes.len() > MAX_FILE_BYTES {
        return Err(ShortlistErrorKind::TooLarge(bytes.len()));
    }
    let h: Header = serde_json::from_slice(bytes).map_err(json_err)?;
    let found = h.format.unwrap_or_default();
    if found != expected {
        return Err(ShortlistErrorKind::Format { expected, found });
    }
    match h.version {
        Some(VERSION) => Ok(()),
        Some(v) => Err(ShortlistErrorKind::Version(v)),
        None => Err(ShortlistErrorKind::Invalid("no `version`".into())),
    }
}

fn check_vocab(tokenizer: &str, n_vocab: u32, expect: Option<(&str, u32)>) -> Result<(), ShortlistErrorKind> {
    if tokenizer.len() != 32 || !tokenizer.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ShortlistErrorKind::Invalid(format!("tokenizer {tokenizer:?} is not a 32-hex-digit fingerprint")));
    }
    if n_vocab == 0 || n_vocab > MAX_VOCAB {
        return Err(ShortlistErrorKind::Invalid(format!("n_vocab {n_vocab} (must be 1..={MAX_VOCAB})")));
    }
    if let Some((fp, n)) = expect {
        if fp != tokenizer {
            return Err(ShortlistErrorKind::TokenizerMismatch { expected: fp.into(), found: tokenizer.into() });
        }
        if n != n_vocab {
            return Err(ShortlistErrorKind::VocabMismatch { expected: n, found: n_vocab });
        }
    }
    Ok(())
}

/// Per-id counts over a corpus: teacher top-k membership and plain occurrence.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    pub tokenizer: String,
    pub n_vocab: u32,
    pub top_k: u32,
    /// Positions counted (teacher predictions).
    pub positions: u64,
    /// What the corpus was (workload names or files), for the record.
    pub corpus: Vec<String>,
    pub topk: Vec<u64>,
    pub frequency: Vec<u64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistogramFile {
    format: String,
    version: u32,
    tokenizer: String,
    n_vocab: u32,
    top_k: u32,
    positions: u64,
    corpus: Vec<String>,
    topk: Vec<(u32, u64)>,
    frequency: Vec<(u32, u64)>,
}

impl Histogram {
    pub fn new(tokenizer: String, n_vocab: usize, top_k: usize) -> Histogram {
        Histogram {
            tokenizer,
            n_vocab: n_vocab as u32,
            top_k: top_k as u32,
            positions: 0,
            corpus: Vec::new(),
            topk: vec![0; n_vocab],
            frequency: vec![0; n_vocab],
        }
    }

    /// Counts the top-k ids of one position's logits.
    pub fn add_logits(&mut self, logits: &[f32]) {
        for id in top_ids(logits, self.top_k as usize) {
            self.topk[id as usize] += 1;
        }
        self.positions += 1;
    }

    /// Counts the tokens of a text (FR-Spec's frequency).
    pub fn add_text(&mut self, tokens: &[Token]) {
        for &t in tokens {
            if (t as u32) < self.n_vocab {
                self.frequency[t as usize] += 1;
            }
        }
    }

    /// Ids by descending count of `method`, ties by ascending id; every id appears once.
    pub fn ranking(&self, method: Method) -> Vec<u32> {
        let c = match method {
            Method::Topk => &self.topk,
            Method::Frequency => &self.frequency,
        };
        let mut ids: Vec<u32> = (0..self.n_vocab).collect();
        ids.sort_by(|&a, &b| c[b as usize].cmp(&c[a as usize]).then(a.cmp(&b)));
        ids
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let sparse = |c: &[u64]| c.iter().enumerate().filter(|(_, &n)| n > 0).map(|(i, &n)| (i as u32, n)).collect();
        let f = HistogramFile {
            format: HISTOGRAM_FORMAT.into(),
            version: VERSION,
            tokenizer: self.tokenizer.clone(),
            n_vocab: self.n_vocab,
            top_k: self.top_k,
            positions: self.positions,
            corpus: self.corpus.clone(),
            topk: sparse(&self.topk),
            frequency: sparse(&self.frequency),
        };
        serde_json::to_vec(&f).expect("histogram serializes")
    }

    /// Reads an untrusted histogram; `expect` = the model's (fingerprint, n_vocab).
    pub fn from_slice(bytes: &[u8], origin: &str, expect: Option<(&str, u32)>) -> Result<Histogram, ShortlistError> {
        let err = |kind| ShortlistError { origin: origin.into(), kind };
        check_header(bytes, HISTOGRAM_FORMAT).map_err(err)?;
        let f: HistogramFile = serde_json::from_slice(bytes).map_err(|e| err(json_err(e)))?;
        check_vocab(&f.tokenizer, f.n_vocab, expect).map_err(err)?;
        if f.top_k == 0 || f.top_k > f.n_vocab {
            return Err(err(ShortlistErrorKind::Invalid(format!("top_k {} (must be 1..=n_vocab)", f.top_k))));
        }
        let dense = |pairs: &[(u32, u64)]| -> Result<Vec<u64>, ShortlistErrorKind> {
            let mut c = vec![0u64; f.n_vocab as usize];
            let mut seen = vec![false; f.n_vocab as usize];
            for &(id, n) in pairs {
                if id >= f.n_vocab {
                    return Err(ShortlistErrorKind::TokenOutOfRange { token: id, n_vocab: f.n_vocab });
                }
                if std::mem::replace(&mut seen[id as usize], true) {
                    return Err(ShortlistErrorKind::Duplicate(id));
                }
                c[id as usize] = n;
            }
            Ok(c)
        };
        let topk = dense(&f.topk).map_err(err)?;
        let frequency = dense(&f.frequency).map_err(err)?;
        Ok(Histogram { tokenizer: f.tokenizer, n_vocab: f.n_vocab, top_k: f.top_k, positions: f.positions, corpus: f.corpus, topk, frequency })
    }

    pub fn load(path: &Path, expect: Option<(&str, u32)>) -> Result<Histogram, Box<dyn std::error::Error>> {
        let bytes = std::fs::read(path).map_err(|e| format!("histogram {}: {e}", path.display()))?;
        Ok(Histogram::from_slice(&bytes, &path.display().to_string(), expect)?)
    }
}

/// The ids of the `k` largest logits, largest first (ties: lower id first).
pub fn top_ids(logits: &[f32], k: usize) -> Vec<u32> {
    let k = k.min(logits.len());
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (i, &v) in logits.iter().enumerate() {
        if best.len() == k && v <= best[k - 1].0 {
            continue;
        }
        let at = best.partition_point(|&(b, _)| b >= v);
        best.insert(at, (v, i as u32));
        best.truncate(k);
    }
    best.into_iter().map(|(_, i)| i).collect()
}

/// A ranked set of token ids for a restricted head.
#[derive(Clone, Debug, PartialEq)]
pub struct Shortlist {
    /// Unique ids in rank order; the first `always` are the always-in special tokens.
    pub ids: Vec<u32>,
    pub n_vocab: u32,
    pub tokenizer: String,
    pub method: Method,
    pub top_k: u32,
    pub always: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShortlistFile {
    format: String,
    version: u32,
    tokenizer: String,
    n_vocab: u32,
    method: Method,
    top_k: u32,
    always: u32,
    ids: Vec<u32>,
}

/// The tokens every shortlist holds: end-of-generation tokens and the control tokens of the model's chat
/// template (end of turn, role markers). Sorted, unique.
pub fn always_tokens(model: &Model) -> Vec<u32> {
    let n = model.n_vocab() as Token;
    let mut out: Vec<u32> = (0..n).filter(|&t| model.is_eog(t)).map(|t| t as u32).collect();
    if let Some(tmpl) = model.chat_prompt("x") {
        // The assistant's turn ends with the template's end-of-turn marker; render a full exchange.
        if let Ok(toks) = model.tokenize(&tmpl, true, true) {
            out.extend(toks.into_iter().filter(|&t| model.is_control(t)).map(|t| t as u32));
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

impl Shortlist {
    /// The first `size` ids (clamped to the vocabulary): `always` first, then `ranking` order.
    pub fn from_ranking(ranking: &[u32], always: &[u32], size: usize, n_vocab: u32, tokenizer: String, method: Method, top_k: u32) -> Shortlist {
        let size = size.min(n_vocab as usize).max(always.len());
        let mut inset = vec![false; n_vocab as usize];
        let mut ids = Vec::with_capacity(size);
        for &t in always.iter().chain(ranking) {
            if ids.len() == size {
                break;
            }
            if (t as usize) < inset.len() && !std::mem::replace(&mut inset[t as usize], true) {
                ids.push(t);
            }
        }
        Shortlist { ids, n_vocab, tokenizer, method, top_k, always: always.len() as u32 }
    }

    pub fn from_histogram(h: &Histogram, method: Method, always: &[u32], size: usize) -> Shortlist {
        Shortlist::from_ranking(&h.ranking(method), always, size, h.n_vocab, h.tokenizer.clone(), method, h.top_k)
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The shortlist of the first `n` ids (never fewer than the always-in tokens).
    pub fn prefix(&self, n: usize) -> Shortlist {
        let n = n.clamp(self.always as usize, self.ids.len());
        Shortlist { ids: self.ids[..n].to_vec(), ..self.clone() }
    }

    /// For every vocabulary id, its row in the subset (or `None`): the inverse id map.
    pub fn rows(&self) -> Vec<Option<u32>> {
        let mut r = vec![None; self.n_vocab as usize];
        for (i, &t) in self.ids.iter().enumerate() {
            r[t as usize] = Some(i as u32);
        }
        r
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let f = ShortlistFile {
            format: FORMAT.into(),
            version: VERSION,
            tokenizer: self.tokenizer.clone(),
            n_vocab: self.n_vocab,
            method: self.method,
            top_k: self.top_k,
            always: self.always,
            ids: self.ids.clone(),
        };
        serde_json::to_vec(&f).expect("shortlist serializes")
    }

    /// Reads an untrusted shortlist; `expect` = the model's (fingerprint, n_vocab).
    pub fn from_slice(bytes: &[u8], origin: &str, expect: Option<(&str, u32)>) -> Result<Shortlist, ShortlistError> {
        let err = |kind| ShortlistError { origin: origin.into(), kind };
        check_header(bytes, FORMAT).map_err(err)?;
        let f: ShortlistFile = serde_json::from_slice(bytes).map_err(|e| err(json_err(e)))?;
        check_vocab(&f.tokenizer, f.n_vocab, expect).map_err(err)?;
        if f.ids.is_empty() {
            return Err(err(ShortlistErrorKind::Invalid("`ids` is empty".into())));
        }
        if f.ids.len() > f.n_vocab as usize {
            return Err(err(ShortlistErrorKind::Invalid(format!("{} ids for a vocabulary of {}", f.ids.len(), f.n_vocab))));
        }
        if f.always as usize > f.ids.len() {
            return Err(err(ShortlistErrorKind::Invalid(format!("always {} exceeds the {} ids", f.always, f.ids.len()))));
        }
        if f.top_k == 0 || f.top_k > f.n_vocab {
            return Err(err(ShortlistErrorKind::Invalid(format!("top_k {} (must be 1..=n_vocab)", f.top_k))));
        }
        let mut seen = vec![false; f.n_vocab as usize];
        for &t in &f.ids {
            if t >= f.n_vocab {
                return Err(err(ShortlistErrorKind::TokenOutOfRange { token: t, n_vocab: f.n_vocab }));
            }
            if std::mem::replace(&mut seen[t as usize], true) {
                return Err(err(ShortlistErrorKind::Duplicate(t)));
            }
        }
        Ok(Shortlist { ids: f.ids, n_vocab: f.n_vocab, tokenizer: f.tokenizer, method: f.method, top_k: f.top_k, always: f.always })
    }

    /// Loads a shortlist for `model`: its tokenizer fingerprint and vocabulary size must match.
    pub fn load(path: &Path, model: &Model) -> Result<Shortlist, Box<dyn std::error::Error>> {
        let bytes = std::fs::read(path).map_err(|e| format!("shortlist {}: {e}", path.display()))?;
        let fp = crate::vocab::fingerprint(model);
        Ok(Shortlist::from_slice(&bytes, &path.display().to_string(), Some((&fp, model.n_vocab() as u32)))?)
    }
}


/// One scored position: the teacher's logits for the next token, and (when asked) the hidden state that
/// produced them.
pub struct Position<'a> {
    pub logits: &'a [f32],
    pub hidden: Option<&'a [f32]>,
}

/// Runs every text through `model` with logits at every position, `n_batch` positions per decode (all
/// logits of a chunk in one batch), calling `f` per position. `done(n)` reports texts finished.
pub fn score_positions(
    model: &Model,
    texts: &[Vec<Token>],
    n_batch: usize,
    n_threads: i32,
    hidden: bool,
    mut f: impl FnMut(&Position),
    mut done: impl FnMut(usize),
) -> Result<(), LlamaError> {
    let longest = texts.iter().map(Vec::len).max().unwrap_or(1).max(1);
    let opts = ContextOptions { n_ctx: (longest + 1).next_multiple_of(256) as u32, n_batch: n_batch as u32, n_seq: 1, n_threads, ..Default::default() };
    let mut ctx = Context::new(model, &opts)?;
    ctx.set_embeddings(hidden);
    let mut batch = Batch::new(n_batch, 1);
    for (n, text) in texts.iter().enumerate() {
        ctx.clear();
        for (c, chunk) in text.chunks(n_batch).enumerate() {
            batch.clear();
            for (i, &t) in chunk.iter().enumerate() {
                batch.add(t, (c * n_batch + i) as i32, &[0], true);
            }
            ctx.decode(&batch)?;
            for i in 0..chunk.len() {
                let p = Position { logits: ctx.logits(i as i32), hidden: hidden.then(|| ctx.embeddings(i as i32)) };
                f(&p);
            }
        }
        done(n + 1);
    }
    Ok(())
}

/// The top-k sets a coverage table asks about.
pub const COVERAGE_KS: [usize; 4] = [1, 2, 4, 10];

/// Per held-out position, the worst rank (in a shortlist's order) among the teacher's top-1/2/4/10:
/// the teacher's top-k are all inside the first `n` ids iff that rank is below `n`.
#[derive(Clone, Debug, Default)]
pub struct Coverage {
    worst: Vec<[u32; 4]>,
}

impl Coverage {
    /// Adds a position given its teacher top-10 ids (largest first) and `rank` (id → rank, u32::MAX
    /// when absent from the ranking).
    pub fn add(&mut self, top10: &[u32], rank: &[u32]) {
        let mut w = [0u32; 4];
        let mut worst = 0u32;
        let mut j = 0;
        for (i, &id) in top10.iter().enumerate().take(10) {
            worst = worst.max(rank[id as usize]);
            while j < 4 && i + 1 == COVERAGE_KS[j] {
                w[j] = worst;
                j += 1;
            }
        }
        while j < 4 {
            w[j] = worst;
            j += 1;
        }
        self.worst.push(w);
    }

    pub fn positions(&self) -> usize {
        self.worst.len()
    }

    /// Share of positions whose top-k (k = `COVERAGE_KS[j]`) lies in the first `n` ids.
    pub fn share(&self, n: usize, j: usize) -> f64 {
        if self.worst.is_empty() {
            return 0.0;
        }
        self.worst.iter().filter(|w| (w[j] as usize) < n).count() as f64 / self.worst.len() as f64
    }

    /// A markdown table: one row per size, columns top-1/2/4/10.
    pub fn table(&self, sizes: &[usize]) -> String {
        let mut s = String::from("| size | top-1 | top-2 | top-4 | top-10 |\n|---|---|---|---|---|\n");
        for &n in sizes {
            s += &format!("| {n} |");
            for j in 0..4 {
                s += &format!(" {:.2}% |", 100.0 * self.share(n, j));
            }
            s.push('\n');
        }
        s
    }
}

/// id → rank in `ids` (u32::MAX when absent).
pub fn rank_of(ids: &[u32], n_vocab: usize) -> Vec<u32> {
    let mut r = vec![u32::MAX; n_vocab];
    for (i, &t) in ids.iter().enumerate() {
        r[t as usize] = i as u32;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    const FP: &str = "0123456789abcdef0123456789abcdef";

    fn hist() -> Histogram {
        let mut h = Histogram::new(FP.into(), 8, 2);
        h.add_logits(&[0.0, 5.0, 1.0, 4.0, 0.0, 0.0, 0.0, 0.0]);
        h.add_logits(&[0.0, 5.0, 6.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        h.add_text(&[7, 7, 3]);
        h.corpus.push("test".into());
        h
    }

    #[test]
    fn top_ids_largest_first_ties_low_id() {
        assert_eq!(top_ids(&[1.0, 3.0, 3.0, 2.0], 3), vec![1, 2, 3]);
        assert_eq!(top_ids(&[1.0], 4), vec![0]);
    }

    #[test]
    fn histogram_ranks_and_round_trips() {
        let h = hist();
        assert_eq!(h.ranking(Method::Topk)[..3], [1, 2, 3]);
        assert_eq!(h.ranking(Method::Frequency)[..2], [7, 3]);
        let back = Histogram::from_slice(&h.to_vec(), "h", Some((FP, 8))).unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn shortlist_always_first_prefix_and_round_trip() {
        let s = Shortlist::from_histogram(&hist(), Method::Topk, &[6], 3);
        assert_eq!(s.ids, vec![6, 1, 2]);
        assert_eq!(s.prefix(2).ids, vec![6, 1]);
        assert_eq!(s.prefix(0).ids, vec![6]);
        let back = Shortlist::from_slice(&s.to_vec(), "s", Some((FP, 8))).unwrap();
        assert_eq!(back, s);
        let rows = s.rows();
        assert_eq!((rows[6], rows[2], rows[0]), (Some(0), Some(2), None));
    }

    #[test]
    fn coverage_counts_worst_rank() {
        let rank = rank_of(&[5, 1, 2, 3], 8);
        let mut c = Coverage::default();
        c.add(&[1, 2, 3, 0, 4, 6, 7, 5, 0, 0], &rank);
        assert_eq!(c.share(2, 0), 1.0);
        assert_eq!(c.share(2, 1), 0.0);
        assert_eq!(c.share(3, 1), 1.0);
        assert_eq!(c.share(4, 2), 0.0);
    }
}
