//! `kolm-rsd compile`, `inspect` and `merge`: making, reading and growing recipe packs.

use super::CliResult;
use indicatif::ProgressBar;
use kolm_rsd::compile::{compile, CompileOptions, CompileReport};
use kolm_rsd::llama::{Model, ModelOptions};
use kolm_rsd::pack::{write_atomic, EntryKind, Pack};
use kolm_rsd::{engine, workload};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct CompileArgs {
    /// Target model (GGUF).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompts: a JSONL file with a `prompt` field, or json-extraction / humaneval / mt-bench[:CATEGORY].
    #[arg(long)]
    pub prompts: String,
    /// Samples per prompt (K), decoded together in one batch.
    #[arg(long, default_value_t = 4)]
    pub samples: usize,
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    #[arg(long, default_value_t = 192)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Do not add the greedy continuation as an extra sequence of each batch.
    #[arg(long)]
    pub no_greedy: bool,
    /// Miss logs from serving to fold in (repeatable).
    #[arg(long)]
    pub misses: Vec<PathBuf>,
    /// Output pack; default: beside the model (M.gguf → M.recipes.json), merged with what is there.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Threads of the teacher (default: one per core; on a machine busy with other work, fewer is faster).
    #[arg(long, default_value_t = 0)]
    pub threads: i32,
}

/// A progress bar over prompts × samples with an ETA.
pub fn bar(what: &str) -> ProgressBar {
    super::progress::bar(0, "{msg} [{bar:30}] {pos}/{len} runs, {elapsed} elapsed, eta {eta}", what)
}

/// Compiles, prints the report, writes the pack atomically (merged with an existing one: packs only grow).
pub fn run_compile(a: &CompileArgs) -> Result<CompileReport, Box<dyn std::error::Error>> {
    let model = Model::load(&a.model, &ModelOptions::default())?;
    let prompts = workload::load(&a.prompts)?;
    let name = a.model.file_stem().unwrap_or_default().to_string_lossy().into_owned();
    let mut opts = CompileOptions::default();
    opts.sampling.samples = a.samples;
    opts.sampling.temperature = a.temperature;
    opts.sampling.max_tokens = a.max_tokens;
    opts.sampling.seed = a.seed;
    opts.sampling.with_greedy = !a.no_greedy;
    opts.misses = a.misses.clone();
    opts.threads = a.threads;
    let b = bar("compile");
    let report = compile(&model, &name, &prompts, &opts, &b)?;
    b.finish_and_clear();
    let out = a.output.clone().unwrap_or_else(|| engine::pack_beside(&a.model));
    let pack = if out.is_file() {
        let old = engine::load_pack(&out, &model)?;
        println!("merging into the existing pack {} ({} entries)", out.display(), old.entries().len());
        old.merge(&report.pack)?
    } else {
        report.pack.clone()
    };
    let bytes = pack.to_vec();
    write_atomic(&out, &bytes).map_err(|e| format!("{}: {e}", out.display()))?;
    println!(
        "compiled {} prompts x {} samples{} ({} tokens sampled, {} greedy held-out tokens: {:.1} tok/s; {} misses folded{}) in {:.0} s",
        report.train_prompts,
        a.samples,
        if a.no_greedy { "" } else { " + greedy" },
        report.sampled_tokens,
        report.heldout_tokens,
        report.generation_rate(),
        report.misses_folded,
        match report.miss_lines_skipped {
            0 => String::new(),
            n => format!(", {n} miss-log lines skipped"),
        },
        report.seconds
    );
    println!(
        "pack: {} entries, {} bytes ({:.2} KB per 100 entries) -> {}",
        pack.entries().len(),
        bytes.len(),
        bytes.len() as f64 / 1024.0 / (pack.entries().len().max(1) as f64 / 100.0),
        out.display()
    );
    match report.pack.meta.coverage {
        Some(c) => println!(
            "coverage on {} held-out prompts: {:.1}% of generated tokens by the pack alone; with copies of the request, replayed at this CPU's prior verify cost, {:.2}x plain decoding; recommended drafter: {:?}",
            report.heldout_prompts,
            100.0 * c,
            report.heldout_speedup.unwrap_or(1.0),
            report.pack.meta.recommended
        ),
        None => println!("no held-out prompts: coverage not measured"),
    }
    Ok(report)
}

/// Reads a pack without a model (no tokenizer check) for inspect/merge. A live index (what a server learned
/// from its traffic) reads as the pack of its contexts that pass the compile's own rule.
fn read(path: &Path) -> Result<Pack, Box<dyn std::error::Error>> {
    let bytes = std::fs::read(path).map_err(|e| format!("recipe pack {}: {e}", path.display()))?;
    if kolm_rsd::live::file::is_live(&bytes) {
        let saved = kolm_rsd::live::file::Saved::from_slice(&bytes, &path.display().to_string(), None, None)?;
        return Ok(saved.to_pack(&kolm_rsd::align::BuildConfig::default())?);
    }
    Ok(Pack::from_slice(&bytes, &path.display().to_string(), None, None)?)
}

pub fn run_inspect(pack: &Path, model: Option<&Path>, top: usize) -> CliResult {
    let p = read(pack)?;
    let size = std::fs::metadata(pack)?.len();
    let m = &p.meta;
    println!("pack:        {}", pack.display());
    println!("model:       {} ({})", m.model.name, m.model.arch);
    println!("tokenizer:   {}", m.tokenizer);
    println!("compiled:    k={} temperature={} max_tokens={} prompts={} held out={}", m.compile.k, m.compile.temperature, m.compile.max_tokens, m.compile.prompts, m.compile.heldout);
    println!("coverage:    {}", m.coverage.map_or("not measured".into(), |c| format!("{:.1}%", 100.0 * c)));
    println!("recommended: {:?}", m.recommended);
    println!("size:        {size} bytes, content hash {}", p.content_hash());
    let (lit, shp): (Vec<&kolm_rsd::pack::Entry>, Vec<_>) = p.entries().iter().partition(|e| e.kind == EntryKind::Literal);
    println!("entries:     {} ({} literal, {} shape)", p.entries().len(), lit.len(), shp.len());
    let mut by_n = std::collections::BTreeMap::new();
    for e in p.entries() {
        *by_n.entry((e.kind == EntryKind::Shape, e.n)).or_insert(0usize) += 1;
    }
    let lens: Vec<String> = by_n.iter().map(|((s, n), c)| format!("{}{n}:{c}", if *s { "s" } else { "l" })).collect();
    println!("by length:   {}", lens.join(" "));
    let model = model.map(|m| Model::load(m, &ModelOptions { n_gpu_layers: 0 })).transpose()?;
    let mut top_entries: Vec<_> = p.entries().to_vec();
    top_entries.sort_by_key(|e| std::cmp::Reverse(e.count));
    println!("most used recipes (context length, kind -> next token, count):");
    for e in top_entries.iter().take(top) {
        let tok = match &model {
            Some(m) => format!("{:?}", String::from_utf8_lossy(&m.token_piece(e.token as i32))),
            None => format!("token {}", e.token),
        };
        println!("  {:>2} {:7} -> {:24} x{}", e.n, format!("{:?}", e.kind).to_lowercase(), tok, e.count);
    }
    Ok(())
}

pub fn run_merge(inputs: &[PathBuf], output: &Path) -> CliResult {
    let mut it = inputs.iter();
    let first = it.next().ok_or("merge needs at least one pack")?;
    let mut acc = read(first)?;
    for p in it {
        acc = acc.merge(&read(p)?)?;
    }
    let bytes = acc.to_vec();
    write_atomic(output, &bytes).map_err(|e| format!("{}: {e}", output.display()))?;
    println!("merged {} packs: {} entries, {} bytes -> {}", inputs.len(), acc.entries().len(), bytes.len(), output.display());
    Ok(())
}
