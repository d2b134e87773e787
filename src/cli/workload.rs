//! `kolm-rsd workload`: a workload's prompts as JSONL, split as every tool splits them, for tools outside
//! this binary (the vLLM benchmark) to serve the same prompts.

use super::CliResult;
use clap::{Args, ValueEnum};
use kolm_rsd::workload;
use std::io::Write;

#[derive(Args)]
pub struct WorkloadArgs {
    /// json-extraction, humaneval, code-edit, mt-bench, mt-bench:CATEGORY, or a .jsonl file.
    name: String,
    /// Which part of the project's split (every 4th prompt held out).
    #[arg(long, value_enum, default_value_t = Part::HeldOut)]
    split: Part,
}

#[derive(Clone, Copy, ValueEnum)]
enum Part {
    Train,
    HeldOut,
    All,
}

pub fn run(a: &WorkloadArgs) -> CliResult {
    let all = workload::load(&a.name)?;
    let (train, held) = workload::split(&all);
    let prompts = match a.split {
        Part::Train => train,
        Part::HeldOut => held,
        Part::All => all,
    };
    let mut out = std::io::stdout().lock();
    for p in prompts {
        let line = serde_json::json!({"id": p.id, "category": p.category, "prompt": p.text});
        writeln!(out, "{line}")?;
    }
    Ok(())
}
