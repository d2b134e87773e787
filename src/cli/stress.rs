//! `kolm-rsd stress load|soak|crash`: the reliability harness (docs/reliability.md) on the default model and
//! the pack beside it, against llama-server on 127.0.0.1.

use super::CliResult;
use kolm_rsd::compile::templated;
use kolm_rsd::llama::{Model, ModelOptions};
use kolm_rsd::stress::crash::{self, CrashOptions};
use kolm_rsd::stress::soak::{self, SoakOptions};
use kolm_rsd::stress::{self, Prompts, StressOptions, Target};
use kolm_rsd::{engine, fetch, server, workload};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum StressCmd {
    /// Concurrent clients, streamed and abandoned requests, hostile bodies; outputs against each prompt alone.
    Load {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 16)]
        clients: usize,
        #[arg(long, default_value_t = 12)]
        per_client: usize,
        /// No request is sent after this many seconds.
        #[arg(long, default_value_t = 1800)]
        deadline: u64,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// Resident memory with and without the plugin over many requests.
    Soak {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 1000)]
        requests: usize,
        #[arg(long, default_value_t = 4)]
        clients: usize,
        /// Read RSS after every this many requests.
        #[arg(long, default_value_t = 50)]
        every: usize,
    },
    /// kill -9 while the miss log is written, then read it back, again and again.
    Crash {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 50)]
        kills: usize,
        /// The miss log's cap for the run, small enough to be reached.
        #[arg(long, default_value_t = 64 << 10)]
        cap: u64,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
}

#[derive(clap::Args)]
pub struct Common {
    /// A model name from `kolm-rsd model list`, or a GGUF path.
    #[arg(long, default_value = fetch::DEFAULT_MODEL)]
    model: String,
    /// The recipe pack (default: the one beside the model; `kolm-rsd demo` makes it).
    #[arg(long)]
    pack: Option<PathBuf>,
    #[arg(long, default_value_t = 4)]
    np: u32,
    /// KV cells per slot.
    #[arg(long, default_value_t = 1024)]
    slot_ctx: u32,
    #[arg(long, default_value_t = 64)]
    n_predict: i64,
    /// Where the servers' logs go.
    #[arg(long, default_value = "target/stress")]
    out: PathBuf,
    /// Also write the report here (Markdown).
    #[arg(long)]
    report: Option<PathBuf>,
}

/// The server under test from the common flags, and the prompts.
fn setup(c: &Common) -> Result<(Target, Prompts), Box<dyn std::error::Error>> {
    let model = if Path::new(&c.model).is_file() { PathBuf::from(&c.model) } else { fetch::model(&c.model, true)? };
    let pack = c.pack.clone().unwrap_or_else(|| engine::pack_beside(&model));
    if !pack.is_file() {
        return Err(format!("no recipe pack at {} (run `kolm-rsd demo` or `kolm-rsd compile`, or pass --pack)", pack.display()).into());
    }
    let plugin = server::plugin_path().ok_or("libkolm_rsd.so is not next to this executable (cargo build --release)")?;
    let m = Model::load(&model, &ModelOptions { n_gpu_layers: 0 })?;
    let prompts = build_prompts(&m, c.slot_ctx)?;
    let target = Target { model, pack, plugin, n_parallel: c.np, slot_ctx: c.slot_ctx, n_predict: c.n_predict, out: c.out.clone() };
    Ok((target, prompts))
}

/// Every JSON-extraction prompt, templated, and one made longer than a slot from several of them.
pub fn build_prompts(m: &Model, slot_ctx: u32) -> Result<Prompts, Box<dyn std::error::Error>> {
    let all = workload::load("json-extraction")?;
    let normal: Vec<String> = all.iter().map(|p| templated(m, &p.text)).collect();
    let mut text = String::new();
    for p in all.iter().cycle() {
        if m.tokenize(&text, true, false)?.len() > slot_ctx as usize + 64 {
            break;
        }
        text.push_str(&p.text);
        text.push('\n');
    }
    Ok(Prompts { normal, long: templated(m, &text) })
}

fn emit(report: &str, to: Option<&Path>) -> CliResult {
    println!("{report}");
    if let Some(p) = to {
        std::fs::write(p, report).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

pub fn run(cmd: StressCmd) -> Result<i32, Box<dyn std::error::Error>> {
    let timeout = Duration::from_secs(600);
    match cmd {
        StressCmd::Load { common, clients, per_client, deadline, seed } => {
            let (target, prompts) = setup(&common)?;
            let o = StressOptions { target, clients, per_client, seed, deadline: Duration::from_secs(deadline), request_timeout: timeout };
            eprintln!("stress load: {} requests from {clients} clients, plain llama-server then with the plugin", clients * per_client);
            let rep = stress::run(&prompts, &o)?;
            emit(&stress::markdown(&rep, &o), common.report.as_deref())?;
            Ok(i32::from(!rep.problems.is_empty()))
        }
        StressCmd::Soak { common, requests, clients, every } => {
            let (target, prompts) = setup(&common)?;
            let o = SoakOptions { target, requests, clients, every, request_timeout: timeout };
            eprintln!("stress soak: {requests} requests to plain llama-server, then with the plugin");
            let curves = soak::run(&prompts.normal, &o)?;
            emit(&soak::markdown(&curves), common.report.as_deref())?;
            Ok(i32::from(curves.iter().any(|c| c.failed > 0)))
        }
        StressCmd::Crash { common, kills, cap, seed } => {
            let (target, prompts) = setup(&common)?;
            let o = CrashOptions {
                target,
                kills,
                clients: 4,
                cap_bytes: cap,
                kill_after: (Duration::ZERO, Duration::from_millis(2000)),
                seed,
            };
            eprintln!("stress crash: {kills} kills of llama-server with the plugin while clients keep it logging misses");
            let r = crash::run(&prompts.normal, &o)?;
            emit(&r.text(cap), common.report.as_deref())?;
            Ok(i32::from(!r.problems.is_empty()))
        }
    }
}
