//! The drafter on arbitrary streams of begin / propose / accept / time, as the engine drives it: the real
//! vocabulary and pack, four sequences, sequence ids checked as the C API checks them (out-of-range ids
//! must be harmless even so: they are also fed straight in), tokens at and beyond the vocabulary's edge,
//! `n_max` 0..64, accepts larger than the draft. A draft never exceeds `n_max` nor the drafter's cap.
#![no_main]

use kolm_rsd::draft::syntax::TokenTexts;
use kolm_rsd::draft::{Drafter, DrafterConfig};
use kolm_rsd::engine::load_index;
use kolm_rsd::vocab::{drafter_texts, token_texts};
use kolm_rsd::index::Index;
use kolm_rsd_fuzz::{model, pack_path, Op, Ops};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const N_SEQ: usize = 4;

/// The real pack's index and the vocabulary as the drafter reads it, built once; each input gets clones.
fn loaded() -> &'static (Index, TokenTexts) {
    static L: OnceLock<(Index, TokenTexts)> = OnceLock::new();
    L.get_or_init(|| {
        let texts = token_texts(model());
        (load_index(&pack_path(), &texts).expect("the real pack"), drafter_texts(model(), &texts))
    })
}

fuzz_target!(|data: &[u8]| {
    let (index, texts) = loaded();
    let mut d = Drafter::new(Some(index.clone()), DrafterConfig { n_seq: N_SEQ, ..DrafterConfig::default() }).with_texts(texts.clone());
    let n_vocab = model().n_vocab() as i32;
    let mut history: Vec<Vec<i32>> = vec![Vec::new(); N_SEQ];
    let mut now = 0u64;
    let mut out = Vec::new();
    for op in Ops::new(data, n_vocab) {
        // Valid ids as the engine passes them; others straight in, which the drafter must ignore.
        let at = |seq: i32| usize::try_from(seq).unwrap_or(usize::MAX).min(1 << 20);
        match op {
            Op::Begin { seq, prompt } => {
                d.begin(at(seq), &prompt);
                if let Some(h) = history.get_mut(at(seq)) {
                    *h = prompt;
                }
            }
            Op::Propose { seq, n_max, produced, id_last } => {
                let h = history.get_mut(at(seq)).map(|h| {
                    h.extend_from_slice(&produced);
                    h.clone()
                });
                let n = d.propose(at(seq), h.as_deref().unwrap_or(&produced), id_last, n_max, now, &mut out);
                assert!(n == out.len() && n <= n_max && n <= kolm_rsd::draft::step::INVARIANT_DRAFT);
                d.end_propose(at(seq), now);
                if let Some(h) = history.get_mut(at(seq)) {
                    h.push(id_last);
                }
            }
            Op::Accept { seq, n } => d.accept(at(seq), n),
            Op::Wait { us, .. } => now += us * 1000,
            Op::Miss { .. } => {}
        }
    }
    let mut misses = Vec::new();
    d.drain_misses(&mut misses);
    assert!(misses.iter().all(|m| m.context.len() <= kolm_rsd::draft::MISS_CONTEXT));
});
