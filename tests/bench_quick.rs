//! The benchmark harness end to end on SmolLM2-135M, shrunk: two held-out JSON-extraction prompts, no
//! speculation against llama.cpp's ngram-cache (with lookup caches written by our own writer, so llama.cpp's
//! loader checks the format) and the kolm-rsd pack + context n-grams (compiled in process from the same
//! training prompts). Outputs must be byte-identical; the numbers must be sane. No timing assertions. And the
//! compile's throughput comparison (`bench --compile`) runs llama-batched-bench with the compile's shape.

mod common;

use kolm_rsd::bench::{self, config::ConfigKind, prep, report, BenchOptions, Quiet};

#[test]
fn quick_bench_gives_identical_outputs_and_sane_numbers() {
    let _serial = common::one_at_a_time();
    kolm_rsd::llama::quiet_logs();
    let model = common::smol();
    let out = common::scratch("bench-quick");
    let mut o = BenchOptions::quick();
    o.models = vec![model.display().to_string()];
    o.prompts = 2;
    o.train_prompts = 8;
    o.n_predict = 32;
    o.sampling.max_tokens = 32;
    o.sampling.samples = 2;
    o.configs = vec![ConfigKind::None, ConfigKind::NgramCache, ConfigKind::PackContext];
    o.out = out.clone();
    o.fetch = false;
    o.beta_reps = 3;
    // one thread: on a shared 2-core machine two OpenMP threads per server can stall each other badly
    o.threads = Some(1);
    let builder = prep::compile_pack_builder(indicatif::ProgressBar::hidden);
    let r = bench::run(&o, Some(&*builder), &Quiet).expect("bench runs");

    assert!(r.mismatches.is_empty(), "outputs differ from no speculation: {:#?}", r.mismatches);
    assert_eq!(r.failures(), 0);
    assert_eq!(r.groups.len(), 1);
    let g = &r.groups[0];
    // compile holds every 4th of the 8 training prompts back for its coverage: 6 are sampled
    assert_eq!((g.slots, g.prompts, g.train_prompts), (1, 2, 6));
    assert!(g.pack.as_deref().unwrap_or("").contains("entries"), "{:?}", g.pack);
    assert!(g.train_tokens > 0);
    let cfg = |k: ConfigKind| g.configs.iter().find(|c| c.kind == k).unwrap_or_else(|| panic!("{k:?} missing"));

    let none = cfg(ConfigKind::None);
    let n = none.summary.as_ref().expect("reference ran");
    assert_eq!(n.requests, 2);
    assert!(n.tokens > 2 && n.tok_s > 0.0 && n.wall_tok_s > 0.0, "{n:?}");
    assert_eq!((n.drafted, n.accepted, n.identical, n.compared), (0, 0, 2, 2));
    assert!((n.speedup - 1.0).abs() < 1e-12 && n.tokens_per_pass == 1.0);

    let nc = cfg(ConfigKind::NgramCache);
    assert_eq!(nc.status, "ran", "{:?}", nc.reason);
    assert!(nc.flags.contains("-lcs") && nc.flags.contains("-lcd"), "{}", nc.flags);
    let s = nc.summary.as_ref().unwrap();
    assert_eq!((s.identical, s.compared), (2, 2));
    assert!(s.tok_s > 0.0 && s.speedup > 0.0 && s.accepted <= s.drafted && s.tokens_per_pass >= 1.0, "{s:?}");
    assert!(s.drafts.is_some(), "/metrics gave no draft count");

    let pack = cfg(ConfigKind::PackContext);
    assert_eq!(pack.status, "ran", "pack configuration: {:?}", pack.reason);
    assert!(pack.flags.contains("--spec-plugin") && pack.flags.contains("pack="), "{}", pack.flags);
    let s = pack.summary.as_ref().unwrap();
    assert_eq!((s.identical, s.compared), (2, 2));
    assert!(s.accepted <= s.drafted && s.tokens_per_pass >= 1.0, "{s:?}");

    assert_eq!(r.betas.len(), 1);
    let b = &r.betas[0];
    assert!(b.t1_ms > 0.0 && b.points.len() >= 9, "{b:?}");
    assert!(b.points.iter().all(|p| p.1 > 0.0 && p.2 > 0.3), "{b:?}");

    let md = report::markdown(&r);
    assert!(md.contains("| none |") && md.contains("| ngram-cache |"), "{md}");
    let (json, _) = report::write_files(&r, &out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    assert_eq!(v["groups"][0]["configs"][0]["requests"].as_array().unwrap().len(), 2);
    eprintln!("{md}");
}

#[test]
fn the_compile_is_set_beside_llama_batched_bench() {
    let _serial = common::one_at_a_time();
    kolm_rsd::llama::quiet_logs();
    let mut options = kolm_rsd::compile::CompileOptions::default();
    options.sampling.samples = 2;
    options.sampling.max_tokens = 16;
    options.threads = 1;
    let b = bench::compile::CompileBench { model: common::smol(), workload: "json-extraction".into(), prompts: 4, options };
    let r = bench::compile::run(&b, &indicatif::ProgressBar::hidden()).expect("compile and llama-batched-bench run");
    // 3 prompts sampled (2 samples + greedy each), 1 held out: every sequence generates at most 16 tokens.
    assert_eq!((r.prompts, r.n_seq, r.threads), (4, 3, 1));
    assert!(r.compile_tokens > 0 && r.compile_tokens <= 3 * 3 * 16 + 16, "{}", r.compile_tokens);
    assert_eq!((r.batched.pl, r.batched.tg), (3, 16), "llama-batched-bench ran with the compile's shape");
    assert!(r.batched.pp as usize == r.mean_prompt_tokens && r.batched.speed_tg > 0.0 && r.compile_rate > 0.0);
    assert!(r.markdown().contains("llama-batched-bench"));
}

/// The load mode's call costs on a real model: every draft length and prefill measured, and the ceiling they
/// give sane (no timing thresholds beyond "more tokens in the same calls take longer").
#[test]
fn the_load_ceiling_measures_real_calls() {
    use kolm_rsd::bench::load_ceiling::{self, strict_calls};
    let _serial = common::one_at_a_time();
    kolm_rsd::llama::quiet_logs();
    let model = kolm_rsd::llama::Model::load(&common::smol(), &kolm_rsd::llama::ModelOptions { n_gpu_layers: 0 }).unwrap();
    let c = load_ceiling::measure(&model, 3, 1, 24, 64, 1).expect("measured");
    assert_eq!((c.slots, c.n_past, c.step_ms.len()), (3, 24, 16));
    assert!(c.step_ms.iter().all(|&t| t.is_finite() && t > 0.0), "{:?}", c.step_ms);
    // 3 slots × 16 tokens are three calls of 16: far more work than one call of 3 tokens.
    assert_eq!(strict_calls(3, 16), [16, 16, 16]);
    assert!(c.step_ms[15] > c.step_ms[0], "{:?}", c.step_ms);
    assert_eq!(c.prefill_ms.iter().map(|p| p.0).collect::<Vec<_>>(), [32, 64]);
    // Uneven steps measured and priced from one-slot steps: 2-1-1 is two passes (3 tokens, then 1) and one call.
    assert_eq!(c.uneven.iter().map(|u| u.shape.clone()).collect::<Vec<_>>(), load_ceiling::uneven_shapes(3));
    assert!(c.uneven.iter().all(|u| u.ms > 0.0 && u.passes_ms > 0.0 && u.calls_ms > 0.0), "{:?}", c.uneven);
    // Priced from the one-slot steps, not compared by their timings (one repetition each: either may be the
    // faster on a noisy machine, as in session 55's CI run).
    assert_eq!(c.single_ms.len(), 16);
    let u = &c.uneven[0];
    assert_eq!(u.shape, [2, 1, 1]);
    assert_eq!(u.passes_ms, c.single_ms[2] + c.single_ms[0], "two passes, 3 tokens then 1: {u:?}");
    assert_eq!(u.calls_ms, c.single_ms[3], "one call of 4 tokens: {u:?}");
    assert!(c.prefill(64) > 0.0 && c.prefill(128) > c.prefill(64));
    let (g, s) = c.decode_ceiling(1.0);
    assert!(g >= 1 && s >= 1.0, "sure drafts pay at some length: γ {g}, {s}");
    assert_eq!(c.decode_ceiling(0.0), (0, 1.0), "drafts never accepted never pay");
    let run = load_ceiling::ceiling(&c, 100, 90, 10_000.0, c.prefill(64) * 4.0, 1.0).unwrap();
    assert!(run.s >= 1.0 && run.s <= s + 1e-9 && run.prefill_share > 0.0, "{run:?}");
}
