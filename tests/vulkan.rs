//! ggml-vulkan for real (built only with `--features vulkan`; `scripts/vulkan-test` runs it on Mesa's lavapipe,
//! a Vulkan device on the CPU, selected with `GGML_VK_VISIBLE_DEVICES`): the model fully offloaded to the
//! device, verify batches bitwise equal to single-token decoding (patch 0010), llama-server with the
//! plugin giving the greedy output plain decoding gives on the same device (drafting from the request, and
//! from a draft model whose layers and subset LM head are on the device), and the subset LM head on it.

mod common;

use kolm_rsd::head::{top2, HeadDevice, HeadOptions, SubsetHead};
use kolm_rsd::llama::{self, Model, ModelOptions};
use kolm_rsd::server::{Server, ServerOptions};
use kolm_rsd::shortlist::score_positions;
use std::path::Path;
use std::process::Command;

/// The ggml device the tests offload to.
const DEVICE: &str = "Vulkan0";

/// A short prompt: every context of the check decodes it again, and lavapipe is slow.
const PROMPT: &str = "def fibonacci(n: int) -> int:";

/// `batch_invariance` on SmolLM2, every layer on the Vulkan device, b = 2..bmax: (passed, output).
fn batch_invariance(fa: &str, bmax: u32, env_max: Option<&str>) -> (bool, String) {
    let dir = common::scratch(&format!("vk-batch-invariance-{fa}-{}", env_max.unwrap_or("default")));
    let exe = dir.join("batch_invariance");
    common::cc(&["tests/c/batch_invariance.c"], &exe, false, false);
    let mut cmd = Command::new(&exe);
    cmd.arg(common::smol()).args(["-ngl", "99", "-dev", DEVICE, "-p", PROMPT, "-n", "16", "-bmin", "2", "-q"]);
    cmd.args(["-bmax", &bmax.to_string()]);
    cmd.args(["--mode", "plain", "-fa", fa]);
    if let Some(v) = env_max {
        cmd.env("GGML_VK_BATCH_INVARIANT_MAX", v);
    }
    let o = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(text.contains(&format!("device {DEVICE}")), "{text}");
    (o.status.success(), text)
}

#[test]
fn verify_batches_on_the_vulkan_device_are_bitwise_single_token_decoding() {
    let _one = common::one_at_a_time();
    for fa in ["off", "on"] {
        let (ok, out) = batch_invariance(fa, 16, None);
        eprintln!("{out}");
        assert!(ok, "flash attention {fa}: batched logits differ from single-token decoding on {DEVICE}\n{out}");
    }
}

#[test]
fn without_the_vulkan_patch_the_check_does_catch_differences() {
    // GGML_VK_BATCH_INVARIANT_MAX=0: upstream's dispatches (tiled matmul from 9 columns, batched attention).
    let _one = common::one_at_a_time();
    // b = 2..3 is enough: upstream differs at every b (docs/gpu.md).
    let (ok, out) = batch_invariance("off", 3, Some("0"));
    eprintln!("{out}");
    assert!(!ok, "upstream ggml-vulkan was expected to differ bitwise\n{out}");
}

/// llama-server with SmolLM2's every layer on the device (checked in its log), with the plugin and
/// `plugin_arg` when given.
fn serve_on_device(dir: &Path, log: &str, plugin_arg: Option<String>) -> Server {
    let mut o = ServerOptions::new(&common::smol(), &dir.join(log));
    // -lv 4: the log says where the layers went.
    o.extra = ["-ngl", "99", "-dev", DEVICE, "-lv", "4"].map(String::from).to_vec();
    if let Some(arg) = plugin_arg {
        o.plugin = Some(common::plugin());
        o.plugin_arg = Some(arg);
    }
    let s = Server::start(&o).unwrap();
    let text = std::fs::read_to_string(dir.join(log)).unwrap();
    let on_device = text.contains("offloaded 31/31 layers") && text.contains(&format!("{DEVICE} model buffer size"));
    assert!(on_device, "SmolLM2's 31 layers are not all on {DEVICE}:\n{}", s.log_tail());
    s
}

/// Greedy completions of `prompts` by plain llama-server on the device.
fn plain_on_device(dir: &Path, prompts: &[&str], n: u32) -> Vec<String> {
    let plain = serve_on_device(dir, "plain.log", None);
    prompts.iter().map(|p| plain.complete(p, n).unwrap().content).collect()
}

#[test]
fn served_on_the_vulkan_device_the_plugin_output_is_plain_decoding() {
    let _one = common::one_at_a_time();
    // Raw prompts of at most 16 tokens: lavapipe takes minutes over a templated prompt of a few hundred. The
    // second repeats itself, so drafts copied from the request are accepted.
    let prompts = [PROMPT, "red green blue red green blue red green"];
    let dir = common::scratch("vk-server");
    let reference = plain_on_device(&dir, &prompts, 32);
    // adaptive=0: draft at every step, so every token goes through a verify batch.
    let spec = serve_on_device(&dir, "plugin.log", Some("adaptive=0,misslog=off".into()));
    let (mut drafted, mut accepted) = (0, 0);
    for (p, r) in prompts.iter().zip(&reference) {
        let c = spec.complete(p, 32).unwrap();
        assert_eq!(&c.content, r, "speculative output on {DEVICE} differs from plain decoding for prompt:\n{p}");
        drafted += c.draft_n;
        accepted += c.draft_n_accepted;
    }
    assert!(accepted > 0, "no drafted token was accepted ({drafted} drafted): verification was not exercised");
    eprintln!("{DEVICE}: {} prompts identical, {drafted} drafted, {accepted} accepted", prompts.len());
}

#[test]
fn served_with_a_draft_model_its_head_runs_on_the_vulkan_device_and_output_is_plain_decoding() {
    let _one = common::one_at_a_time();
    let dir = common::scratch("vk-server-draft");
    let n = 24;
    let reference = plain_on_device(&dir, &[PROMPT], n);
    // SmolLM2 drafts for itself through a 4,096-id shortlist that holds the answer's tokens.
    let smol = common::smol();
    let model = Model::load(&smol, &ModelOptions { n_gpu_layers: 0 }).unwrap();
    let answer = model.tokenize(&reference[0], false, false).unwrap();
    let sl = dir.join("smol.shortlist.json");
    common::shortlist_with(&model, &answer, 4096, &sl);
    drop(model);
    // Only the model drafts (no pack, request copies or live index), at every step; margin=0: the subset
    // head alone, no full-head fallback. head_dev is left at its default.
    let arg = format!("pack=off,context=0,live=off,misslog=off,adaptive=0,margin=0,draft={},shortlist={}", smol.display(), sl.display());
    let spec = serve_on_device(&dir, "draft.log", Some(arg));
    let log = std::fs::read_to_string(dir.join("draft.log")).unwrap();
    // The target and then the draft model (loaded by the plugin with every layer offloaded).
    let offloads = log.matches("offloaded 31/31 layers").count();
    assert_eq!(offloads, 2, "the draft model's layers are not all on {DEVICE}:\n{}", spec.log_tail());
    let started = log.lines().find(|l| l.starts_with("kolm-rsd: ") && l.contains("draft model")).unwrap_or_default().to_string();
    assert!(started.contains(&format!("head on {DEVICE} (head_dev=best)")), "start-up line: {started}");
    let c = spec.complete(PROMPT, n).unwrap();
    spec.stop();
    assert_eq!(c.content, reference[0], "output with the draft model on {DEVICE} differs from plain decoding");
    let summary = common::plugin_summary(&dir.join("draft.log"));
    assert!(summary.contains(&format!("draft model 4096 rows on {DEVICE}: ")), "the head did not run on {DEVICE}: {summary}");
    let hits = common::summary_number(&summary, "model hits ");
    assert!(hits > 0 && c.draft_n_accepted > 0, "the draft model drafted nothing accepted ({} drafted): {summary}", c.draft_n);
    eprintln!("{DEVICE}: {started}");
    eprintln!("{DEVICE}: identical, {} drafted, {} accepted; {summary}", c.draft_n, c.draft_n_accepted);
}

#[test]
fn the_subset_head_on_the_vulkan_device_gives_the_full_heads_argmax() {
    let _one = common::one_at_a_time();
    llama::quiet_logs();
    let path = common::smol();
    // Hidden states from the CPU, a short text in batches of 8 (no op is offloaded to the device).
    let model = Model::load(&path, &ModelOptions { n_gpu_layers: 0 }).unwrap();
    let toks = model.tokenize(&format!("{PROMPT}\n    if n < 2:\n        return n\n    return fibonacci(n - 1)"), true, true).unwrap();
    let mut hidden = Vec::new();
    score_positions(&model, &[toks], 8, 2, true, |pos| hidden.push(pos.hidden.unwrap().to_vec()), |_| {}).unwrap();
    let n_vocab = model.n_vocab() as u32;
    drop(model);
    let opts = HeadOptions { device: HeadDevice::Best, ..HeadOptions::default() };
    let mut full = SubsetHead::from_gguf(&path, &(0..n_vocab).collect::<Vec<_>>(), &opts).unwrap();
    assert_eq!(full.backend_name(), DEVICE);
    // 8 columns a call: the mat-vec shaders, where a row's logit does not depend on how many rows there are.
    let full_top: Vec<u32> = hidden
        .chunks(8)
        .flat_map(|c| {
            let out = full.logits(&c.concat(), c.len()).unwrap();
            out.chunks(n_vocab as usize).map(|l| top2(l).0 as u32).collect::<Vec<_>>()
        })
        .collect();
    // 3,000 spread ids and every position's argmax, unsorted.
    let mut ids: Vec<u32> = (0..3000u32).map(|i| (i * 7919 + 13) % n_vocab).collect();
    ids.extend(&full_top);
    let mut seen = std::collections::HashSet::new();
    ids.retain(|i| seen.insert(*i));
    ids.reverse();
    let mut sub = SubsetHead::from_gguf(&path, &ids, &opts).unwrap();
    assert_eq!(sub.backend_name(), DEVICE);
    for (c, (h, &want)) in hidden.iter().zip(&full_top).enumerate() {
        let (i1, _, _) = top2(&sub.logits(h, 1).unwrap());
        assert_eq!(ids[i1], want, "position {c}: the subset head's argmax on {DEVICE} is not the full head's");
    }
    eprintln!("{DEVICE}: {} positions, subset of {} rows = full head's argmax at each", hidden.len(), ids.len());
}
