//! llama-server for real on 127.0.0.1, with and without `--spec-plugin libkolm_rsd.so`: greedy outputs
//! must be byte-identical, and the plugin must have drafted and had drafts accepted.

mod common;

use kolm_rsd::llama::{Model, ModelOptions};
use kolm_rsd::server::{Server, ServerOptions};
use kolm_rsd::workload;
use serde_json::{json, Value};

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
    let _one = common::one_at_a_time();
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
    opts.plugin_arg = Some("adaptive=0,live=mem,misslog=off".into());
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

/// A generation that runs into the end of the slot's context stops where plain decoding stops: the server
/// used to add a whole accepted draft to the slot before checking each of its tokens against the limit,
/// and so ended up to a draft's length early (patch 0006).
#[test]
fn a_generation_that_fills_the_context_ends_where_plain_decoding_ends() {
    let _one = common::one_at_a_time();
    let path = common::smol();
    let model = Model::load(&path, &ModelOptions { n_gpu_layers: 0 }).unwrap();
    // SmolLM2 answers this contact card with a JSON object whose last key it repeats until the context is full.
    let card = workload::load("json-extraction").unwrap().into_iter().find(|p| p.id == "je-006").unwrap();
    let prompt = model.chat_prompt(&card.text).unwrap();
    drop(model);
    let dir = common::scratch("server-context-limit");
    let serve = |plugin: bool, log: &str| {
        let mut o = ServerOptions::new(&path, &dir.join(log));
        o.n_ctx = 512;
        if plugin {
            o.plugin = Some(common::plugin());
            o.plugin_arg = Some("adaptive=0,live=mem,misslog=off".into());
        }
        let s = Server::start(&o).unwrap();
        s.complete(&prompt, 4096).unwrap()
    };
    let plain = serve(false, "plain.log");
    let spec = serve(true, "plugin.log");
    eprintln!("plain {} tokens, spec {} tokens, {} drafted {} accepted", plain.predicted_n, spec.predicted_n, spec.draft_n, spec.draft_n_accepted);
    assert!(spec.draft_n_accepted > 0, "nothing was drafted: the test would not test the limit");
    assert_eq!(spec.predicted_n, plain.predicted_n, "tokens generated before the context was full");
    assert_eq!(spec.content, plain.content);
}

/// `n_probs` answers with the probabilities plain decoding reports for every token, also for the tokens a
/// verification emits (upstream llama.cpp leaves them at 1 with no candidates: patch 0015), before sampling
/// and after it, greedy and sampled.
#[test]
fn token_probabilities_are_those_of_plain_decoding() {
    let _one = common::one_at_a_time();
    let path = common::smol();
    let model = Model::load(&path, &ModelOptions { n_gpu_layers: 0 }).unwrap();
    let prompts = prompts(&model);
    drop(model);
    let dir = common::scratch("server-token-probs");
    // The last three prompts (the copy prompt among them): four kinds of request each.
    let requests: Vec<Value> = prompts[prompts.len().saturating_sub(3)..]
        .iter()
        .flat_map(|p| {
            [(false, 0.0), (true, 0.0), (false, 0.7), (true, 0.7)].map(|(post, temperature)| {
                json!({"prompt": p, "n_predict": 64, "temperature": temperature, "seed": 42, "n_probs": 5,
                       "post_sampling_probs": post, "cache_prompt": false})
            })
        })
        .collect();
    let serve = |plugin: bool, log: &str| -> Vec<Value> {
        let mut o = ServerOptions::new(&path, &dir.join(log));
        if plugin {
            o.plugin = Some(common::plugin());
            o.plugin_arg = Some("adaptive=0,live=mem,misslog=off".into());
        }
        let s = Server::start(&o).unwrap();
        requests
            .iter()
            .map(|r| match s.post("/completion", r.clone()).unwrap() {
                (200, v) => v,
                (status, v) => panic!("status {status}: {v}\n{}", s.log_tail()),
            })
            .collect()
    };
    let plain = serve(false, "plain.log");
    let spec = serve(true, "plugin.log");
    let mut accepted = 0;
    for ((r, a), b) in requests.iter().zip(&plain).zip(&spec) {
        assert_eq!(a["content"], b["content"], "output differs from plain decoding for {r}");
        let probs = a["completion_probabilities"].as_array().expect("plain decoding reports probabilities");
        assert_eq!(probs.len() as u64, a["tokens_predicted"].as_u64().unwrap(), "a row per token");
        // Before sampling every row lists five candidates, after greedy sampling one (the token, p = 1).
        let list = if r["post_sampling_probs"] == true { "top_probs" } else { "top_logprobs" };
        assert!(probs.iter().all(|t| !t[list].as_array().unwrap().is_empty()), "a row without candidates: {a}");
        assert_eq!(a["completion_probabilities"], b["completion_probabilities"], "probabilities differ for {r}");
        accepted += b["timings"]["draft_n_accepted"].as_u64().unwrap_or(0);
    }
    assert!(accepted > 0, "no draft was accepted: the verification path was not exercised");
    eprintln!("token probabilities equal over {} requests, {accepted} drafted tokens accepted", requests.len());
}

/// Serves A, then B (A, its answer and a new question: a second turn), C (half of A's start), A, D (unrelated), B and
/// C again, with the cache and then each alone, on `model` with the plugin, batches of 160 tokens cut into ubatches of
/// 64 (boundaries at 64, 128, 160, 224, ...) and `extra`: the answers that differ from alone (text or probabilities),
/// the cells each cached request reused, the drafted tokens accepted and the server's log.
fn cached_prompts_against_alone(model: &std::path::Path, extra: &[&str], dir: &std::path::Path, log: &str) -> (usize, Vec<u64>, u64, String) {
    let records = workload::load("json-extraction").unwrap();
    let texts: Vec<&str> = records.iter().map(|r| r.text.as_str()).collect();
    let base = texts[..3].join("\n\n");
    let a = format!("{base}\n\nFirst, the contact card above:");
    let c = format!("{}\n\nSomething else entirely: summarise this.", common::head(&base, base.len() / 2));
    let d = texts[3..5].join("\n\n");
    let body = |p: &str, cache: bool| json!({"prompt": p, "n_predict": 48, "temperature": 0.0, "n_probs": 2, "cache_prompt": cache});
    let mut o = ServerOptions::new(model, &dir.join(log));
    o.plugin = Some(common::plugin());
    o.plugin_arg = Some("adaptive=0,live=mem,misslog=off".into());
    o.extra = ["-b", "160", "-ub", "64", "-fa", "off"].iter().chain(extra).map(|a| a.to_string()).collect();
    let s = Server::start(&o).unwrap();
    let ask = |p: &str, cache: bool| match s.post("/completion", body(p, cache)).unwrap() {
        (200, v) => v,
        (status, v) => panic!("status {status}: {v}\n{}", s.log_tail()),
    };
    let first = ask(&a, true);
    let b = format!("{a}{}\n\nNow the second one:", first["content"].as_str().unwrap());
    let order = [&a, &b, &c, &a, &d, &b, &c];
    let cached: Vec<Value> = std::iter::once(first).chain(order[1..].iter().map(|p| ask(p, true))).collect();
    let (mut differ, mut accepted) = (0, 0);
    for (i, (p, v)) in order.iter().zip(&cached).enumerate() {
        let alone = ask(p, false);
        assert_eq!(alone["timings"]["cache_n"], 0, "a request without the cache reused cells");
        if v["content"] != alone["content"] || v["completion_probabilities"] != alone["completion_probabilities"] {
            let (g, a) = (v["completion_probabilities"].as_array().cloned().unwrap_or_default(), alone["completion_probabilities"].as_array().cloned().unwrap_or_default());
            eprintln!("differs: request {} of 7 (reused {}), first at token {:?}", i + 1, v["timings"]["cache_n"], g.iter().zip(&a).position(|(x, y)| x != y));
            differ += 1;
        }
        accepted += v["timings"]["draft_n_accepted"].as_u64().unwrap_or(0);
    }
    let reused = cached.iter().map(|v| v["timings"]["cache_n"].as_u64().unwrap()).collect();
    let log = std::fs::read_to_string(dir.join(log)).unwrap();
    s.stop();
    (differ, reused, accepted, log)
}

/// With `--cache-exact` and prompt caching on (llama-server's default), a request reuses an earlier prompt's cells only
/// up to a ubatch that starts there when its own prompt is decoded alone, and only cells that were computed so (patch
/// 0019): every answer and its probabilities equal the same request with `cache_prompt: false`, while shared prefixes
/// are still reused. Without the flag the server reuses the longest common prefix, as upstream, and that changes them.
#[test]
fn a_cached_prompt_answers_as_the_prompt_decoded_alone() {
    let _one = common::one_at_a_time();
    let dir = common::scratch("server-prompt-cache");
    let (differ, reused, accepted, log) = cached_prompts_against_alone(&common::smol(), &["--cache-exact", "--cache-reuse", "64"], &dir, "exact.log");
    eprintln!("--cache-exact: cells reused {reused:?}, {accepted} drafted tokens accepted");
    assert_eq!(differ, 0, "with --cache-exact, an answer from a cached prompt differs from its prompt decoded alone");
    assert!(reused.iter().all(|n| n % 160 % 64 == 0), "reuse stopped inside an alone ubatch: {reused:?}");
    assert!(reused[1] >= 640, "the second turn reused less than its first turn's whole ubatches: {reused:?}");
    assert!(reused.iter().filter(|&&n| n > 0).count() >= 4, "shared prefixes were not reused: {reused:?}");
    assert!(accepted > 0, "no draft was accepted: the test served no verification");
    assert!(log.contains("--cache-reuse moves cached cells"), "--cache-reuse was not refused:\n{log}");

    let (differ, reused, _, _) = cached_prompts_against_alone(&common::smol(), &[], &dir, "default.log");
    eprintln!("without --cache-exact: cells reused {reused:?}, {differ} of 7 answers differ from alone");
    assert!(differ > 0, "upstream's reuse changed no answer, so this test would not catch a change of cells");
}

/// Gemma-3's sliding window keeps checkpoints, where `--cache-exact` does not apply (the server says so at start, and
/// names `--swa-full`); with `--swa-full` it keeps every cell, and a cached prompt answers as alone there too, also
/// the second turn served after an unrelated prompt, which the server restores from its RAM prompt cache with the
/// cells that left the window (patch 0020).
#[test]
fn a_sliding_window_model_with_swa_full_answers_from_a_cached_prompt_as_alone() {
    let _one = common::one_at_a_time();
    let dir = common::scratch("server-prompt-cache-swa");
    let gemma = kolm_rsd::fetch::model("gemma3-270m", false).expect("fetch gemma3-270m");
    let (differ, reused, _, log) = cached_prompts_against_alone(&gemma, &["--cache-exact", "--swa-full"], &dir, "swa-full.log");
    eprintln!("Gemma-3, --swa-full --cache-exact: cells reused {reused:?}, {differ} of 7 answers differ from alone");
    assert!(log.contains("--cache-exact: a cached prompt is reused only where"), "--cache-exact did not apply:\n{log}");
    assert_eq!(differ, 0, "with --swa-full --cache-exact, an answer from a cached prompt differs from its prompt decoded alone");
    assert!(reused.iter().all(|n| n % 160 % 64 == 0), "reuse stopped inside an alone ubatch: {reused:?}");
    assert!(reused.iter().filter(|&&n| n > 0).count() >= 4, "shared prefixes were not reused: {reused:?}");
    assert!(reused[5] >= 640, "the second turn, restored from the RAM prompt cache, reused less than its first turn's whole ubatches: {reused:?}");
}

/// With `--swa-full` in a KV cache shared by the slots (`-kvu`), a sequence's cells that left the sliding window stay
/// its own: a later request of its slot reuses a prefix of it, whose window reaches back to them. Upstream (and patch
/// 0017's pages) counted them free, so another slot's prompt took them, and that reuse then read a window with a hole
/// and answered unlike alone (patch 0020). Two ways: B after A, with `--no-cache-idle-slots` (by default the server
/// saves and clears an idle slot when another one starts); and with the defaults, B while A is still generating.
#[test]
fn a_full_size_sliding_window_in_a_shared_cache_keeps_a_slot_s_cells_for_its_next_request() {
    let _one = common::one_at_a_time();
    let dir = common::scratch("server-shared-swa-full");
    let gemma = kolm_rsd::fetch::model("gemma3-270m", false).expect("fetch gemma3-270m");
    // A is long enough that its first two pages of 256 cells leave the window of 512; A2 shares A's first 800
    // tokens or so, so its window reaches into them; B, in the other slot, is long enough to want two pages.
    let a = format!("{}\n\nFirst, the records about Ann Lee:", common::records(0));
    let a2 = format!("{}\n\nSomething else: how many records name Oslo?", common::head(&a, a.len() * 7 / 10));
    let b = common::head(&common::records(2), 1500).to_string();
    let model = Model::load(&gemma, &ModelOptions { n_gpu_layers: 0 }).unwrap();
    let n = |p: &str| model.tokenize(p, true, false).unwrap().len();
    let (n_a, n_a2, n_b) = (n(&a), n(&a2), n(&b));
    drop(model);
    assert!(n_a + 48 > 512 + 512 + 64 && n_a2 > 512 + 256 && n_b > 256, "prompt lengths miss the layout: A {n_a}, A2 {n_a2}, B {n_b}");

    for (case, flags, b_beside_a) in [("B after A", &["--no-cache-idle-slots"][..], false), ("B while A generates", &[][..], true)] {
        let mut o = ServerOptions::new(&gemma, &dir.join(format!("{}.log", case.replace(' ', "-"))));
        o.n_ctx = 4096;
        o.n_parallel = 2;
        o.plugin = Some(common::plugin());
        o.plugin_arg = Some("adaptive=0,live=mem,misslog=off".into());
        o.extra = ["-kvu", "--swa-full", "--cache-exact", "-b", "160", "-ub", "64", "-fa", "off"].iter().chain(flags).map(|a| a.to_string()).collect();
        let s = Server::start(&o).unwrap();
        let ask = |p: &str, slot: i64, cache: bool, n_predict: u32| {
            let body = json!({"prompt": p, "n_predict": n_predict, "ignore_eos": true, "temperature": 0.0, "n_probs": 2,
                              "cache_prompt": cache, "id_slot": slot});
            match s.post("/completion", body).unwrap() {
                (200, v) => v,
                (status, v) => panic!("{case}: status {status}: {v}\n{}", s.log_tail()),
            }
        };
        if b_beside_a {
            std::thread::scope(|t| {
                let a_run = t.spawn(|| ask(&a, 0, true, 300));
                // B comes once A's prompt is in and A generates
                let generating = || {
                    let slots: Value = ureq::get(&format!("http://127.0.0.1:{}/slots", s.port())).call().unwrap().into_json().unwrap();
                    slots[0]["is_processing"] == true && slots[0]["next_token"][0]["n_decoded"].as_u64().unwrap_or(0) > 0
                };
                while !generating() {
                    assert!(!a_run.is_finished(), "{case}: A ended before it was seen generating");
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                // A has some 300 tokens to go: B's prompt goes in beside it (were A done first, B would clear its
                // idle slot, and A2 would reuse nothing)
                ask(&b, 1, true, 48);
                a_run.join().unwrap();
            });
        } else {
            ask(&a, 0, true, 48);
            ask(&b, 1, true, 48);
        }
        let cached = ask(&a2, 0, true, 48);
        let alone = ask(&a2, 0, false, 48);
        s.stop();
        let reused = cached["timings"]["cache_n"].as_u64().unwrap();
        eprintln!("{case}: A {n_a}, A2 {n_a2}, B {n_b} tokens; A2 reused {reused} cells of A");
        assert!(reused >= 512 + 64, "{case}: A2 reused {reused} cells of A: its window does not reach back into cells that left A's");
        assert_eq!(alone["timings"]["cache_n"], 0, "{case}: a request without the cache reused cells");
        assert_eq!(cached["content"], alone["content"], "{case}: A2 from A's cells differs from A2 alone");
        assert_eq!(cached["completion_probabilities"], alone["completion_probabilities"], "{case}: A2's probabilities from A's cells differ from alone");
    }
}
