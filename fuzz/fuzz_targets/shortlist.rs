//! Shortlist and teacher-histogram files: parse and validate against the real vocabulary and without it; a
//! file that parses must round-trip and give rows for every id.
#![no_main]

use kolm_rsd::shortlist::{Histogram, Shortlist};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn expect() -> &'static (String, u32) {
    static E: OnceLock<(String, u32)> = OnceLock::new();
    E.get_or_init(|| {
        let m = kolm_rsd_fuzz::model();
        let texts: Vec<&[u8]> = (0..m.n_vocab() as i32).map(|t| m.token_text(t)).collect();
        (kolm_rsd::pack::tokenizer_fingerprint(texts.into_iter()), m.n_vocab() as u32)
    })
}

fuzz_target!(|data: &[u8]| {
    let (fp, nv) = expect();
    for want in [None, Some((fp.as_str(), *nv))] {
        if let Ok(s) = Shortlist::from_slice(data, "fuzz", want) {
            let back = Shortlist::from_slice(&s.to_vec(), "round trip", want).expect("a shortlist reads back what it wrote");
            assert_eq!(back, s);
            let rows = s.rows();
            assert!(rows.iter().flatten().all(|&r| (r as usize) < s.len()));
            let _ = s.prefix(s.len() / 2);
        }
        if let Ok(h) = Histogram::from_slice(data, "fuzz", want) {
            let _ = Histogram::from_slice(&h.to_vec(), "round trip", want).expect("a histogram reads back what it wrote");
        }
    }
});
