//! `kolm-rsd bench`: kolm-rsd against llama.cpp's own drafters, side by side in one run, with the ceiling.
//!
//! For each model and workload: the workload's held-out prompts are served (the training prompts are what the
//! recipe pack and ngram-cache's lookup caches are made from — the same material for both), by one fresh
//! llama-server per configuration, round by round ([`run()`]); every output is checked byte for byte against no
//! speculation; β is measured with the bindings and the ceiling S = E(α,γ)/(β(γ+1)+γ·d) set beside each
//! measured speedup ([`ceiling`]); the result is a markdown table, JSON with every raw number and PNG charts
//! ([`report`]). [`load`] is the other mode: many clients at once, at several slot counts; [`compile`] sets the
//! pack compile's throughput beside llama-batched-bench's.

pub mod calls;
pub mod ceiling;
pub mod compile;
pub mod config;
pub mod load;
pub mod load_ceiling;
pub mod lookup_cache;
pub mod paired;
pub mod pool;
pub mod prep;
pub mod report;
pub mod run;
pub mod steps;
pub mod timing;

use crate::draft::model::ModelDraftConfig;
use crate::engine::DEFAULT_HEAD_DEVICE;
use crate::fetch::{self, FetchError};
use crate::shortlist::Shortlist;
use crate::llama::{LlamaError, Model, ModelOptions};
use crate::workload::{self, WorkloadError};
use config::{Assets, ConfigKind, Planned};
use prep::{PackBuilder, PackJob, SamplingSpec};
use report::{BenchReport, ConfigResult, DraftCost, Group, Machine, Mismatch};
use run::{BenchPrompt, RunError, RunSpec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where a benchmark reports its progress (the CLI's progress bar; tests stay quiet).
pub trait Observer: Sync {
    /// More steps are coming.
    fn add_total(&self, _n: u64) {}
    /// One step is done (a request, a teacher prompt).
    fn step(&self, _msg: &str) {}
    /// A line for the person watching.
    fn note(&self, _msg: &str) {}
}

/// Says nothing.
pub struct Quiet;
impl Observer for Quiet {}

/// Notes to stderr, no bar.
pub struct Stderr;
impl Observer for Stderr {
    fn note(&self, msg: &str) {
        eprintln!("{msg}");
    }
}

/// What to run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchOptions {
    /// Registry names (`kolm-rsd model list`) or paths to GGUF files.
    pub models: Vec<String>,
    /// json-extraction, humaneval, mt-bench, mt-bench:CATEGORY, or a .jsonl file.
    pub workloads: Vec<String>,
    /// Configurations; `none` is always run (first) as the reference.
    pub configs: Vec<ConfigKind>,
    pub n_predict: u32,
    /// Held-out prompts served per workload (at most).
    pub prompts: usize,
    /// Training prompts the pack and the lookup caches are made from (at most; 0 = all).
    pub train_prompts: usize,
    /// Server slot counts (`-np`); with N > 1, N clients send at once.
    pub slots: Vec<u32>,
    /// Threads of every server and of the β measurement.
    pub threads: Option<u32>,
    /// Passes over the prompts.
    pub repeat: usize,
    /// Training prompts every server answers before the measured ones, unmeasured: traffic it has already
    /// seen (what a live index or ngram-mod's pool learns from).
    pub warm: usize,
    pub out: PathBuf,
    pub sampling: SamplingSpec,
    /// Shortlist file for the draft model (default: `DRAFT.shortlist.json` beside the draft GGUF).
    pub shortlist: Option<PathBuf>,
    /// Draft model for path-given targets (registry targets use [`config::draft_for`]).
    pub draft_model: Option<PathBuf>,
    /// Fetch missing registry models (targets and drafts); otherwise only cached ones are used.
    pub fetch: bool,
    /// Repetitions of each β measurement.
    pub beta_reps: usize,
    /// The command line, for the report.
    pub command: String,
}

impl BenchOptions {
    /// The full run of issue 5 (about 45 minutes here; a run with 6 prompts × 128 tokens took over 2 hours).
    pub fn full() -> Self {
        BenchOptions {
            models: vec!["smollm2-135m".into(), "qwen2.5-coder-1.5b".into(), "gemma3-270m".into()],
            workloads: vec!["json-extraction".into(), "humaneval".into(), "code-edit".into(), "mt-bench:writing".into()],
            configs: ConfigKind::ALL.to_vec(),
            n_predict: 96,
            prompts: 3,
            train_prompts: 8,
            slots: vec![1, 4],
            threads: default_threads(),
            repeat: 1,
            warm: 0,
            out: PathBuf::from("bench-out"),
            sampling: SamplingSpec { max_tokens: 96, ..SamplingSpec::default() },
            shortlist: None,
            draft_model: None,
            fetch: true,
            beta_reps: 7,
            command: "kolm-rsd bench".into(),
        }
    }

    /// `--quick`: SmolLM2 on JSON extraction, a few prompts, one slot: a few minutes (the CI smoke test).
    pub fn quick() -> Self {
        BenchOptions {
            models: vec!["smollm2-135m".into()],
            workloads: vec!["json-extraction".into()],
            n_predict: 64,
            prompts: 4,
            train_prompts: 16,
            slots: vec![1],
            sampling: SamplingSpec { max_tokens: 64, ..SamplingSpec::default() },
            beta_reps: 5,
            command: "kolm-rsd bench --quick".into(),
            ..BenchOptions::full()
        }
    }
}

/// All cores.
pub fn default_threads() -> Option<u32> {
    std::thread::available_parallelism().ok().map(|n| n.get() as u32)
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error(transparent)]
    Llama(#[from] LlamaError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}")]
    Options(String),
    #[error(transparent)]
    Compile(#[from] crate::compile::CompileError),
    /// A llama.cpp tool run beside ours failed (its path and what it said).
    #[error("{0}")]
    Tool(String),
}

fn io_err(p: &Path) -> impl Fn(std::io::Error) -> BenchError + '_ {
    move |e| BenchError::Io(p.display().to_string(), e)
}

/// A model given by registry name or path: (display name, registry name if any, path).
fn resolve_model(spec: &str, fetch_ok: bool) -> Result<(String, Option<String>, PathBuf), BenchError> {
    let p = Path::new(spec);
    if spec.ends_with(".gguf") || p.is_file() {
        if !p.is_file() {
            return Err(BenchError::Options(format!("{spec}: no such model file")));
        }
        let name = p.file_stem().map_or(spec.to_string(), |s| s.to_string_lossy().into_owned());
        return Ok((name, None, p.to_path_buf()));
    }
    let path = cached_or_fetch(spec, fetch_ok)?;
    Ok((spec.to_string(), Some(spec.to_string()), path))
}

fn cached_or_fetch(name: &str, fetch_ok: bool) -> Result<PathBuf, BenchError> {
    let spec = fetch::model_spec(name)?;
    let cached = fetch::cache_dir().join("models").join(spec.file);
    if !fetch_ok && !cached.is_file() {
        return Err(BenchError::Options(format!("{name} is not cached at {} (fetching is off)", cached.display())));
    }
    Ok(fetch::model(name, fetch_ok)?)
}

fn safe(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect()
}

/// Runs the benchmark. `packs` makes recipe packs (e.g. [`prep::compile_pack_builder`]); without it the pack
/// configurations are skipped. Mismatches are in the report (the caller decides what they mean for its exit).
pub fn run(opts: &BenchOptions, packs: Option<&PackBuilder>, obs: &dyn Observer) -> Result<BenchReport, BenchError> {
    let t_start = Instant::now();
    if opts.models.is_empty() || opts.workloads.is_empty() || opts.slots.is_empty() {
        return Err(BenchError::Options("nothing to run: give at least one model, workload and slot count".into()));
    }
    let prep_dir = opts.out.join("prep");
    let log_dir = opts.out.join("logs");
    for d in [&opts.out, &prep_dir, &log_dir] {
        std::fs::create_dir_all(d).map_err(io_err(d))?;
    }
    let mut kinds: Vec<ConfigKind> = vec![ConfigKind::None];
    kinds.extend(opts.configs.iter().copied().filter(|&k| k != ConfigKind::None));
    let plugin = crate::server::plugin_path()
        .ok_or_else(|| "no libkolm_rsd.so next to the executable (built by `cargo build --release`)".to_string());

    let mut report = BenchReport {
        tool: "kolm-rsd bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        llama_cpp: llama_cpp_version(),
        machine: Machine::this(opts.threads),
        unix_time: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        elapsed_s: 0.0,
        command: opts.command.clone(),
        options: serde_json::to_value(opts).unwrap_or_default(),
        groups: vec![],
        betas: vec![],
        draft_costs: vec![],
        mismatches: vec![],
        notes: vec![],
    };
    let threads = opts.threads.map_or(0, |t| t as i32);

    for model_spec in &opts.models {
        let (name, registry, path) = match resolve_model(model_spec, opts.fetch) {
            Ok(x) => x,
            Err(e) => {
                let msg = format!("model {model_spec} skipped: {e}");
                obs.note(&msg);
                report.notes.push(msg);
                continue;
            }
        };
        obs.note(&format!("== {name} ({})", path.display()));
        let model = Model::load(&path, &ModelOptions { n_gpu_layers: 0 })?;
        let wants_draft = kinds.iter().any(|k| k.uses_draft_model());
        let draft: Result<PathBuf, String> = if !wants_draft {
            Err("no draft-model configuration asked for".into())
        } else if let Some(d) = &opts.draft_model {
            Ok(d.clone())
        } else {
            match registry.as_deref().and_then(config::draft_for) {
                None => Err(format!("no smaller draft model with the same tokenizer for {name}")),
                Some(d) => cached_or_fetch(d, opts.fetch).map_err(|e| format!("draft model {d}: {e}")),
            }
        };
        let shortlist: Result<PathBuf, String> = match (&opts.shortlist, &draft) {
            (Some(s), _) if s.is_file() => Ok(s.clone()),
            (Some(s), _) => Err(format!("no shortlist at {}", s.display())),
            (None, Ok(d)) => {
                let s = crate::engine::shortlist_beside(d);
                if s.is_file() {
                    Ok(s)
                } else {
                    Err(format!("no shortlist at {} (build one with `kolm-rsd shortlist build`)", s.display()))
                }
            }
            (None, Err(e)) => Err(e.clone()),
        };
        let first_group = report.groups.len();

        for wl in &opts.workloads {
            let all = workload::load(wl)?;
            let (mut train, mut held) = workload::split(&all);
            held.truncate(opts.prompts);
            if opts.train_prompts > 0 {
                train.truncate(opts.train_prompts);
            }
            if held.is_empty() {
                let msg = format!("{name} · {wl}: no held-out prompts, skipped");
                obs.note(&msg);
                report.notes.push(msg);
                continue;
            }
            let template = |u: &str| crate::compile::templated(&model, u);
            let bench_prompt = |p: &workload::Prompt| BenchPrompt {
                id: p.id.clone(),
                text: template(&p.text),
                prediction: workload::code_edit::code_block(&p.text).map(str::to_string),
            };
            let prompts: Vec<BenchPrompt> = held.iter().map(bench_prompt).collect();
            let traffic: Vec<BenchPrompt> = train.iter().take(opts.warm).map(bench_prompt).collect();
            let longest = prompts.iter().map(|p| model.tokenize(&p.text, true, true).map(|t| t.len())).collect::<Result<Vec<_>, _>>()?;
            let longest = longest.into_iter().max().unwrap_or(0);
            let n_ctx = ((longest + opts.n_predict as usize + 64).next_multiple_of(256)).max(512) as u32;
            obs.note(&format!("-- {name} · {wl}: {} prompts served, {} training prompts", prompts.len(), train.len()));

            let stem = format!("{}-{}", safe(&name), safe(wl));
            let mut assets = Assets {
                plugin: plugin.clone(),
                draft_model: draft.clone(),
                pack: Err("no pack configuration asked for".into()),
                lookup_caches: Err("not asked for".into()),
                shortlist: shortlist.clone(),
                live_file: log_dir.join(&stem).join("kolm-live-kept.live.json"),
                predictions: if prompts.iter().all(|p| p.prediction.is_some()) {
                    Ok(())
                } else {
                    Err(format!("{wl}: not every prompt has a code block to send as its predicted output"))
                },
            };
            let (mut train_prompts, mut train_tokens, mut pack_note) = (0, 0, None);
            let mut built_runs: Option<Vec<prep::TrainRun>> = None;
            if kinds.iter().any(|k| k.needs_pack()) {
                assets.pack = match packs {
                    None => Err("no pack builder given".into()),
                    Some(build) => {
                        let out = prep_dir.join(format!("{stem}.recipes.json"));
                        obs.note(&format!("  recipe pack from {} training prompts (compiled, or reused when made before from them)", train.len()));
                        let job = PackJob { model: &model, model_path: &path, name: &name, prompts: &train, sampling: &opts.sampling, out: &out };
                        match build(&job) {
                            Ok(b) => {
                                obs.note(&format!("  {}", b.summary));
                                pack_note = Some(b.summary);
                                built_runs = b.runs;
                                Ok(out)
                            }
                            Err(e) => Err(format!("no recipe pack: {e}")),
                        }
                    }
                };
            }
            if kinds.contains(&ConfigKind::NgramCache) {
                let ts = match built_runs {
                    Some(runs) => prep::TrainSet { key: "from the pack builder".into(), sampling: opts.sampling, runs },
                    None => prep::teacher_runs(&model, &path, &train, &opts.sampling, &prep_dir.join(format!("{stem}.train.json")), obs)?,
                };
                train_prompts = ts.runs.len();
                train_tokens = ts.n_generated();
                assets.lookup_caches = prep::write_lookup_caches(&ts, &prep_dir, &stem);
            }
            let planned = config::plan(&kinds, &assets);
            for p in &planned {
                if let Planned::Skip { kind, reason } = p {
                    obs.note(&format!("  skipped {}: {reason}", kind.name()));
                }
            }
            let runnable: Vec<config::Config> = planned.iter().filter_map(|p| if let Planned::Run(c) = p { Some(c.clone()) } else { None }).collect();

            // The outputs of plain decoding with the first slot count (normally -np 1).
            let mut first_plain: Option<BTreeMap<String, String>> = None;
            for &slots in &opts.slots {
                let spec = RunSpec {
                    model: &path,
                    prompts: &prompts,
                    warmup: &template("Say hello."),
                    traffic: &traffic,
                    n_predict: opts.n_predict,
                    slots,
                    threads: opts.threads,
                    n_ctx,
                    repeat: opts.repeat,
                    log_dir: &log_dir.join(&stem),
                    settle: crate::server::SETTLE,
                };
                std::fs::create_dir_all(spec.log_dir).map_err(io_err(spec.log_dir))?;
                obs.add_total((runnable.len() * prompts.len() * opts.repeat.max(1)) as u64);
                let runs = run::run_interleaved(&spec, &runnable, obs)?;
                let none = &runs[0];
                let refr = report::reference(&none.requests, &none.rounds);
                // The reference is no speculation with the same slot count. With several slots plain decoding
                // itself may differ from one slot (llama.cpp's batched decoding is not batch-invariant on every
                // machine); then differences at that slot count cannot be put on speculation and do not count.
                let exp: BTreeMap<String, String> = none.requests.iter().map(|r| (r.prompt_id.clone(), r.content.clone())).collect();
                let plain_vs_first = first_plain.as_ref().map(|f| {
                    let same = exp.iter().filter(|(id, c)| f.get(*id) == Some(*c)).count();
                    (same, exp.len())
                });
                let counts = plain_vs_first.is_none_or(|(same, n)| same == n);
                if let Some((same, n)) = plain_vs_first.filter(|(same, n)| same != n) {
                    let msg = format!(
                        "{name} · {wl} · -np {slots}: plain decoding itself gave the same output as with -np {} on only {same}/{n} prompts \
                         (batched decoding is not batch-invariant here), so differences at -np {slots} are listed but not counted",
                        opts.slots[0]
                    );
                    obs.note(&format!("  !! {msg}"));
                    report.notes.push(msg);
                }
                first_plain.get_or_insert_with(|| exp.clone());
                let mut results: Vec<ConfigResult> = Vec::new();
                let mut runs = runs.into_iter();
                for p in &planned {
                    match p {
                        Planned::Skip { kind, reason } => results.push(ConfigResult::skipped(*kind, reason)),
                        Planned::Run(_) => {
                            let r = runs.next().expect("one run per runnable configuration");
                            for q in &r.requests {
                                if let Some(want) = exp.get(&q.prompt_id) {
                                    if *want != q.content {
                                        let (at, e, g) = report::first_difference(want, &q.content);
                                        let m = Mismatch {
                                            model: name.clone(),
                                            workload: wl.clone(),
                                            slots,
                                            config: r.config.name.clone(),
                                            prompt_id: q.prompt_id.clone(),
                                            at,
                                            expected: e,
                                            got: g,
                                            counts,
                                        };
                                        obs.note(&format!(
                                            "  {} OUTPUT MISMATCH: {} -np {} prompt {}: differs from no speculation at byte {at}:\n       expected {:?}\n       got      {:?}",
                                            if counts { "!!!!" } else { "(not counted)" },
                                            m.config,
                                            slots,
                                            m.prompt_id,
                                            m.expected,
                                            m.got
                                        ));
                                        report.mismatches.push(m);
                                    }
                                }
                            }
                            let summary = (!r.requests.is_empty()).then(|| report::summarize(&r.requests, &r.rounds, &refr, &exp));
                            results.push(ConfigResult::from_run(r, summary));
                        }
                    }
                }
                report.groups.push(Group {
                    model: name.clone(),
                    model_path: path.clone(),
                    workload: wl.clone(),
                    slots,
                    prompts: prompts.len(),
                    n_predict: opts.n_predict,
                    train_prompts,
                    train_tokens,
                    pack: pack_note.clone(),
                    plain_vs_first,
                    configs: results,
                });
            }
        }

        // β for the longest mean draft this model's runs used (at least n = 9), with the servers stopped.
        if report.groups.len() == first_group {
            continue;
        }
        let configs_of_model = || report.groups[first_group..].iter().flat_map(|g| g.configs.iter());
        let max_gamma = configs_of_model().filter_map(|c| c.summary.as_ref().and_then(|s| s.gamma)).fold(0.0f64, f64::max);
        let ran_draft = configs_of_model().any(|c| c.kind.uses_draft_model() && c.summary.is_some());
        let max_n = ((max_gamma.ceil() as usize) + 1).clamp(9, 129);
        obs.note(&format!("  measuring β(n), n = 1..{max_n}, threads: {threads}"));
        let betas = ceiling::measure_beta(&model, &name, max_n, threads, 128, opts.beta_reps)?;
        let mut d_of: BTreeMap<ConfigKind, f64> = BTreeMap::new();
        if let (true, Ok(dpath)) = (ran_draft, &draft) {
            let dm = Model::load(dpath, &ModelOptions { n_gpu_layers: 0 })?;
            let dname = dpath.file_stem().map_or("draft".into(), |s| s.to_string_lossy().into_owned());
            let t1 = ceiling::one_token_ms(&dm, &dname, threads, 128, opts.beta_reps)?;
            let d = t1 / betas.t1_ms;
            d_of.insert(ConfigKind::DraftSimple, d);
            let step = |shortlist: Option<PathBuf>| {
                let cfg = ModelDraftConfig {
                    model: dpath.clone(),
                    shortlist,
                    margin: 0.0,
                    request_rows: false,
                    n_seq: 1,
                    n_ctx: 1024,
                    n_threads: threads,
                    // The plugin's default, so the step costs what serving pays.
                    head_device: DEFAULT_HEAD_DEVICE,
                };
                ceiling::model_draft_step_ms(&cfg, 128, opts.beta_reps.max(5) * 3)
            };
            let full = step(None).map_err(|e| obs.note(&format!("  draft step with the full head not measured: {e}"))).ok();
            let subset = match &shortlist {
                Ok(sl) => step(Some(sl.clone())).map_err(|e| obs.note(&format!("  subset draft step not measured: {e}"))).ok(),
                Err(_) => None,
            };
            let rows = shortlist.as_ref().ok().and_then(|sl| Shortlist::load(sl, &dm).ok()).map(|s| s.len());
            if let Some(f) = full {
                d_of.insert(ConfigKind::FullHeadFixed, f / betas.t1_ms);
            }
            for k in [ConfigKind::Shortlist, ConfigKind::PackShortlist, ConfigKind::ShortlistFixed] {
                d_of.insert(k, subset.map_or(d, |s| s / betas.t1_ms));
            }
            report.draft_costs.push(DraftCost {
                target: name.clone(),
                draft: dname,
                t1_draft_ms: t1,
                t1_target_ms: betas.t1_ms,
                d,
                subset_rows: rows,
                step_subset_ms: subset,
                step_full_ms: full,
            });
        }
        for g in report.groups[first_group..].iter_mut().filter(|g| g.slots == 1) {
            for c in &mut g.configs {
                if let Some(s) = c.summary.as_mut() {
                    if let Some(drafts) = s.drafts {
                        let d = d_of.get(&c.kind).copied().unwrap_or(0.0);
                        s.ceiling = ceiling::ceiling(s.drafted, s.accepted, drafts, &betas, d, s.speedup);
                    }
                }
            }
        }
        report.betas.push(betas);
    }
    if report.groups.iter().any(|g| g.slots > 1) {
        report.notes.push("the ceiling is given for -np 1 only: β above is for one sequence.".into());
    }
    report.elapsed_s = t_start.elapsed().as_secs_f64();
    Ok(report)
}

/// `package version` of the pinned llama.cpp, from vendor/llama.cpp.lock.
fn llama_cpp_version() -> String {
    let lock = include_str!("../../vendor/llama.cpp.lock");
    let get = |k: &str| {
        lock.lines().find_map(|l| l.split_once('=').filter(|(a, _)| a.trim() == k).map(|(_, v)| v.trim().to_string())).unwrap_or_default()
    };
    format!("{} {} (ggml {})", get("package"), get("version"), get("ggml"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_and_version() {
        let q = BenchOptions::quick();
        assert_eq!(q.models, ["smollm2-135m"]);
        assert_eq!(q.slots, [1]);
        assert!(q.sampling.max_tokens >= q.n_predict as usize);
        let f = BenchOptions::full();
        assert!(f.slots.contains(&4) && f.configs.len() == ConfigKind::ALL.len());
        assert_eq!(llama_cpp_version(), "llama-cpp-python 0.3.36 (ggml 0.25.3)");
    }
}
