//! The reliability harness, small: plain llama-server and the one with the plugin at `-np 4` under 4
//! concurrent clients sending every kind of request (streamed, abandoned, hostile bodies, prompts longer
//! than a slot, `n_predict` 0, 1 and far past the context); every completed output of the plugin's server
//! equals the prompt served alone, and both servers stay healthy.

mod common;

use kolm_rsd::load::{Kind, Outcome};
use kolm_rsd::llama::{Model, ModelOptions};
use kolm_rsd::stress::{self, Prompts, StressOptions, Target};
use std::time::Duration;

#[test]
fn small_load_with_faults_keeps_every_promise() {
    let _one = common::one_at_a_time();
    let dir = common::scratch("stress-small");
    let model = common::smol();
    let m = Model::load(&model, &ModelOptions { n_gpu_layers: 0 }).unwrap();
    let slot_ctx = 512;
    let all = kolm_rsd::workload::load("json-extraction").unwrap();
    let normal: Vec<String> = all.iter().take(12).map(|p| kolm_rsd::compile::templated(&m, &p.text)).collect();
    let long_text = all.iter().map(|p| p.text.as_str()).collect::<Vec<_>>().join("\n");
    assert!(m.tokenize(&long_text, true, false).unwrap().len() > slot_ctx as usize);
    let prompts = Prompts { normal, long: kolm_rsd::compile::templated(&m, &long_text) };
    drop(m);
    let target = Target { model, pack: common::small_pack(), plugin: common::plugin(), n_parallel: 4, slot_ctx, n_predict: 24, out: dir };
    let o = StressOptions { target, clients: 4, per_client: 12, seed: 3, deadline: Duration::from_secs(600), request_timeout: Duration::from_secs(300) };
    let rep = stress::run(&prompts, &o).unwrap();
    let table = stress::markdown(&rep, &o);
    eprintln!("{table}");
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    let plugin = &rep.sides[1];
    assert_eq!(plugin.records.len(), 48);
    for r in &plugin.records {
        let req = &rep.requests[r.request];
        match (&req.kind, &r.outcome) {
            (Kind::Raw { .. }, Outcome::Refused { status, .. }) => assert!(*status >= 400, "{}: {status}", req.label),
            // llama-server (plain as well) takes an empty message list as a valid chat and answers it.
            (Kind::Raw { .. }, Outcome::Done { .. }) if req.label == "empty messages" => {}
            (Kind::Raw { .. }, o) => panic!("{}: a malformed body got {o:?}", req.label),
            (_, Outcome::Failed(why)) => panic!("{}: {why}", req.label),
            _ => {}
        }
    }
    let (same, differ) = plugin.identity(&rep.requests, &rep.alone);
    assert!(differ.is_empty() && same >= 30, "{same} identical, {} differ", differ.len());
    assert!(plugin.summary.contains(" drafts, "), "the plugin ran and said so at shutdown: {:?}", plugin.summary);
}
