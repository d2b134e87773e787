//! The material the trained configurations are made from, the same for each: a workload's training prompts
//! (never the served, held-out ones) and the teacher's sampled continuations of them. From it come the recipe
//! pack (through a [`PackBuilder`], by default [`compile_pack_builder`]: `kolm_rsd::compile` in process) and
//! llama.cpp's lookup caches for `--spec-type ngram-cache` (static 2-grams for `-lcs`, 1–4-grams for `-lcd`).
//!
//! `compile` holds every 4th of the prompts it is given back for its coverage measurement and samples the
//! rest; [`teacher_runs`] repeats exactly that (same split, same sampling settings, seed, context size and
//! order), so the lookup caches learn from the same prompts and, as far as the decoding is deterministic, the
//! same samples as the pack.

use super::lookup_cache::LookupCache;
use super::Observer;
use crate::compile::{compile, templated, CompileOptions};
use crate::llama::{LlamaError, Model, Token};
use crate::pack::{write_atomic, Pack};
use crate::teacher::{Sampling, Teacher};
use crate::workload::{split, Prompt};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// How the teacher samples (the same numbers go to `compile`).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct SamplingSpec {
    pub samples: usize,
    pub temperature: f32,
    pub top_k: usize,
    pub max_tokens: usize,
    pub seed: u64,
}

impl Default for SamplingSpec {
    /// `compile`'s defaults.
    fn default() -> Self {
        let s = CompileOptions::default().sampling;
        SamplingSpec { samples: s.samples, temperature: s.temperature, top_k: s.top_k, max_tokens: s.max_tokens, seed: s.seed }
    }
}

impl SamplingSpec {
    pub fn teacher(&self) -> Sampling {
        Sampling { samples: self.samples, temperature: self.temperature, top_k: self.top_k, max_tokens: self.max_tokens, seed: self.seed, with_greedy: true }
    }
}

/// The teacher's continuations of one training prompt.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TrainRun {
    pub id: String,
    /// The templated prompt's tokens (as the server tokenizes it).
    pub prompt: Vec<Token>,
    pub samples: Vec<Vec<Token>>,
}

/// All of it for one model and workload, with what it was made from (so a cached copy can be checked).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TrainSet {
    pub key: String,
    pub sampling: SamplingSpec,
    pub runs: Vec<TrainRun>,
}

impl TrainSet {
    /// Every token sequence the caches learn from: each prompt followed by each of its samples.
    pub fn sequences(&self) -> Vec<Vec<Token>> {
        self.runs
            .iter()
            .flat_map(|r| r.samples.iter().map(move |s| r.prompt.iter().chain(s).copied().collect()))
            .collect()
    }

    pub fn n_generated(&self) -> usize {
        self.runs.iter().flat_map(|r| &r.samples).map(Vec::len).sum()
    }
}

/// A key over the model file, the prompts and the sampling settings (names the cached teacher runs).
pub fn train_key(model_path: &Path, prompts: &[Prompt], s: &SamplingSpec) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(model_path.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
    h.update(std::fs::metadata(model_path).map(|m| m.len()).unwrap_or(0).to_le_bytes());
    for p in prompts {
        h.update(p.id.as_bytes());
        h.update([0]);
        h.update(p.text.as_bytes());
        h.update([0]);
    }
    h.update(serde_json::to_vec(s).unwrap_or_default());
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The teacher runs `compile` makes from `prompts` (its training 3/4: every 4th prompt is its held-out),
/// made again here the same way; or the runs cached at `cache` when made from the same model, prompts and
/// settings.
pub fn teacher_runs(
    model: &Model,
    model_path: &Path,
    prompts: &[Prompt],
    s: &SamplingSpec,
    cache: &Path,
    obs: &dyn Observer,
) -> Result<TrainSet, LlamaError> {
    let key = train_key(model_path, prompts, s);
    let (train, held) = split(prompts);
    obs.add_total(train.len() as u64);
    if let Ok(bytes) = std::fs::read(cache) {
        if let Ok(t) = serde_json::from_slice::<TrainSet>(&bytes) {
            if t.key == key {
                obs.note(&format!("  teacher runs: reusing {}", cache.display()));
                for r in &t.runs {
                    obs.step(&format!("teacher {} (cached)", r.id));
                }
                return Ok(t);
            }
        }
    }
    let tok = |p: &Prompt| model.tokenize(&templated(model, &p.text), true, true);
    let train_toks = train.iter().map(tok).collect::<Result<Vec<_>, _>>()?;
    let held_toks = held.iter().map(tok).collect::<Result<Vec<_>, _>>()?;
    // the context size compile gives its teacher (a different size could change the arithmetic)
    let longest = train_toks.iter().chain(&held_toks).map(Vec::len).max().unwrap_or(0);
    let sampling = s.teacher();
    let mut teacher = Teacher::new(model, s.samples.max(1), longest + s.max_tokens + 8, 0)?;
    let mut rng = fastrand::Rng::with_seed(s.seed);
    obs.note(&format!("  teacher: {} prompts × {} samples × ≤{} tokens", train.len(), s.samples, s.max_tokens));
    let mut runs = Vec::with_capacity(train.len());
    for (p, t) in train.iter().zip(train_toks) {
        let samples = teacher.sample(&t, &sampling, &mut rng)?;
        runs.push(TrainRun { id: p.id.clone(), prompt: t, samples });
        obs.step(&format!("teacher {}", p.id));
    }
    let set = TrainSet { key, sampling: *s, runs };
    if let Ok(bytes) = serde_json::to_vec(&set) {
        let _ = std::fs::write(cache, bytes);
    }
    Ok(set)
}

/// Writes llama.cpp's static (2-gram) and dynamic (1–4-gram) lookup caches from the training material.
pub fn write_lookup_caches(train: &TrainSet, dir: &Path, stem: &str) -> Result<(PathBuf, PathBuf), String> {
    let seqs = train.sequences();
    let stat = LookupCache::static_from(seqs.iter().map(Vec::as_slice));
    let dynamic = LookupCache::dynamic_from(seqs.iter().map(Vec::as_slice));
    if stat.is_empty() {
        return Err("the training material is empty: no lookup cache".into());
    }
    let ps = dir.join(format!("{stem}.lcs.bin"));
    let pd = dir.join(format!("{stem}.lcd.bin"));
    stat.write(&ps).map_err(|e| e.to_string())?;
    dynamic.write(&pd).map_err(|e| e.to_string())?;
    Ok((ps, pd))
}

/// Everything a pack builder gets.
pub struct PackJob<'a> {
    pub model: &'a Model,
    pub model_path: &'a Path,
    /// Model name recorded in the pack.
    pub name: &'a str,
    /// The training prompts (user text; the builder applies the chat template).
    pub prompts: &'a [Prompt],
    pub sampling: &'a SamplingSpec,
    /// Where the pack goes.
    pub out: &'a Path,
}

/// What a builder made: a line about the pack for the report, and the teacher runs it compiled from when it
/// can hand them over (then the lookup caches are made from exactly those).
pub struct Built {
    pub summary: String,
    pub runs: Option<Vec<TrainRun>>,
}

/// Makes the recipe pack for a job; `Err` says why there is none (the pack configurations are then skipped).
pub type PackBuilder = dyn Fn(&PackJob) -> Result<Built, String> + Send + Sync;

/// The builder over `kolm_rsd::compile` (in process, the job's model, the job's sampling settings). A pack
/// it made before from the same model, prompts, settings and kolm-rsd version (its key is kept beside it,
/// `*.recipes.key`) is reused: compiling the pack from HumanEval's 93 training prompts took 25 minutes here.
/// Delete the key to compile again. `bar` makes the compile's progress bar (it can take many minutes).
pub fn compile_pack_builder(bar: impl Fn() -> indicatif::ProgressBar + Send + Sync + 'static) -> Box<PackBuilder> {
    Box::new(move |job: &PackJob| {
        let opts = CompileOptions { sampling: job.sampling.teacher(), ..CompileOptions::default() };
        let key_path = job.out.with_extension("key");
        let key = format!("{} {opts:?} kolm-rsd {}", train_key(job.model_path, job.prompts, job.sampling), env!("CARGO_PKG_VERSION"));
        if let Some((pack, bytes)) = reusable(job.out, &key_path, &key) {
            return Ok(Built { summary: summary(&pack, bytes, "reused, made before from the same prompts and settings"), runs: None });
        }
        let _ = std::fs::remove_file(&key_path);
        let _ = std::fs::remove_file(job.out);
        let b = bar();
        let report = compile(job.model, job.name, job.prompts, &opts, &b);
        b.finish_and_clear();
        let report = report.map_err(|e| e.to_string())?;
        let bytes = report.pack.to_vec();
        write_atomic(job.out, &bytes).map_err(|e| format!("{}: {e}", job.out.display()))?;
        write_atomic(&key_path, key.as_bytes()).map_err(|e| format!("{}: {e}", key_path.display()))?;
        let made = format!("{} tokens sampled, {:.0} s", report.sampled_tokens, report.seconds);
        Ok(Built { summary: summary(&report.pack, bytes.len(), &made), runs: None })
    })
}

/// The pack at `out` and its size, if the key beside it is `key` and it still reads as a valid pack.
fn reusable(out: &Path, key_path: &Path, key: &str) -> Option<(Pack, usize)> {
    if std::fs::read_to_string(key_path).ok()? != key {
        return None;
    }
    let bytes = std::fs::read(out).ok()?;
    let pack = Pack::from_slice(&bytes, &out.display().to_string(), None, None).ok()?;
    Some((pack, bytes.len()))
}

/// The report's line about a pack: its size, what it was compiled from and its measured coverage.
fn summary(pack: &Pack, bytes: usize, how: &str) -> String {
    let c = &pack.meta.compile;
    format!(
        "pack: {} entries, {} bytes, from {} prompts × {} samples ({how}), coverage on {} held-out training prompts {}",
        pack.entries().len(),
        bytes,
        c.prompts,
        c.k,
        c.heldout,
        pack.meta.coverage.map_or("–".into(), |c| format!("{:.1}%", 100.0 * c)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_are_prompt_then_sample_and_become_lookup_caches() {
        let t = TrainSet {
            key: "k".into(),
            sampling: SamplingSpec::default(),
            runs: vec![TrainRun { id: "a".into(), prompt: vec![1, 2], samples: vec![vec![3], vec![4, 5]] }],
        };
        assert_eq!(t.sequences(), vec![vec![1, 2, 3], vec![1, 2, 4, 5]]);
        assert_eq!(t.n_generated(), 3);
        let dir = std::env::temp_dir().join(format!("kolm-prep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (s, d) = write_lookup_caches(&t, &dir, "m").unwrap();
        let s = LookupCache::read(&s).unwrap();
        assert_eq!(s.get(&[1, 2, -1, -1]).unwrap().len(), 2);
        assert_eq!(LookupCache::read(&d).unwrap().get(&[1, 2, 4, -1]).unwrap().get(&5), Some(&1));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_pack_is_reused_only_under_its_own_key_and_only_while_valid() {
        let dir = std::env::temp_dir().join(format!("kolm-prep-reuse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (out, key) = (dir.join("m.recipes.json"), dir.join("m.recipes.key"));
        let pack = Pack::from_entries(crate::pack::tests::meta(), vec![]).unwrap();
        std::fs::write(&out, pack.to_vec()).unwrap();
        assert!(reusable(&out, &key, "k1").is_none(), "no key beside it");
        std::fs::write(&key, "k1").unwrap();
        assert_eq!(reusable(&out, &key, "k1").map(|(p, _)| p), Some(pack));
        assert!(reusable(&out, &key, "k2").is_none(), "made from other prompts or settings");
        std::fs::write(&out, b"{ not a pack").unwrap();
        assert!(reusable(&out, &key, "k1").is_none(), "a damaged pack is compiled again");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn key_changes_with_prompts_and_settings() {
        let p = |t: &str| vec![Prompt { id: "1".into(), category: String::new(), text: t.into() }];
        let m = Path::new("/nonexistent/m.gguf");
        let s = SamplingSpec::default();
        assert_eq!(train_key(m, &p("a"), &s), train_key(m, &p("a"), &s));
        assert_ne!(train_key(m, &p("a"), &s), train_key(m, &p("b"), &s));
        assert_ne!(train_key(m, &p("a"), &s), train_key(m, &p("a"), &SamplingSpec { samples: 2, ..s }));
    }
}
