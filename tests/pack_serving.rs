//! A recipe pack compiled by the project's own compiler, served by llama-server through the plugin:
//! output byte-identical to plain decoding, drafts from the pack accepted; found beside the model.

mod common;

use kolm_rsd::compile::templated;
use kolm_rsd::llama::{Model, ModelOptions};
use kolm_rsd::server::{Server, ServerOptions};
use kolm_rsd::workload;

#[test]
fn pack_beside_the_model_drafts_and_output_is_identical() {
    let dir = common::scratch("pack-serving");
    // the model and its pack side by side, as a user ships them
    let model_path = dir.join("smol.gguf");
    std::os::unix::fs::symlink(common::smol(), &model_path).unwrap();
    std::fs::copy(common::small_pack(), dir.join("smol.recipes.json")).unwrap();

    let model = Model::load(&model_path, &ModelOptions { n_gpu_layers: 0 }).unwrap();
    let all = workload::load("json-extraction").unwrap();
    let prompts: Vec<String> = all.iter().skip(3).step_by(12).map(|p| templated(&model, &p.text)).collect();
    drop(model);

    let plain = Server::start(&ServerOptions::new(&model_path, &dir.join("plain.log"))).unwrap();
    let reference: Vec<String> = prompts.iter().map(|p| plain.complete(p, 96).unwrap().content).collect();
    plain.stop();

    let mut opts = ServerOptions::new(&model_path, &dir.join("plugin.log"));
    opts.plugin = Some(common::plugin());
    opts.plugin_arg = Some(format!("adaptive=0,live=mem,misslog={}", dir.join("misses.jsonl").display()));
    let spec = Server::start(&opts).unwrap();
    let mut accepted = 0;
    for (p, r) in prompts.iter().zip(&reference) {
        let c = spec.complete(p, 96).unwrap();
        assert_eq!(&c.content, r, "output with the pack differs from plain decoding");
        accepted += c.draft_n_accepted;
    }
    spec.stop();
    let log = std::fs::read_to_string(dir.join("plugin.log")).unwrap();
    assert!(log.contains("smol.recipes.json"), "the pack beside the model was not loaded:\n{log}");
    let summary = common::plugin_summary(&dir.join("plugin.log"));
    let pack_hits = common::summary_number(&summary, "pack hits ");
    assert!(accepted > 0 && pack_hits > 0, "accepted {accepted}, pack hits {pack_hits}: {summary}");
    eprintln!("{summary}");
}
