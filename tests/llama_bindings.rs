//! The safe llama layer on the real test model: load, metadata, tokenize round trip, greedy generation (and the
//! teacher's batched greedy answers), and clear errors for missing or broken model files.

mod common;

use kolm_rsd::llama::{argmax, sys, Batch, Context, ContextOptions, GgufFile, Model, ModelOptions};
use kolm_rsd::teacher::{Job, Sampling, Teacher};
use std::ffi::CStr;

#[test]
fn greedy_generation_is_deterministic_and_readable() {
    let _serial = common::one_at_a_time();
    let path = common::smol();
    let model = Model::load(&path, &ModelOptions::default()).unwrap();
    assert_eq!(model.n_vocab(), 49_152);
    let prompt = model.chat_prompt("What is the capital of France? Answer in one word.").expect("SmolLM2 has a chat template");
    assert!(prompt.contains("<|im_start|>assistant"), "{prompt}");
    let tokens = model.tokenize(&prompt, true, true).unwrap();
    assert_eq!(model.detokenize(&tokens), prompt, "tokenize/detokenize round trip");

    let run = || {
        let mut ctx = Context::new(&model, &ContextOptions::default()).unwrap();
        let mut batch = Batch::new(tokens.len(), 1);
        for (i, &t) in tokens.iter().enumerate() {
            batch.add(t, i as i32, &[0], i + 1 == tokens.len());
        }
        ctx.decode(&batch).unwrap();
        let mut out = vec![];
        let mut tok = argmax(ctx.logits(-1));
        for i in 0..16 {
            if model.is_eog(tok) {
                break;
            }
            out.push(tok);
            batch.clear();
            batch.add(tok, (tokens.len() + i) as i32, &[0], true);
            ctx.decode(&batch).unwrap();
            tok = argmax(ctx.logits(0));
        }
        out
    };
    let a = run();
    assert!(!a.is_empty());
    assert_eq!(a, run(), "greedy decoding twice gives the same tokens");
    assert!(model.detokenize(&a).contains("Paris"), "{}", model.detokenize(&a));
}

/// The CPU backend's kernels as compiled: ggml's AMX ones are not batch invariant (one path for a token, tiles for
/// several) and died of SIGILL at the first prompt on a Xeon that has AMX, so build.rs keeps them out on every CPU.
#[test]
fn the_cpu_backend_is_built_without_amx() {
    // SAFETY: the registry's CPU device and its documented `ggml_backend_get_features` entry point (type
    // `ggml_backend_get_features_t`); the list it returns is static, ends with a null name, and is only read.
    let features: Vec<String> = unsafe {
        let dev = sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU);
        assert!(!dev.is_null(), "no CPU backend device");
        let reg = sys::ggml_backend_dev_backend_reg(dev);
        let f = sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_get_features".as_ptr());
        assert!(!f.is_null(), "the CPU backend names no features");
        let f: unsafe extern "C" fn(sys::ggml_backend_reg_t) -> *mut sys::ggml_backend_feature = std::mem::transmute(f);
        let mut p = f(reg);
        let mut out = vec![];
        while !(*p).name.is_null() {
            out.push(CStr::from_ptr((*p).name).to_string_lossy().into_owned());
            p = p.add(1);
        }
        out
    };
    assert!(features.iter().any(|f| f == "AVX2" || f == "NEON" || f == "SSE3"), "no ISA named: {features:?}");
    assert!(!features.iter().any(|f| f.starts_with("AMX")), "{features:?}");
}

#[test]
fn gguf_directory_names_the_head() {
    let g = GgufFile::open(&common::smol()).unwrap();
    assert_eq!(g.get_str("general.architecture").as_deref(), Some("llama"));
    assert_eq!(g.array_len("tokenizer.ggml.tokens"), Some(49_152));
    let head = g.head_tensor().unwrap();
    assert_eq!(head.name, "token_embd.weight", "SmolLM2 ties its embeddings");
    assert_eq!(head.shape, vec![576, 49_152]);
}

#[test]
fn missing_and_corrupt_models_are_clear_errors() {
    let dir = common::scratch("bad-models");
    let missing = dir.join("nope.gguf");
    let e = Model::load(&missing, &ModelOptions::default()).err().unwrap().to_string();
    assert!(e.contains("nope.gguf") && e.contains("no such file"), "{e}");
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"GGUF but not really").unwrap();
    let e = GgufFile::open(&junk).err().unwrap().to_string();
    assert!(e.contains("junk.gguf") && e.contains("not a valid GGUF"), "{e}");
    let e = Model::load(&junk, &ModelOptions::default()).err().unwrap().to_string();
    assert!(e.contains("junk.gguf") && e.contains("cannot load"), "{e}");
}

#[test]
fn a_stream_of_jobs_on_fewer_sequences_gives_each_prompt_its_greedy_answer() {
    let _serial = common::one_at_a_time();
    let model = Model::load(&common::smol(), &ModelOptions::default()).unwrap();
    let prompts: Vec<Vec<i32>> = ["What is the capital of France?", "Write one sentence about rain.", "Name three colours."]
        .iter()
        .map(|q| model.tokenize(&model.chat_prompt(q).unwrap(), true, true).unwrap())
        .collect();
    // One sequence at a time, one token per decode: the oracle.
    let mut alone = Teacher::new(&model, 1, 256, 0).unwrap();
    let want: Vec<Vec<i32>> = prompts.iter().map(|p| alone.greedy(p, 24).unwrap()).collect();
    assert!(want.iter().all(|w| !w.is_empty()));
    // The compile's way: one stream of jobs over fewer sequences than jobs, so ending sequences take the next job
    // and the jobs of one prompt copy its decoded prompt; generation calls of at most 2 tokens are computed like
    // single-token decoding (patch 0002). The jobs that start on an empty cache (the first two, on a copied
    // prompt, their cells in position order) give the greedy answer exactly; later ones reuse freed cells, whose
    // order can tip a near tie (Teacher::run), so of them the first token, drawn from the prompt's logits, is
    // held to the oracle, and each answer to stop at the budget or at end of generation.
    let s = Sampling { samples: 1, temperature: 0.0, top_k: 1, max_tokens: 24, seed: 0, with_greedy: true };
    let jobs: Vec<Job> = [0, 0, 0, 1, 2].into_iter().map(|prompt| Job { prompt, greedy: true }).collect();
    let mut got = vec![Vec::new(); jobs.len()];
    let mut order = Vec::new();
    let mut two = Teacher::new(&model, 2, 256, 0).unwrap();
    two.run(&prompts, &jobs, &s, &mut fastrand::Rng::with_seed(1), |j, out| {
        order.push(j);
        got[j] = out;
    })
    .unwrap();
    order.sort_unstable();
    assert_eq!(order, [0, 1, 2, 3, 4], "every job is handed over once");
    let prompt_of = [0, 0, 0, 1, 2];
    assert_eq!(got[..2], [want[0].clone(), want[0].clone()]);
    for (j, out) in got.iter().enumerate() {
        let w = &want[prompt_of[j]];
        assert_eq!(out.first(), w.first(), "job {j}: the first token comes from the prompt's logits");
        assert!(out.len() == 24 || out.last().is_some_and(|&t| model.is_eog(t)), "job {j} stops at the budget or end of generation");
    }
}
