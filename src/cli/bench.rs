//! `kolm-rsd bench`: kolm-rsd against llama.cpp's own drafters, side by side in one run, with the ceiling.

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kolm_rsd::bench::{self, config::ConfigKind, prep, report, BenchOptions, Observer};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// SmolLM2-135M on JSON extraction, a few prompts, one slot: a few minutes (the CI smoke test).
    #[arg(long)]
    quick: bool,
    /// Models: registry names (`kolm-rsd model list`) or GGUF paths, comma-separated.
    #[arg(long, value_delimiter = ',')]
    models: Option<Vec<String>>,
    /// Workloads: json-extraction, humaneval, mt-bench, mt-bench:CATEGORY, or .jsonl files, comma-separated.
    #[arg(long, value_delimiter = ',')]
    workloads: Option<Vec<String>>,
    /// Configurations (default: all): none, ngram-simple, ngram-map-k, ngram-mod, ngram-cache, draft-simple,
    /// kolm-pack, kolm-pack+ctx, kolm-shortlist, kolm-pack+shortlist, kolm-shortlist-fixed, kolm-fullhead-fixed.
    #[arg(long)]
    configs: Option<String>,
    /// Tokens generated per request (greedy).
    #[arg(long)]
    n_predict: Option<u32>,
    /// Held-out prompts served per workload (at most).
    #[arg(long)]
    prompts: Option<usize>,
    /// Training prompts the recipe pack and the lookup caches are made from (0 = all).
    #[arg(long)]
    train_prompts: Option<usize>,
    /// Server slot counts (-np), comma-separated; with N > 1, N clients send at once.
    #[arg(long, value_delimiter = ',')]
    slots: Option<Vec<u32>>,
    /// Threads of every server and of the β measurement (default: all cores).
    #[arg(long)]
    threads: Option<u32>,
    /// Passes over the prompts.
    #[arg(long)]
    repeat: Option<usize>,
    /// Teacher samples per training prompt (pack and lookup caches).
    #[arg(long)]
    samples: Option<usize>,
    /// Shortlist file for the draft model (default: DRAFT.shortlist.json beside the draft GGUF).
    #[arg(long)]
    shortlist: Option<PathBuf>,
    /// Draft model for a target given as a path.
    #[arg(long)]
    draft_model: Option<PathBuf>,
    /// Use only cached models; fetch nothing.
    #[arg(long)]
    no_fetch: bool,
    /// Where bench.json, bench.md, the charts, logs and the training material go.
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// Exit 0 even when an output differs from no speculation.
    #[arg(long)]
    allow_mismatch: bool,
}

struct Bar(ProgressBar);

impl Observer for Bar {
    fn add_total(&self, n: u64) {
        self.0.inc_length(n);
    }
    fn step(&self, msg: &str) {
        self.0.set_message(msg.to_string());
        self.0.inc(1);
    }
    fn note(&self, msg: &str) {
        // A hidden bar (stderr not a terminal) drops println: notes, mismatches among them, go to stderr then.
        if self.0.is_hidden() {
            eprintln!("{msg}");
        } else {
            self.0.println(msg);
        }
    }
}

/// Runs the benchmark; the exit code is 2 when an output differs from no speculation (unless allowed).
pub fn run(a: BenchArgs) -> Result<i32, Box<dyn std::error::Error>> {
    let mut o = if a.quick { BenchOptions::quick() } else { BenchOptions::full() };
    o.command = std::env::args().collect::<Vec<_>>().join(" ");
    if let Some(v) = a.models {
        o.models = v;
    }
    if let Some(v) = a.workloads {
        o.workloads = v;
    }
    if let Some(v) = a.configs {
        o.configs = ConfigKind::parse_list(&v)?;
    }
    if let Some(n) = a.n_predict {
        o.n_predict = n;
        o.sampling.max_tokens = n as usize;
    }
    if let Some(n) = a.prompts {
        o.prompts = n;
    }
    if let Some(n) = a.train_prompts {
        o.train_prompts = n;
    }
    if let Some(v) = a.slots {
        if v.contains(&0) {
            return Err("--slots: a slot count must be at least 1".into());
        }
        o.slots = v;
    }
    if a.threads.is_some() {
        o.threads = a.threads;
    }
    if let Some(n) = a.repeat {
        o.repeat = n.max(1);
    }
    if let Some(n) = a.samples {
        o.sampling.samples = n.max(1);
    }
    o.shortlist = a.shortlist;
    o.draft_model = a.draft_model;
    o.fetch = !a.no_fetch;
    o.out = a.out;

    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} ETA {eta} {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.enable_steady_tick(std::time::Duration::from_millis(250));
    let obs = Bar(pb);
    kolm_rsd::llama::quiet_logs();
    let builder = prep::compile_pack_builder();
    let result = bench::run(&o, Some(&*builder), &obs);
    obs.0.finish_and_clear();
    let r = result?;

    let (json, md) = report::write_files(&r, &o.out)?;
    print!("{}", report::markdown(&r));
    println!();
    println!("raw numbers: {}", json.display());
    println!("table:       {}", md.display());
    match report::write_charts(&r, &o.out) {
        Ok(files) => {
            for f in files {
                println!("chart:       {}", f.display());
            }
        }
        Err(e) => eprintln!("kolm-rsd bench: no chart: {e}"),
    }
    let failures = r.failures();
    if failures > 0 {
        eprintln!();
        eprintln!("!!!! {failures} OUTPUT(S) DIFFER FROM DECODING WITHOUT SPECULATION (see the list above) !!!!");
        if !a.allow_mismatch {
            return Ok(2);
        }
    }
    Ok(0)
}
