//! `bench --compile`: the compile's generation throughput beside llama.cpp's own batched generation
//! (`llama-batched-bench`) at the same parallel sequences, prompt length, answer budget and threads, in one run.
//!
//! llama-batched-bench runs before and after the compile, and the compile is set against their mean: on this
//! machine its speed drifted by a third between runs minutes apart. The compile is timed whole (prompt processing, sampling, the held-out answers, building the pack), and
//! its generated tokens are set against llama-batched-bench's two rates: generation alone (`speed_tg`, the
//! strict comparison) and generation over its whole run with the shared prompt (`pl·tg / t`).

use super::BenchError;
use crate::compile::{compile, templated, CompileOptions, CompileReport};
use crate::llama::{Model, ModelOptions};
use crate::workload::{self, Prompt};
use indicatif::ProgressBar;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What to compare.
#[derive(Clone, Debug)]
pub struct CompileBench {
    pub model: PathBuf,
    pub workload: String,
    /// Prompts compiled (the workload's training split, the first this many; the compile holds out a quarter).
    pub prompts: usize,
    pub options: CompileOptions,
}

/// llama-batched-bench's row for one batch size.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct BatchedRow {
    pub pp: u32,
    pub tg: u32,
    pub pl: u32,
    pub t_pp: f64,
    pub t_tg: f64,
    pub speed_tg: f64,
    pub t: f64,
}

impl BatchedRow {
    /// Generated tokens per second of the whole run, the shared prompt's processing included.
    pub fn whole_rate(&self) -> f64 {
        f64::from(self.pl) * f64::from(self.tg) / self.t
    }
}

/// One side-by-side run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CompileBenchResult {
    pub model: String,
    pub workload: String,
    pub prompts: usize,
    /// Parallel sequences of the compile (samples + greedy), the batch size given to llama-batched-bench.
    pub n_seq: usize,
    pub threads: i32,
    pub mean_prompt_tokens: usize,
    pub compile_tokens: usize,
    pub compile_seconds: f64,
    pub compile_rate: f64,
    /// llama-batched-bench's run before the compile and the one after: a machine's speed drifts over minutes.
    pub batched_runs: [BatchedRow; 2],
    /// Their mean (times averaged), what the compile is set against.
    pub batched: BatchedRow,
}

impl CompileBenchResult {
    /// The compile's rate against llama-batched-bench's generation alone.
    pub fn ratio_tg(&self) -> f64 {
        self.compile_rate / self.batched.speed_tg
    }

    /// … against llama-batched-bench's generated tokens over its whole run (prompt processing included).
    pub fn ratio_whole(&self) -> f64 {
        self.compile_rate / self.batched.whole_rate()
    }

    pub fn markdown(&self) -> String {
        let b = &self.batched;
        format!(
            "| | tokens generated | seconds | tok/s |\n|---|---:|---:|---:|\n\
             | `kolm-rsd compile` ({} prompts of {}, {} sequences) | {} | {:.1} | {:.1} |\n\
             | llama-batched-bench, generation alone (pp {} shared, tg {}, pl {}) | {} | {:.1} | {:.1} |\n\
             | llama-batched-bench, whole run | {} | {:.1} | {:.1} |\n\n\
             llama-batched-bench ran before and after the compile ({:.1} and {:.1} tok/s generating); the rows are their mean.\n\n\
             compile / batched generation: **{:.2}** (whole run: {:.2}); {}, {} threads\n",
            self.prompts,
            self.workload,
            self.n_seq,
            self.compile_tokens,
            self.compile_seconds,
            self.compile_rate,
            b.pp,
            b.tg,
            b.pl,
            b.pl * b.tg,
            b.t_tg,
            b.speed_tg,
            b.pl * b.tg,
            b.t,
            b.whole_rate(),
            self.batched_runs[0].speed_tg,
            self.batched_runs[1].speed_tg,
            self.ratio_tg(),
            self.ratio_whole(),
            self.model,
            self.threads,
        )
    }
}

/// `llama-batched-bench` of the pinned build.
pub fn batched_bench_path() -> PathBuf {
    PathBuf::from(env!("KOLM_LLAMA_BIN_DIR")).join("llama-batched-bench")
}

/// Compiles, then runs llama-batched-bench with the compile's shape; `bar` shows the compile's progress.
pub fn run(b: &CompileBench, bar: &ProgressBar) -> Result<CompileBenchResult, BenchError> {
    let model = Model::load(&b.model, &ModelOptions::default())?;
    let (train, _) = workload::split(&workload::load(&b.workload)?);
    let prompts: Vec<Prompt> = train.into_iter().take(b.prompts.max(2)).collect();
    let mut lens = Vec::with_capacity(prompts.len());
    for p in &prompts {
        lens.push(model.tokenize(&templated(&model, &p.text), true, true)?.len());
    }
    let mean_prompt = lens.iter().sum::<usize>() / lens.len().max(1);
    let name = b.model.file_stem().unwrap_or_default().to_string_lossy().into_owned();
    let s = &b.options.sampling;
    let threads = match b.options.threads {
        0 => super::default_threads().map_or(4, |n| n as i32),
        n => n,
    };
    let before = batched_bench(&b.model, mean_prompt, s.max_tokens, s.n_seq(), threads)?;
    let report: CompileReport = compile(&model, &name, &prompts, &b.options, bar)?;
    drop(model);
    let after = batched_bench(&b.model, mean_prompt, s.max_tokens, s.n_seq(), threads)?;
    let batched = BatchedRow {
        t_pp: (before.t_pp + after.t_pp) / 2.0,
        t_tg: (before.t_tg + after.t_tg) / 2.0,
        t: (before.t + after.t) / 2.0,
        speed_tg: f64::from(before.pl) * f64::from(before.tg) * 2.0 / (before.t_tg + after.t_tg),
        ..before.clone()
    };
    let tokens = report.sampled_tokens + report.heldout_tokens;
    Ok(CompileBenchResult {
        model: name,
        workload: b.workload.clone(),
        prompts: prompts.len(),
        n_seq: s.n_seq(),
        threads,
        mean_prompt_tokens: mean_prompt,
        compile_tokens: tokens,
        compile_seconds: report.seconds,
        compile_rate: report.generation_rate(),
        batched_runs: [before, after],
        batched,
    })
}

/// One llama-batched-bench run: a prompt of `pp` tokens shared by `pl` sequences (the compile prefills once
/// and copies it), `tg` tokens generated by each, one unified KV cache as the compile uses.
fn batched_bench(model: &Path, pp: usize, tg: usize, pl: usize, threads: i32) -> Result<BatchedRow, BenchError> {
    let exe = batched_bench_path();
    let ctx = pl * (pp + tg) + 64;
    let out = Command::new(&exe)
        .arg("-m")
        .arg(model)
        .args(["-c", &ctx.to_string(), "-b", "512", "-ub", "512", "-npp", &pp.to_string(), "-ntg", &tg.to_string()])
        .args(["-npl", &pl.to_string(), "-pps", "-kvu", "-t", &threads.to_string(), "--output-format", "jsonl"])
        .output()
        .map_err(|e| BenchError::Tool(format!("{}: {e}", exe.display())))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    text.lines()
        .filter(|l| l.starts_with("{\"n_kv_max\""))
        .find_map(|l| serde_json::from_str::<BatchedRow>(l).ok())
        .ok_or_else(|| BenchError::Tool(format!("{} printed no result row (exit {}): {}", exe.display(), out.status, text.lines().rev().take(5).collect::<Vec<_>>().join(" | "))))
}
