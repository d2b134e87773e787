//! The miss log as a crashed or hostile writer may leave it: read it (every record from a whole line), fold it
//! as `compile --misses` does, build the pack.
#![no_main]

use kolm_rsd::align::{AlignConfig, BuildConfig, Recipes};
use kolm_rsd::misslog::{fold_misses, read_misses};
use kolm_rsd::pack::{CompileParams, ModelInfo, PackMeta, Recommended};
use kolm_rsd::shape::ShapeTable;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn shapes() -> &'static ShapeTable {
    static S: OnceLock<ShapeTable> = OnceLock::new();
    S.get_or_init(|| {
        let m = kolm_rsd_fuzz::model();
        let texts: Vec<&[u8]> = (0..m.n_vocab() as i32).map(|t| m.token_text(t)).collect();
        ShapeTable::from_token_texts(&texts)
    })
}

fn meta() -> PackMeta {
    PackMeta {
        tokenizer: "0123456789abcdef0123456789abcdef".into(),
        model: ModelInfo { name: "fuzz".into(), arch: "llama".into() },
        compile: CompileParams { k: 4, temperature: 0.7, max_tokens: 96, prompts: 1, heldout: 0 },
        coverage: None,
        recommended: Recommended::Pack,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut misses = Vec::new();
    let rep = read_misses(data, 1 << 16, &mut misses).expect("reading from memory does not fail");
    assert_eq!(rep.read, misses.len());
    let whole_lines = data.iter().filter(|&&b| b == b'\n').count();
    assert!(rep.read + rep.skipped <= whole_lines, "a record or skip without its newline: {rep:?}, {whole_lines} lines");
    assert!(rep.torn <= 1 + data.split(|&b| b == b'\n').filter(|l| l.len() > 1024).count());
    if let Some(last) = misses.last() {
        assert!(last.token >= 0 && last.context.iter().all(|&t| t >= 0));
    }
    for shaped in [false, true] {
        let mut r = Recipes::new(AlignConfig::default(), shaped.then(|| shapes().clone()));
        fold_misses(&misses, 2, &mut r);
        let _ = r.build(meta(), &BuildConfig::default());
    }
});
