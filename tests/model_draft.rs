//! The draft-model drafter of the plugin (issue 4): llama.cpp's LM head skipped (patch 0003), the hidden
//! state scored by the subset head, greedy; served by llama-server with output identical to plain decoding.
//! SmolLM2 drafts for itself here: the one small model CI has, and the strictest oracle (a draft model
//! equal to its target must agree with it on every token).

mod common;

use kolm_rsd::compile::templated;
use kolm_rsd::draft::model::{ModelDraftConfig, ModelDrafter};
use kolm_rsd::draft::TokenSource;
use kolm_rsd::llama::{argmax, Batch, Context, ContextOptions, Model, ModelOptions, Token};
use kolm_rsd::server::{Server, ServerOptions};
use common::shortlist_with;
use kolm_rsd::head::HeadDevice;
use std::path::{Path, PathBuf};

const PROMPT: &str = "Extract JSON with name and age: Ann Lee is 42 years old and lives in Oslo.";

/// Greedy tokens of plain llama.cpp decoding (full head, logits), one token per decode.
fn greedy(model: &Model, prompt: &[Token], n: usize) -> Vec<Token> {
    let mut ctx = Context::new(model, &ContextOptions { n_ctx: 1024, ..ContextOptions::default() }).unwrap();
    let mut batch = Batch::new(512, 1);
    for (i, &t) in prompt.iter().enumerate() {
        batch.add(t, i as i32, &[0], i + 1 == prompt.len());
    }
    ctx.decode(&batch).unwrap();
    let mut out = Vec::new();
    for k in 0..n {
        let t = argmax(ctx.logits(-1));
        out.push(t);
        batch.clear();
        batch.add(t, (prompt.len() + k) as i32, &[0], true);
        ctx.decode(&batch).unwrap();
    }
    out
}

/// The same tokens predicted one by one by the draft model.
fn drafted(cfg: &ModelDraftConfig, prompt: &[Token], n: usize) -> (Vec<Token>, ModelDrafter) {
    let mut md = ModelDrafter::load(cfg).unwrap();
    let mut hist = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = md.next(0, &hist).expect("a prediction");
        out.push(t);
        hist.push(t);
    }
    (out, md)
}

/// SmolLM2, the tokens of [`PROMPT`] and llama.cpp's 24 greedy tokens after it: the oracle of these tests.
fn smol_answer() -> (Model, Vec<Token>, Vec<Token>) {
    let model = Model::load(&common::smol(), &ModelOptions { n_gpu_layers: 0 }).unwrap();
    let prompt = model.tokenize(&templated(&model, PROMPT), false, true).unwrap();
    let want = greedy(&model, &prompt, 24);
    (model, prompt, want)
}

fn config(shortlist: Option<PathBuf>, margin: f32) -> ModelDraftConfig {
    let head_device = HeadDevice::Best;
    ModelDraftConfig { model: common::smol(), shortlist, margin, request_rows: false, n_seq: 1, n_ctx: 1024, n_threads: 0, head_device }
}

#[test]
fn request_rows_give_the_prompt_tokens_a_shortlist_lacks() {
    let _serial = common::one_at_a_time();
    let dir = common::scratch("model-draft-request-rows");
    let (model, prompt, want) = smol_answer();
    // The list holds every answer token the prompt does not (and the lowest ids): what the answer copies
    // from the prompt is missing from it, as a name or an e-mail address is missing from a real list.
    let must: Vec<Token> = want.iter().copied().filter(|t| !prompt.contains(t)).collect();
    let path = dir.join("smol.shortlist.json");
    let s = shortlist_with(&model, &must, must.len() + 256, &path);
    let missing: Vec<Token> = want.iter().copied().filter(|&t| !s.ids.contains(&(t as u32))).collect();
    assert!(!missing.is_empty(), "the answer copies nothing the list lacks: {want:?}");
    assert!(missing.iter().all(|t| prompt.contains(t)));

    let (without, md) = drafted(&config(Some(path.clone()), 0.0), &prompt, 24);
    assert_ne!(without, want, "a list without {missing:?} cannot give the answer");
    assert_eq!(md.stats().request_hits, 0);

    let cfg = ModelDraftConfig { request_rows: true, ..config(Some(path), 0.0) };
    let (with, md) = drafted(&cfg, &prompt, 24);
    assert_eq!(with, want, "the request's own rows did not restore the copied tokens");
    let st = md.stats();
    assert!(st.request_hits as usize >= missing.len(), "{st:?}, missing {missing:?}");
    // The prompt brings the new ids at once; the answer adds none (it is made of the list and the prompt).
    assert_eq!(st.request_rebuilds, 1, "{st:?}");
}

#[test]
fn skipped_head_and_subset_head_give_the_targets_greedy_tokens() {
    let _serial = common::one_at_a_time();
    let dir = common::scratch("model-draft-parity");
    let (model, prompt, want) = smol_answer();

    // The full head through the drafter's path (LM head skipped in llama.cpp, rows scored by ggml).
    let (full, md) = drafted(&config(None, 0.0), &prompt, 24);
    assert!(md.stats().head_skipped, "llama.cpp did not skip the LM head");
    assert_eq!(md.head_rows(), model.n_vocab());
    assert_eq!(full, want, "full head via the hidden state differs from llama.cpp's logits");

    // A 2,048-id shortlist holding every token of the answer: the same tokens, without fallback.
    let path = dir.join("smol.shortlist.json");
    let s = shortlist_with(&model, &want, 2048, &path);
    assert!(s.len() == 2048 && s.len() < model.n_vocab());
    let (sub, md) = drafted(&config(Some(path.clone()), 0.0), &prompt, 24);
    assert_eq!(md.head_rows(), 2048);
    assert_eq!(sub, want, "the subset head lost a token that is in the set");
    assert_eq!(md.stats().fallbacks, 0);

    // A huge margin sends every step to the full head, and the tokens stay right.
    let (fb, md) = drafted(&config(Some(path), 1e9), &prompt, 24);
    assert_eq!(fb, want);
    assert_eq!(md.stats().fallbacks, 24, "{:?}", md.stats());
    assert_eq!(md.stats().tokens, 24);
}

fn prompts(model_path: &Path) -> Vec<String> {
    let model = Model::load(model_path, &ModelOptions { n_gpu_layers: 0 }).unwrap();
    let all = kolm_rsd::workload::load("json-extraction").unwrap();
    all.iter().skip(2).step_by(15).take(3).map(|p| templated(&model, &p.text)).collect()
}

#[test]
fn plugin_drafts_with_the_model_and_output_is_identical() {
    let _serial = common::one_at_a_time();
    let dir = common::scratch("model-draft-serving");
    let smol = common::smol();
    let prompts = prompts(&smol);
    let plain = Server::start(&ServerOptions::new(&smol, &dir.join("plain.log"))).unwrap();
    let reference: Vec<String> = prompts.iter().map(|p| plain.complete(p, 64).unwrap().content).collect();
    plain.stop();

    let model = Model::load(&smol, &ModelOptions { n_gpu_layers: 0 }).unwrap();
    let sl = dir.join("s.shortlist.json");
    let answer: Vec<Token> = reference.iter().flat_map(|r| model.tokenize(r, false, false).unwrap()).collect();
    shortlist_with(&model, &answer, 4096, &sl);
    drop(model);

    for (name, head) in [("full", "shortlist=full".to_string()), ("subset", format!("shortlist={}", sl.display()))] {
        let log = dir.join(format!("{name}.log"));
        let mut opts = ServerOptions::new(&smol, &log);
        opts.plugin = Some(common::plugin());
        opts.plugin_arg = Some(format!("pack=off,context=0,live=off,misslog=off,adaptive=0,nmax=3,draft={},{head}", smol.display()));
        let spec = Server::start(&opts).unwrap();
        let (mut drafted, mut accepted) = (0, 0);
        for (p, r) in prompts.iter().zip(&reference) {
            let c = spec.complete(p, 64).unwrap();
            assert_eq!(&c.content, r, "{name}: output with the draft model differs from plain decoding");
            drafted += c.draft_n;
            accepted += c.draft_n_accepted;
        }
        spec.stop();
        let summary = common::plugin_summary(&log);
        assert!(common::summary_number(&summary, "model hits ") > 0, "{name}: the model drafted nothing: {summary}");
        // head_dev's default, `best`, is the CPU when libggml has no GPU.
        if !cfg!(any(feature = "cuda", feature = "metal", feature = "vulkan")) {
            assert!(summary.contains(" rows on CPU: "), "{name}: the head's backend is not named: {summary}");
        }
        // The draft model is the target: it must agree almost everywhere.
        assert!(drafted > 0 && accepted * 10 >= drafted * 9, "{name}: accepted {accepted} of {drafted}: {summary}");
        eprintln!("{name}: {summary}");
    }
}

#[test]
fn draft_model_with_another_tokenizer_is_refused() {
    let _serial = common::one_at_a_time();
    let dir = common::scratch("model-draft-tokenizer");
    let qwen = kolm_rsd::fetch::model("qwen2.5-coder-0.5b", false).expect("fetch qwen2.5-coder-0.5b");
    let mut opts = ServerOptions::new(&common::smol(), &dir.join("log"));
    opts.plugin = Some(common::plugin());
    opts.plugin_arg = Some(format!("live=mem,draft={}", qwen.display()));
    let e = match Server::start(&opts) {
        Ok(_) => panic!("llama-server started with a draft model of another tokenizer"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains(&qwen.display().to_string()) && e.contains("tokenizer differs"), "{e}");
}
