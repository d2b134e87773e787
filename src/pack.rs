//! The `recipes.json` format: schema, validation of untrusted input, content hash, merge.
//!
//! # Schema (format `"kolm-rsd/recipes"`, version 1)
//!
//! ```json
//! {
//!   "format": "kolm-rsd/recipes",
//!   "version": 1,
//!   "tokenizer": "9f2c4e0d1a7b3c5e8f60718293a4b5c6",
//!   "model": { "name": "qwen2.5-coder-1.5b-instruct-q4_k_m", "arch": "qwen2" },
//!   "compile": { "k": 4, "temperature": 0.7, "max_tokens": 256, "prompts": 12, "heldout": 3 },
//!   "coverage": 0.41,
//!   "recommended": "pack",
//!   "content_hash": "<64 hex digits>",
//!   "tables": [ { "kind": "literal", "n": 2, "entries": "<base64>" }, … ]
//! }
//! ```
//!
//! * `tokenizer`: [`tokenizer_fingerprint`] of the vocabulary the ids refer to.
//! * `coverage`: share of held-out generated tokens the pack predicted (`null` if not measured).
//! * `recommended`: `"pack"`, `"draft-model"` or `"none"`: the drafter the compiler picked.
//! * `tables`: at most one table per (`kind`, `n`), `kind` `"literal"` (key over the last `n`
//!   token ids) or `"shape"` (key over the shape classes of the last `n` tokens, see
//!   [`crate::shape`]), `1 ≤ n ≤ 32`.
//! * `entries`: standard base64 (no padding needed) of 12-byte little-endian records
//!   `key: u48 | token: u24 | count: u24`. `key` is [`crate::hash`]'s window key. One context may
//!   have several records (one per next token); `(kind, n, key, token)` must be unique.
//!
//! Why base64 records rather than JSON arrays: a record is 16 characters, so 100 entries take
//! about 1.6 KB; the same data as `[key,token,count]` arrays takes about 3 KB (a 48-bit key alone
//! is 15 decimal digits). Keys are opaque hashes either way, so nothing readable is lost;
//! `inspect` tools decode the records. Fixed-size records also make validation trivial.
//!
//! * `content_hash`: SHA-256 (hex) of the canonical entry bytes: for each table in canonical
//!   order (literal before shape, `n` ascending), one byte kind (0 literal, 1 shape), one byte `n`,
//!   the record count as u32 LE, then its records sorted by (key, token). It covers entries only,
//!   not metadata, so the same recipes compiled twice hash the same.
//!
//! Unknown fields are refused: a new field means a new version.

use std::fmt;
use std::io::{self, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Value of the `format` field.
pub const FORMAT: &str = "kolm-rsd/recipes";
/// The only version this code reads and writes.
pub const VERSION: u32 = 1;
/// Largest accepted file.
pub const MAX_FILE_BYTES: usize = 64 << 20;
/// Largest accepted number of entries.
pub const MAX_ENTRIES: usize = 4 << 20;
/// Longest context (in tokens) of an entry.
pub const MAX_N: usize = 32;
/// Largest count and largest token id a record can hold (24 bits).
pub const MAX_COUNT: u32 = (1 << 24) - 1;
/// Largest token id a record can hold.
pub const MAX_TOKEN: u32 = (1 << 24) - 1;
const MAX_NAME: usize = 256;
const RECORD: usize = 12;
const RECORD_B64: usize = 16;

/// What a context is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    Literal,
    Shape,
}

/// One recipe: after a context with this key, the target produced `token` `count` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    pub kind: EntryKind,
    pub n: u8,
    pub key: u64,
    pub token: u32,
    pub count: u32,
}

/// Which drafter the compiler recommends for the task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Recommended {
    #[serde(rename = "pack")]
    Pack,
    #[serde(rename = "draft-model")]
    DraftModel,
    #[serde(rename = "none")]
    None,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInfo {
    pub name: String,
    pub arch: String,
}

/// How the pack was compiled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompileParams {
    /// Samples per prompt.
    pub k: u32,
    pub temperature: f64,
    pub max_tokens: u32,
    /// Prompts compiled.
    pub prompts: u32,
    /// Prompts held out to measure coverage.
    pub heldout: u32,
}

/// Everything in a pack except its entries.
#[derive(Clone, Debug, PartialEq)]
pub struct PackMeta {
    pub tokenizer: String,
    pub model: ModelInfo,
    pub compile: CompileParams,
    pub coverage: Option<f64>,
    pub recommended: Recommended,
}

/// A validated pack: entries unique and in canonical order, content hash computed.
#[derive(Clone, Debug, PartialEq)]
pub struct Pack {
    pub meta: PackMeta,
    entries: Vec<Entry>,
    content_hash: String,
}

/// Why a pack was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PackErrorKind {
    #[error("file too large ({0} bytes, limit {MAX_FILE_BYTES})")]
    TooLarge(usize),
    #[error("bad JSON at line {line}, column {column}: {message}")]
    Json {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("not a recipe pack (format {0:?}, expected {FORMAT:?})")]
    Format(String),
    #[error("unsupported version {0} (this build reads version {VERSION})")]
    Version(u32),
    #[error("tokenizer mismatch: pack is for {found}, model has {expected}")]
    TokenizerMismatch { expected: String, found: String },
    #[error("content hash mismatch: file says {stated}, entries hash to {computed}")]
    ContentHash { stated: String, computed: String },
    #[error("token id {token} out of range (vocabulary has {n_vocab} tokens)")]
    TokenOutOfRange { token: u32, n_vocab: u32 },
    #[error("limit exceeded: {0}")]
    Limit(String),
    #[error("duplicate {0}")]
    Duplicate(String),
    #[error("invalid field: {0}")]
    Invalid(String),
}

/// A refused pack: where it came from and why.
#[derive(Debug, PartialEq)]
pub struct PackError {
    pub origin: String,
    pub kind: PackErrorKind,
}

impl fmt::Display for PackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "recipe pack {}: {}", self.origin, self.kind)
    }
}

impl std::error::Error for PackError {}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTable {
    kind: EntryKind,
    n: u32,
    entries: String,
}

/// On-disk layout; `format` and `version` are read first so a foreign file gets a clear error.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    format: String,
    version: u32,
    tokenizer: String,
    model: ModelInfo,
    compile: CompileParams,
    coverage: Option<f64>,
    recommended: Recommended,
    content_hash: String,
    tables: Vec<FileTable>,
}

#[derive(Deserialize)]
struct Header {
    format: Option<String>,
    version: Option<u32>,
}

/// Fingerprint of a vocabulary: SHA-256 over each token text as u32 LE length then bytes, in id
/// order; first 16 bytes as lowercase hex.
pub fn tokenizer_fingerprint<'a>(texts: impl Iterator<Item = &'a [u8]>) -> String {
    let mut h = Sha256::new();
    for t in texts {
        h.update((t.len() as u32).to_le_bytes());
        h.update(t);
    }
    hex(&h.finalize()[..16])
}

/// Writes `bytes` to `path` atomically: a temp file in the same directory, synced, then renamed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_mode(path, bytes, None)
}

/// [`write_atomic`], the file created with `mode` (Unix permissions) when given.
pub(crate) fn write_atomic_mode(path: &Path, bytes: &[u8], mode: Option<u32>) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        if let Some(m) = mode {
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, m);
        }
        let mut f = opts.open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

impl Pack {
    /// Builds a pack from entries in any order; entries with the same (kind, n, key, token) are
    /// combined by adding counts (saturating at [`MAX_COUNT`]).
    pub fn from_entries(meta: PackMeta, mut entries: Vec<Entry>) -> Result<Pack, PackError> {
        let err = |kind| PackError {
            origin: "<built>".into(),
            kind,
        };
        check_meta(&meta).map_err(err)?;
        for e in &entries {
            check_entry(e, None).map_err(err)?;
        }
        entries.sort_unstable();
        entries.dedup_by(|b, a| {
            let same = (a.kind, a.n, a.key, a.token) == (b.kind, b.n, b.key, b.token);
            if same {
                a.count = a.count.saturating_add(b.count).min(MAX_COUNT);
            }
            same
        });
        if entries.len() > MAX_ENTRIES {
            return Err(err(PackErrorKind::Limit(format!(
                "{} entries, limit {MAX_ENTRIES}",
                entries.len()
            ))));
        }
        let content_hash = content_hash(&entries);
        Ok(Pack {
            meta,
            entries,
            content_hash,
        })
    }

    /// Entries in canonical order: (kind, n, key, token).
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// SHA-256 (hex) of the canonical entry bytes.
    pub fn content_hash(&self) -> &str {
        &self.content_hash
    }

    /// Parses and validates an untrusted pack. `origin` names it in errors (usually the path).
    /// With `expect_fingerprint`, the pack must be for that tokenizer; with `n_vocab`, every
    /// token id must be below it.
    pub fn from_slice(
        bytes: &[u8],
        origin: &str,
        expect_fingerprint: Option<&str>,
        n_vocab: Option<u32>,
    ) -> Result<Pack, PackError> {
        let err = |kind| PackError {
            origin: origin.to_string(),
            kind,
        };
        if bytes.len() > MAX_FILE_BYTES {
            return Err(err(PackErrorKind::TooLarge(bytes.len())));
        }
        let json_err = |e: serde_json::Error| {
            err(PackErrorKind::Json {
                line: e.line(),
                column: e.column(),
                message: e.to_string(),
            })
        };
        let header: Header = serde_json::from_slice(bytes).map_err(json_err)?;
        match header.format.as_deref() {
            Some(FORMAT) => {}
            other => {
                return Err(err(PackErrorKind::Format(
                    other.unwrap_or("<missing>").into(),
                )))
            }
        }
        match header.version {
            Some(VERSION) => {}
            other => return Err(err(PackErrorKind::Version(other.unwrap_or(0)))),
        }
        let file: File = serde_json::from_slice(bytes).map_err(json_err)?;
        let meta = PackMeta {
            tokenizer: file.tokenizer,
            model: file.model,
            compile: file.compile,
            coverage: file.coverage,
            recommended: file.recommended,
        };
        check_meta(&meta).map_err(err)?;
        if let Some(expected) = expect_fingerprint {
            if meta.tokenizer != expected {
                return Err(err(PackErrorKind::TokenizerMismatch {
                    expected: expected.into(),
                    found: meta.tokenizer,
                }));
            }
        }
        let entries = decode_tables(&file.tables, n_vocab).map_err(err)?;
        let computed = content_hash(&entries);
        if computed != file.content_hash {
            return Err(err(PackErrorKind::ContentHash {
                stated: file.content_hash,
                computed,
            }));
        }
        Ok(Pack {
            meta,
            entries,
            content_hash: computed,
        })
    }

    /// Canonical JSON: fixed field order, tables in canonical order, records sorted.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut tables: Vec<FileTable> = Vec::new();
        for group in self.entries.chunk_by(|a, b| (a.kind, a.n) == (b.kind, b.n)) {
            let mut raw = Vec::with_capacity(group.len() * RECORD);
            for e in group {
                raw.extend_from_slice(&record(e));
            }
            tables.push(FileTable {
                kind: group[0].kind,
                n: u32::from(group[0].n),
                entries: b64_encode(&raw),
            });
        }
        let file = File {
            format: FORMAT.into(),
            version: VERSION,
            tokenizer: self.meta.tokenizer.clone(),
            model: self.meta.model.clone(),
            compile: self.meta.compile.clone(),
            coverage: self.meta.coverage,
            recommended: self.meta.recommended,
            content_hash: self.content_hash.clone(),
            tables,
        };
        let mut out = serde_json::to_vec_pretty(&file).expect("pack serialises");
        out.push(b'\n');
        out
    }

    /// Union of two packs for the same tokenizer; counts of identical entries add (saturating at
    /// [`MAX_COUNT`]), no entry is dropped. Metadata: `self`'s, with prompt counts added and
    /// coverage unknown (it was measured on neither union).
    pub fn merge(&self, other: &Pack) -> Result<Pack, PackError> {
        if self.meta.tokenizer != other.meta.tokenizer {
            return Err(PackError {
                origin: "merge".into(),
                kind: PackErrorKind::TokenizerMismatch {
                    expected: self.meta.tokenizer.clone(),
                    found: other.meta.tokenizer.clone(),
                },
            });
        }
        let mut meta = self.meta.clone();
        meta.compile.prompts = meta
            .compile
            .prompts
            .saturating_add(other.meta.compile.prompts);
        meta.compile.heldout = meta
            .compile
            .heldout
            .saturating_add(other.meta.compile.heldout);
        meta.coverage = None;
        let mut entries = Vec::with_capacity(self.entries.len() + other.entries.len());
        entries.extend_from_slice(&self.entries);
        entries.extend_from_slice(&other.entries);
        Pack::from_entries(meta, entries).map_err(|e| PackError {
            origin: "merge".into(),
            kind: e.kind,
        })
    }
}

fn check_meta(m: &PackMeta) -> Result<(), PackErrorKind> {
    let hexlen = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if !hexlen(&m.tokenizer, 32) {
        return Err(PackErrorKind::Invalid(
            "tokenizer must be 32 lowercase hex digits".into(),
        ));
    }
    for (what, s) in [("model.name", &m.model.name), ("model.arch", &m.model.arch)] {
        if s.len() > MAX_NAME {
            return Err(PackErrorKind::Limit(format!(
                "{what} longer than {MAX_NAME} bytes"
            )));
        }
    }
    let c = &m.compile;
    if !(c.temperature.is_finite() && (0.0..=100.0).contains(&c.temperature)) {
        return Err(PackErrorKind::Invalid(format!(
            "compile.temperature {} not in 0..=100",
            c.temperature
        )));
    }
    if let Some(cov) = m.coverage {
        if !(cov.is_finite() && (0.0..=1.0).contains(&cov)) {
            return Err(PackErrorKind::Invalid(format!(
                "coverage {cov} not in 0..=1"
            )));
        }
    }
    Ok(())
}

fn check_entry(e: &Entry, n_vocab: Option<u32>) -> Result<(), PackErrorKind> {
    if e.n == 0 || usize::from(e.n) > MAX_N {
        return Err(PackErrorKind::Limit(format!(
            "context length n = {} not in 1..={MAX_N}",
            e.n
        )));
    }
    if e.count == 0 || e.count > MAX_COUNT {
        return Err(PackErrorKind::Limit(format!(
            "count {} not in 1..={MAX_COUNT}",
            e.count
        )));
    }
    if e.key >> crate::hash::KEY_BITS != 0 {
        return Err(PackErrorKind::Invalid(format!(
            "key {:#x} wider than {} bits",
            e.key,
            crate::hash::KEY_BITS
        )));
    }
    let limit = n_vocab.unwrap_or(MAX_TOKEN + 1).min(MAX_TOKEN + 1);
    if e.token >= limit {
        return Err(PackErrorKind::TokenOutOfRange {
            token: e.token,
            n_vocab: limit,
        });
    }
    Ok(())
}

fn decode_tables(tables: &[FileTable], n_vocab: Option<u32>) -> Result<Vec<Entry>, PackErrorKind> {
    let total: usize = tables.iter().map(|t| t.entries.len() / RECORD_B64).sum();
    if total > MAX_ENTRIES {
        return Err(PackErrorKind::Limit(format!(
            "{total} entries, limit {MAX_ENTRIES}"
        )));
    }
    let mut entries = Vec::with_capacity(total);
    let mut seen = Vec::with_capacity(tables.len());
    let mut raw = Vec::new();
    for t in tables {
        if t.n == 0 || t.n as usize > MAX_N {
            return Err(PackErrorKind::Limit(format!(
                "table n = {} not in 1..={MAX_N}",
                t.n
            )));
        }
        let n = t.n as u8;
        if seen.contains(&(t.kind, n)) {
            return Err(PackErrorKind::Duplicate(format!(
                "table ({:?}, n = {n})",
                t.kind
            )));
        }
        seen.push((t.kind, n));
        if !t.entries.len().is_multiple_of(RECORD_B64) {
            return Err(PackErrorKind::Invalid(format!(
                "table ({:?}, n = {n}): entries length {} is not a multiple of {RECORD_B64}",
                t.kind,
                t.entries.len()
            )));
        }
        raw.clear();
        b64_decode(t.entries.as_bytes(), &mut raw).map_err(|at| {
            PackErrorKind::Invalid(format!("table ({:?}, n = {n}): bad base64 at {at}", t.kind))
        })?;
        for r in raw.chunks_exact(RECORD) {
            let key = u64::from_le_bytes([r[0], r[1], r[2], r[3], r[4], r[5], 0, 0]);
            let token = u32::from_le_bytes([r[6], r[7], r[8], 0]);
            let count = u32::from_le_bytes([r[9], r[10], r[11], 0]);
            let e = Entry {
                kind: t.kind,
                n,
                key,
                token,
                count,
            };
            check_entry(&e, n_vocab)?;
            entries.push(e);
        }
    }
    entries.sort_unstable();
    if let Some(w) = entries.windows(2).find(|w| {
        (w[0].kind, w[0].n, w[0].key, w[0].token) == (w[1].kind, w[1].n, w[1].key, w[1].token)
    }) {
        let e = w[0];
        return Err(PackErrorKind::Duplicate(format!(
            "entry ({:?}, n = {}, key {:#x}, token {})",
            e.kind, e.n, e.key, e.token
        )));
    }
    Ok(entries)
}

fn record(e: &Entry) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[..6].copy_from_slice(&e.key.to_le_bytes()[..6]);
    r[6..9].copy_from_slice(&e.token.to_le_bytes()[..3]);
    r[9..].copy_from_slice(&e.count.to_le_bytes()[..3]);
    r
}

fn content_hash(entries: &[Entry]) -> String {
    let mut h = Sha256::new();
    for group in entries.chunk_by(|a, b| (a.kind, a.n) == (b.kind, b.n)) {
        let kind = match group[0].kind {
            EntryKind::Literal => 0u8,
            EntryKind::Shape => 1,
        };
        h.update([kind, group[0].n]);
        h.update((group.len() as u32).to_le_bytes());
        for e in group {
            h.update(record(e));
        }
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Base64 of data whose length is a multiple of 3 (records are 12 bytes), so no padding.
fn b64_encode(data: &[u8]) -> String {
    debug_assert!(data.len().is_multiple_of(3));
    let mut out = String::with_capacity(data.len() / 3 * 4);
    for c in data.chunks_exact(3) {
        let v = u32::from(c[0]) << 16 | u32::from(c[1]) << 8 | u32::from(c[2]);
        for shift in [18, 12, 6, 0] {
            out.push(B64[(v >> shift & 63) as usize] as char);
        }
    }
    out
}

/// Sextet of each base64 byte, 0xFF for bytes outside the alphabet (a table: the branchy
/// version was most of the load time).
const B64_VALUE: [u8; 256] = {
    let mut t = [0xFF; 256];
    let mut i = 0;
    while i < 64 {
        t[B64[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// Strict decoding of unpadded base64 whose length is a multiple of 4; error is the bad offset.
fn b64_decode(text: &[u8], out: &mut Vec<u8>) -> Result<(), usize> {
    out.reserve(text.len() / 4 * 3);
    for (i, c) in text.chunks_exact(4).enumerate() {
        let s = [
            B64_VALUE[c[0] as usize],
            B64_VALUE[c[1] as usize],
            B64_VALUE[c[2] as usize],
            B64_VALUE[c[3] as usize],
        ];
        if let Some(j) = s.iter().position(|&v| v == 0xFF) {
            return Err(i * 4 + j);
        }
        let v =
            u32::from(s[0]) << 18 | u32::from(s[1]) << 12 | u32::from(s[2]) << 6 | u32::from(s[3]);
        out.extend_from_slice(&[(v >> 16) as u8, (v >> 8) as u8, v as u8]);
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) const FP: &str = "00112233445566778899aabbccddeeff";

    /// A literal entry for the token window `window` (test helper shared by the index and drafter tests).
    pub(crate) fn lit(window: &[i32], token: u32, count: u32) -> Entry {
        let w: Vec<u32> = window.iter().map(|&t| t as u32).collect();
        Entry {
            kind: EntryKind::Literal,
            n: window.len() as u8,
            key: crate::hash::window_key(&w),
            token,
            count,
        }
    }

    pub(crate) fn meta() -> PackMeta {
        PackMeta {
            tokenizer: FP.into(),
            model: ModelInfo {
                name: "test-model".into(),
                arch: "qwen2".into(),
            },
            compile: CompileParams {
                k: 4,
                temperature: 0.7,
                max_tokens: 256,
                prompts: 10,
                heldout: 2,
            },
            coverage: Some(0.5),
            recommended: Recommended::Pack,
        }
    }

    fn e(kind: EntryKind, n: u8, key: u64, token: u32, count: u32) -> Entry {
        Entry {
            kind,
            n,
            key,
            token,
            count,
        }
    }

    fn sample() -> Pack {
        Pack::from_entries(
            meta(),
            vec![
                e(EntryKind::Literal, 2, 0xabc, 5, 3),
                e(EntryKind::Literal, 1, 0x123456789abc, 7, 1),
                e(EntryKind::Shape, 3, 0x42, 9, 8),
                e(EntryKind::Literal, 2, 0xabc, 6, 1),
            ],
        )
        .unwrap()
    }

    /// Parses the canonical JSON of `pack`, lets `edit` change it, and loads the result.
    fn load_edited(edit: impl FnOnce(&mut serde_json::Value)) -> Result<Pack, PackError> {
        let mut v: serde_json::Value = serde_json::from_slice(&sample().to_vec()).unwrap();
        edit(&mut v);
        Pack::from_slice(
            &serde_json::to_vec(&v).unwrap(),
            "evil.json",
            Some(FP),
            Some(1000),
        )
    }

    fn assert_refused(r: Result<Pack, PackError>, reason: &str) {
        let msg = r.expect_err("hostile pack must be refused").to_string();
        assert!(
            msg.contains("evil.json"),
            "message must name the file: {msg}"
        );
        assert!(msg.contains(reason), "message must say {reason:?}: {msg}");
    }

    fn records_b64(records: &[Entry]) -> String {
        let raw: Vec<u8> = records.iter().flat_map(record).collect();
        b64_encode(&raw)
    }

    #[test]
    fn round_trip_is_canonical() {
        let p = sample();
        let bytes = p.to_vec();
        let q = Pack::from_slice(&bytes, "a.json", Some(FP), Some(1000)).unwrap();
        assert_eq!(p, q);
        assert_eq!(q.to_vec(), bytes);
        assert_eq!(q.entries().len(), 4);
        assert_eq!(
            q.entries()[0],
            e(EntryKind::Literal, 1, 0x123456789abc, 7, 1)
        );
        assert_eq!(p.content_hash().len(), 64);
    }

    #[test]
    fn content_hash_ignores_metadata_and_order() {
        let mut m = meta();
        m.model.name = "other".into();
        let a = sample();
        let mut rev = a.entries().to_vec();
        rev.reverse();
        let b = Pack::from_entries(m, rev).unwrap();
        assert_eq!(a.content_hash(), b.content_hash());
    }

    #[test]
    fn fingerprint_is_length_prefixed() {
        let a = tokenizer_fingerprint([&b"ab"[..], b"c"].into_iter());
        let b = tokenizer_fingerprint([&b"a"[..], b"bc"].into_iter());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
    }

    #[test]
    fn refuses_bad_json_with_position() {
        let r = Pack::from_slice(
            b"{\n  \"format\": \"kolm-rsd/recipes\",\n  oops",
            "evil.json",
            None,
            None,
        );
        assert_refused(r, "bad JSON at line 3, column 3");
    }

    #[test]
    fn refuses_oversized_file() {
        let big = vec![b' '; MAX_FILE_BYTES + 1];
        assert_refused(
            Pack::from_slice(&big, "evil.json", None, None),
            "file too large",
        );
    }

    #[test]
    fn refuses_wrong_format() {
        assert_refused(
            load_edited(|v| v["format"] = "gguf".into()),
            "not a recipe pack",
        );
        assert_refused(
            Pack::from_slice(b"{}", "evil.json", None, None),
            "not a recipe pack",
        );
    }

    #[test]
    fn refuses_wrong_version() {
        assert_refused(
            load_edited(|v| v["version"] = 2.into()),
            "unsupported version 2",
        );
    }

    #[test]
    fn refuses_tokenizer_mismatch() {
        assert_refused(
            load_edited(|v| v["tokenizer"] = "ffffffffffffffffffffffffffffffff".into()),
            "tokenizer mismatch",
        );
    }

    #[test]
    fn refuses_content_hash_mismatch() {
        assert_refused(
            load_edited(|v| {
                v["tables"][0]["entries"] =
                    records_b64(&[e(EntryKind::Literal, 1, 0x123456789abc, 7, 2)]).into()
            }),
            "content hash mismatch",
        );
    }

    #[test]
    fn refuses_token_out_of_range() {
        assert_refused(
            load_edited(|v| {
                v["tables"][0]["entries"] =
                    records_b64(&[e(EntryKind::Literal, 1, 1, 5000, 2)]).into()
            }),
            "token id 5000 out of range",
        );
    }

    #[test]
    fn refuses_limits() {
        assert_refused(
            load_edited(|v| v["tables"][0]["n"] = 33.into()),
            "limit exceeded: table n = 33",
        );
        assert_refused(
            load_edited(|v| {
                v["tables"][0]["entries"] = records_b64(&[e(EntryKind::Literal, 1, 1, 5, 0)]).into()
            }),
            "limit exceeded: count 0",
        );
        assert_refused(
            load_edited(|v| v["model"]["name"] = "x".repeat(300).into()),
            "limit exceeded: model.name",
        );
    }

    #[test]
    fn refuses_duplicates() {
        let dup = records_b64(&[
            e(EntryKind::Literal, 1, 1, 5, 2),
            e(EntryKind::Literal, 1, 1, 5, 3),
        ]);
        assert_refused(
            load_edited(|v| v["tables"][0]["entries"] = dup.into()),
            "duplicate entry",
        );
        assert_refused(
            load_edited(|v| {
                let t = v["tables"][0].clone();
                v["tables"].as_array_mut().unwrap().push(t);
            }),
            "duplicate table",
        );
        let text = String::from_utf8(sample().to_vec()).unwrap().replacen(
            "\"version\": 1,",
            "\"version\": 1, \"version\": 1,",
            1,
        );
        assert_refused(
            Pack::from_slice(text.as_bytes(), "evil.json", None, None),
            "duplicate field `version`",
        );
    }

    #[test]
    fn refuses_bad_fields() {
        assert_refused(
            load_edited(|v| v["tables"][0]["entries"] = "AAAA".into()),
            "not a multiple of 16",
        );
        assert_refused(
            load_edited(|v| v["tables"][0]["entries"] = "AAAAAAAAAAAAAAA*".into()),
            "bad base64 at 15",
        );
        assert_refused(
            load_edited(|v| v["extra"] = 1.into()),
            "unknown field `extra`",
        );
        assert_refused(load_edited(|v| v["coverage"] = 1.5.into()), "coverage 1.5");
        assert_refused(
            load_edited(|v| v["recommended"] = "magic".into()),
            "unknown variant `magic`",
        );
    }

    #[test]
    fn merge_refuses_other_tokenizer() {
        let mut m = meta();
        m.tokenizer = "ffffffffffffffffffffffffffffffff".into();
        let other = Pack::from_entries(m, vec![]).unwrap();
        let msg = sample().merge(&other).unwrap_err().to_string();
        assert!(
            msg.contains("merge") && msg.contains("tokenizer mismatch"),
            "{msg}"
        );
    }

    #[test]
    fn write_atomic_replaces_file() {
        let dir = std::env::temp_dir().join(format!("kolm-core-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("recipes.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temp file left behind"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn arb_entries() -> impl Strategy<Value = Vec<Entry>> {
        proptest::collection::vec(
            (
                prop_oneof![Just(EntryKind::Literal), Just(EntryKind::Shape)],
                1u8..4,
                0u64..6,
                0u32..4,
                1u32..100,
            )
                .prop_map(|(kind, n, key, token, count)| Entry {
                    kind,
                    n,
                    key,
                    token,
                    count,
                }),
            0..30,
        )
    }

    fn pack(entries: Vec<Entry>) -> Pack {
        Pack::from_entries(meta(), entries).unwrap()
    }

    fn count_of(p: &Pack, e: &Entry) -> u32 {
        p.entries()
            .iter()
            .find(|x| (x.kind, x.n, x.key, x.token) == (e.kind, e.n, e.key, e.token))
            .map_or(0, |x| x.count)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Pack::from_slice(&bytes, "fuzz.json", None, None);
        }

        #[test]
        fn a_corrupted_pack_is_refused_or_keeps_its_entries(pos in any::<usize>(), byte in any::<u8>()) {
            let original = sample();
            let mut bytes = original.to_vec();
            let i = pos % bytes.len();
            bytes[i] = byte;
            if let Ok(p) = Pack::from_slice(&bytes, "fuzz.json", None, None) {
                prop_assert_eq!(p.entries(), original.entries(), "the content hash guards the entries");
            }
        }

        #[test]
        fn merge_laws(a in arb_entries(), b in arb_entries(), c in arb_entries()) {
            let (a, b, c) = (pack(a), pack(b), pack(c));
            let ab = a.merge(&b).unwrap();
            let ba = b.merge(&a).unwrap();
            prop_assert_eq!(ab.entries(), ba.entries(), "commutative");
            let (ab_c, a_bc) = (ab.merge(&c).unwrap(), a.merge(&b.merge(&c).unwrap()).unwrap());
            prop_assert_eq!(ab_c.entries(), a_bc.entries(), "associative");
            for e in a.entries().iter().chain(b.entries()) {
                prop_assert_eq!(count_of(&ab, e), count_of(&a, e) + count_of(&b, e), "counts add, nothing lost");
            }
            prop_assert_eq!(ab.entries().iter().map(|e| u64::from(e.count)).sum::<u64>(),
                a.entries().iter().chain(b.entries()).map(|e| u64::from(e.count)).sum::<u64>());
            let reloaded = Pack::from_slice(&ab.to_vec(), "m.json", Some(FP), None).unwrap();
            prop_assert_eq!(reloaded, ab);
        }
    }
}
