//! The synthetic traffic both benches draft on: a 32,000-token vocabulary of words, numbers, JSON punctuation
//! and indentation, token streams of which 70% follow a fixed successor function (so recipes recur), and a
//! pack cut from such a stream.

use kolm_rsd::hash::window_key;
use kolm_rsd::pack::{CompileParams, Entry, EntryKind, ModelInfo, Pack, PackMeta, Recommended};
use kolm_rsd::shape::ShapeTable;

pub const VOCAB: usize = 32_000;

pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self, n: u32) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % u64::from(n)) as u32
    }
}

/// The synthetic vocabulary's token texts: words, numbers, JSON punctuation, indentation.
pub fn vocab() -> Vec<String> {
    (0..VOCAB)
        .map(|i| match i % 8 {
            0 => format!("Ġw{i}"),
            1 => format!("{}", i % 1000),
            2 => ["{", "}", "\":", "Ġ\"", "\",", ",", "(", ")"][i / 8 % 8].to_string(),
            3 => "ĊĠĠĠĠ".to_string(),
            _ => format!("tok{i}"),
        })
        .collect()
}

pub fn refs(texts: &[String]) -> Vec<&[u8]> {
    texts.iter().map(|s| s.as_bytes()).collect()
}

/// A token stream where 70% of tokens follow a fixed successor function.
pub fn stream(len: usize, rng: &mut Lcg) -> Vec<i32> {
    let mut s = vec![1i32];
    while s.len() < len {
        let prev = *s.last().unwrap() as u32;
        let t = if rng.next(10) < 7 {
            (prev.wrapping_mul(2_654_435_761) >> 7) % 2000
        } else {
            rng.next(VOCAB as u32)
        };
        s.push(t as i32);
    }
    s
}

pub fn meta() -> PackMeta {
    PackMeta {
        tokenizer: "00112233445566778899aabbccddeeff".into(),
        model: ModelInfo {
            name: "synthetic".into(),
            arch: "none".into(),
        },
        compile: CompileParams {
            k: 4,
            temperature: 0.7,
            max_tokens: 256,
            prompts: 100,
            heldout: 10,
        },
        coverage: Some(0.5),
        recommended: Recommended::Pack,
    }
}

/// `n_entries` entries taken from windows of `s` (2/3 literal n = 1..4, 1/3 shape n = 2..6).
pub fn pack_from(s: &[i32], shapes: &ShapeTable, n_entries: usize, rng: &mut Lcg) -> Pack {
    let mut entries = Vec::new();
    while entries.len() < n_entries {
        let i = 8 + rng.next(s.len() as u32 - 8) as usize;
        let (kind, n) = if entries.len() % 3 == 2 {
            (EntryKind::Shape, 2 + rng.next(5) as usize)
        } else {
            (EntryKind::Literal, 1 + rng.next(4) as usize)
        };
        let w = &s[i - n..i];
        let key = match kind {
            EntryKind::Literal => window_key(&w.iter().map(|&t| t as u32).collect::<Vec<_>>()),
            EntryKind::Shape => shapes.window_key(w),
        };
        entries.push(Entry {
            kind,
            n: n as u8,
            key,
            token: s[i] as u32,
            count: 1 + rng.next(20),
        });
    }
    let mut p = Pack::from_entries(meta(), entries).unwrap();
    // Duplicates were merged; top up to the exact size.
    while p.entries().len() < n_entries {
        let extra = pack_from(s, shapes, n_entries - p.entries().len(), rng);
        p = p.merge(&extra).unwrap();
    }
    p
}
