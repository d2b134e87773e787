//! The pure part of compile: find deterministic (context → token) pairs in K sampled
//! continuations of each prompt, rank and prune them into a [`Pack`], and measure coverage.
//!
//! A context is a window of the last `n` tokens (literal) or of their shapes (see
//! [`crate::shape`]). Within one prompt's sample set, a context is deterministic when every one of
//! its occurrences at a generated position, across all K samples, is followed by the same token,
//! and it occurs in at least `min_support` samples (default K). This generalises the longest
//! common prefix: the samples may drift apart and realign, and a context counts wherever it
//! occurs. Across prompts, a context seen with conflicting next tokens keeps those occurrences as
//! evidence against itself, so its confidence drops below the build threshold.

use ahash::AHashMap;

use crate::hash::literal_suffix_keys;
use crate::index::Index;
use crate::pack::{Entry, EntryKind, Pack, PackError, PackMeta, MAX_COUNT, MAX_N};
use crate::shape::ShapeTable;

/// How contexts are collected.
#[derive(Clone, Debug)]
pub struct AlignConfig {
    /// Longest literal context, in tokens.
    pub max_n_literal: usize,
    /// Longest shape context, in tokens (ignored without a shape table).
    pub max_n_shape: usize,
    /// Samples a context must occur in to be kept; `None` means all K.
    pub min_support: Option<usize>,
}

impl Default for AlignConfig {
    fn default() -> Self {
        AlignConfig {
            max_n_literal: 8,
            max_n_shape: 6,
            min_support: None,
        }
    }
}

/// How candidates become pack entries.
#[derive(Clone, Debug)]
pub struct BuildConfig {
    /// Share of a context's evidence its token needs (> 0.5 keeps one token per context).
    pub min_confidence: f64,
    /// Contexts of at most this many tokens …
    pub short_n: u8,
    /// … need at least this count: a short context seen once predicts nothing reliably.
    pub min_count_short: u32,
    /// Most entries kept, highest counts first.
    pub max_entries: usize,
}

impl Default for BuildConfig {
    fn default() -> Self {
        BuildConfig {
            min_confidence: 0.9,
            short_n: 2,
            min_count_short: 2,
            max_entries: 1 << 20,
        }
    }
}

/// Evidence about one context and one next token, as fed to [`Recipes::add`].
#[derive(Clone, Copy, Debug)]
pub struct Observation {
    pub kind: EntryKind,
    pub n: u8,
    pub key: u64,
    /// Key of the same kind of context one token shorter (`None` for n = 1).
    pub parent: Option<u64>,
    pub token: u32,
    /// Occurrences followed by `token`.
    pub count: u32,
    /// Occurrences followed by something else.
    pub conflicts: u32,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    kind: EntryKind,
    n: u8,
    key: u64,
}

#[derive(Default)]
struct Candidate {
    tokens: Vec<(u32, u32)>,
    conflicts: u32,
    parent: Option<u64>,
    /// Shape context made only of always-literal tokens: the literal entry says the same.
    all_literal: bool,
}

/// Occurrences of one context within one sample set.
struct Occurrence {
    token: u32,
    conflict: bool,
    count: u32,
    samples: u32,
    last_sample: usize,
    parent: Option<u64>,
    all_literal: bool,
}

/// Recipe candidates accumulated over sample sets (and folded misses).
pub struct Recipes {
    cfg: AlignConfig,
    shapes: Option<ShapeTable>,
    cands: AHashMap<Key, Candidate>,
}

impl Recipes {
    /// Without a shape table only literal recipes are collected.
    pub fn new(mut cfg: AlignConfig, shapes: Option<ShapeTable>) -> Recipes {
        cfg.max_n_literal = cfg.max_n_literal.min(MAX_N);
        cfg.max_n_shape = cfg.max_n_shape.min(MAX_N);
        Recipes {
            cfg,
            shapes,
            cands: AHashMap::new(),
        }
    }

    /// Longest literal context collected.
    pub fn max_n_literal(&self) -> usize {
        self.cfg.max_n_literal
    }

    /// Longest shape context collected, and the shape table (None: literal recipes only).
    pub fn shapes(&self) -> Option<(&ShapeTable, usize)> {
        self.shapes.as_ref().map(|s| (s, self.cfg.max_n_shape))
    }

    /// Number of distinct contexts seen so far.
    pub fn len(&self) -> usize {
        self.cands.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cands.is_empty()
    }

    /// Adds the deterministic contexts of K sampled continuations of one prompt.
    pub fn add_sample_set(&mut self, prompt: &[i32], samples: &[Vec<i32>]) {
        let k = samples.len();
        if k == 0 {
            return;
        }
        let support = self.cfg.min_support.unwrap_or(k).clamp(1, k) as u32;
        let mut local: AHashMap<Key, Occurrence> = AHashMap::new();
        let mut seq =
            Vec::with_capacity(prompt.len() + samples.iter().map(Vec::len).max().unwrap_or(0));
        let mut keys = [0u64; MAX_N];
        for (si, sample) in samples.iter().enumerate() {
            seq.clear();
            seq.extend_from_slice(prompt);
            seq.extend_from_slice(sample);
            for j in prompt.len()..seq.len() {
                let (hist, next) = (&seq[..j], seq[j]);
                let Ok(next) = u32::try_from(next) else {
                    continue;
                };
                let mut record = |kind, i: usize, keys: &[u64], all_literal| {
                    let key = Key {
                        kind,
                        n: i as u8 + 1,
                        key: keys[i],
                    };
                    let parent = i.checked_sub(1).map(|p| keys[p]);
                    let o = local.entry(key).or_insert(Occurrence {
                        token: next,
                        conflict: false,
                        count: 0,
                        samples: 0,
                        last_sample: usize::MAX,
                        parent,
                        all_literal,
                    });
                    o.conflict |= o.token != next;
                    o.count = o.count.saturating_add(1);
                    if o.last_sample != si {
                        o.last_sample = si;
                        o.samples += 1;
                    }
                };
                let n = literal_suffix_keys(hist, self.cfg.max_n_literal, &mut keys);
                for i in 0..n {
                    record(EntryKind::Literal, i, &keys, false);
                }
                if let Some(shapes) = &self.shapes {
                    let n = shapes.suffix_keys(hist, self.cfg.max_n_shape, &mut keys);
                    let mut all_literal = true;
                    for i in 0..n {
                        all_literal &= shapes.always_literal(hist[j - 1 - i]);
                        record(EntryKind::Shape, i, &keys, all_literal);
                    }
                }
            }
        }
        for (key, o) in local {
            let (count, conflicts) = match (o.conflict, o.samples >= support) {
                (true, _) => (0, o.count),
                (false, true) => (o.count, 0),
                (false, false) => continue,
            };
            let obs = Observation {
                kind: key.kind,
                n: key.n,
                key: key.key,
                parent: o.parent,
                token: o.token,
                count,
                conflicts,
            };
            self.add_observation(obs, o.all_literal);
        }
    }

    /// Adds evidence gathered elsewhere (e.g. folded misses); `all_literal`: a shape context made only of
    /// tokens that are their own class (its literal entry has the same key, so the build skips it).
    pub fn add(&mut self, obs: Observation, all_literal: bool) {
        self.add_observation(obs, all_literal);
    }

    fn add_observation(&mut self, o: Observation, all_literal: bool) {
        let c = self
            .cands
            .entry(Key {
                kind: o.kind,
                n: o.n,
                key: o.key,
            })
            .or_default();
        c.parent = o.parent;
        c.all_literal = all_literal;
        c.conflicts = c.conflicts.saturating_add(o.conflicts);
        if o.count > 0 {
            match c.tokens.iter_mut().find(|(t, _)| *t == o.token) {
                Some((_, n)) => *n = n.saturating_add(o.count),
                None => c.tokens.push((o.token, o.count)),
            }
        }
    }

    /// Ranks and prunes the candidates into a pack:
    /// 1. keep a (context, token) when its share of the context's evidence reaches
    ///    `min_confidence`, short contexts reach `min_count_short`, and (shape) the context is
    ///    not made only of literal tokens (the literal entry is the same key);
    /// 2. drop a context whose one-shorter suffix was kept with the same token: lookups try the
    ///    longest context first, so the shorter one gives the same answer;
    /// 3. keep the `max_entries` highest counts.
    pub fn build(&self, meta: PackMeta, cfg: &BuildConfig) -> Result<Pack, PackError> {
        let mut passed: AHashMap<Key, Vec<(u32, u32)>> = AHashMap::new();
        for (k, c) in &self.cands {
            if k.kind == EntryKind::Shape && c.all_literal {
                continue;
            }
            let total: u64 =
                c.tokens.iter().map(|&(_, n)| u64::from(n)).sum::<u64>() + u64::from(c.conflicts);
            let ok: Vec<(u32, u32)> = c
                .tokens
                .iter()
                .copied()
                .filter(|&(_, n)| {
                    f64::from(n) >= cfg.min_confidence * total as f64
                        && (k.n > cfg.short_n || n >= cfg.min_count_short)
                })
                .collect();
            if !ok.is_empty() {
                passed.insert(*k, ok);
            }
        }
        let mut entries = Vec::new();
        for (k, toks) in &passed {
            let parent = self.cands[k].parent.map(|p| Key {
                kind: k.kind,
                n: k.n - 1,
                key: p,
            });
            let parent_toks = parent.and_then(|p| passed.get(&p));
            for &(token, count) in toks {
                if parent_toks.is_some_and(|pt| pt.iter().any(|&(t, _)| t == token)) {
                    continue;
                }
                entries.push(Entry {
                    kind: k.kind,
                    n: k.n,
                    key: k.key,
                    token,
                    count: count.min(MAX_COUNT),
                });
            }
        }
        entries.sort_unstable_by(|a, b| b.count.cmp(&a.count).then(a.cmp(b)));
        entries.truncate(cfg.max_entries);
        Pack::from_entries(meta, entries)
    }
}

/// Share of the generated tokens of `heldout` (prompt, continuation) pairs that greedy drafting
/// with `index` would have produced: at each step chain up to `max_draft` confident lookups,
/// count the drafted prefix the continuation agrees with, then advance past it and the target's
/// own next token.
pub fn coverage(
    index: &Index,
    heldout: &[(Vec<i32>, Vec<i32>)],
    max_draft: usize,
    min_confidence: f32,
) -> f64 {
    let (mut covered, mut total) = (0usize, 0usize);
    let mut hist = Vec::new();
    for (prompt, cont) in heldout {
        total += cont.len();
        hist.clear();
        hist.extend_from_slice(prompt);
        let mut j = 0;
        while j < cont.len() {
            let base = hist.len();
            let mut accepted = 0;
            while accepted < max_draft && j + accepted < cont.len() {
                match index
                    .lookup(&hist)
                    .filter(|h| h.confidence() >= min_confidence)
                {
                    Some(h) if h.token == cont[j + accepted] => {
                        hist.push(h.token);
                        accepted += 1;
                    }
                    _ => break,
                }
            }
            hist.truncate(base);
            let step = (accepted + 1).min(cont.len() - j);
            hist.extend_from_slice(&cont[j..j + step]);
            covered += accepted;
            j += step;
        }
    }
    if total == 0 {
        0.0
    } else {
        covered as f64 / total as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::window_key;
    use crate::pack::tests::meta;
    use crate::shape::tests::{id, table, VOCAB};
    use proptest::prelude::*;

    fn build(r: &Recipes) -> Pack {
        r.build(meta(), &BuildConfig::default()).unwrap()
    }

    #[test]
    fn keeps_agreeing_tokens_beyond_the_common_prefix() {
        let mut r = Recipes::new(AlignConfig::default(), None);
        // Samples diverge at position 1 (7 vs 8) but realign: "5" is always followed by 6.
        r.add_sample_set(
            &[1, 2],
            &[vec![3, 7, 5, 6], vec![3, 8, 5, 6], vec![3, 9, 9, 5, 6]],
        );
        let idx = Index::new(&build(&r), None);
        assert_eq!(
            idx.lookup(&[1, 2]).map(|h| h.token),
            Some(3),
            "common prefix"
        );
        assert_eq!(
            idx.lookup(&[4, 4, 5]).map(|h| h.token),
            Some(6),
            "realigned context"
        );
        assert_eq!(idx.lookup(&[1, 2, 3]), None, "samples disagree after 3");
        let pack = build(&r);
        let five = pack
            .entries()
            .iter()
            .find(|e| e.key == window_key(&[5]) && e.n == 1)
            .unwrap();
        assert_eq!((five.token, five.count), (6, 3));
        assert!(
            !pack.entries().iter().any(|e| e.n == 2 && e.token == 6),
            "longer contexts predicting the same 6 as \"5\" are pruned"
        );
    }

    #[test]
    fn support_and_conflicts_across_prompts() {
        let mut r = Recipes::new(
            AlignConfig {
                min_support: Some(2),
                ..AlignConfig::default()
            },
            None,
        );
        r.add_sample_set(&[1], &[vec![4, 5], vec![4, 5], vec![9]]);
        let p = build(&r);
        assert!(
            p.entries()
                .iter()
                .any(|e| e.n == 1 && e.key == window_key(&[4]) && e.token == 5),
            "2 of 3 samples suffice"
        );
        // Another prompt where 4 is followed by 6 and 7: "4" is no longer reliable.
        r.add_sample_set(&[2], &[vec![4, 6], vec![4, 7]]);
        assert!(!build(&r)
            .entries()
            .iter()
            .any(|e| e.n == 1 && e.key == window_key(&[4])));
        let single = {
            let mut r = Recipes::new(AlignConfig::default(), None);
            r.add_sample_set(&[1], &[vec![4, 5]]);
            build(&r)
        };
        assert!(
            !single.entries().iter().any(|e| e.n <= 2),
            "a short context seen once is pruned: {:?}",
            single.entries()
        );
    }

    #[test]
    fn shape_recipes_generalise_to_new_values() {
        let mut r = Recipes::new(AlignConfig::default(), Some(table()));
        let rec = |name: &str, age: &str| -> Vec<i32> {
            [
                "{", "\"", "name", "\":", "Ġ\"", name, "\",", "Ġ\"", "age", "\":", age, "}",
            ]
            .iter()
            .map(|t| id(t))
            .collect()
        };
        r.add_sample_set(&[id("Ċ")], &[rec("Ann", "Ġ41"), rec("Bob", "Ġ41")]);
        let pack = build(&r);
        assert!(pack.entries().iter().any(|e| e.kind == EntryKind::Shape));
        let idx = Index::new(&pack, Some(table()));
        // "x_1" was never a name: only the shape recipe knows what follows it.
        let hist: Vec<i32> = ["Ċ", "{", "\"", "name", "\":", "Ġ\"", "x_1"]
            .iter()
            .map(|t| id(t))
            .collect();
        let hit = idx.lookup(&hist).unwrap();
        assert_eq!((hit.token, hit.kind), (id("\","), EntryKind::Shape));
        assert!(
            !pack.entries().iter().any(|e| e.kind == EntryKind::Shape
                && e.n == 1
                && e.key == table().window_key(&[id("{")])),
            "all-literal shape contexts are left to the literal table"
        );
    }

    #[test]
    fn coverage_simulates_greedy_drafting() {
        let mut r = Recipes::new(AlignConfig::default(), None);
        r.add_sample_set(&[1], &[vec![2, 3, 9], vec![2, 3, 8]]);
        let idx = Index::new(&build(&r), None);
        assert_eq!(
            coverage(&idx, &[(vec![1], vec![2, 3, 7])], 4, 0.6),
            2.0 / 3.0
        );
        assert_eq!(
            coverage(&idx, &[(vec![1], vec![2, 3, 7])], 1, 0.6),
            1.0 / 3.0,
            "1 drafted, then the target's 3"
        );
        assert_eq!(coverage(&idx, &[(vec![5], vec![6])], 4, 0.6), 0.0);
        assert_eq!(coverage(&idx, &[], 4, 0.6), 0.0);
    }

    fn sample_sets() -> impl Strategy<Value = (Vec<i32>, Vec<Vec<i32>>)> {
        let tok = 0i32..VOCAB.len() as i32;
        (
            proptest::collection::vec(tok.clone(), 0..4),
            proptest::collection::vec(tok.clone(), 0..16),
            proptest::collection::vec(proptest::collection::vec((0usize..16, tok), 0..3), 1..4),
        )
            .prop_map(|(prompt, base, edits)| {
                let samples = edits
                    .into_iter()
                    .map(|ed| {
                        let mut s = base.clone();
                        for (pos, t) in ed {
                            if pos < s.len() {
                                s[pos] = t;
                            }
                        }
                        s
                    })
                    .collect();
                (prompt, samples)
            })
    }

    /// Every (window, next) at a generated position, with the sample it occurred in.
    fn occurrences(prompt: &[i32], samples: &[Vec<i32>], n: usize) -> Vec<(Vec<i32>, i32, usize)> {
        let mut out = Vec::new();
        for (si, s) in samples.iter().enumerate() {
            let seq: Vec<i32> = prompt.iter().chain(s).copied().collect();
            for j in prompt.len().max(n)..seq.len() {
                out.push((seq[j - n..j].to_vec(), seq[j], si));
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn every_recipe_agrees_with_all_samples((prompt, samples) in sample_sets()) {
            let t = table();
            let mut r = Recipes::new(AlignConfig { max_n_literal: 4, max_n_shape: 4, min_support: None }, Some(t.clone()));
            r.add_sample_set(&prompt, &samples);
            let pack = r.build(meta(), &BuildConfig { min_count_short: 0, ..BuildConfig::default() }).unwrap();
            let lit_key = |w: &[i32]| window_key(&w.iter().map(|&x| x as u32).collect::<Vec<_>>());
            for e in pack.entries() {
                let key_of = |w: &[i32]| if e.kind == EntryKind::Literal { lit_key(w) } else { t.window_key(w) };
                let occ: Vec<_> = occurrences(&prompt, &samples, e.n as usize).into_iter().filter(|(w, _, _)| key_of(w) == e.key).collect();
                prop_assert!(!occ.is_empty());
                prop_assert!(occ.iter().all(|(_, next, _)| *next as u32 == e.token), "entry {:?} disagrees with a sample", e);
                let mut in_samples: Vec<usize> = occ.iter().map(|o| o.2).collect();
                in_samples.dedup();
                prop_assert_eq!(in_samples.len(), samples.len(), "occurs in every sample");
                prop_assert_eq!(e.count as usize, occ.len());
            }
            // Completeness: every literal context that all samples agree on is answered.
            let idx = Index::new(&pack, Some(t.clone()));
            for n in 1..=4 {
                let occ = occurrences(&prompt, &samples, n);
                for (w, next, _) in &occ {
                    let same: Vec<_> = occ.iter().filter(|o| &o.0 == w).collect();
                    let mut sids: Vec<usize> = same.iter().map(|o| o.2).collect();
                    sids.dedup();
                    if same.iter().all(|o| o.1 == *next) && sids.len() == samples.len() {
                        let hit = idx.lookup(w);
                        prop_assert_eq!(hit.map(|h| h.token), Some(*next), "deterministic context {:?} lost", w);
                    }
                }
            }
        }
    }
}
