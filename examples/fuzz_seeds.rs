//! Writes the fuzz targets' seed corpora from real material (scripts/fuzz runs it): the pack `kolm-rsd demo`
//! compiled, a shortlist and a teacher histogram ranked from the model's own greedy answers, a miss log written
//! by the project's MissLog from the drafter's own misses on those answers, and the answers themselves as
//! begin / propose / accept streams in the op format of fuzz/src/lib.rs.
//!
//! `cargo run --release --example fuzz_seeds -- fuzz/corpus`

use kolm_rsd::compile::templated;
use kolm_rsd::draft::{Drafter, DrafterConfig};
use kolm_rsd::engine::{load_index, pack_beside};
use kolm_rsd::vocab::{drafter_texts, fingerprint, token_texts};
use kolm_rsd::llama::{self, Model, ModelOptions};
use kolm_rsd::misslog::MissLog;
use kolm_rsd::shortlist::{Histogram, Method, Shortlist};
use kolm_rsd::teacher::Teacher;
use std::path::{Path, PathBuf};

/// Op-stream encoding (fuzz/src/lib.rs): ids below 0xFFF0 as u16 LE.
fn tok(out: &mut Vec<u8>, t: i32) {
    out.extend_from_slice(&(t as u16).to_le_bytes());
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()));
}

fn main() {
    let corpus = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "fuzz/corpus".into()));
    llama::quiet_logs();
    let path = kolm_rsd::fetch::model(kolm_rsd::fetch::DEFAULT_MODEL, false).expect("SmolLM2 (kolm-rsd model fetch)");
    // KOLM_FUZZ_PACK, as for the targets themselves: another real pack than the demo's.
    let pack = std::env::var_os("KOLM_FUZZ_PACK").map(PathBuf::from).unwrap_or_else(|| pack_beside(&path));
    let m = Model::load(&path, &ModelOptions { n_gpu_layers: 0 }).unwrap();
    let texts = token_texts(&m);

    let pack_bytes = std::fs::read(&pack).unwrap_or_else(|e| panic!("{} (kolm-rsd demo compiles it): {e}", pack.display()));
    write(&corpus.join("pack"), "seed.recipes.json", &pack_bytes);

    // Real answers: the model's greedy continuations of a few JSON-extraction prompts.
    let prompts = kolm_rsd::workload::load("json-extraction").unwrap();
    let mut teacher = Teacher::new(&m, 1, 2048, 0).unwrap();
    let mut streams = Vec::new();
    for p in prompts.iter().step_by(12) {
        let prompt = m.tokenize(&templated(&m, &p.text), true, true).unwrap();
        let answer = teacher.greedy(&prompt, 64).unwrap();
        streams.push((prompt, answer));
    }

    let fp = fingerprint(&m);
    let mut hist = Histogram::new(fp.clone(), m.n_vocab(), 10);
    for (_, a) in &streams {
        hist.add_text(a);
    }
    write(&corpus.join("shortlist"), "answers.histogram.json", &hist.to_vec());
    let ranking = hist.ranking(Method::Frequency);
    let sl = Shortlist::from_ranking(&ranking, &[0], 512, m.n_vocab() as u32, fp, Method::Frequency, 10);
    write(&corpus.join("shortlist"), "answers.shortlist.json", &sl.to_vec());

    // The drafter on the answers, step by step as the server drives it: seeds for the drafter and C API
    // targets, and the misses it records for the miss-log target.
    let index = load_index(&pack, &texts).unwrap();
    let mut d = Drafter::new(Some(index), DrafterConfig::default()).with_texts(drafter_texts(&m, &texts));
    let mut out = Vec::new();
    for (i, (prompt, answer)) in streams.iter().enumerate() {
        let mut ops = Vec::new();
        ops.extend_from_slice(&[0, 0]);
        ops.extend_from_slice(&(prompt.len() as u16).to_le_bytes());
        prompt.iter().for_each(|&t| tok(&mut ops, t));
        d.begin(0, prompt);
        let (mut pos, mut now) = (0, 0u64);
        // Tokens the target kept since the last call, before the one it sampled (id_last).
        let mut produced: Vec<i32> = Vec::new();
        while pos < answer.len() {
            let history: Vec<i32> = prompt.iter().chain(&answer[..pos]).copied().collect();
            d.propose(0, &history, answer[pos], 16, now, &mut out);
            d.end_propose(0, now);
            let kept = out.iter().zip(&answer[pos + 1..]).take_while(|(a, b)| a == b).count();
            d.accept(0, kept);
            ops.extend_from_slice(&[1, 0, 16, produced.len() as u8]);
            produced.iter().for_each(|&t| tok(&mut ops, t));
            tok(&mut ops, answer[pos]);
            ops.extend_from_slice(&[2, 0, kept as u8, 3, 0]);
            ops.extend_from_slice(&2000u16.to_le_bytes());
            produced = answer[pos + 1..pos + 1 + kept].to_vec();
            pos += 1 + kept;
            now += 2_000_000;
        }
        write(&corpus.join("drafter"), &format!("answer-{i}.ops"), &ops);
        // The C API target reads a flags byte first: the real pack, options with 4 sequences.
        let mut capi = vec![0x42];
        capi.extend_from_slice(&ops);
        write(&corpus.join("capi"), &format!("answer-{i}.ops"), &capi);
    }
    let mut misses = Vec::new();
    d.drain_misses(&mut misses);
    let log_path = corpus.join("misslog").join("drafter.jsonl");
    std::fs::create_dir_all(log_path.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&log_path);
    let n = MissLog::new(&log_path, 1 << 20).append(&misses).unwrap();
    eprintln!("seeds in {}: pack, shortlist and histogram, {} answer streams, {n} misses", corpus.display(), streams.len());
}
