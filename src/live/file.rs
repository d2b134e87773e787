//! The live index on disk, so what a server learned survives a restart: JSON (format `kolm-rsd/live`,
//! version 1), written atomically with mode 0600 (it is the user's traffic and stays on this machine), read
//! back with the file and the reason named when it is corrupt, hostile or for another tokenizer. Beside the
//! table it keeps the drafter's learned acceptance per class of evidence ([`Learned`]), so a restarted server
//! trusts the table as much as it had learned to instead of starting again from the priors.
//! `kolm-rsd merge` folds one into a compiled pack under the compile's own rule for what a recipe is.

use super::{Live, LiveEntry};
use crate::align::BuildConfig;
use crate::hash::KEY_BITS;
use crate::pack::{write_atomic_mode, CompileParams, Entry, EntryKind, ModelInfo, Pack, PackError, PackMeta, Recommended, MAX_FILE_BYTES, MAX_N, MAX_TOKEN};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const FORMAT: &str = "kolm-rsd/live";
pub const VERSION: u32 = 1;
/// Entries a file may hold: 16× the default table, far beyond what one is saved with.
const MAX_ENTRIES: usize = 1 << 22;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc {
    format: String,
    version: u32,
    tokenizer: String,
    model: ModelInfo,
    fed: u64,
    /// [kind (0 literal, 1 shape), n, key, lead token, lead count, runner-up token, its count, total, seen]
    entries: Vec<[u64; 9]>,
    /// Absent in files written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    learned: Option<Learned>,
}

/// The drafter's acceptance learned while serving: decayed counts of accepted tokens and of trials per class
/// of evidence, for the class layout it names (counts for another layout are not used).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Learned {
    pub layout: String,
    pub num: Vec<f32>,
    pub den: Vec<f32>,
}

/// Classes a file may count: far more than any layout has.
const MAX_CLASSES: usize = 4096;

impl Learned {
    /// Why the counts cannot be counts, if they cannot.
    fn check(&self) -> Result<(), String> {
        if self.layout.len() > 256 {
            return Err(format!("learned acceptance: a layout name of {} bytes (at most 256)", self.layout.len()));
        }
        if self.num.len() != self.den.len() || self.num.len() > MAX_CLASSES {
            return Err(format!("learned acceptance: {} accepted and {} trial counts (at most {MAX_CLASSES}, as many of each)", self.num.len(), self.den.len()));
        }
        match self.num.iter().zip(&self.den).position(|(&a, &t)| !(a.is_finite() && t.is_finite() && 0.0 <= a && a <= t && t <= 1e9)) {
            Some(i) => Err(format!("learned acceptance: class {i} has {} accepted of {} trials", self.num[i], self.den[i])),
            None => Ok(()),
        }
    }
}

#[derive(Deserialize)]
struct Header {
    format: Option<String>,
    version: Option<u32>,
}

/// A table as saved: its entries, the tokenizer it counts tokens of, and how many answer tokens it has seen.
#[derive(Clone, Debug, PartialEq)]
pub struct Saved {
    pub tokenizer: String,
    pub model: ModelInfo,
    pub fed: u64,
    pub entries: Vec<LiveEntry>,
    pub learned: Option<Learned>,
}

/// A live index file refused: which and why.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("live index {path}: {reason}")]
pub struct LiveFileError {
    pub path: String,
    pub reason: String,
}

/// Whether `bytes` claim to be a live index (they may still be refused by [`Saved::from_slice`]).
pub fn is_live(bytes: &[u8]) -> bool {
    serde_json::from_slice::<Header>(bytes).is_ok_and(|h| h.format.as_deref() == Some(FORMAT))
}

impl Saved {
    /// A copy of `live`'s entries, oldest first (cheap enough for the server thread; writing is not), with
    /// the drafter's learned acceptance.
    pub fn of(live: &Live, learned: Option<Learned>, tokenizer: &str, model: &ModelInfo, fed_before: u64) -> Saved {
        let mut entries: Vec<LiveEntry> = live.entries().collect();
        entries.sort_unstable_by_key(|e| e.seen);
        Saved { tokenizer: tokenizer.into(), model: model.clone(), fed: fed_before + live.fed(), entries, learned }
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let entries = self
            .entries
            .iter()
            .map(|e| {
                let kind = u64::from(e.kind == EntryKind::Shape);
                let [a, b] = [e.lead, e.second].map(|(t, c)| (u64::from(t), u64::from(c)));
                [kind, u64::from(e.n), e.key, a.0, a.1, b.0, b.1, u64::from(e.total), u64::from(e.seen)]
            })
            .collect();
        let doc = Doc {
            format: FORMAT.into(),
            version: VERSION,
            tokenizer: self.tokenizer.clone(),
            model: self.model.clone(),
            fed: self.fed,
            entries,
            learned: self.learned.clone(),
        };
        serde_json::to_vec(&doc).expect("plain data serializes")
    }

    /// Parses and checks an untrusted file; `origin` names it in errors. With `tokenizer`, it must count
    /// that tokenizer's tokens; with `n_vocab`, every id must be below it.
    pub fn from_slice(bytes: &[u8], origin: &str, tokenizer: Option<&str>, n_vocab: Option<u32>) -> Result<Saved, LiveFileError> {
        let err = |reason: String| LiveFileError { path: origin.into(), reason };
        if bytes.len() > MAX_FILE_BYTES {
            return Err(err(format!("{} bytes, more than the {MAX_FILE_BYTES} a live index may have", bytes.len())));
        }
        let json = |e: serde_json::Error| err(format!("not a live index (line {}, column {}: {e})", e.line(), e.column()));
        let h: Header = serde_json::from_slice(bytes).map_err(json)?;
        if h.format.as_deref() != Some(FORMAT) {
            return Err(err(format!("format is {:?}, not {FORMAT:?}", h.format.unwrap_or_default())));
        }
        if h.version != Some(VERSION) {
            return Err(err(format!("version {} is not {VERSION}", h.version.unwrap_or(0))));
        }
        let doc: Doc = serde_json::from_slice(bytes).map_err(json)?;
        if let Some(want) = tokenizer {
            if doc.tokenizer != want {
                return Err(err(format!("counts tokens of tokenizer {}, not of this model's ({want})", doc.tokenizer)));
            }
        }
        if doc.entries.len() > MAX_ENTRIES {
            return Err(err(format!("{} entries, more than {MAX_ENTRIES}", doc.entries.len())));
        }
        let vocab = u64::from(n_vocab.unwrap_or(MAX_TOKEN + 1).min(MAX_TOKEN + 1));
        let entries = doc
            .entries
            .iter()
            .enumerate()
            .map(|(i, r)| entry(r, vocab).map_err(|why| err(format!("entry {i}: {why}"))))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(l) = &doc.learned {
            l.check().map_err(err)?;
        }
        Ok(Saved { tokenizer: doc.tokenizer, model: doc.model, fed: doc.fed, entries, learned: doc.learned })
    }

    /// Puts the entries into `live` (oldest first, so a smaller table keeps the newest).
    pub fn restore_into(&self, live: &mut Live) {
        for &e in &self.entries {
            live.restore(e);
        }
    }

    /// A pack of the contexts that pass the compile's own rule (`build`): a leading token with that share
    /// of the context's occurrences, and, for short contexts, that count.
    pub fn to_pack(&self, build: &BuildConfig) -> Result<Pack, PackError> {
        let entries = self
            .entries
            .iter()
            .filter(|e| f64::from(e.lead.1) >= build.min_confidence * f64::from(e.total))
            .filter(|e| e.n > build.short_n || e.lead.1 >= build.min_count_short)
            .map(|e| Entry { kind: e.kind, n: e.n, key: e.key, token: e.lead.0, count: e.lead.1.min(crate::pack::MAX_COUNT) })
            .collect();
        let meta = PackMeta {
            tokenizer: self.tokenizer.clone(),
            model: self.model.clone(),
            compile: CompileParams { k: 1, temperature: 0.0, max_tokens: 0, prompts: 0, heldout: 0 },
            coverage: None,
            recommended: Recommended::Pack,
        };
        Pack::from_entries(meta, entries)
    }
}

/// One saved entry, checked.
fn entry(r: &[u64; 9], vocab: u64) -> Result<LiveEntry, String> {
    let &[kind, n, key, a, ca, b, cb, total, seen] = r;
    let kind = match kind {
        0 => EntryKind::Literal,
        1 => EntryKind::Shape,
        k => return Err(format!("kind {k} is neither 0 (literal) nor 1 (shape)")),
    };
    if n == 0 || n > MAX_N as u64 {
        return Err(format!("context length {n} not in 1..={MAX_N}"));
    }
    if key >> KEY_BITS != 0 {
        return Err(format!("key {key:#x} wider than {KEY_BITS} bits"));
    }
    if a >= vocab || b >= vocab {
        return Err(format!("token {} not below the vocabulary's {vocab}", a.max(b)));
    }
    let total = u32::try_from(total).map_err(|_| format!("total {total} too large"))?;
    let seen = u32::try_from(seen).map_err(|_| format!("seen {seen} too large"))?;
    if ca == 0 || ca < cb || ca.saturating_add(cb) > u64::from(total) {
        return Err(format!("counts {ca} and {cb} do not fit a leader, a runner-up and a total of {total}"));
    }
    Ok(LiveEntry { kind, n: n as u8, key, lead: (a as u32, ca as u32), second: (b as u32, cb as u32), total, seen })
}

/// Writes `bytes` to `path` atomically with mode 0600, making its directory (0700) when missing.
pub fn save(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    write_atomic_mode(path, bytes, Some(0o600))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::LiveConfig;
    use crate::shape::tests::table;

    const FP: &str = "0123456789abcdef0123456789abcdef";

    fn model() -> ModelInfo {
        ModelInfo { name: "m".into(), arch: "llama".into() }
    }

    fn learned() -> Live {
        let mut live = Live::new(LiveConfig::default(), Some(table()));
        for round in 0..3 {
            let mut h = vec![1, 2, 3];
            for t in [10, 11, 12, 13] {
                live.feed(&h, if round == 2 && t == 12 { 99 } else { t });
                h.push(t);
            }
        }
        live
    }

    #[test]
    fn round_trips_and_restores() {
        let live = learned();
        let learned = Learned { layout: "2 kinds".into(), num: vec![1.0, 0.5], den: vec![2.0, 0.5] };
        let saved = Saved::of(&live, Some(learned.clone()), FP, &model(), 5);
        let bytes = saved.to_vec();
        assert!(is_live(&bytes));
        let back = Saved::from_slice(&bytes, "x", Some(FP), Some(100)).unwrap();
        assert_eq!(back, saved);
        assert_eq!(back.fed, 5 + 12);
        assert_eq!(back.learned, Some(learned));
        let mut copy = Live::new(LiveConfig::default(), Some(table()));
        back.restore_into(&mut copy);
        for h in [&[1, 2, 3][..], &[1, 2, 3, 10, 11], &[2, 3, 10]] {
            assert_eq!(copy.lookup(h), live.lookup(h));
        }
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let bytes = Saved::of(&learned(), None, FP, &model(), 0).to_vec();
        let reason = |b: &[u8], fp: Option<&str>, vocab| Saved::from_slice(b, "f.json", fp, vocab).unwrap_err().to_string();
        assert!(reason(&bytes, Some("ffffffffffffffffffffffffffffffff"), None).contains("tokenizer"));
        assert!(reason(&bytes, None, Some(12)).contains("not below the vocabulary"));
        assert!(reason(b"{", None, None).starts_with("live index f.json: not a live index"));
        assert!(reason(br#"{"format":"kolm-rsd/recipes","version":1}"#, None, None).contains("format"));
        let text = String::from_utf8(bytes.clone()).unwrap();
        let i = text.find("\"entries\":[[").unwrap() + 12;
        let bad_kind = format!("{}7{}", &text[..i], &text[i + 1..]);
        assert!(reason(bad_kind.as_bytes(), None, None).contains("kind 7"));
        let over = format!("{}\"entries\":[[0,2,1,5,9,6,1,3,0]]}}", &text[..text.find("\"entries\"").unwrap()]);
        assert!(reason(over.as_bytes(), None, None).contains("do not fit"));
        let with = |num: &str, den: &str| format!(r#"{},"learned":{{"layout":"x","num":{num},"den":{den}}}}}"#, &text[..text.len() - 1]);
        assert!(Saved::from_slice(with("[1.0]", "[2.0]").as_bytes(), "f.json", None, None).is_ok(), "{}", with("[1.0]", "[2.0]"));
        assert!(reason(with("[3.0]", "[2.0]").as_bytes(), None, None).contains("class 0 has 3 accepted of 2 trials"));
        assert!(reason(with("[1.0]", "[]").as_bytes(), None, None).contains("1 accepted and 0 trial counts"));
        let long = with("[1.0]", "[2.0]").replace(r#""layout":"x""#, &format!(r#""layout":"{}""#, "x".repeat(300)));
        assert!(reason(long.as_bytes(), None, None).contains("layout name of 300 bytes"));
    }

    #[test]
    fn files_from_before_the_learned_acceptance_still_load() {
        let text = String::from_utf8(Saved::of(&learned(), None, FP, &model(), 0).to_vec()).unwrap();
        assert!(!text.contains("learned"));
        assert_eq!(Saved::from_slice(text.as_bytes(), "f.json", Some(FP), None).unwrap().learned, None);
    }

    #[test]
    fn merging_keeps_only_what_the_compile_would() {
        let saved = Saved::of(&learned(), None, FP, &model(), 0);
        let pack = saved.to_pack(&BuildConfig::default()).unwrap();
        assert!(!pack.entries().is_empty());
        // The context before the token that changed once in three answers is 67% sure: not a recipe.
        let contradicted = crate::hash::window_key(&[1, 2, 3, 10, 11].map(|t| t as u32));
        assert!(pack.entries().iter().all(|e| e.key != contradicted));
        assert!(pack.entries().iter().all(|e| e.count >= 2 || e.n > 2));
    }

    #[test]
    fn saved_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("kolm-live-{}", std::process::id()));
        let path = dir.join("sub").join("m.live.json");
        save(&path, b"one").unwrap();
        save(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
