//! recipes.json: parse and validate, then everything a validated pack must survive: the index with the real
//! vocabulary's shape table, lookups of hostile histories, a byte-exact round trip, a merge with itself.
#![no_main]

use kolm_rsd::index::Index;
use kolm_rsd::pack::Pack;
use kolm_rsd::shape::ShapeTable;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn vocab() -> &'static (Vec<Vec<u8>>, String, ShapeTable) {
    static V: OnceLock<(Vec<Vec<u8>>, String, ShapeTable)> = OnceLock::new();
    V.get_or_init(|| {
        let m = kolm_rsd_fuzz::model();
        let texts: Vec<Vec<u8>> = (0..m.n_vocab() as i32).map(|t| m.token_text(t).to_vec()).collect();
        let refs: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
        let fp = kolm_rsd::pack::tokenizer_fingerprint(refs.iter().copied());
        let shapes = ShapeTable::from_token_texts(&refs);
        (texts, fp, shapes)
    })
}

fuzz_target!(|data: &[u8]| {
    let (texts, fp, shapes) = vocab();
    let n_vocab = texts.len() as u32;
    // As the engine loads it (fingerprint and vocabulary checked), and as `inspect` does (neither).
    let Ok(pack) = Pack::from_slice(data, "fuzz", None, None) else { return };
    let again = Pack::from_slice(&pack.to_vec(), "round trip", None, None).expect("a pack reads back what it wrote");
    assert_eq!(again.content_hash(), pack.content_hash());
    assert_eq!(again.entries(), pack.entries());
    pack.merge(&pack).expect("a pack merges with itself");
    let plain = Index::new(&pack, None);
    let checked = Pack::from_slice(data, "fuzz", Some(fp), Some(n_vocab));
    let shaped = checked.as_ref().ok().map(|p| Index::new(p, Some(shapes.clone())));
    let tail = &data[data.len().saturating_sub(64)..];
    let history: Vec<i32> = tail.chunks(2).map(|c| i32::from(c[0]) << 8 | i32::from(*c.get(1).unwrap_or(&0))).collect();
    for idx in std::iter::once(&plain).chain(shaped.as_ref()) {
        for h in [&history[..], &[], &[-1, i32::MAX, n_vocab as i32]] {
            if let Some(hit) = idx.lookup(h) {
                assert!(hit.confidence().is_finite());
            }
        }
    }
});
