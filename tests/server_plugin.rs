//! llama-server for real on 127.0.0.1, with and without `--spec-plugin libkolm_rsd.so`: greedy outputs
//! must be byte-identical, and the plugin must have drafted and had drafts accepted.

mod common;

use kolm_rsd::llama::{Model, ModelOptions};
use kolm_rsd::server::{Server, ServerOptions};
use kolm_rsd::workload;

/// Held-out JSON-extraction prompts plus one that invites copying, templated as the server will see them.
fn prompts(model: &Model) -> Vec<String> {
    let all = workload::load("json-extraction").unwrap();
    let (_, held) = workload::split(&all);
    let mut users: Vec<String> = held.iter().step_by(5).map(|p| p.text.clone()).collect();
    users.push("Repeat this line three times: {\"id\": 17, \"name\": \"Ann Lee\", \"tags\": [\"x\", \"y\"]}".into());
    users.iter().map(|u| model.chat_prompt(u).unwrap()).collect()
}

#[test]
fn plugin_output_is_byte_identical_and_drafts_are_accepted() {
    let path = common::smol();
    let model = Model::load(&path, &ModelOptions { n_gpu_layers: 0 }).unwrap();
    let prompts = prompts(&model);
    let dir = common::scratch("server-identity");

    let plain = Server::start(&ServerOptions::new(&path, &dir.join("plain.log"))).unwrap();
    let reference: Vec<_> = prompts.iter().map(|p| plain.complete(p, 96).unwrap()).collect();
    drop(plain);

    let mut opts = ServerOptions::new(&path, &dir.join("plugin.log"));
    opts.plugin = Some(common::plugin());
    // adaptive=0: draft at every step (15 tokens, the longest a verify pass carries exactly), so the test
    // exercises verification on every token.
    opts.plugin_arg = Some("adaptive=0,misslog=off".into());
    let spec = Server::start(&opts).unwrap();
    // The host's limit for plugin drafts is --spec-plugin-n-max (default 16), not the draft model's 3.
    let log = std::fs::read_to_string(dir.join("plugin.log")).unwrap();
    assert!(log.contains("n_max = 16"), "{}", spec.log_tail());
    let (mut drafted, mut accepted) = (0, 0);
    for (p, r) in prompts.iter().zip(&reference) {
        let c = spec.complete(p, 96).unwrap();
        assert_eq!(c.content, r.content, "speculative output differs from plain decoding for prompt:\n{p}");
        drafted += c.draft_n;
        accepted += c.draft_n_accepted;
    }
    assert!(drafted > 0, "the plugin proposed no draft\n{}", spec.log_tail());
    assert!(accepted > 0, "no drafted token was accepted ({drafted} drafted)");
    eprintln!("plugin: {drafted} drafted, {accepted} accepted over {} prompts", prompts.len());
}
