//! What the fuzz targets share: the op stream the drafter and C API targets decode from the fuzzer's bytes
//! (examples/fuzz_seeds.rs in the main crate writes real token streams in it), and the real model and pack
//! they run against, loaded once per process.
//!
//! Op stream, repeated until the bytes run out; a token is a u16 LE, where 0xFFF0..=0xFFFF pick an id at or
//! beyond the vocabulary's edge (see [`Ops::token`]):
//! - `0 seq len:u16 tokens…` begin a request with this prompt;
//! - `1 seq n_max:u8 k:u8 tokens×k id_last` the target produced `tokens`, then `id_last`: propose;
//! - `2 seq n:u8` the target accepted `n` drafted tokens (may exceed the draft);
//! - `3 seq dt:u16` time passes (µs) before the sequence's next call;
//! - `4 len:u8 tokens… token` a miss reported by the caller.
//!
//! `seq` is an i8: negative and out-of-range ids are part of the test.

use kolm_rsd::llama::{Model, ModelOptions};
use std::path::PathBuf;
use std::sync::OnceLock;

pub enum Op {
    Begin { seq: i32, prompt: Vec<i32> },
    Propose { seq: i32, n_max: usize, produced: Vec<i32>, id_last: i32 },
    Accept { seq: i32, n: usize },
    Wait { seq: i32, us: u64 },
    Miss { context: Vec<i32>, token: i32 },
}

/// Decodes ops from fuzzer bytes; a truncated last op is dropped.
pub struct Ops<'a> {
    data: &'a [u8],
    n_vocab: i32,
}

impl<'a> Ops<'a> {
    pub fn new(data: &'a [u8], n_vocab: i32) -> Ops<'a> {
        Ops { data, n_vocab }
    }

    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.data.split_first()?;
        self.data = rest;
        Some(b)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes([self.u8()?, self.u8()?]))
    }

    /// A token id: in the vocabulary, or one of the edges a hostile caller could pass.
    fn token(&mut self) -> Option<i32> {
        let v = self.u16()?;
        Some(match v {
            0xFFF0 => -1,
            0xFFF1 => i32::MIN,
            0xFFF2 => i32::MAX,
            0xFFF3 => self.n_vocab,
            0xFFF4 => self.n_vocab - 1,
            0xFFF5 => self.n_vocab + 1,
            0xFFF6..=0xFFFF => 0,
            v => i32::from(v) % self.n_vocab.max(1),
        })
    }

    fn tokens(&mut self, n: usize) -> Option<Vec<i32>> {
        (0..n).map(|_| self.token()).collect()
    }
}

impl Iterator for Ops<'_> {
    type Item = Op;

    fn next(&mut self) -> Option<Op> {
        let seq = |o: &mut Self| o.u8().map(|b| i32::from(b as i8));
        Some(match self.u8()? % 5 {
            0 => {
                let seq = seq(self)?;
                let len = usize::from(self.u16()? % 4096);
                Op::Begin { seq, prompt: self.tokens(len)? }
            }
            1 => {
                let seq = seq(self)?;
                let n_max = usize::from(self.u8()? % 65);
                let k = usize::from(self.u8()? % 32);
                Op::Propose { seq, n_max, produced: self.tokens(k)?, id_last: self.token()? }
            }
            2 => Op::Accept { seq: seq(self)?, n: usize::from(self.u8()?) },
            3 => Op::Wait { seq: seq(self)?, us: u64::from(self.u16()?) },
            _ => {
                let len = usize::from(self.u8()? % 16);
                Op::Miss { context: self.tokens(len)?, token: self.token()? }
            }
        })
    }
}

/// SmolLM2-135M from the project's cache (`kolm-rsd model fetch`), loaded once, llama.cpp's log silenced.
pub fn model() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| {
        kolm_rsd::llama::quiet_logs();
        let path = kolm_rsd::fetch::model(kolm_rsd::fetch::DEFAULT_MODEL, false).expect("SmolLM2 in the cache (kolm-rsd model fetch)");
        Model::load(&path, &ModelOptions { n_gpu_layers: 0 }).expect("load SmolLM2")
    })
}

/// The real pack the targets draft from: `KOLM_FUZZ_PACK`, else the one `kolm-rsd demo` compiles beside the model.
pub fn pack_path() -> PathBuf {
    std::env::var_os("KOLM_FUZZ_PACK").map(PathBuf::from).unwrap_or_else(|| {
        let m = kolm_rsd::fetch::model(kolm_rsd::fetch::DEFAULT_MODEL, false).expect("SmolLM2 in the cache");
        kolm_rsd::engine::pack_beside(&m)
    })
}
