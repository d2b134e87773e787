//! `kolm-rsd replay`: the drafter on recorded greedy continuations of held-out prompts, with this CPU's
//! verify cost and with free verification as the clock (src/replay.rs says why).

use super::CliResult;
use kolm_rsd::draft::control::{BetaModel, DEFAULT_BETA_PRIOR, INVARIANT_DRAFT};
use kolm_rsd::draft::{Drafter, DrafterConfig};
use kolm_rsd::llama::{self, Model, ModelOptions};
use kolm_rsd::replay::{oracle, replay, NgramSimple, Recorded, Replayed};
use kolm_rsd::teacher::Teacher;
use kolm_rsd::{compile, engine, vocab, workload};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Target model (GGUF): its greedy continuations are recorded.
    #[arg(long)]
    model: PathBuf,
    /// Recipe pack (default: the one beside the model, if any); `off` for none.
    #[arg(long)]
    pack: Option<String>,
    /// Workload whose held-out prompts are replayed: json-extraction, humaneval, mt-bench[:CATEGORY], or a .jsonl file.
    #[arg(long, default_value = "json-extraction")]
    workload: String,
    #[arg(long, default_value_t = 6)]
    prompts: usize,
    /// Tokens generated per prompt (greedy).
    #[arg(long, default_value_t = 96)]
    tokens: usize,
    /// Do not draft from the request's own text.
    #[arg(long)]
    no_context: bool,
}

pub fn run(a: &ReplayArgs) -> CliResult {
    let model = Model::load(&a.model, &ModelOptions::default())?;
    let pack = match a.pack.as_deref() {
        Some("off") => None,
        Some(p) => Some(PathBuf::from(p)),
        None => Some(engine::pack_beside(&a.model)).filter(|p| p.exists()),
    };
    let (_, held) = workload::split(&workload::load(&a.workload)?);
    let prompts: Vec<Vec<i32>> = held
        .iter()
        .take(a.prompts)
        .map(|p| model.tokenize(&compile::templated(&model, &p.text), true, true))
        .collect::<Result<_, _>>()?;
    let longest = prompts.iter().map(Vec::len).max().ok_or_else(|| format!("{}: no held-out prompts", a.workload))?;
    eprintln!("recording {} greedy continuations of {} tokens …", prompts.len(), a.tokens);
    let mut teacher = Teacher::new(&model, 1, longest + a.tokens + 8, 0)?;
    let runs: Vec<Recorded> = prompts
        .into_iter()
        .map(|prompt| Ok(Recorded { output: teacher.greedy(&prompt, a.tokens)?, prompt }))
        .collect::<Result<_, llama::LlamaError>>()?;

    let cpu = BetaModel::new(DEFAULT_BETA_PRIOR);
    let clocks: [(&str, &dyn Fn(usize) -> f64); 2] = [
        ("this CPU (β prior: Qwen2.5-Coder-1.5B, 2 cores)", &|m| cpu.beta(m)),
        ("free verification (β = 1, a GPU's limit)", &|_| 1.0),
    ];
    println!(
        "replay: {} on {} ({} held-out prompts × {} tokens), pack {}, request's own text {}",
        a.model.display(),
        a.workload,
        runs.len(),
        a.tokens,
        pack.as_ref().map_or("none".into(), |p| p.display().to_string()),
        if a.no_context { "off" } else { "on" }
    );
    println!("\n| clock | speedup | tokens per pass | drafted | accepted | α | per prompt |\n|---|---:|---:|---:|---:|---:|---|");
    let vocab = vocab::token_texts(&model);
    let index = pack.as_deref().map(|p| engine::load_index(p, &vocab)).transpose()?;
    let cfg = DrafterConfig { use_context: !a.no_context, ..DrafterConfig::default() };
    let texts = vocab::drafter_texts(&model, &vocab);
    let row = |name: &str, (each, t): (Vec<Replayed>, Replayed)| {
        let per: Vec<String> = each.iter().map(|r| format!("{:.2}", r.speedup())).collect();
        println!(
            "| {name} | {:.3} | {:.2} | {} | {} | {:.2} | {} |",
            t.speedup(),
            t.tokens_per_pass(),
            t.drafted,
            t.accepted,
            t.acceptance(),
            per.join(" ")
        );
    };
    for (name, beta) in clocks {
        let mut d = Drafter::new(index.clone(), cfg.clone()).with_texts(texts.clone());
        row(name, replay(&mut d, &runs, INVARIANT_DRAFT, beta, 1e6));
        // Upstream verifies its whole m-gram, split into calls as patch 0004 does; the clock prices that.
        let mut baseline = NgramSimple::DEFAULT;
        let n_max = baseline.m;
        row("… llama.cpp's ngram-simple (its long verifies priced as strict calls of 16; served, 48 tokens cost β ≈ 21 on the fast kernels)", replay(&mut baseline, &runs, n_max, beta, 1e6));
        let o = oracle(index.as_ref(), Some(&texts), &cfg, &runs, INVARIANT_DRAFT, beta);
        println!(
            "| … oracle: every run of right proposals drafted, nothing else | {:.3} | {:.2} | {} | {} | 1.00 | |",
            o.speedup(),
            o.tokens_per_pass(),
            o.drafted,
            o.accepted
        );
    }
    Ok(())
}
