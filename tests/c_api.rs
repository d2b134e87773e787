//! C programs that include only kolm-rsd.h and llama.h, linked against libkolm_rsd and the one libllama:
//! the propose → verify loop (identical to plain greedy decoding), and the batch-invariance check of the
//! patched ggml (logits of a verify batch bitwise equal to single-token decoding, and its multi-column kernels
//! bitwise equal to the single-column ones).

mod common;

use std::process::Command;

/// Runs one C program; programs that run a model take turns (see `common::one_at_a_time`).
fn run(cmd: &mut Command) -> (bool, String) {
    let _one = common::one_at_a_time();
    let o = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.success(), text)
}

#[test]
fn c_propose_verify_loop_is_identical_with_context_ngrams() {
    let dir = common::scratch("c-propose-verify");
    let exe = dir.join("propose_verify");
    common::cc(&["tests/c/propose_verify.c"], &exe, false, true);
    let (ok, out) = run(Command::new(&exe).arg(common::smol()).arg("-").arg("96"));
    assert!(ok, "{out}");
    assert!(out.contains("identical: yes"), "{out}");
}

#[test]
fn c_predicted_output_drafts_the_answer_and_changes_nothing() {
    let dir = common::scratch("c-propose-verify-predict");
    let exe = dir.join("propose_verify");
    common::cc(&["tests/c/propose_verify.c"], &exe, false, true);
    let (ok, out) = run(Command::new(&exe).arg(common::smol()).arg("-").arg("96").arg("predict"));
    assert!(ok, "{out}");
    assert!(out.contains("identical: yes"), "{out}");
}

#[test]
fn c_propose_verify_loop_is_identical_with_a_pack() {
    let dir = common::scratch("c-propose-verify-pack");
    let exe = dir.join("propose_verify");
    common::cc(&["tests/c/propose_verify.c"], &exe, false, true);
    let (ok, out) = run(Command::new(&exe).arg(common::smol()).arg(common::small_pack()).arg("96"));
    assert!(ok, "{out}");
    assert!(out.contains("identical: yes"), "{out}");
}

fn batch_invariance(extra: &[&str], env_max: Option<&str>) -> (bool, String) {
    let name: String = extra.concat().chars().filter(char::is_ascii_alphanumeric).take(48).collect();
    let dir = common::scratch(&format!("c-batch-invariance{name}"));
    let exe = dir.join("batch_invariance");
    common::cc(&["tests/c/batch_invariance.c"], &exe, false, false);
    let mut cmd = Command::new(&exe);
    cmd.arg(common::smol()).args(["-n", "24", "-bmin", "2", "-bmax", "8", "-q"]).args(extra);
    if let Some(v) = env_max {
        cmd.env("GGML_CPU_BATCH_INVARIANT_MAX", v);
    }
    run(&mut cmd)
}

#[test]
fn verify_batches_are_bitwise_single_token_decoding() {
    for fa in ["off", "on"] {
        let (ok, out) = batch_invariance(&["-fa", fa, "--mode", "all"], None);
        assert!(ok, "flash attention {fa}: batched logits differ from single-token decoding\n{out}");
    }
}

#[test]
fn two_sequences_in_one_shared_kv_cache_are_bitwise_without_flash_attention() {
    // Patch 0017: in a unified KV cache with pages asked for (llama_context_params.kv_pages, as llama-server's strict
    // batching asks), each sequence's cells keep their offsets in pages of their own, so the non-FA softmax and
    // KQV product sum them in the same SIMD blocks whatever the other sequence holds.
    for fa in ["off", "on"] {
        let (ok, out) = batch_invariance(&["-fa", fa, "--mode", "multi", "--kv-unified", "--kv-pages"], None);
        assert!(ok, "flash attention {fa}, one shared KV cache: batched logits differ\n{out}");
        assert!(out.contains("multiU"), "{out}");
    }
    // With upstream's placement (no pages) the same check fails without FA: it does compare.
    let (ok, out) = batch_invariance(&["-fa", "off", "--mode", "multi", "--kv-unified"], None);
    assert!(!ok && out.contains("MISMATCH"), "upstream's placement was expected to differ bitwise\n{out}");
}

#[test]
fn sequences_copied_from_one_prompt_in_a_shared_kv_cache_are_bitwise() {
    // Patch 0017: llama_memory_seq_cp gives each copy a page of its own holding the prompt's last, partial page, so
    // four sequences continuing one prompt (llama-server's n_cmpl > 1) each keep the offsets they have alone. Shared,
    // that page left three of them to go on in another page, and without FA the SIMD block it cuts was summed as two:
    // with this prompt of 29 tokens, 135 of 288 positions differed.
    let prompt = "Extract the fields as JSON: name Di Eck, age 52, city Kyiv, email di@example.com.\nJSON:";
    for fa in ["off", "on"] {
        let (ok, out) = batch_invariance(&["-fa", fa, "--mode", "copied", "--kv-unified", "--kv-pages", "-p", prompt], None);
        assert!(ok, "flash attention {fa}, copies of one prompt in one shared KV cache: batched logits differ\n{out}");
        assert!(out.contains("copiedU") && out.contains("prompt tokens 29,"), "{out}");
    }
}

#[test]
fn copies_of_a_prompt_past_its_sliding_window_ring_replace_cells_and_stay_bitwise() {
    // Patch 0017 on Gemma-3 (a window of 512 positions; alone, a ring of 1,024 cells): a prompt of 1,088 tokens goes
    // round its ring in sequence 0 after sequences 1..3 took a short prompt each, and the copies replace those
    // (seq_rm, then seq_cp, as llama-server copies a prompt to slots that kept their cells), so each finds its freed
    // page below the ring and shares the ring's cells. Session 46's seq_cp also shared the cells that had left the
    // window; sequence 0 then found its next cell taken and no page, and 144 of 576 positions differed with FA, 96
    // without.
    let gemma = kolm_rsd::fetch::model("gemma3-270m", false).expect("fetch gemma3-270m");
    let exe = common::scratch("c-batch-invariance-swa-copied").join("batch_invariance");
    common::cc(&["tests/c/batch_invariance.c"], &exe, false, false);
    let prompt = common::records(1);
    for fa in ["off", "on"] {
        let (ok, out) = run(Command::new(&exe).arg(&gemma).args(["-c", "8192", "-q", "--mode", "copied", "--kv-unified"])
            .args(["--kv-pages", "--copy-over", "-fa", fa, "-p", &prompt]));
        assert!(ok, "Gemma-3, flash attention {fa}: copies of a prompt past its ring differ from it decoded alone\n{out}");
        assert!(out.contains("copiedU") && out.contains("prompt tokens 1088,"), "{out}");
    }
}

#[test]
fn without_the_fix_the_check_does_catch_differences() {
    // GGML_CPU_BATCH_INVARIANT_MAX=0 restores upstream kernels (llamafile sgemm for batches > 1):
    // the same check must then fail, or it would prove nothing.
    let (ok, out) = batch_invariance(&["-fa", "off", "--mode", "plain"], Some("0"));
    assert!(!ok, "the upstream kernels were expected to differ bitwise\n{out}");
}

/// `batch_invariance` built in `scratch`, and Qwen2.5-Coder-0.5B Q4_K_M, which exercises the repacked Q4_K and the
/// Q6_K paths that SmolLM2's Q4_1 does not.
fn batch_invariance_on_qwen(scratch: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let model = kolm_rsd::fetch::model("qwen2.5-coder-0.5b", false).expect("fetch qwen2.5-coder-0.5b");
    let exe = common::scratch(scratch).join("batch_invariance");
    common::cc(&["tests/c/batch_invariance.c"], &exe, false, false);
    (exe, model)
}

#[test]
fn verify_batches_are_bitwise_on_qwen_q4_k_m() {
    let (exe, model) = batch_invariance_on_qwen("c-batch-invariance-qwen");
    for fa in ["off", "on"] {
        // up to 16 columns: the multi-column Q4_K and Q6_K kernels (patch 0005) in one pass each
        let (ok, out) = run(Command::new(&exe).arg(&model).args(["-n", "16", "-bmin", "2", "-bmax", "16", "-q", "--mode", "plain", "-fa", fa]));
        assert!(ok, "Qwen, flash attention {fa}: batched logits differ from single-token decoding\n{out}");
    }
}

#[test]
fn unequal_slots_in_one_pass_are_bitwise_each_slot_alone() {
    // Patch 0014: four sequences verifying 0..4 tokens each (wrong drafts removed) in one forward pass, each
    // sequence's logits against it decoded alone, on the repacked Q4_K and Q6_K paths; without the exact
    // kernels the same check fails, so it does compare.
    let (exe, model) = batch_invariance_on_qwen("c-batch-invariance-ragged");
    for fa in ["on", "off"] {
        let (ok, out) = run(Command::new(&exe).arg(&model).args(["-n", "16", "-q", "--mode", "ragged", "-fa", fa]));
        assert!(ok, "Qwen, flash attention {fa}: a slot's logits differ from it decoded alone\n{out}");
        assert!(out.contains("ragged    4"), "{out}");
    }
    let (ok, out) = run(Command::new(&exe).arg(&model).args(["-n", "16", "-q", "--mode", "ragged", "-fa", "on"]).env("GGML_CPU_BATCH_INVARIANT_MAX", "0"));
    assert!(!ok, "the upstream kernels were expected to differ bitwise\n{out}");
}

#[test]
fn attention_rows_computed_together_are_bitwise_one_at_a_time() {
    // Patch 0012: the rows of a flash attention that share their K and V rows are computed together. One
    // thread (rows together) against a thread per four rows (each row alone), every output bit, on the head
    // sizes and grouped-query ratios of the project's models, masks with holes, ALiBi and a softcap.
    c_check("fa_rows");
}

#[test]
fn multi_column_kernels_are_bitwise_their_single_column_originals() {
    // Random blocks, several row lengths, 1..16 columns: what one model's shapes would not all reach; and
    // patch 0011's quantize_row_q8_K against ggml's reference on rows with ties, zero blocks, NaN, infinity.
    c_check("ncols_kernels");
}

/// Builds `tests/c/NAME.c` (a check of the CPU backend with no model) and runs it: it must exit 0 and say PASS.
fn c_check(name: &str) {
    let exe = common::scratch(&format!("c-{}", name.replace('_', "-"))).join(name);
    common::cc(&[&format!("tests/c/{name}.c")], &exe, false, false);
    let (ok, out) = run(&mut Command::new(&exe));
    assert!(ok, "{out}");
    assert!(out.contains("PASS"), "{out}");
}
