//! `kolm-rsd bench`: kolm-rsd against llama.cpp's own drafters, side by side in one run, with the ceiling.

use clap::Args;
use indicatif::ProgressBar;
use kolm_rsd::bench::load::{self, LoadConfig, LoadOptions, Prompts};
use kolm_rsd::bench::{self, config::ConfigKind, prep, report, BenchOptions, Observer};
use kolm_rsd::compile::templated;
use kolm_rsd::llama::{Model, ModelOptions};
use kolm_rsd::{engine, fetch, server, workload};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// SmolLM2-135M on JSON extraction, a few prompts, one slot: a few minutes (the CI smoke test).
    #[arg(long)]
    quick: bool,
    /// Models: registry names (`kolm-rsd model list`) or GGUF paths, comma-separated.
    #[arg(long, value_delimiter = ',')]
    models: Option<Vec<String>>,
    /// Workloads: json-extraction, humaneval, code-edit, mt-bench, mt-bench:CATEGORY, or .jsonl files, comma-separated.
    #[arg(long, value_delimiter = ',')]
    workloads: Option<Vec<String>>,
    /// Configurations (default: all): none, ngram-simple, ngram-map-k, ngram-mod, ngram-cache, draft-simple,
    /// kolm-pack, kolm-pack+ctx, kolm-shortlist, kolm-pack+shortlist, kolm-shortlist-fixed, kolm-fullhead-fixed,
    /// kolm-live (no pack: copies and the live index), kolm-live-kept (the same, restarted after --warm), kolm-predict (each code-edit prompt's code as its `prediction`, copies of the answer's own text, no pack, no live index), kolm-pack+predict (the same with the pack and the live index: kolm-pack+ctx with the code in the prediction).
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
    /// Passes over the prompts (with --load: rounds over the configurations at each slot count, every other one
    /// in reverse order; the rows pool them).
    #[arg(long)]
    repeat: Option<usize>,
    /// Training prompts every server answers, unmeasured, before the held-out ones: traffic it has already seen
    /// (kolm-live learns from it; kolm-live-kept is restarted after it, from its saved live index).
    #[arg(long)]
    warm: Option<usize>,
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
    /// Load mode: many concurrent clients against one server per configuration and slot count (default
    /// slots 1,4,8; configurations plain, plain-strict, kolm-idle, kolm; workloads json-extraction, mt-bench, each
    /// workload's prompts in turn), on the first model and the pack beside it.
    #[arg(long)]
    load: bool,
    /// Load mode: concurrent clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Load mode: requests per client.
    #[arg(long, default_value_t = 4)]
    per_client: usize,
    /// Load mode: the recipe pack (default: the one beside the model; `kolm-rsd demo` makes it; `off`: none, the
    /// plugin drafting from copies and its live index alone).
    #[arg(long)]
    pack: Option<PathBuf>,
    /// Load mode: plugin settings (`key=value,…`, as in --spec-plugin-arg) that configuration `kolm-b` adds to
    /// `kolm`'s, for an A/B of the drafter's settings on the same stream.
    #[arg(long, requires = "load")]
    ab_arg: Option<String>,
    /// Load mode: llama-server flags that configuration `kolm-b` adds to `kolm`'s (space-separated, e.g. `-kvu`).
    #[arg(long, requires = "load", allow_hyphen_values = true)]
    ab_server_args: Option<String>,
    /// Load mode: llama-server flags every server gets, the one answering alone included (space-separated, e.g.
    /// `-kvu`: the slots share one KV cache, as when llama-server is started without -np).
    #[arg(long, requires = "load", allow_hyphen_values = true)]
    server_args: Option<String>,
    /// Load mode: every plugin configuration writes a line per server step (wall time, drafting time, the tokens
    /// each slot verified) to steps-np{slots}-{config}-r{round}.tsv under --out.
    #[arg(long, requires = "load")]
    step_log: bool,
    /// Load mode: requests go with `cache_prompt: true` (llama-server's default: a slot reuses what it cached of an
    /// earlier prompt; `--ab-server-args --cache-exact` then measures the exact reuse); the answers served alone go
    /// without it.
    #[arg(long, requires = "load")]
    cache_prompt: bool,
    /// Compile mode: the pack compile's generation throughput beside llama-batched-bench's at the same parallel
    /// sequences, prompt length and answer budget (first model, first workload, --train-prompts prompts,
    /// default 8; --samples, --n-predict as the answer budget, --threads).
    #[arg(long, conflicts_with = "load")]
    compile: bool,
    /// Pool mode: several `--load` runs of one stream read as one (their output directories or load.json files,
    /// comma-separated): each configuration's rounds paired with plain's in the same run, the pairings of all runs
    /// together, printed as a table. Nothing is served.
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with_all = ["load", "compile"])]
    pool: Option<Vec<PathBuf>>,
}

struct Bar(ProgressBar);

impl Observer for Bar {
    fn add_total(&self, n: u64) {
        self.0.inc_length(n);
    }
    fn step(&self, msg: &str) {
        // The message first: each draws the line, and in a pipe a line is printed when its stage (the message)
        // changes or 30 s after the last, so counting first printed the last step's message beside this count.
        self.0.set_message(msg.to_string());
        self.0.inc(1);
        // In a pipe the bar is hidden: a line per step shows the progress there.
        if self.0.is_hidden() {
            eprintln!("[{}/{}] {msg}", self.0.position(), self.0.length().unwrap_or(0));
        }
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
    if let Some(runs) = &a.pool {
        return run_pool(runs);
    }
    if a.load {
        return run_load(a);
    }
    if a.compile {
        return run_compile_bench(a);
    }
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
    if let Some(n) = a.warm {
        o.warm = n;
    }
    if let Some(n) = a.samples {
        o.sampling.samples = n.max(1);
    }
    o.shortlist = a.shortlist;
    o.draft_model = a.draft_model;
    o.fetch = !a.no_fetch;
    o.out = a.out;

    let obs = Bar(progress("requests"));
    let builder = prep::compile_pack_builder(|| super::pack::bar("  compile"));
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

/// `--compile`: the compile against llama-batched-bench, side by side in one run.
fn run_compile_bench(a: BenchArgs) -> Result<i32, Box<dyn std::error::Error>> {
    let name = a.models.as_ref().and_then(|m| m.first().cloned()).unwrap_or_else(|| fetch::DEFAULT_MODEL.into());
    let model = if Path::new(&name).is_file() { PathBuf::from(&name) } else { fetch::model(&name, !a.no_fetch)? };
    let mut options = kolm_rsd::compile::CompileOptions::default();
    if let Some(n) = a.samples {
        options.sampling.samples = n.max(1);
    }
    if let Some(n) = a.n_predict {
        options.sampling.max_tokens = n as usize;
    }
    options.threads = a.threads.map_or(0, |t| t as i32);
    let b = bench::compile::CompileBench {
        model,
        workload: a.workloads.as_ref().and_then(|w| w.first().cloned()).unwrap_or_else(|| "json-extraction".into()),
        prompts: a.train_prompts.filter(|&n| n > 0).unwrap_or(8),
        options,
    };
    let bar = super::pack::bar("compile");
    let r = bench::compile::run(&b, &bar);
    bar.finish_and_clear();
    let r = r?;
    let md = r.markdown();
    print!("{md}");
    std::fs::create_dir_all(&a.out)?;
    std::fs::write(a.out.join("compile.md"), &md)?;
    std::fs::write(a.out.join("compile.json"), serde_json::to_string_pretty(&r)?)?;
    println!("\nraw numbers: {}", a.out.join("compile.json").display());
    Ok(0)
}

/// `--load`: the held-out prompts of the workloads (a structured and a prose one by default) from many clients at once.
fn run_load(a: BenchArgs) -> Result<i32, Box<dyn std::error::Error>> {
    // A setting the plugin refuses would otherwise surface only when `kolm-b`'s first server fails to start, after
    // the answers alone and the configurations before it were served.
    if let Some(arg) = &a.ab_arg {
        engine::EngineConfig::from_plugin_arg(arg, "").map_err(|e| format!("--ab-arg {arg}: {e}"))?;
    }
    let name = a.models.as_ref().and_then(|m| m.first().cloned()).unwrap_or_else(|| fetch::DEFAULT_MODEL.into());
    let model = if Path::new(&name).is_file() { PathBuf::from(&name) } else { fetch::model(&name, !a.no_fetch)? };
    let configs = LoadConfig::parse_list(a.configs.as_deref().unwrap_or("plain-strict,kolm-idle,kolm"))?;
    let pack = match a.pack.clone() {
        Some(p) if p.as_os_str() == "off" => None,
        p => Some(p.unwrap_or_else(|| engine::pack_beside(&model))),
    };
    if let Some(p) = pack.as_ref().filter(|p| configs.iter().any(|c| c.uses_pack()) && !p.is_file()) {
        return Err(format!("no recipe pack at {} (run `kolm-rsd demo` or `kolm-rsd compile`, or pass --pack, or --pack off)", p.display()).into());
    }
    let plugin = server::plugin_path().ok_or("libkolm_rsd.so is not next to this executable (cargo build --release)")?;
    let workloads = a.workloads.clone().unwrap_or_else(|| vec!["json-extraction".into(), "mt-bench".into()]);
    let m = Model::load(&model, &ModelOptions { n_gpu_layers: 0 })?;
    let workloads = workloads
        .iter()
        .map(|w| -> Result<Prompts, Box<dyn std::error::Error>> {
            let (_, held) = workload::split(&workload::load(w)?);
            if held.is_empty() {
                return Err(format!("--workloads {w}: no held-out prompts to serve").into());
            }
            Ok(Prompts { name: w.clone(), prompts: held.iter().map(|p| templated(&m, &p.text)).collect() })
        })
        .collect::<Result<Vec<_>, _>>()?;
    drop(m);
    let o = LoadOptions {
        model,
        pack,
        ab_arg: a.ab_arg.clone().unwrap_or_default(),
        ab_server_args: flags(&a.ab_server_args),
        server_args: flags(&a.server_args),
        plugin,
        configs,
        slots: a.slots.clone().unwrap_or_else(|| vec![1, 4, 8]),
        clients: a.clients.max(1),
        per_client: a.per_client.max(1),
        n_predict: i64::from(a.n_predict.unwrap_or(64)),
        slot_ctx: 1024,
        threads: a.threads.or_else(bench::default_threads),
        out: a.out.clone(),
        request_timeout: Duration::from_secs(1800),
        repeat: a.repeat.unwrap_or(1).max(1),
        step_log: a.step_log,
        cache_prompt: a.cache_prompt,
    };
    if o.slots.contains(&0) {
        return Err("--slots: a slot count must be at least 1".into());
    }
    let obs = Bar(progress("server runs"));
    let rows = load::run(&workloads, &o, &obs);
    obs.0.finish_and_clear();
    let (rows, bases) = rows?;
    let md = load::repeats_line(&load::plan(&workloads, &o)).unwrap_or_default() + &load::markdown(&rows, &bases, &o);
    print!("{md}");
    std::fs::write(o.out.join("load.md"), &md)?;
    std::fs::write(o.out.join("load.json"), serde_json::to_string_pretty(&serde_json::json!({ "rows": rows, "ceiling_basis": bases }))?)?;
    println!("\nraw numbers: {}", o.out.join("load.json").display());
    let differ: usize = rows.iter().map(|r| r.compared - r.identical).sum();
    let exact = |name: &str| LoadConfig::named(name).is_some_and(|c| load::promised(&o, c));
    let strict = rows.iter().filter(|r| exact(r.config)).map(|r| r.compared - r.identical).sum::<usize>();
    if strict > 0 && !a.allow_mismatch {
        eprintln!("!!!! {strict} OUTPUT(S) WITH STRICT BATCHING OR THE PLUGIN DIFFER FROM THE PROMPT SERVED ALONE !!!!");
        return Ok(2);
    }
    if differ > 0 {
        eprintln!("note: {differ} answer(s) of plain llama-server or of llama.cpp's own ngram-simple differ from the prompt served alone (plain batches are not batch-invariant; ngram-simple verifies up to 64 tokens at once)");
    }
    Ok(0)
}

/// `--pool`: the runs' pairings read together.
fn run_pool(paths: &[PathBuf]) -> Result<i32, Box<dyn std::error::Error>> {
    let runs = paths.iter().map(|p| bench::pool::read(p)).collect::<Result<Vec<_>, _>>()?;
    print!("{}", bench::pool::markdown(&bench::pool::pool(&runs), &runs));
    Ok(0)
}

/// Space-separated llama-server flags.
fn flags(arg: &Option<String>) -> Vec<String> {
    arg.as_deref().unwrap_or("").split_whitespace().map(String::from).collect()
}

/// The bench's bar, counting `unit` (the load mode counts whole server runs, not requests).
fn progress(unit: &str) -> ProgressBar {
    super::progress::bar(0, &format!("{{msg}} [{{bar:30}}] {{pos}}/{{len}} {unit}, {{elapsed_precise}} elapsed, eta {{eta}}"), "bench")
}
