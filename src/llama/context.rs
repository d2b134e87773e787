//! A llama context (KV cache + compute) over a model, and the token batches it decodes.

use super::{sys, LlamaError, Model, Token};
use std::ptr::NonNull;

/// How to create a context.
#[derive(Clone, Debug)]
pub struct ContextOptions {
    pub n_ctx: u32,
    pub n_batch: u32,
    pub n_seq: u32,
    /// Threads; 0 = one per available core (llama.cpp's own default is a fixed 4, which oversubscribes
    /// small machines).
    pub n_threads: i32,
    /// Flash attention: None = llama.cpp's auto choice.
    pub flash_attn: Option<bool>,
    /// One KV buffer shared by all sequences (copying a prompt to K sequences then costs nothing).
    pub kv_unified: bool,
}

impl Default for ContextOptions {
    fn default() -> Self {
        Self { n_ctx: 4096, n_batch: 512, n_seq: 1, n_threads: 0, flash_attn: None, kv_unified: false }
    }
}

/// An owned `llama_context`. It borrows its model, so the model must outlive it.
pub struct Context<'m> {
    ptr: NonNull<sys::llama_context>,
    model: &'m Model,
}

// SAFETY: a llama_context may move between threads; it is used by one thread at a time (&mut self).
unsafe impl Send for Context<'_> {}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the context; freed exactly once.
        unsafe { sys::llama_free(self.ptr.as_ptr()) };
    }
}

impl<'m> Context<'m> {
    pub fn new(model: &'m Model, opts: &ContextOptions) -> Result<Context<'m>, LlamaError> {
        // SAFETY: default params are plain data; the model pointer is live for 'm.
        let ptr = unsafe {
            let mut p = sys::llama_context_default_params();
            p.n_ctx = opts.n_ctx;
            p.n_batch = opts.n_batch;
            p.n_ubatch = opts.n_batch;
            p.n_seq_max = opts.n_seq;
            p.no_perf = true;
            p.kv_unified = opts.kv_unified;
            let n_threads = match opts.n_threads {
                0 => std::thread::available_parallelism().map_or(4, |n| n.get() as i32),
                n => n,
            };
            p.n_threads = n_threads;
            p.n_threads_batch = n_threads;
            p.flash_attn_type = match opts.flash_attn {
                None => sys::LLAMA_FLASH_ATTN_TYPE_AUTO,
                Some(true) => sys::LLAMA_FLASH_ATTN_TYPE_ENABLED,
                Some(false) => sys::LLAMA_FLASH_ATTN_TYPE_DISABLED,
            };
            sys::llama_init_from_model(model.as_ptr(), p)
        };
        let ptr = NonNull::new(ptr).ok_or_else(|| LlamaError::Context(format!("n_ctx={} n_seq={}", opts.n_ctx, opts.n_seq)))?;
        Ok(Context { ptr, model })
    }

    pub fn model(&self) -> &'m Model {
        self.model
    }

    pub fn as_ptr(&self) -> *mut sys::llama_context {
        self.ptr.as_ptr()
    }

    pub fn decode(&mut self, batch: &Batch) -> Result<(), LlamaError> {
        // SAFETY: the batch's arrays are valid for batch.n_tokens entries (Batch keeps that invariant).
        let rc = unsafe { sys::llama_decode(self.ptr.as_ptr(), batch.raw) };
        if rc == 0 {
            Ok(())
        } else {
            Err(LlamaError::Decode(rc))
        }
    }

    /// Logits of the i-th token of the last decoded batch that asked for them (negative: from the end).
    pub fn logits(&self, i: i32) -> &[f32] {
        let n = self.model.n_vocab();
        // SAFETY: llama_get_logits_ith returns NULL for an index without logits (checked) or a pointer to
        // n_vocab floats valid until the next decode, which needs &mut self.
        unsafe {
            let p = sys::llama_get_logits_ith(self.ptr.as_ptr(), i);
            assert!(!p.is_null(), "no logits for batch index {i}");
            std::slice::from_raw_parts(p, n)
        }
    }

    /// Also return, for every token that asks for logits, the final normed hidden state (the input of
    /// the LM head, llama.cpp's `result_norm`); read it with [`Context::embeddings`].
    pub fn set_embeddings(&mut self, on: bool) {
        // SAFETY: live context; the flag only changes which outputs the next decode copies back.
        unsafe { sys::llama_set_embeddings(self.ptr.as_ptr(), on) };
    }

    /// Skip the LM head in decode (patch 0003): only hidden states are computed, so [`Context::logits`]
    /// must not be used while it is on. Returns false, changing nothing, for a model whose head has a
    /// bias or scale (its head always runs).
    pub fn set_skip_output_head(&mut self, skip: bool) -> bool {
        // SAFETY: live context; the flag only changes which graph the next decode builds.
        unsafe { sys::llama_set_skip_output_head(self.ptr.as_ptr(), skip) }
    }

    /// The hidden state (n_embd floats) of the i-th token of the last decoded batch that asked for
    /// logits, when embeddings are on (see [`Context::set_embeddings`]).
    pub fn embeddings(&self, i: i32) -> &[f32] {
        let n = self.model.n_embd();
        // SAFETY: llama_get_embeddings_ith returns NULL for an index without outputs (checked) or a
        // pointer to n_embd floats valid until the next decode, which needs &mut self.
        unsafe {
            let p = sys::llama_get_embeddings_ith(self.ptr.as_ptr(), i);
            assert!(!p.is_null(), "no embeddings for batch index {i} (set_embeddings(true) first)");
            std::slice::from_raw_parts(p, n)
        }
    }

    /// Removes positions [p0, p1) of a sequence from the KV cache (p1 < 0: to the end).
    pub fn seq_rm(&mut self, seq: i32, p0: i32, p1: i32) -> bool {
        // SAFETY: live context; llama.cpp validates the ranges.
        unsafe { sys::llama_memory_seq_rm(sys::llama_get_memory(self.ptr.as_ptr()), seq, p0, p1) }
    }

    /// Copies sequence `src`'s cache at positions `p0..p1` into `dst` (shares cells; no recompute; -1 = open end;
    /// a part of a sequence only with a unified cache).
    pub fn seq_cp(&mut self, src: i32, dst: i32, p0: i32, p1: i32) {
        // SAFETY: live context; llama.cpp validates the sequence ids and the range.
        unsafe { sys::llama_memory_seq_cp(sys::llama_get_memory(self.ptr.as_ptr()), src, dst, p0, p1) };
    }

    /// Empties the KV cache.
    pub fn clear(&mut self) {
        // SAFETY: live context.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ptr.as_ptr()), true) };
    }
}

/// A `llama_batch` that owns its arrays and knows its capacity.
pub struct Batch {
    raw: sys::llama_batch,
    cap: usize,
    n_seq_max: usize,
}

// SAFETY: the arrays are owned by this value (allocated by llama_batch_init, freed in Drop) and only
// touched through &mut self or read by llama_decode during a call that borrows it.
unsafe impl Send for Batch {}

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: raw came from llama_batch_init and is freed once.
        unsafe { sys::llama_batch_free(self.raw) };
    }
}

impl Batch {
    pub fn new(cap: usize, n_seq_max: usize) -> Batch {
        // SAFETY: allocates arrays of `cap` entries; n_tokens starts at 0 so nothing uninitialized is read.
        let mut raw = unsafe { sys::llama_batch_init(cap as i32, 0, n_seq_max as i32) };
        raw.n_tokens = 0;
        Batch { raw, cap, n_seq_max }
    }

    pub fn clear(&mut self) {
        self.raw.n_tokens = 0;
    }

    pub fn len(&self) -> usize {
        self.raw.n_tokens as usize
    }

    pub fn is_empty(&self) -> bool {
        self.raw.n_tokens == 0
    }

    /// Appends a token at `pos` in the given sequences; `logits` asks for its logits.
    pub fn add(&mut self, token: Token, pos: i32, seqs: &[i32], logits: bool) {
        let i = self.len();
        assert!(i < self.cap, "batch full ({} tokens)", self.cap);
        assert!(!seqs.is_empty() && seqs.len() <= self.n_seq_max, "bad sequence list");
        // SAFETY: i < cap, and llama_batch_init allocated every array with cap entries (seq_id[i] with
        // n_seq_max ids each), so all writes are in bounds.
        unsafe {
            *self.raw.token.add(i) = token;
            *self.raw.pos.add(i) = pos;
            *self.raw.n_seq_id.add(i) = seqs.len() as i32;
            let ids = *self.raw.seq_id.add(i);
            for (k, &s) in seqs.iter().enumerate() {
                *ids.add(k) = s;
            }
            *self.raw.logits.add(i) = logits as i8;
        }
        self.raw.n_tokens += 1;
    }
}
